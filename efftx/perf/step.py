"""A variant's training step, compiled as efftx.train compiles it: what efftx.perf's ab, bench, peers, gpu_bench time.

A variant (`variant`: plain data, so that it crosses the pipe to an ab --commits worker) is a config file, or a mixer
at the peer shape (`peer_shape`: the shape bench and peers time mixers at), with overrides of its fields; `prepare`
compiles its step and returns a function that runs n more steps. An ab --commits worker (`worker`) loads this file
by path against an older tree's efftx, so it imports only core modules that every compared commit has.
"""

from __future__ import annotations

from collections.abc import Callable
import difflib
import hashlib
import json
import math
import os
import pathlib
import re
import runpy
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import ml_collections

# Only modules that every compared commit has: an ab --commits worker runs this file against an older tree's efftx.
from efftx import config as config_lib
from efftx import model as model_lib
from efftx import objectives
from efftx import sharding
from efftx import trainer
from efftx.errors import UserError
from efftx.mixers import MIXERS


def variant(
  config: str = "", mixer: str = "", length: int = 0, tokens: int = 0, overrides: str = "", compiler: str = ""
) -> dict:
  """A variant as plain data (it crosses the pipe to a --commits worker); the strings as the flags take them."""
  return {
    "config": config,
    "mixer": mixer,
    "length": length,
    "tokens": tokens,
    "set": _pairs("overrides", overrides),
    "compiler": _pairs("compiler options", compiler),
  }


def _pairs(what: str, text: str) -> dict[str, str]:
  out = {}
  for item in filter(None, text.split(",")):
    name, has_value, value = item.partition("=")
    if not has_value or not name.strip():
      raise UserError(f"{what}: '{item}' is not name=value")
    out[name.strip()] = value.strip()
  return out


def _typed(path: str, old, text: str):
  try:
    if isinstance(old, bool):
      return {"true": True, "false": False}[text.lower()]
    return type(old)(text) if isinstance(old, (int, float, str)) else ml_collections.ConfigDict(json.loads(text))
  except (KeyError, ValueError):
    raise UserError(f"{path}={text}: {path} takes a {type(old).__name__}") from None


def _set(config: ml_collections.ConfigDict, path: str, text: str) -> None:
  *parents, name = path.split(".")
  node, where = config, "config"
  for part in parents + [name]:
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      fields = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      guess = difflib.get_close_matches(part, fields, n=1)
      raise UserError(
        f"{path}: {where} has no field '{part}'"
        + (f" (did you mean '{guess[0]}'?)" if guess else "")
        + (f"; its fields: {', '.join(fields)}" if fields else "")
      )
    if part != name:
      node, where = node[part], f"{where}.{part}"
  if path == "model.mixer":  # the new mixer's options, keeping the ones the two share (num_heads, ...)
    old_options, config.mixer = config.mixer.to_dict(), config_lib.mixer_options(text)
    config_lib.set_where_declared(config.mixer, **old_options)
  node[name] = _typed(path, node[name], text)


def peer_shape(mixer: str, length: int) -> ml_collections.ConfigDict:
  """The shape efftx.bench and efftx.peers time a mixer at: width 256, 4 layers, 4 heads, FF 1024, dropout 0,
  AdamW without clipping (the peers' step). Here, not in bench, because a --commits worker runs this file against
  an older tree."""
  config = config_lib.default_config(mixer)
  config.model.update(d_model=256, num_layers=4, d_ff=1024, max_len=length, dropout=0.0)
  config_lib.set_where_declared(config.mixer, num_heads=4)
  config.optim.grad_clip = 0.0
  return config


