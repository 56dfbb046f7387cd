"""The config vocabulary shared by every file under configs/, its argument parser, and its checks.

Every config starts from `default_config()`: one vocabulary of fields for all configs (later work adds fields,
never renames them), each commented with its meaning and unit. A config file's `get_config(arg)` parses its
argument string with `parse_arg` and overrides what it needs.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import runpy
import sys

import ml_collections


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()

  c.model = ml_collections.ConfigDict()
  c.model.mixer = "attention"        # token mixer, a key of efftx.mixers.MIXERS
  c.model.d_model = 128              # width of the residual stream
  c.model.num_heads = 4              # attention heads (mixers with heads)
  c.model.num_layers = 2             # blocks (mixer sublayer + feed-forward sublayer)
  c.model.d_ff = 512                 # hidden width of the feed-forward sublayer
  c.model.max_len = 128              # sequence length every example is padded to (tokens)
  c.model.dropout = 0.1              # dropout rate on embeddings, residual branches and FF hidden
  c.model.attention_dropout = 0.0    # dropout rate on attention probabilities (attention mixers)
  c.model.dtype = "float32"          # compute dtype, "float32" or "bfloat16"; parameters stay float32
  c.model.causal = False             # causal mixing (required by LM objectives); FNet cannot be causal
  c.model.reversible = False         # reversible couplings: activation memory independent of num_layers
  c.model.ff_chunk_size = 0          # feed-forward over chunks of this many positions (0: all at once)
  c.model.attention_impl = "auto"    # attention: "plain", "chunked" (O(L) memory), "fused" (cuDNN on GPU), "auto"
  c.model.attention_chunk = 256      # attention "chunked" block size; linear attention's causal chunk (tokens)
  c.model.window = 32                # AFT-local: bias for |t - t'| < window; local: keys with |t - t'| < window
  c.model.aft_bias_dim = 64          # AFT-full/local: d' of the factorised position bias w = u v^T
  c.model.aft_factorized = True      # AFT-full/local: False learns a full max_len x max_len bias instead
  c.model.kernel_size = 7            # AFT-conv: kernel length over t - t' per head (tokens)
  c.model.lsh_buckets = 8            # LSH attention: hash buckets per round (1 or even)
  c.model.lsh_hashes = 2             # LSH attention: hash rounds (8 is close to full attention)
  c.model.lsh_chunk = 64             # LSH attention: chunk of the sorted sequence (tokens)
  c.model.lsh_seed = 0               # LSH attention: seed of the random rotations (fixed, reproducible)
  c.model.fourier_impl = "auto"      # FNet: "fft", "rfft" (Hermitian symmetry), "matmul" (DFT matrices), "auto"

  c.data = ml_collections.ConfigDict()
  c.data.task = "listops"            # a key of efftx.data.TASKS
  c.data.variant = "small"           # the task's dataset variant (ListOps: full, small, tiny; MQAR: 256x16; ...)
  c.data.objective = ""              # "" = the task's own ("classify" or "lm"); "mlm" = masked-LM on a text task
  c.data.truncate = False            # cut examples longer than max_len (LRA text does); False: refuse them
  c.data.batch_size = 32             # global batch (examples per step, all processes together)
  c.data.data_dir = ""               # where TFDS data is prepared and read; "" = ~/tensorflow_datasets
  c.data.corpus_dir = ""             # tasks read from local files: their folder (bytes "files", fashion_mnist)
  c.data.worker_count = 0            # grain worker processes (0: read in the training process)
  c.data.read_threads = 2            # grain reader threads per process

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 1e-3       # peak learning rate of AdamW, reached after warmup
  c.optim.warmup_steps = 100         # linear warmup from 0 (steps); cosine decay to 0 afterwards
  c.optim.weight_decay = 0.01        # decoupled AdamW weight decay (not applied to biases and norms)
  c.optim.grad_clip = 1.0            # clip gradients to this global norm (0 disables)

  c.init_from = ""                   # fine-tune: a workdir (or workdir/checkpoints/<step>) to load the encoder
                                     # from; the head is new. "" = train from scratch
  c.seed = 0                         # seeds parameters, dropout and the data order
  c.total_steps = 1_000              # training steps
  c.log_every = 50                   # steps between train-metric rows in metrics.jsonl / TensorBoard
  c.eval_every = 250                 # steps between validation passes (and at the last step)
  c.checkpoint_every = 250           # steps between checkpoints (and at the last step)
  c.keep_checkpoints = 2             # checkpoints kept in workdir/checkpoints
  return c


def smoke_schedule(config: ml_collections.ConfigDict) -> None:
  """The `smoke` argument's schedule, shared by every config: 4 steps, logged every 2, evaluated at the end,
  checkpointed twice — a plumbing check that runs in seconds."""
  config.total_steps, config.log_every, config.eval_every, config.checkpoint_every = 4, 2, 4, 2


def parse_arg(arg: str | None, **defaults):
  """Parses a config argument string: comma-separated `key=value` pairs or bare words that switch a flag on.

  `defaults` names the accepted keys and their types: `parse_arg("mixer=fnet,smoke", mixer="attention",
  smoke=False)` returns `ConfigDict(mixer="fnet", smoke=True)`. An unknown key or a bad value raises ValueError.
  """
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, has_value, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise ValueError(f"unknown config argument '{key}'; valid: {', '.join(sorted(defaults))}")
    default = defaults[key]
    if isinstance(default, bool):
      if has_value and value.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"config argument '{key}' takes true or false, not '{value}'")
      out[key] = not has_value or value.lower() in ("true", "1")
    elif not has_value:
      raise ValueError(f"config argument '{key}' needs a value: {key}=...")
    else:
      try:
        out[key] = type(default)(value)
      except ValueError:
        raise ValueError(f"config argument '{key}' must be {type(default).__name__}, not '{value}'") from None
  return out


def validate(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """Raises ValueError naming the first invalid field and, where there are choices, the valid ones."""
  from efftx.data import objective, OBJECTIVES, TASKS  # pylint: disable=g-import-not-at-top
  from efftx.mixers import MIXERS  # pylint: disable=g-import-not-at-top

  m, d, o = config.model, config.data, config.optim
  if m.mixer not in MIXERS:
    raise ValueError(f"config.model.mixer='{m.mixer}' is not a mixer; choose from: {', '.join(MIXERS)}")
  if d.task not in TASKS:
    raise ValueError(f"config.data.task='{d.task}' is not a task; choose from: {', '.join(TASKS)}")
  task = TASKS[d.task]
  variants = task.variant_names()
  if d.variant not in variants:
    raise ValueError(f"config.data.variant='{d.variant}' is not a variant of {d.task}; "
                     f"choose from: {', '.join(variants)}")
  for name in ("d_model", "num_heads", "num_layers", "d_ff", "max_len"):
    if m[name] < 1:
      raise ValueError(f"config.model.{name}={m[name]} must be a positive integer")
  for name in ("dropout", "attention_dropout"):
    if not 0 <= m[name] < 1:
      raise ValueError(f"config.model.{name}={m[name]} must be in [0, 1)")
  if m.dtype not in ("float32", "bfloat16"):
    raise ValueError(f"config.model.dtype='{m.dtype}' must be float32 or bfloat16")
  if m.ff_chunk_size < 0 or (m.ff_chunk_size and m.max_len % m.ff_chunk_size):
    raise ValueError(f"config.model.ff_chunk_size={m.ff_chunk_size} must be 0 or divide max_len={m.max_len}")
  if m.d_model % m.num_heads:
    raise ValueError(f"config.model.d_model={m.d_model} must be divisible by config.model.num_heads={m.num_heads}")
  if task.max_len and m.max_len > task.max_len:
    raise ValueError(f"config.model.max_len={m.max_len}: task '{d.task}' examples hold at most "
                     f"{task.max_len} tokens")
  if d.objective and d.objective not in OBJECTIVES:
    raise ValueError(f"config.data.objective='{d.objective}' is not an objective; choose from: "
                     f"'' (the task's own), {', '.join(OBJECTIVES)}")
  if d.objective and d.objective != task.objective and d.objective != "mlm":
    raise ValueError(f"task '{d.task}' has objective '{task.objective}'; only 'mlm' can replace it")
  if objective(config) == "mlm" and task.mask_id is None:
    raise ValueError(f"task '{d.task}' has no text to mask: masked-LM needs a text task (bytes, imdb_bytes, glue)")
  if objective(config) == "mlm" and m.causal:
    raise ValueError("masked-LM reads both sides of a token: set config.model.causal=False")
  if objective(config) == "lm" and not m.causal:
    raise ValueError(f"task '{d.task}' is language modelling: set config.model.causal=True")
  reads_folder = task.local and d.variant in getattr(task.dataset, "MANUAL_DIR_VARIANTS", ())
  if d.corpus_dir and not reads_folder:
    raise ValueError(f"config.data.corpus_dir is set, but task '{d.task}' ({d.variant}) does not read a folder "
                     "(bytes with variant files, fashion_mnist, fashion_mnist_ar do)")
  if reads_folder and not d.corpus_dir and not getattr(task.dataset, "DEFAULT_MANUAL_DIR", None):
    raise ValueError(f"task '{d.task}' ({d.variant}) reads a folder: set config.data.corpus_dir")
  if d.batch_size < 1 or d.batch_size % num_devices:
    raise ValueError(f"config.data.batch_size={d.batch_size} must be a positive multiple of the "
                     f"{num_devices} devices it is sharded over")
  if o.learning_rate <= 0 or o.warmup_steps < 0 or o.weight_decay < 0 or o.grad_clip < 0:
    raise ValueError("config.optim: learning_rate must be > 0; warmup_steps, weight_decay, grad_clip >= 0")
  for name in ("total_steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints"):
    if config[name] < 1:
      raise ValueError(f"config.{name}={config[name]} must be a positive integer")
  # Constructing the mixer runs its own checks (e.g. FNet refuses causal=True).
  mixer_cls = MIXERS[m.mixer]
  mixer_cls(**mixer_kwargs(mixer_cls, m))


def mixer_kwargs(mixer_cls: type, model_config: ml_collections.ConfigDict) -> dict:
  """The mixer's hyperparameters: the config.model fields named like the mixer class's fields."""
  names = {f.name for f in dataclasses.fields(mixer_cls)} - {"parent", "name"}
  return {name: model_config[name] for name in names if name in model_config}


def explain_flag_error(argv: list[str], error: Exception) -> str:
  """One line for an error raised while parsing --config and its overrides.

  For a mistyped override key (`--config.model.mixerr=...`), names the field and the valid fields beside it;
  otherwise the first line of the error.
  """
  config_arg = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  overrides = [a[2:].split("=", 1)[0] for a in argv if a.startswith("--config.")]
  if config_arg:
    path, _, arg = config_arg.partition(":")
    if not os.path.exists(path):
      return f"--config={config_arg}: no such config file"
    try:
      config = runpy.run_path(path)["get_config"](*([arg] if arg else []))
    except Exception as e:  # pylint: disable=broad-except
      return f"--config={config_arg}: {_first_line(e)}"
    for key in overrides:
      node, parts = config, key.split(".")[1:]
      for depth, part in enumerate(parts):
        if not isinstance(node, ml_collections.ConfigDict):
          break
        if part not in node:
          parent = ".".join(["config"] + parts[:depth])
          guess = difflib.get_close_matches(part, list(node.keys()), n=1)
          hint = f" (did you mean '{guess[0]}'?)" if guess else ""
          return (f"--{key}: {parent} has no field '{part}'{hint}; "
                  f"fields of {parent}: {', '.join(sorted(node.keys()))}")
        node = node[part]
  return _first_line(error)


def _first_line(error: Exception) -> str:
  lines = str(error).strip().strip("'\"").splitlines()
  return lines[0] if lines else type(error).__name__


def quiet_orbax_logs() -> None:
  """Orbax logs every step of every save and restore at INFO; keep the entry points' own INFO lines readable."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.get_absl_handler().addFilter(lambda record: record.levelno >= 30 or "/orbax/" not in record.pathname)


def exit_with(prog: str, message: str) -> None:
  print(f"{prog}: error: {message}", file=sys.stderr)
  sys.exit(2)
