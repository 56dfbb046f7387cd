"""The config vocabulary shared by every file under configs/, its argument parser, and its checks.

Every config starts from `default_config(mixer)`: one vocabulary of fields for all configs, each with its meaning
and unit (`config.model`'s declared in efftx/model.py: CONFIG_FIELDS; the others commented here), plus
`config.mixer`: the options the chosen mixer declares (efftx/mixers/spec.py), and only those. A config file's
`get_config(arg)` parses its argument string with `parse_arg` and overrides what it needs. `validate` runs every
declared check (the model fields', the mixer options', the objective's rules, the task's limits) before a run
writes anything. Reading a run's config.json: efftx/saved_configs.py; the command line's plumbing: efftx/cli.py.

    python -m efftx.config    # config.model's fields: default, allowed values, meaning
"""

from __future__ import annotations

import ml_collections

from efftx import model as model_lib
from efftx import patterns
from efftx.errors import UserError
from efftx.mixers import MIXERS


def default_config(mixer: str = model_lib.CONFIG_FIELDS["mixer"].default) -> ml_collections.ConfigDict:
  """Every field at its default, with `config.mixer` holding the options of `mixer` (and only those)."""
  c = ml_collections.ConfigDict()

  # The model's fields, each declared once with its default, meaning and allowed values in efftx/model.py
  # (CONFIG_FIELDS; `python -m efftx.config` lists them).
  c.model = ml_collections.ConfigDict({name: field.default for name, field in model_lib.CONFIG_FIELDS.items()})
  c.model.mixer = mixer

  # The chosen mixer's options, declared by the mixer (efftx/mixers/<file>.py: SPEC; `python -m efftx.mixers`
  # lists them all). Only the chosen mixer's options are here: setting another is an error, never ignored.
  c.mixer = mixer_options(mixer)

  c.data = ml_collections.ConfigDict()
  c.data.task = "listops"  # a key of efftx.data.TASKS
  c.data.variant = "small"  # the task's dataset variant (ListOps: full, small, tiny; MQAR: 256x16; ...)
  c.data.objective = ""  # "" = the task's own ("classify" or "lm"); "mlm" = masked-LM on a text task
  c.data.truncate = False  # cut examples longer than max_len (LRA text does); False: refuse them
  c.data.batch_size = 32  # global batch (examples per step, all processes together)
  c.data.data_dir = ""  # where TFDS data is prepared and read; "" = ~/tensorflow_datasets
  c.data.corpus_dir = ""  # tasks read from local files: their folder (bytes "files", fashion_mnist)
  c.data.worker_count = 0  # grain worker processes (0: read in the training process)
  c.data.read_threads = 2  # grain reader threads per process
  c.data.tokenizer = ""  # text tasks: a checkpoint's tokenizer (folder with tokenizer.json, a SentencePiece
  # .model or vocab.txt; efftx/data/tokenizer.py) encodes the text as [CLS] a [SEP]
  # b [SEP] with token types; "" = bytes
  c.data.vocab_size = 0  # embedding rows; 0 = the task's (or the tokenizer's) vocabulary. A checkpoint
  # whose embeddings hold more rows than its tokenizer has tokens needs its count
  c.data.eval_examples = 0  # validation passes during training read the split's first N examples (0: all
  # of it; a cheaper, fixed subset for short runs); efftx.evaluate reads all

  c.mesh = ml_collections.ConfigDict()
  c.mesh.fsdp = 1  # devices along the mesh's fsdp axis, over which parameters and AdamW state are
  # split (efftx/sharding.py); the other devices form the data axis. 1: plain
  # data parallelism (every device holds everything). Free to change on resume

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 1e-3  # peak learning rate of AdamW, reached after warmup
  c.optim.warmup_steps = 100  # linear warmup from 0 (steps); cosine decay to 0 afterwards
  c.optim.weight_decay = 0.01  # decoupled AdamW weight decay (not applied to biases and norms)
  c.optim.grad_clip = 1.0  # clip gradients to this global norm (0 disables)

  c.init_from = ""  # fine-tune: a workdir (or workdir/checkpoints/<step>), or a Hugging Face BERT /
  # FNet folder (efftx/hf.py), to load the encoder from; the head is new (a
  # checkpoint's pooler is kept). "" = train from scratch
  c.seed = 0  # seeds parameters, dropout and the data order
  c.total_steps = 1_000  # training steps
  c.log_every = 50  # steps between train-metric rows in metrics.jsonl / TensorBoard
  c.eval_every = 250  # steps between validation passes (and at the last step)
  c.checkpoint_every = 250  # steps between checkpoints (and at the last step)
  c.keep_checkpoints = 2  # checkpoints kept in workdir/checkpoints
  return c