def load_config(spec: dict) -> tuple[ml_collections.ConfigDict, int]:
  """(the variant's config, its device count: 0 for as many as divide the batch)."""
  if bool(spec["config"]) == bool(spec["mixer"]):
    raise UserError("give one of --config=FILE[:arg] and --mixer=NAME")
  if spec["config"]:
    path, _, arg = spec["config"].partition(":")
    if not os.path.exists(path):
      raise UserError(f"--config={spec['config']}: no such config file")
    try:
      config = runpy.run_path(path)["get_config"](*([arg] if arg else []))
    except UserError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (the config file's own error, in one line)
      lines = [
        f.lineno
        for f in traceback.extract_tb(e.__traceback__)
        if os.path.realpath(f.filename) == os.path.realpath(path)
      ]
      first = (str(e).strip().splitlines() or [""])[0]
      raise UserError(
        f"--config={spec['config']}: {type(e).__name__}: {first}" + (f" ({path}, line {lines[-1]})" if lines else "")
      ) from None
  else:
    config = peer_shape(spec["mixer"], 1024)
  config.model.max_len = spec["length"] or config.model.max_len
  devices = 0
  for path, text in sorted(spec["set"].items(), key=lambda kv: kv[0] != "model.mixer"):  # the mixer first
    if path == "devices":
      devices = int(_typed("devices", 0, text))
    else:
      _set(config, path, text)
  tokens = spec["tokens"] or (0 if spec["config"] else 8192)
  if tokens:
    config.data.batch_size = max(1, tokens // config.model.max_len)
  return config, devices


def _random_batch(model, objective, params, batch_size: int, length: int, scored: int = 0) -> dict:
  """Random tokens, every position real, and the objective's own keys: labels (as many classes as the model has
  outputs), targets, weights of 1; where the task scores `scored` positions per example (MQAR's queries), that
  many distinct random "positions" per row, with their targets and weights, as its batches carry them."""
  keys = jax.random.split(jax.random.key(1), 4)
  out = {
    "tokens": jax.random.randint(keys[0], (batch_size, length), 0, model.vocab_size),
    "mask": jnp.ones((batch_size, length), bool),
  }
  logits = jax.eval_shape(
    lambda p: model.apply({"params": p}, out["tokens"][:1], mask=out["mask"][:1], deterministic=True), params
  )
  per_row = scored or length
  makers = {
    "label": lambda: jax.random.randint(keys[1], (batch_size,), 0, logits.shape[-1]),
    "targets": lambda: jax.random.randint(keys[2], (batch_size, per_row), 0, model.vocab_size),
    "weights": lambda: jnp.ones((batch_size, per_row), jnp.float32),
  }
  if scored:
    order_BxL = jax.vmap(lambda k: jax.random.permutation(k, length))(jax.random.split(keys[3], batch_size))
    out["positions"] = jnp.sort(order_BxL[:, :scored], axis=1).astype(jnp.int32)
  return {**out, **{k: makers[k]() for k in objective.batch_keys}}


def prepare(spec: dict) -> tuple[Callable[[int], float], dict]:
  """(run(n) → mean seconds of n more steps, the variant's description) for a variant compiled as efftx.train
  compiles its step; one step has run (its loss is in the description)."""
  config, devices = load_config(spec)
  batch_size, length = config.data.batch_size, config.model.max_len
  devices = devices or math.gcd(batch_size, jax.device_count())
  if devices > jax.device_count() or batch_size % devices:
    raise UserError(
      f"devices={devices}: there are {jax.device_count()} devices and the batch of {batch_size} "
      "must split evenly over the ones used"
    )
  scored = 0
  if spec["mixer"]:  # a next-token head at every position, vocabulary 256, as efftx.bench's mixers mode
    m = config.model
    try:
      from efftx import patterns  # pylint: disable=g-import-not-at-top
    except ImportError:  # a --commits tree from before layer patterns: one mixer per model
      MIXERS[m.mixer].check(dict(config.mixer), m.d_model, m.causal)
    else:
      patterns.check(m.mixer, config.mixer, m.num_layers, m.d_model, m.causal)
    objective = objectives.OBJECTIVES["lm"]
    model = model_lib.build_model(config, objective.head(256, 0), 256)
  else:
    config_lib.validate(config, devices)
    parts = trainer.parts(config)
    model, objective = parts.model, parts.objective
    scored = getattr(parts.task, "scored", lambda _: 0)(config.data.variant)  # older trees: every position
  mesh = sharding.make_mesh(config.mesh.fsdp, devices=jax.devices()[:devices])
  tx, schedule = trainer.make_optimizer(config)
  init_key, dropout_key = jax.random.split(jax.random.key(config.seed))
  state_sharding = sharding.shardings(mesh, jax.eval_shape(lambda: trainer.create_state(model, tx, init_key)))
  state = jax.jit(lambda: trainer.create_state(model, tx, init_key), out_shardings=state_sharding)()
  batch = jax.device_put(
    _random_batch(model, objective, state.params, batch_size, length, scored), sharding.batch(mesh)
  )
  train_options = getattr(sharding, "step_compiler_options", lambda *_: {})(batch_size, mesh)  # older trees: none
  options = {**train_options, **{k: _xla_value(v) for k, v in spec["compiler"].items()}}
  start = time.perf_counter()
  with jax.set_mesh(mesh):  # as efftx.train lowers its step: per-device kernels (splash attention) split by it
    compiled = (
      jax.jit(
        trainer.make_train_step(model, objective, tx, schedule, dropout_key),
        in_shardings=(state_sharding, sharding.batch(mesh)),
        out_shardings=(state_sharding, sharding.replicated(mesh)),
        donate_argnums=0,
        compiler_options=options,
      )
      .lower(state, batch)
      .compile()
    )
  info = {
    "overrides": spec["set"],
    "mixer": config.model.mixer,
    "batch": batch_size,
    "length": length,
    "devices": devices,
    "compiler_options": options,
    "compile_s": time.perf_counter() - start,
    "params": sum(x.size for x in jax.tree.leaves(state.params)),
    "matmul_params": sum(
      x.size
      for path, x in jax.tree_util.tree_leaves_with_path(state.params)
      if getattr(path[-1], "key", None) == "kernel"
    ),
    "efftx": str(pathlib.Path(config_lib.__file__).parent),
  }  # where the variant's code came from
  memory = compiled.memory_analysis()  # per device; None where the backend gives none
  if memory is not None:
    info.update(temp_bytes=memory.temp_size_in_bytes, argument_bytes=memory.argument_size_in_bytes)
  # The program without its source locations (metadata and the stack-frame tables), which differ between commits.
  program_text = compiled.as_text()
  program = re.sub(
    r"(?m), metadata=\{[^}]*\}|^(\d+ [{\"].*|FileNames|FunctionNames|FileLocations|StackFrames)\n", "", program_text
  )
  info["program_sha1"] = hashlib.sha1(program.encode()).hexdigest()[:12]
  holder = {"state": state}

  def run(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
      holder["state"], metrics = compiled(holder["state"], batch)
    holder["loss"] = float(metrics["loss"])  # waits for the last step
    return (time.perf_counter() - start) / n

  run(1)
  # For a profile of the step (efftx.perf.profiling): the compiled program and the paths of its dense layers.
  run.program_text = program_text
  run.params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), holder["state"].params)
  return run, {**info, "first_loss": holder["loss"]}


def _xla_value(text: str):
  return {"true": True, "false": False}.get(text.lower(), int(text) if text.lstrip("-").isdigit() else text)


def worker() -> None:
  """A --commits worker: the first line read is the variant, each next one a step count; replies on stdout."""
  getattr(sharding, "use_cpu_cores", lambda: None)()  # trees before it: JAX's default device (the report says)
  reply = lambda obj: print("AB " + json.dumps(obj), flush=True)
  try:
    run, info = prepare(json.loads(sys.stdin.readline()))
  except UserError as e:
    return reply({"error": str(e)})
  reply(info)
  for line in sys.stdin:
    reply({"seconds": run(int(line))})
