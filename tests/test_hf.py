"""Hugging Face FNet and BERT checkpoints load into efftx with their tokenizers and give HF's outputs; efftx encoders
export to HF folders that transformers runs to efftx's outputs (fixtures from tests/fixtures/make_hf_fixtures.py:
tiny random models and tokenizers run in torch; these tests need numpy and the tokenizer libraries only)."""

import json
import os
import runpy
import shutil

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from conftest import REPO
from conftest import compiled
from efftx import checkpoints
from efftx import config as config_lib
from efftx import hf
from efftx import init_from
from efftx import model as model_lib
from efftx import train
from efftx import trainer
from efftx.data import pipeline
from efftx.data import resolve
from efftx.data import tokenizer as tokenizer_lib
from efftx.errors import UserError
from efftx.objectives import OBJECTIVES

FIXTURES = os.path.join(REPO, "tests", "fixtures")


def _encoder(config, params):
  """The users' model builder with the checkpoint's vocabulary and an identity head: the final hidden states,
  HF's last_hidden_state."""
  vocab_size = params["embed"]["embedding"].shape[0]
  return model_lib.build_model(config, lambda x_BxLxD, mask_BxL: x_BxLxD, vocab_size)


def _flat(tree):
  return {
    "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
    for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def _pairs_through_efftx(folder, expected, max_len=20):
  """The fixture's sentence pairs as efftx's GLUE pipeline encodes them with the checkpoint's tokenizer."""
  encode = pipeline.Encode("glue", max_len, True, "mrpc", tokenizer=folder)
  rows = [
    encode({"sentence1": str(a), "sentence2": str(b), "label": 0, "idx": i})
    for i, (a, b) in enumerate(zip(expected["first"], expected["second"]))
  ]
  return {k: np.stack([r[k] for r in rows]) for k in ("tokens", "mask", "token_types")}


@pytest.mark.parametrize("name", ["hf_fnet_tiny", "hf_bert_tiny"])
def test_tokenized_sentence_pairs_give_hf_hidden_states_and_pooled_output(name):
  """Sentence pairs → efftx's GLUE encoder with the checkpoint's tokenizer → the converted model: the ids, token
  types and padding of transformers' tokenizer (pairs cut longest first to 20 tokens), then HF's last_hidden_state
  and pooler_output (FNet: padded with its pad id and mixed in, as HF's users pad)."""
  folder = os.path.join(FIXTURES, name)
  expected = np.load(os.path.join(folder, "expected.npz"))
  config, params = hf.load(folder)
  assert config.data.tokenizer == folder and config.model.pooling == "first" and config.model.type_vocab_size
  config_lib.validate(config, jax.device_count())
  batch = _pairs_through_efftx(folder, expected)
  np.testing.assert_array_equal(batch["tokens"], expected["input_ids"])
  np.testing.assert_array_equal(batch["token_types"], expected["token_type_ids"])
  np.testing.assert_array_equal(batch["mask"], expected["attention_mask"].astype(bool))
  assert batch["token_types"].any() and (~batch["mask"]).any()  # segment B and padding are both exercised
  got = np.asarray(
    compiled(_encoder(config, params)).apply(
      {"params": params}, batch["tokens"], mask=batch["mask"], token_types=batch["token_types"]
    )
  )
  want, mask = expected["last_hidden_state"], batch["mask"]
  error = float(np.abs(got - want)[mask].max())
  print(f"{name}: max |efftx - HF| = {error:.2e} over {int(mask.sum())} real positions")
  assert error < 1e-5 * max(1.0, float(np.abs(want).max()))
  pooled = np.tanh(got[:, 0] @ params["pooler"]["kernel"] + params["pooler"]["bias"])
  np.testing.assert_allclose(pooled, expected["pooler_output"], atol=1e-5)
  without_types = np.asarray(compiled(_encoder(config, params)).apply({"params": params}, batch["tokens"], mask=mask))
  assert np.abs(without_types - want)[mask].max() > 1e-2  # segment B's embedding matters here


def test_sentencepiece_and_vocab_files_tokenize_as_transformers_does(tmp_path):
  """Without tokenizer.json: FNet's spiece.model through sentencepiece gives the ids and types of transformers'
  Python FNetTokenizer (longest-first cut included); BERT's vocab.txt through tokenizers' WordPiece gives its
  fast tokenizer's."""
  for name, files, prefix, kind in (
    ("hf_fnet_tiny", ("spiece.model", "tokenizer_config.json"), "slow_", "sentencepiece"),
    ("hf_bert_tiny", ("vocab.txt", "tokenizer_config.json"), "", "wordpiece"),
  ):
    folder = tmp_path / name
    folder.mkdir()
    for file in files:
      shutil.copy(os.path.join(FIXTURES, name, file), folder)
    assert tokenizer_lib.Tokenizer(str(folder)).kind == kind
    expected = np.load(os.path.join(FIXTURES, name, "expected.npz"))
    batch = _pairs_through_efftx(str(folder), expected)
    np.testing.assert_array_equal(batch["tokens"], expected[f"{prefix}input_ids"])
    np.testing.assert_array_equal(batch["token_types"], expected[f"{prefix}token_type_ids"])
    np.testing.assert_array_equal(batch["mask"], expected[f"{prefix}attention_mask"].astype(bool))


def test_longest_first_truncation_follows_transformers():
  """transformers' Python tokenizers: the longer text loses tokens; on a tie the first keeps the extra one."""
  cut = tokenizer_lib.truncate_longest_first
  assert cut(list(range(10)), list(range(10)), 17) == (list(range(9)), list(range(8)))
  assert cut(list(range(12)), list(range(3)), 10) == (list(range(7)), list(range(3)))
  assert cut(list(range(3)), list(range(12)), 10) == (list(range(3)), list(range(7)))
  assert cut(list(range(5)), None, 3) == (list(range(3)), None)
  assert cut([1, 2], [3], 10) == ([1, 2], [3])


def test_a_converted_encoder_takes_a_new_classifier_and_keeps_its_pooler():
  """Fine-tuning: the converted parameters are the whole of efftx's model with pooling="first" (embeddings, token
  types, blocks, the checkpoint's pooler), nothing extra; only the classifier is new."""
  config, params = hf.load(os.path.join(FIXTURES, "hf_bert_tiny"), max_len=16)
  vocab = len(params["embed"]["embedding"])
  model = model_lib.build_model(config, OBJECTIVES["classify"].head(vocab, 3, "first"), vocab)
  fresh = jax.eval_shape(lambda: trainer.init_params(model, jax.random.key(0)))  # shapes
  flat = lambda tree: {
    "/".join(str(k.key) for k in path): v.shape for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]
  }
  new = flat(fresh)
  head = {k for k in new if k.split("/")[0] in OBJECTIVES["classify"].fresh_params}
  assert head == {"classifier/kernel", "classifier/bias"}
  assert {k: s for k, s in new.items() if k not in head} == flat(params)
  assert "pooler/kernel" in new and "type_embed/embedding" in new


