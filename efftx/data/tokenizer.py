"""A pretrained checkpoint's own tokenizer, offline: the ids, token types and special tokens its model was trained on.

`load(path)` reads, from a folder (or the file itself), the first of:
  - tokenizer.json — HF `tokenizers` (a fast tokenizer saved by transformers: BERT's WordPiece, FNet's
    SentencePiece-as-Unigram, ...), its own normaliser, pre-tokeniser and [CLS]/[SEP] template, so the ids and
    token types are those of transformers' fast tokenizer for the checkpoint;
  - a SentencePiece model (spiece.model, *.model) — `sentencepiece`, with FNet's conventions as its HF tokenizer
    (transformers' FNetTokenizer) applies them: whitespace collapsed, accents kept, case kept, ALBERT's split of a
    piece that ends in a digit and a comma, then [CLS] a [SEP] (b [SEP]);
  - vocab.txt — a WordPiece vocabulary (old BERT checkpoints), with BERT's normaliser (lower case unless
    tokenizer_config.json says do_lower_case=false) and template.

`encode(first, second, max_len)` gives (ids, token types) with the special tokens in place; with max_len, the texts
are cut longest first so that the result with its special tokens fits, as transformers' truncation=True does with
the same files: tokenizer.json and vocab.txt as its fast (Rust) tokenizers, a SentencePiece model as its Python
FNetTokenizer. The two differ on a tie: the Python one keeps the extra token in the first text, the Rust one in the
second. A Tokenizer pickles as its path (grain's worker processes load it again); one is shared by threads.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import threading
import unicodedata

import numpy as np

from efftx.errors import UserError

_SPIECE_UNDERLINE = "\u2581"
# Names a checkpoint's special tokens go by (special_tokens_map.json, when present, names them first).
_CANDIDATES = {
  "cls": ("[CLS]", "<s>", "<cls>"),
  "sep": ("[SEP]", "</s>", "<sep>"),
  "pad": ("[PAD]", "<pad>"),
  "mask": ("[MASK]", "<mask>"),
}


class Tokenizer:
  """Text → (ids, token types) as the checkpoint's tokenizer gives them. Attributes: path, kind ("tokenizers",
  "sentencepiece" or "wordpiece"), vocab_size, and the ids cls_id, sep_id, pad_id, mask_id."""

  def __init__(self, path: str):
    self.path = os.path.abspath(path)
    folder = self.path if os.path.isdir(self.path) else os.path.dirname(self.path)
    self._settings = _read_json(os.path.join(folder, "tokenizer_config.json"))
    named = _read_json(os.path.join(folder, "special_tokens_map.json"))
    file = _tokenizer_file(self.path)
    if file.endswith(".json"):
      import tokenizers  # pylint: disable=g-import-not-at-top

      self.kind, self._tok = "tokenizers", tokenizers.Tokenizer.from_file(file)
      self._tok.no_padding()
      self._tok.no_truncation()
      lookup = self._tok.token_to_id
      self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    elif file.endswith(".txt"):
      from tokenizers import implementations  # pylint: disable=g-import-not-at-top

      self.kind = "wordpiece"
      self._tok = implementations.BertWordPieceTokenizer(file, lowercase=self._settings.get("do_lower_case", True))
      lookup = self._tok.token_to_id
      self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    else:
      import sentencepiece  # pylint: disable=g-import-not-at-top

      self.kind, self._sp = "sentencepiece", sentencepiece.SentencePieceProcessor(model_file=file)
      self.vocab_size = self._sp.get_piece_size()
      lookup = lambda piece: (
        self._sp.piece_to_id(piece) if self._sp.id_to_piece(self._sp.piece_to_id(piece)) == piece else None
      )
    self.file = file
    self._truncation, self._lock = None, threading.Lock()
    for role, candidates in _CANDIDATES.items():
      given = named.get(f"{role}_token")
      given = given.get("content") if isinstance(given, dict) else given
      found = next((lookup(t) for t in ((given,) if given else ()) + candidates if lookup(t) is not None), None)
      setattr(self, f"{role}_id", found)
    missing = [role for role in ("cls", "sep", "pad") if getattr(self, f"{role}_id") is None]
    if missing:
      raise UserError(
        f"tokenizer {file}: no {', '.join(missing)} token ({', '.join(_CANDIDATES[missing[0]])}): "
        "efftx encodes [CLS] a [SEP] b [SEP] as BERT and FNet do"
      )
    ids, types = self.encode("a", "b")
    if ids[0] != self.cls_id or ids[-1] != self.sep_id or list(ids).count(self.sep_id) != 2 or not types.any():
      raise UserError(
        f"tokenizer {file} does not encode a pair as [CLS] a [SEP] b [SEP] with token types 0 and 1 "
        f"(it gives ids {ids.tolist()}, types {types.tolist()}): a first-token classifier would read "
        "a word, not [CLS]"
      )

  def __reduce__(self):
    return (load, (self.path,))

  @property
  def special_ids(self) -> tuple[int, ...]:
    """The ids a masked-LM never chooses to mask."""
    return tuple(i for i in (self.cls_id, self.sep_id, self.pad_id) if i is not None)

  def encode(
    self, first: str | bytes, second: str | bytes | None = None, max_len: int | None = None
  ) -> tuple[np.ndarray, np.ndarray]:
    """(ids, token types), int32: [CLS] first [SEP] (second [SEP]), types 0 up to the first [SEP], 1 after it; with
    max_len, cut longest first to fit."""
    first, second = _text(first), None if second is None else _text(second)
    if self.kind == "sentencepiece":
      return self._encode_sentencepiece(first, second, max_len)
    with self._lock:  # the truncation length is the tokenizer's state; threads (grain's readers) share it
      if max_len != self._truncation:
        if max_len:
          self._tok.enable_truncation(max_len, strategy="longest_first")
        else:
          self._tok.no_truncation()
        self._truncation = max_len
      encoding = self._tok.encode(first, second) if second is not None else self._tok.encode(first)
    return np.asarray(encoding.ids, np.int32), np.asarray(encoding.type_ids, np.int32)

  def _encode_sentencepiece(self, first, second, max_len):
    a, b = self._pieces(first), None if second is None else self._pieces(second)
    if max_len:
      a, b = truncate_longest_first(a, b, max_len - (2 if b is None else 3))
    ids = [self.cls_id, *a, self.sep_id]
    types = [0] * len(ids)
    if b is not None:
      ids += [*b, self.sep_id]
      types += [1] * (len(b) + 1)
    return np.asarray(ids, np.int32), np.asarray(types, np.int32)

  def _pieces(self, text: str) -> list[int]:
    """FNet's SentencePiece tokenisation (transformers' FNetTokenizer: remove_space, keep_accents, cased)."""
    text = " ".join(text.strip().split()).replace("``", '"').replace("''", '"')
    if not self._settings.get("keep_accents", True):
      text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    if self._settings.get("do_lower_case", False):
      text = text.lower()
    pieces = []
    for piece in self._sp.encode(text, out_type=str):
      if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():  # "1990," → "▁1990", ","
        split = self._sp.encode(piece[:-1].replace(_SPIECE_UNDERLINE, ""), out_type=str)
        if piece[0] != _SPIECE_UNDERLINE and split and split[0][0] == _SPIECE_UNDERLINE:
          split = split[1:] if len(split[0]) == 1 else [split[0][1:], *split[1:]]
        pieces += [*split, piece[-1]]
      else:
        pieces.append(piece)
    return [self._sp.piece_to_id(p) for p in pieces]


def truncate_longest_first(a: list, b: list | None, room: int) -> tuple[list, list | None]:
  """a and b cut to room tokens together, as transformers' Python tokenizers' longest_first does: the longer one
  loses tokens from its end until both are as long, then both lose them alike, the first keeping the odd one."""
  room = max(room, 0)
  if b is None:
    return a[:room], None
  excess = len(a) + len(b) - room
  if excess <= 0:
    return a, b
  gap = min(abs(len(a) - len(b)), excess)
  rest = excess - gap
  cut_a, cut_b = (gap + rest // 2, rest - rest // 2) if len(a) > len(b) else (rest // 2, gap + rest - rest // 2)
  return a[: len(a) - cut_a], b[: len(b) - cut_b]


@functools.lru_cache(maxsize=8)
def load(path: str) -> Tokenizer:
  """The tokenizer at `path` (a checkpoint folder or a tokenizer file), loaded once per process."""
  return Tokenizer(path)


def find(path: str) -> str | None:
  """The tokenizer file `load` would read at `path` (a folder or a file), None if there is none."""
  try:
    return _tokenizer_file(path)
  except UserError:
    return None


def files(path: str) -> list[str]:
  """A tokenizer's files: in a folder, every tokenizer file there; a named file, with its folder's settings
  (tokenizer_config.json, special_tokens_map.json). What an exported checkpoint folder carries along."""
  folder = path if os.path.isdir(path) else os.path.dirname(path)
  settings = [
    os.path.join(folder, n)
    for n in ("tokenizer_config.json", "special_tokens_map.json")
    if os.path.exists(os.path.join(folder, n))
  ]
  if not os.path.isdir(path):
    return [path] + settings
  found = [os.path.join(folder, n) for n in ("tokenizer.json", "vocab.txt") if os.path.exists(os.path.join(folder, n))]
  return found + settings + sorted(glob.glob(os.path.join(folder, "*.model")))


def same(a: str, b: str) -> bool:
  """Whether the tokenizers at a and b give the same ids: the same vocabulary size and special tokens, and the same
  ids and types for a probe pair that uses both cases, digits, punctuation and accents."""
  ta, tb = load(a), load(b)
  probe = ("The Quick brown fox, in 1990, jumped: café ÀÉÎ 3.14!", "a second Sentence -- with [brackets] & more.")
  key = lambda t: (t.vocab_size, t.cls_id, t.sep_id, t.pad_id, t.mask_id)
  return key(ta) == key(tb) and all((x == y).all() for x, y in zip(ta.encode(*probe), tb.encode(*probe)))


def _tokenizer_file(path: str) -> str:
  if os.path.isfile(path):
    if path.endswith((".json", ".model", ".txt")):
      return path
    raise UserError(
      f"config.data.tokenizer='{path}': a tokenizer file is tokenizer.json, a SentencePiece .model "
      "or a WordPiece vocab.txt"
    )
  if not os.path.isdir(path):
    raise UserError(f"config.data.tokenizer='{path}': no such file or folder")
  for pattern in ("tokenizer.json", "spiece.model", "*.model", "vocab.txt"):
    found = sorted(glob.glob(os.path.join(path, pattern)))
    if found:
      return found[0]
  raise UserError(
    f"config.data.tokenizer='{path}': the folder has no tokenizer.json, SentencePiece .model or vocab.txt"
  )


def _read_json(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _text(text: str | bytes) -> str:
  return text.decode("utf-8") if isinstance(text, bytes) else str(text)