def mixer_options(mixer: str) -> ml_collections.ConfigDict:
  """The declared options of `mixer` at their defaults — `mixer` a mixer name or a layer pattern
  (efftx/patterns.py): flat for one mixer, one section per mixer (config.mixer.<name>.<option>) for several.
  Raises UserError for an unknown mixer or a pattern that does not parse."""
  names = patterns.mixer_names(mixer)
  if len(names) == 1:
    return ml_collections.ConfigDict(MIXERS[names[0]].defaults())
  return ml_collections.ConfigDict({name: MIXERS[name].defaults() for name in names})


def _is_sectioned(mixer_config: ml_collections.ConfigDict) -> bool:
  """config.mixer holds one section per mixer (a pattern of several mixers), not one mixer's options."""
  return bool(mixer_config) and all(
    name in MIXERS and isinstance(value, ml_collections.ConfigDict) for name, value in mixer_config.items()
  )


def set_where_declared(mixer_config: ml_collections.ConfigDict, **options) -> None:
  """Sets each option the chosen mixer declares, and skips the others — for a config file that gives one
  setting to every mixer that has it (LRA: 8 heads and attention dropout 0.1 wherever there are heads and
  attention probabilities); with a layer pattern of several mixers, in each mixer's section that declares it.
  Command-line overrides never go through here: there a missing option is an error."""
  for section in mixer_config.values() if _is_sectioned(mixer_config) else [mixer_config]:
    for name, value in options.items():
      if name in section:
        section[name] = value


def smoke_schedule(config: ml_collections.ConfigDict) -> None:
  """The `smoke` argument's schedule, shared by every config: 4 steps, logged every 2, evaluated at the end,
  checkpointed twice — a plumbing check that runs in seconds."""
  config.total_steps, config.log_every, config.eval_every, config.checkpoint_every = 4, 2, 4, 2


