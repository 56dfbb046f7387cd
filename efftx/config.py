"""The config vocabulary shared by every file under configs/, its argument parser, and its checks.

Every config starts from `default_config(mixer)`: one vocabulary of fields for all configs, each with its meaning
and unit (`config.model`'s declared in efftx/model.py: CONFIG_FIELDS; the others here: RUN_FIELDS, ...), plus
`config.mixer`: the options the chosen mixer declares (efftx/mixers/spec.py), and only those. A config file's
`get_config(arg)` parses its argument string with `parse_arg` and overrides what it needs. `validate` runs every
declared check (the model fields', the mixer options', the objective's rules, the task's limits) before a run
writes anything. Reading a run's config.json: efftx/saved_configs.py; the command line's plumbing: efftx/cli.py.

    python -m efftx.config    # every section's fields and every mixer's options: default, allowed values, meaning
"""

from __future__ import annotations

import dataclasses

import ml_collections

from efftx import cli
from efftx import model as model_lib
from efftx import patterns
from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers import MIXERS

# The fields outside config.model and config.mixer, by section, each declared once: its default, meaning and
# allowed values (efftx/fields.py). default_config builds the sections from them, validate checks every value
# against them, and `python -m efftx.config` lists them. Relations between fields (a batch split over the devices,
# a task's variants) are validate's own checks.
RUN_FIELDS: dict[str, Field] = {  # the top level: config.total_steps, ...
  "total_steps": Field("training steps", 1_000, at_least=1),
  "log_every": Field(
    "steps between train-metric rows in metrics.jsonl / TensorBoard (and at the last step)", 50, at_least=1
  ),
  "eval_every": Field("steps between validation passes (and at the last step)", 250, at_least=1),
  "checkpoint_every": Field("steps between checkpoints (and at the last step)", 250, at_least=1),
  "keep_checkpoints": Field("checkpoints kept in workdir/checkpoints", 2, at_least=1),
  "seed": Field("seeds parameters, dropout and the data order", 0),
  "stop_metric": Field(
    'stop early once this evaluation metric (e.g. "eval_accuracy") is above stop_above: a checkpoint at that '
    'step, a row {"stopped_early": value} in metrics.jsonl, and the run is finished (Zoology: "valid/accuracy" '
    'above 0.99); "" = train to total_steps',
    "",
  ),
  "stop_above": Field("the value of stop_metric above which the run stops early", 0.99),
  "init_from": Field(
    "fine-tune: a workdir (or workdir/checkpoints/<step>), or a Hugging Face BERT / FNet folder (efftx/hf.py), to "
    "load the encoder from; the head is new (a checkpoint's pooler is kept); \"\" = train from scratch",
    "",
  ),
}
OPTIM_FIELDS: dict[str, Field] = {
  "learning_rate": Field("peak learning rate of AdamW, reached after warmup", 1e-3, above=0),
  "warmup_steps": Field("linear warmup from 0 (steps); cosine decay to 0 at total_steps afterwards", 100, at_least=0),
  "weight_decay": Field(
    "decoupled AdamW weight decay (not applied to biases and norms, unless decay_all)", 0.01, at_least=0
  ),
  "decay_all": Field(
    "weight decay on every parameter, biases and norms too (torch's AdamW over model.parameters(), as Zoology trains)",
    False,
  ),
  "schedule_every": Field(
    "the learning rate is the schedule's value at the last multiple of this many steps, held in between (Zoology: "
    "once per epoch, its CosineAnnealingLR stepped after each epoch)",
    1,
    at_least=1,
  ),
  "grad_clip": Field("clip gradients to this global norm (0 disables)", 1.0, at_least=0),
}
DATA_FIELDS: dict[str, Field] = {
  "task": Field("the task: a key of efftx.data.TASKS", "listops"),  # choices: `sections()` adds TASKS' names
  "variant": Field("the task's dataset variant (ListOps: full, small, tiny; MQAR: 256x16; GLUE: sst2, ...)", "small"),
  "objective": Field(
    '"" = the task\'s own ("classify" or "lm"); "mlm" = masked-LM on a text task (efftx.objectives.OBJECTIVES)', ""
  ),
  "truncate": Field("cut examples longer than max_len (LRA text does); False: refuse them", False),
  "batch_size": Field(
    "global batch (examples per step, all processes together); a multiple of the devices", 32, at_least=1
  ),
  "data_dir": Field('where TFDS data is prepared and read; "" = ~/tensorflow_datasets', ""),
  "corpus_dir": Field('tasks read from local files: their folder (bytes "files", fashion_mnist)', ""),
  "in_memory": Field(
    "read each split once into memory, encoded, and draw the batches from there: the same batches as reading "
    "the files, without a read and decode per example (for small splits: MQAR, ListOps)",
    False,
  ),
  "worker_count": Field("grain worker processes (0: read in the training process)", 0, at_least=0),
  "read_threads": Field("grain reader threads per process", 2, at_least=0),
  "tokenizer": Field(
    "text tasks: a checkpoint's tokenizer (folder with tokenizer.json, a SentencePiece .model or vocab.txt; "
    'efftx/data/tokenizer.py) encodes the text as [CLS] a [SEP] b [SEP] with token types; "" = bytes',
    "",
  ),
  "vocab_size": Field(
    "embedding rows; 0 = the task's (or the tokenizer's) vocabulary. A checkpoint whose embeddings hold more rows "
    "than its tokenizer has tokens needs its count",
    0,
    at_least=0,
  ),
  "eval_examples": Field(
    "validation passes during training read the split's first N examples (0: all of it; a cheaper, fixed subset "
    "for short runs); efftx.evaluate reads all",
    0,
    at_least=0,
  ),
}
MESH_FIELDS: dict[str, Field] = {
  "fsdp": Field(
    "devices along the mesh's fsdp axis, over which parameters and AdamW state are split (efftx/sharding.py); the "
    "other devices form the data axis. 1: plain data parallelism. Must divide the devices; free to change on resume",
    1,
    at_least=1,
  ),
}