def test_bad_checkpoints_are_refused_clearly(tmp_path):
  with pytest.raises(UserError, match="config.json and model.safetensors"):
    hf.load(str(tmp_path))
  folder = os.path.join(FIXTURES, "hf_fnet_tiny")
  hf_config = json.load(open(os.path.join(folder, "config.json")))
  with pytest.raises(UserError, match="model_type 'gpt2'"):
    hf.convert({**hf_config, "model_type": "gpt2"}, {})
  with pytest.raises(UserError, match="hidden_act 'relu'"):
    hf.convert({**hf_config, "hidden_act": "relu"}, {})
  with pytest.raises(UserError, match="24 position embeddings"):
    hf.load(folder, max_len=64)


def test_settings_that_would_convert_into_another_model_are_refused_in_one_line():
  """Each would otherwise load silently as a different model: relative positions (distance embeddings dropped),
  a decoder (converted bidirectional), a config with fewer or more layers than the weights, a missing tensor."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  folder = os.path.join(FIXTURES, "hf_bert_tiny")
  hf_config = json.load(open(os.path.join(folder, "config.json")))
  weights = load_file(os.path.join(folder, "model.safetensors"))
  for position in ("relative_key", "relative_key_query"):
    with pytest.raises(UserError, match=f"position_embedding_type '{position}'"):
      hf.convert({**hf_config, "position_embedding_type": position}, weights)
  with pytest.raises(UserError, match="is_decoder"):
    hf.convert({**hf_config, "is_decoder": True}, weights)
  with pytest.raises(UserError, match="is_encoder_decoder"):
    hf.convert({**hf_config, "is_encoder_decoder": True}, weights)
  with pytest.raises(UserError, match="pruned_heads"):
    hf.convert({**hf_config, "pruned_heads": {"0": [1]}}, weights)
  with pytest.raises(UserError, match="num_hidden_layers is 1 but the weights hold layers 0, 1"):
    hf.convert({**hf_config, "num_hidden_layers": 1}, weights)
  with pytest.raises(UserError, match="num_hidden_layers is 3 but the weights hold layers 0, 1"):
    hf.convert({**hf_config, "num_hidden_layers": 3}, weights)
  missing = {k: v for k, v in weights.items() if "layer.1.output.dense.bias" not in k}
  with pytest.raises(UserError, match=r"no tensor (bert\.)?encoder\.layer\.1\.output\.dense\.bias"):
    hf.convert(hf_config, missing)


def test_legacy_layernorm_names_load_as_hf_loads_them():
  """A checkpoint whose LayerNorms are named gamma / beta (TF-converted BERT) converts to the same parameters."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  folder = os.path.join(FIXTURES, "hf_bert_tiny")
  hf_config = json.load(open(os.path.join(folder, "config.json")))
  weights = load_file(os.path.join(folder, "model.safetensors"))
  legacy = {
    k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
    for k, v in weights.items()
  }
  assert legacy.keys() != weights.keys()
  _, want = hf.convert(hf_config, weights)
  _, got = hf.convert(hf_config, legacy)
  jax.tree.map(np.testing.assert_array_equal, got, want)