def fine_tuning_schedule(
  config: ml_collections.ConfigDict, epochs: int, train_examples: int, learning_rate: float
) -> None:
  """FNet's GLUE fine-tuning schedule (f_net configs/classification.py) at config.data.batch_size: `epochs` passes
  over train_examples, 10 % of the steps warming up to learning_rate, weight decay 0.01, gradients clipped to 1,
  evaluated and checkpointed three times."""
  config.total_steps = max(1, epochs * train_examples // config.data.batch_size)
  config.optim.update(
    learning_rate=learning_rate, warmup_steps=config.total_steps // 10, weight_decay=0.01, grad_clip=1.0
  )
  config.log_every = 50
  config.eval_every = max(1, config.total_steps // 3)
  config.checkpoint_every = config.eval_every


def parse_arg(arg: str | None, **defaults):
  """Parses a config argument string: comma-separated `key=value` pairs or bare words that switch a flag on.

  `defaults` names the accepted keys and their types: `parse_arg("mixer=fnet,smoke", mixer="attention",
  smoke=False)` returns `ConfigDict(mixer="fnet", smoke=True)`. An unknown key or a bad value raises UserError.
  """
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, has_value, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise UserError(f"unknown config argument '{key}'; valid: {', '.join(sorted(defaults))}")
    default = defaults[key]
    if isinstance(default, bool):
      if has_value and value.lower() not in ("true", "false", "1", "0"):
        raise UserError(f"config argument '{key}' takes true or false, not '{value}'")
      out[key] = not has_value or value.lower() in ("true", "1")
    elif not has_value:
      raise UserError(f"config argument '{key}' needs a value: {key}=...")
    else:
      try:
        out[key] = type(default)(value)
      except ValueError:
        raise UserError(f"config argument '{key}' must be {type(default).__name__}, not '{value}'") from None
  return out


def validate(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """Raises UserError naming the first invalid field and, where there are choices, the valid ones. Runs every
  declared check — the mixer's options, the objective's rules, the task's limits — before anything is written."""
  from efftx import objectives  # pylint: disable=g-import-not-at-top
  from efftx.data import TASKS  # pylint: disable=g-import-not-at-top

  m, d, o = config.model, config.data, config.optim
  for name, field in model_lib.CONFIG_FIELDS.items():  # each field's declared values (efftx/model.py)
    field.check(f"config.model.{name}", m[name])
  if "mixer" not in config:
    raise UserError("the config has no config.mixer section: build it with config_lib.default_config(mixer)")
  names = patterns.mixer_names(m.mixer)  # raises for a pattern that does not parse
  built_for = _built_for(config.mixer)
  if built_for is not None and set(built_for) != set(names):  # --config.model.mixer=fnet on an attention config
    held = f"mixer '{built_for[0]}'" if len(built_for) == 1 else "mixers " + ", ".join(built_for)
    raise UserError(
      f"config.mixer holds the options of {held}, not of '{m.mixer}': choose the "
      f"mixer in the config argument (--config=FILE:mixer={m.mixer}), which fills config.mixer with "
      "its options"
    )
  if d.task not in TASKS:
    raise UserError(f"config.data.task='{d.task}' is not a task; choose from: {', '.join(TASKS)}")
  if "://" in (d.data_dir or ""):  # google/array_record#120: its reader is riegeli's FdReader
    raise UserError(
      f"config.data.data_dir='{d.data_dir}': array_record, the format efftx reads, opens local "
      "files only; mount the bucket (gcsfuse --implicit-dirs BUCKET /mnt/BUCKET) and set "
      "config.data.data_dir=/mnt/BUCKET/..."
    )
  from efftx.data import task_of  # pylint: disable=g-import-not-at-top

  task = task_of(config)  # raises for a tokenizer that cannot be read or a task without text
  variants = task.variant_names()
  if d.variant not in variants:
    raise UserError(
      f"config.data.variant='{d.variant}' is not a variant of {d.task}; choose from: {', '.join(variants)}"
    )
  if m.reversible and not m.d_ff:
    raise UserError(
      "config.model.reversible=True needs a feed-forward sublayer (d_ff > 0): it is the coupling's second branch"
    )
  if m.reversible and m.block_layout != "pre_ln":
    raise UserError(
      "config.model.reversible=True needs block_layout='pre_ln': a reversible coupling's branches "
      "normalise their own inputs"
    )
  if m.pooling == "first" and not d.tokenizer:
    raise UserError(
      "config.model.pooling='first' classifies from the input's own first token, the [CLS] a "
      "checkpoint's tokenizer puts there: set config.data.tokenizer (or pooling='cls' for a learned one)"
    )
  if d.tokenizer and m.type_vocab_size == 1:
    raise UserError(
      "config.model.type_vocab_size=1: a tokenizer's sentence pairs have token types 0 and 1 (set 2 "
      "or more, or 0 to ignore them)"
    )
  if m.type_vocab_size and m.patch_size:
    raise UserError("config.model.type_vocab_size > 0 embeds text segments; patch embeddings have none")
  if m.pooling == "cls" and m.ff_chunk_size and (m.max_len + 1) % m.ff_chunk_size:
    raise UserError(
      f"config.model.ff_chunk_size={m.ff_chunk_size} must divide max_len + 1 = {m.max_len + 1} "
      "(pooling='cls' adds a position)"
    )
  if m.ff_chunk_size and m.max_len % m.ff_chunk_size:
    raise UserError(f"config.model.ff_chunk_size={m.ff_chunk_size} must be 0 or divide max_len={m.max_len}")
  patterns.check(m.mixer, config.mixer, m.num_layers, m.d_model, m.causal)
  if m.patch_size:
    shape = task.image_shape
    if shape is None:
      raise UserError(
        f"config.model.patch_size={m.patch_size}: task '{d.task}' is not an image task; tasks whose "
        f"tokens are pixels: {', '.join(n for n, t in TASKS.items() if t.image_shape)}"
      )
    if shape[0] % m.patch_size or shape[1] % m.patch_size:
      raise UserError(
        f"config.model.patch_size={m.patch_size} must divide the {shape[0]}×{shape[1]} images of task '{d.task}'"
      )
    if m.max_len != shape[0] * shape[1] * shape[2]:
      raise UserError(
        f"config.model.max_len={m.max_len}: an image of task '{d.task}' is "
        f"{shape[0]}×{shape[1]}×{shape[2]} = {shape[0] * shape[1] * shape[2]} pixel tokens"
      )
  if task.max_len and m.max_len > task.max_len:
    raise UserError(f"config.model.max_len={m.max_len}: task '{d.task}' examples hold at most {task.max_len} tokens")
  objectives.for_run(config, task)  # the objective's own rules (an LM must be causal, ...)
  reads_folder = task.local and d.variant in getattr(task.dataset, "MANUAL_DIR_VARIANTS", ())
  if d.corpus_dir and not reads_folder:
    raise UserError(
      f"config.data.corpus_dir is set, but task '{d.task}' ({d.variant}) does not read a folder "
      "(bytes with variant files, fashion_mnist, fashion_mnist_ar do)"
    )
  if reads_folder and not d.corpus_dir and not getattr(task.dataset, "DEFAULT_MANUAL_DIR", None):
    raise UserError(f"task '{d.task}' ({d.variant}) reads a folder: set config.data.corpus_dir")
  if config.mesh.fsdp < 1 or num_devices % config.mesh.fsdp:
    raise UserError(f"config.mesh.fsdp={config.mesh.fsdp} must divide the {num_devices} devices")
  if d.batch_size < 1 or d.batch_size % num_devices:
    raise UserError(
      f"config.data.batch_size={d.batch_size} must be a positive multiple of the "
      f"{num_devices} devices it is sharded over"
    )
  if d.eval_examples < 0:
    raise UserError(f"config.data.eval_examples={d.eval_examples} must be >= 0 (0: the whole split)")
  if o.learning_rate <= 0 or o.warmup_steps < 0 or o.weight_decay < 0 or o.grad_clip < 0:
    raise UserError("config.optim: learning_rate must be > 0; warmup_steps, weight_decay, grad_clip >= 0")
  for name in ("total_steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
    if config[name] < 1:
      raise UserError(f"config.{name}={config[name]} must be a positive integer")


def _built_for(mixer_config: ml_collections.ConfigDict) -> tuple[str, ...] | None:
  """The mixers whose options config.mixer holds: its sections' names, or the one mixer whose declared options
  are exactly its keys (None where that is not decidable: several mixers declare the same options)."""
  if _is_sectioned(mixer_config):
    return tuple(mixer_config.keys())
  present = set(mixer_config.keys())
  matches = [n for n, s in MIXERS.items() if set(s.options) == present]
  return (matches[0],) if len(matches) == 1 else None


def describe_model_fields() -> str:
  """config.model's fields, two lines each: `name = default  (allowed values)`, then the meaning."""
  lines = ["config.model (declared in efftx/model.py: CONFIG_FIELDS)"]
  for name, field in model_lib.CONFIG_FIELDS.items():
    allowed = field.allowed()
    lines += [f"  {name} = {field.default!r}" + (f"  ({allowed})" if allowed else ""), f"      {field.help}"]
  lines.append(
    "config.mixer: the chosen mixer's options (python -m efftx.mixers); config.data, config.optim, "
    "config.mesh and the top-level fields: efftx/config.py, default_config"
  )
  return "\n".join(lines)


if __name__ == "__main__":
  print(describe_model_fields())