def sections() -> dict[str, dict[str, Field]]:
  """Every declared field by section, in the listing's order: "" (the top level), optim, data, mesh and model
  (efftx/model.py: CONFIG_FIELDS); config.data.task's choices are the names in efftx.data.TASKS. config.mixer's
  options are the mixers' own (efftx/mixers/<file>.py: SPEC)."""
  from efftx.data import TASKS  # pylint: disable=g-import-not-at-top  (TFDS: imported where it is needed)

  data = {**DATA_FIELDS, "task": dataclasses.replace(DATA_FIELDS["task"], choices=tuple(TASKS))}
  return {"": RUN_FIELDS, "optim": OPTIM_FIELDS, "data": data, "mesh": MESH_FIELDS, "model": model_lib.CONFIG_FIELDS}


def default_config(mixer: str = model_lib.CONFIG_FIELDS["mixer"].default) -> ml_collections.ConfigDict:
  """Every field at its default, with `config.mixer` holding the options of `mixer` (and only those)."""
  c = ml_collections.ConfigDict()

  # The model's fields, each declared once with its default, meaning and allowed values in efftx/model.py
  # (CONFIG_FIELDS; `python -m efftx.config` lists them).
  c.model = ml_collections.ConfigDict({name: field.default for name, field in model_lib.CONFIG_FIELDS.items()})
  c.model.mixer = mixer
  # A mixer that is causal only (a recurrence, a causal convolution) makes the model causal by default.
  c.model.causal = c.model.causal or not all(MIXERS[n].can_be_bidirectional for n in patterns.mixer_names(mixer))

  # The chosen mixer's options, declared by the mixer (efftx/mixers/<file>.py: SPEC; `python -m efftx.mixers`
  # lists them all). Only the chosen mixer's options are here: setting another is an error, never ignored.
  c.mixer = mixer_options(mixer)

  # The other sections and the top-level fields, declared above (DATA_FIELDS, MESH_FIELDS, OPTIM_FIELDS, RUN_FIELDS).
  c.data = ml_collections.ConfigDict({name: field.default for name, field in DATA_FIELDS.items()})
  c.mesh = ml_collections.ConfigDict({name: field.default for name, field in MESH_FIELDS.items()})
  c.optim = ml_collections.ConfigDict({name: field.default for name, field in OPTIM_FIELDS.items()})
  c.update({name: field.default for name, field in RUN_FIELDS.items()})
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

  m, d = config.model, config.data
  for section, fields in sections().items():  # every declared field's allowed values
    values = config[section] if section else config
    for name, field in fields.items():
      field.check(f"config.{section + '.' if section else ''}{name}", values[name])
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
  if not m.reversible and not m.reversible_recompute:
    raise UserError(
      "config.model.reversible_recompute=False chooses how reversible couplings are differentiated: it needs "
      "config.model.reversible=True"
    )
  if m.reversible and m.block_layout != "pre_ln":
    raise UserError(
      "config.model.reversible=True needs block_layout='pre_ln': a reversible coupling's branches "
      "normalise their own inputs"
    )
  if m.state_mixer == "identity" and (m.reversible or m.block_layout != "pre_ln" or m.d_ff):
    raise UserError(
      "config.model.state_mixer='identity' (Zoology's blocks) needs block_layout='pre_ln', reversible=False and "
      "d_ff=0 (its blocks have no feed-forward sublayer)"
    )
  if config.get("stop_metric") and not config.stop_metric.startswith("eval_"):
    raise UserError(
      f"config.stop_metric='{config.stop_metric}': the run stops on an evaluation metric, eval_<name> (e.g. "
      "eval_accuracy, eval_loss)"
    )
  if d.in_memory and d.worker_count:
    raise UserError(
      "config.data.in_memory=True holds the splits in this process: set config.data.worker_count=0 (worker "
      "processes would each get a copy)"
    )
  if m.tie_embeddings and (m.patch_size or "lm_head" not in objectives.for_run(config, task).fresh_params):
    raise UserError(
      "config.model.tie_embeddings=True ties a per-position head (LM, MLM, MQAR) to the token embeddings; "
      f"task '{d.task}' has no such head, or its tokens are not embedded (patch_size)"
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
  if m.position_embedding == "rotary":  # some layer's mixer takes it, with an even head width
    model_lib.check_rotary(m.mixer, m.position_embedding)
    for name, options in patterns.sections(m.mixer, config.mixer).items():
      MIXERS[name].maker(options, causal=m.causal, d_model=m.d_model, rotary=True)
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
  if num_devices % config.mesh.fsdp:
    raise UserError(f"config.mesh.fsdp={config.mesh.fsdp} must divide the {num_devices} devices")
  if d.batch_size % num_devices:
    raise UserError(
      f"config.data.batch_size={d.batch_size} must be a positive multiple of the "
      f"{num_devices} devices it is sharded over"
    )


def schedule_warning(config: ml_collections.ConfigDict) -> str | None:
  """One line naming what the config's schedule asks for that a run of config.total_steps steps cannot do, or None:
  a warmup that does not end before the last step (the peak learning rate is never reached and nothing decays),
  and log, eval or checkpoint intervals longer than the run (each then fires only at the last step). efftx.train
  logs it as a warning at start."""
  total, o = config.total_steps, config.optim
  problems = []
  if o.warmup_steps >= total:
    last = o.learning_rate * (total - 1) / o.warmup_steps  # the linear warmup at the last step (steps count from 0)
    problems.append(
      f"config.optim.warmup_steps={o.warmup_steps} ≥ config.total_steps={total}: the run ends in warmup, its last "
      f"step at learning rate {last:.2g} of the peak config.optim.learning_rate={o.learning_rate:g}"
    )
  late = [
    f"config.{name}={config[name]}" for name in ("log_every", "eval_every", "checkpoint_every") if config[name] > total
  ]
  if late:
    fires = "each fires" if len(late) > 1 else "fires"
    problems.append(f"{', '.join(late)} > config.total_steps={total}: {fires} only at the last step")
  return "; ".join(problems) or None


def _built_for(mixer_config: ml_collections.ConfigDict) -> tuple[str, ...] | None:
  """The mixers whose options config.mixer holds: its sections' names, or the one mixer whose declared options
  are exactly its keys (None where that is not decidable: several mixers declare the same options)."""
  if _is_sectioned(mixer_config):
    return tuple(mixer_config.keys())
  present = set(mixer_config.keys())
  matches = [n for n, s in MIXERS.items() if set(s.options) == present]
  return (matches[0],) if len(matches) == 1 else None


def describe() -> str:
  """Every field of the config, section by section, from the declarations `sections()` and the mixers' SPECs:
  two lines each, `name = default  (allowed values)`, then the meaning."""
  lines = ["Defaults as default_config sets them; a config file (configs/*.py) sets some of its own."]

  def field_lines(fields: dict[str, Field], defaults: dict, indent: str) -> None:
    for name, field in fields.items():
      allowed = field.allowed()
      lines.append(f"{indent}{name} = {defaults[name]!r}" + (f"  ({allowed})" if allowed else ""))
      lines.append(f"{indent}    {field.help}")

  for section, fields in sections().items():
    declared = (
      "efftx/model.py: CONFIG_FIELDS" if section == "model" else f"efftx/config.py: {section.upper() or 'RUN'}_FIELDS"
    )
    lines.append(f"config{'.' + section if section else ' (the top level)'}  [{declared}]")
    field_lines(fields, {name: field.default for name, field in fields.items()}, "  ")
  lines.append(
    "config.mixer  [each mixer's SPEC, efftx/mixers/]: the options of config.model.mixer's mixer, set as "
    "config.mixer.OPTION; for a layer pattern of several mixers, config.mixer.MIXER.OPTION"
  )
  for name, spec in MIXERS.items():
    lines.append(f"  {name}: {spec.summary}" + ("" if spec.options else " (no options)"))
    field_lines(spec.options, spec.defaults(), "    ")
  return "\n".join(lines)


USAGE = """usage: python -m efftx.config [--help]

Lists every field of a run's config: each section's fields with their default, allowed values and meaning, and
each mixer's options. Set a field on the command line of efftx.train (and the other programs that take --config)
as --config.SECTION.FIELD=VALUE, e.g. --config.optim.warmup_steps=10 or --config.total_steps=200."""


def main(argv: list[str]) -> None:
  """`python -m efftx.config`: the listing; --help (or -h): the usage; any other argument: a one-line error."""
  if argv and argv[0] in ("--help", "-h"):
    print(USAGE)
    return
  if argv:
    cli.exit_with("efftx.config", f"unexpected arguments: {' '.join(argv)} (usage: python -m efftx.config [--help])")
  print(describe())


if __name__ == "__main__":
  import sys  # pylint: disable=g-import-not-at-top

  main(sys.argv[1:])