@pytest.mark.parametrize("kind", ["bert", "fnet"])
def test_an_exported_encoder_runs_in_transformers_as_in_efftx(kind):
  """tests/fixtures/efftx_export_<kind>: written by efftx.hf.export (a random efftx encoder, every parameter
  perturbed, with the fixture's tokenizer); transformers' AutoModel ran it on the tokenized pairs (expected.npz).
  efftx reads the folder back and gives transformers' outputs; exporting what it read writes the same tensors."""
  folder = os.path.join(FIXTURES, f"efftx_export_{kind}")
  expected = np.load(os.path.join(folder, "expected.npz"))
  config, params = hf.load(folder)
  batch = _pairs_through_efftx(folder, expected)
  np.testing.assert_array_equal(batch["tokens"], expected["input_ids"])
  got = np.asarray(
    compiled(_encoder(config, params)).apply(
      {"params": params}, batch["tokens"], mask=batch["mask"], token_types=batch["token_types"]
    )
  )
  want = expected["last_hidden_state"]
  error = float(np.abs(got - want)[batch["mask"]].max())
  print(f"efftx_export_{kind}: max |efftx - transformers| = {error:.2e}")
  assert error < 1e-5 * max(1.0, float(np.abs(want).max()))
  pooled = np.tanh(got[:, 0] @ params["pooler"]["kernel"] + params["pooler"]["bias"])
  np.testing.assert_allclose(pooled, expected["pooler_output"], atol=1e-5)


@pytest.mark.parametrize("kind", ["bert", "fnet"])
def test_export_then_load_gives_identical_parameters(kind, tmp_path):
  """A fresh efftx encoder in each HF layout → export → efftx.hf.load: every parameter bit for bit, the config's
  architecture the same, the tokenizer carried along; and the committed export's tensors are what export writes."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  source = os.path.join(FIXTURES, f"hf_{kind}_tiny")
  config, _ = hf.load(source)
  config.model.update(num_layers=3, d_ff=40, dropout=0.0)  # settings the fixture does not have
  vocab = tokenizer_lib.load(source).vocab_size
  model = model_lib.build_model(config, OBJECTIVES["classify"].head(vocab, 2, "first"), vocab)
  params = jax.device_get(jax.jit(lambda: trainer.init_params(model, jax.random.key(3)))())  # one program
  params.pop("classifier")
  hf.export(config, params, str(tmp_path), tokenizer=source)
  loaded_config, loaded = hf.load(str(tmp_path))
  assert _flat(loaded).keys() == _flat(params).keys()
  for name, value in _flat(params).items():
    np.testing.assert_array_equal(_flat(loaded)[name], value, err_msg=name)
  assert not hf.mismatches(config, loaded_config)
  assert (
    tokenizer_lib.load(str(tmp_path)).encode("The cat.")[0].tolist()
    == tokenizer_lib.load(source).encode("The cat.")[0].tolist()
  )

  committed = os.path.join(FIXTURES, f"efftx_export_{kind}")
  config, params = hf.load(committed)
  hf.export(config, params, str(tmp_path / "again"))
  again, want = (
    load_file(str(tmp_path / "again" / "model.safetensors")),
    load_file(os.path.join(committed, "model.safetensors")),
  )
  assert again.keys() == want.keys()
  for name in want:
    np.testing.assert_array_equal(again[name], want[name], err_msg=name)


@pytest.mark.parametrize(
  "change,message",
  [
    (dict(block_layout="pre_ln"), "block_layout='pre_ln'"),
    (dict(mixer="aft_simple"), "mixer 'aft_simple'"),
    (dict(pooling="cls"), "pooling='cls'"),
    (dict(causal=True), "causal=True"),
  ],
)
def test_encoders_without_an_hf_counterpart_are_not_exported(change, message, tmp_path):
  config, params = hf.load(os.path.join(FIXTURES, "hf_bert_tiny"))
  config.model.update(change)
  with pytest.raises(UserError, match=f"cannot export to Hugging Face: {message}"):
    hf.export(config, params, str(tmp_path))
  config, params = hf.load(os.path.join(FIXTURES, "hf_fnet_tiny"))
  config.mixer.padding = "zero"
  with pytest.raises(UserError, match="padding='zero'"):
    hf.export(config, params, str(tmp_path))
  assert not os.listdir(tmp_path)


def test_glue_fine_tunes_from_an_hf_bert_folder(data_dir, tmp_path):
  """configs/glue_hf.py with the BERT fixture on MNLI (sentence pairs, 3 classes) under mock data: init_from the HF
  folder, its tokenizer, pooling from its first token through its pooler (configs' smoke test runs the FNet one)."""
  get_config = runpy.run_path(os.path.join(REPO, "configs", "glue_hf.py"))["get_config"]
  folder = os.path.join(FIXTURES, "hf_bert_tiny")
  config = get_config(f"smoke,hf={folder},task=mnli")
  assert (config.init_from, config.data.tokenizer, config.model.pooling) == (folder, folder, "first")
  config.data.data_dir = data_dir
  config.checkpoint_every = config.total_steps  # one checkpoint, at the end (the one read below)
  with tfds.testing.mock_data(num_examples=24):
    result = train.train_and_evaluate(config, str(tmp_path))
  assert result["step"] == 4 and np.isfinite(result["eval_loss"])
  _, tuned = checkpoints.restore_params(str(tmp_path))[:2]
  _, original = hf.load(folder, max_len=config.model.max_len)
  assert not np.array_equal(tuned["pooler"]["kernel"], original["pooler"]["kernel"])  # it trained, from there:
  start = init_from.load_encoder(jax.device_get(tuned), folder, ("classifier",), ("pooler",), config)
  np.testing.assert_array_equal(start["type_embed"]["embedding"], original["type_embed"]["embedding"])


def test_init_from_an_hf_folder_needs_the_checkpoints_architecture(data_dir):
  get_config = runpy.run_path(os.path.join(REPO, "configs", "glue_hf.py"))["get_config"]
  config = get_config("smoke")
  config.model.update(norm_eps=1e-6, block_layout="pre_ln")
  model = trainer.parts(config).model
  params = jax.eval_shape(lambda: trainer.init_params(model, jax.random.key(0)))
  with pytest.raises(
    UserError,
    match=r"the checkpoint has config.model.block_layout='post_ln' \(this run: 'pre_ln'\), "
    r"config.model.norm_eps=1e-12 \(this run: 1e-06\)",
  ):
    init_from.load_encoder(params, config.init_from, ("classifier",), ("pooler",), config)


def test_masked_lm_on_tokenized_pairs_uses_the_tokenizers_special_tokens():
  """data.objective=mlm with a tokenizer: [MASK] is the tokenizer's, [CLS] / [SEP] / padding are never chosen, and
  the pairs keep their token types."""
  from efftx.objectives.mlm import _MaskForMlm  # pylint: disable=g-import-not-at-top

  folder = os.path.join(FIXTURES, "hf_bert_tiny")
  task = resolve("glue", folder)
  tok = tokenizer_lib.load(folder)
  assert (task.mask_id, task.vocab("sst2")) == (tok.mask_id, tok.vocab_size)
  example = task.encode({"sentence1": "The cat sat on the mat.", "sentence2": "A dog.", "label": 1}, 24, True)
  corrupt = _MaskForMlm(task.mask_id, task.random_ids, task.special_ids)
  for seed in range(20):
    out = corrupt(example, np.random.default_rng(seed))
    chosen = out["weights"] > 0
    assert not np.isin(example["tokens"][chosen], [tok.cls_id, tok.sep_id, tok.pad_id]).any()
    np.testing.assert_array_equal(out["token_types"], example["token_types"])
  assert example["token_types"].max() == 1 and example["tokens"][0] == tok.cls_id


def test_tokenizer_settings_that_cannot_work_are_refused_in_one_line(tmp_path):
  config = config_lib.default_config("attention")
  config.data.tokenizer = os.path.join(FIXTURES, "hf_bert_tiny")
  with pytest.raises(UserError, match="task 'listops' has no text to tokenize"):
    config_lib.validate(config, jax.device_count())
  config.data.update(task="glue", variant="sst2", tokenizer=str(tmp_path))
  with pytest.raises(UserError, match="has no tokenizer.json, SentencePiece .model or vocab.txt"):
    config_lib.validate(config, jax.device_count())
  config.data.tokenizer = ""
  config.model.pooling = "first"
  with pytest.raises(UserError, match="pooling='first' classifies from the input's own first token"):
    config_lib.validate(config, jax.device_count())
  config.model.pooling = "mean"
  config.data.update(tokenizer=os.path.join(FIXTURES, "hf_bert_tiny"), vocab_size=100)
  with pytest.raises(UserError, match="vocab_size=100 is smaller than the vocabulary"):
    config_lib.validate(config, jax.device_count())


def test_init_from_an_hf_folder_needs_its_tokenizer_and_its_first_token(tmp_path):
  """The checkpoint's embeddings mean its tokenizer's ids: bytes or another tokenizer are refused, as is a learned
  [CLS] vector; a copy of the same tokenizer in another folder is the same tokenizer."""
  get_config = runpy.run_path(os.path.join(REPO, "configs", "glue_hf.py"))["get_config"]
  bert = os.path.join(FIXTURES, "hf_bert_tiny")
  config = get_config(f"smoke,hf={bert}")
  params = jax.eval_shape(lambda: trainer.init_params(trainer.parts(config).model, jax.random.key(0)))
  load = lambda c: init_from.load_encoder(params, bert, ("classifier",), ("pooler",), c)
  copy = tmp_path / "copy"
  copy.mkdir()
  shutil.copy(os.path.join(bert, "vocab.txt"), copy)
  shutil.copy(os.path.join(bert, "tokenizer_config.json"), copy)
  load(_with(config, data={"tokenizer": str(copy)}))
  with pytest.raises(UserError, match="encodes text with another tokenizer .*hf_fnet_tiny"):
    load(_with(config, data={"tokenizer": os.path.join(FIXTURES, "hf_fnet_tiny")}))
  with pytest.raises(UserError, match="encodes bytes: set config.data.tokenizer="):
    load(_with(config, data={"tokenizer": ""}))
  with pytest.raises(UserError, match="pooling='cls' adds a learned"):
    load(_with(config, model={"pooling": "cls"}))


def _with(config, **sections):
  out = config.copy_and_resolve_references()
  for section, values in sections.items():
    out[section].update(values)
  return out


def test_a_tokenizer_that_does_not_write_cls_a_sep_b_sep_is_refused(tmp_path):
  import tokenizers  # pylint: disable=g-import-not-at-top

  tok = tokenizers.Tokenizer.from_file(os.path.join(FIXTURES, "hf_bert_tiny", "tokenizer.json"))
  tok.post_processor = None  # no template: "a b" without [CLS] / [SEP]
  tok.save(str(tmp_path / "tokenizer.json"))
  with pytest.raises(UserError, match=r"does not encode a pair as \[CLS\] a \[SEP\] b \[SEP\]"):
    tokenizer_lib.Tokenizer(str(tmp_path))


def test_export_with_one_tokenizer_file_copies_that_file_and_its_settings(tmp_path):
  config, params = hf.load(os.path.join(FIXTURES, "hf_fnet_tiny"))
  hf.export(config, params, str(tmp_path), tokenizer=os.path.join(FIXTURES, "hf_fnet_tiny", "spiece.model"))
  assert sorted(os.listdir(tmp_path)) == [
    "config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "spiece.model",
    "tokenizer_config.json",
  ]
  assert tokenizer_lib.Tokenizer(str(tmp_path)).kind == "sentencepiece"
  assert json.load(open(tmp_path / "config.json"))["pad_token_id"] == 3


@pytest.mark.parametrize("name", ["hf_fnet_tiny", "hf_bert_tiny"])
def test_the_config_alone_is_read_from_the_weights_header(name, monkeypatch):
  """hf.load_config gives load's config (configs/glue_hf.py reads it) without reading a tensor."""
  import safetensors.numpy  # pylint: disable=g-import-not-at-top

  folder = os.path.join(FIXTURES, name)
  want, params = hf.load(folder, max_len=16)
  monkeypatch.setattr(safetensors.numpy, "load_file", lambda *a, **k: pytest.fail("read the weights"))
  got = hf.load_config(folder, max_len=16)
  assert got.to_dict() == want.to_dict()
  assert got.data.vocab_size == len(params["embed"]["embedding"]) and got.model.type_vocab_size == len(
    params["type_embed"]["embedding"]
  )
