"""A/B timing: two variants of the training step, as efftx.train builds it, in one run on one machine.

    python -m efftx.ab --config=configs/quickstart.py --a=model.activation=gelu_tanh --b=model.activation=gelu
    python -m efftx.ab --mixer=attention --length=4096 --a=mixer.attention_impl=plain --b=mixer.attention_impl=flash
    python -m efftx.ab --mixer=fnet --length=4096 --b_compiler=xla_cpu_use_xnnpack=false       # XLA options
    python -m efftx.ab --mixer=fnet --length=1024 --a=devices=1 --b=devices=2                  # device counts
    python -m efftx.ab --commits=22f4176~1,22f4176 --mixer=attention --length=4096 --json=/tmp/ab.json

A variant is a config — --config=FILE[:arg], or --mixer=NAME at efftx.bench's peer shape (d 256, 4 layers, 4 heads,
FF 1024, vocab 256, a next-token head at every position, dropout 0, AdamW without clipping) — with --length
(max_len) and --tokens (batch = tokens // length), then overrides `path=value,...` in the config tree: --set for
both, --a / --b for each (model.activation=gelu, mixer.num_heads=8; model.mixer=X takes X's option defaults),
values typed like the field, and the pseudo-field devices=N (default: as many as divide the batch, one device per
core on a CPU, as efftx.train sets up); --a_compiler / --b_compiler add XLA options to efftx.train's own.
--commits=REV_A,REV_B runs A on commit REV_A and B on REV_B: each tree is extracted (git archive) into a temporary
folder and imported by its own long-lived worker process (--config is read from the tree where it has the file);
the workers take turns over pipes, one computing at a time.

Each step is jitted as efftx.train jits it (state and batch shardings, donated state, its compiler options) on a
random batch of the objective's keys, compiled once, then run --rounds times --steps steps, B first in every other
round, the first round left out. Reported: each variant's median step time and B's speed-up, the median over the
rounds of A's time over B's in the same round (paired: the machine's drift over minutes cancels), with its min and
max; each variant's first loss; and whether the two compiled programs (XLA's optimised HLO, source locations aside) are
the same, which catches an override that changes nothing (an XLA option that acts only in code generation may leave
the HLO unchanged).
"""
from __future__ import annotations

import difflib
import hashlib
import io
import json
import math
import os
import pathlib
import re
import runpy
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from typing import Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import ml_collections

# Only modules that every compared commit has: a --commits worker runs this file against an older tree's efftx.
from efftx import config as config_lib
from efftx import model as model_lib
from efftx import objectives
from efftx import sharding
from efftx import trainer
from efftx.errors import UserError
from efftx.mixers import MIXERS


def _define_flags() -> None:
  """The command-line flags, defined only when run as a program (so that efftx.bench and efftx.peers, whose flags
  share names with these, can be imported beside this module)."""
  global _CONFIG, _MIXER, _LENGTH, _TOKENS, _SET, _A, _B, _A_COMPILER, _B_COMPILER, _COMMITS, _ROUNDS, _STEPS, _JSON
  _CONFIG = flags.DEFINE_string("config", "", "Config file[:argument string] (or give --mixer).")
  _MIXER = flags.DEFINE_string("mixer", "", "A mixer at efftx.bench's peer shape (instead of --config).")
  _LENGTH = flags.DEFINE_integer("length", 0,
                                 "Sequence length (config.model.max_len); 0: the config's (--mixer: 1024).")
  _TOKENS = flags.DEFINE_integer("tokens", 0, "Tokens per step, batch = tokens // length; 0: the config's batch "
                                 "(--mixer: 8192).")
  _SET = flags.DEFINE_string("set", "", "Overrides for both variants (before --a and --b): path=value,...")
  _A = flags.DEFINE_string("a", "", "Variant A's overrides: path=value,... (and devices=N).")
  _B = flags.DEFINE_string("b", "", "Variant B's overrides.")
  _A_COMPILER = flags.DEFINE_string("a_compiler", "", "Variant A's extra XLA options: name=value,...")
  _B_COMPILER = flags.DEFINE_string("b_compiler", "", "Variant B's extra XLA options.")
  _COMMITS = flags.DEFINE_list("commits", [], "REV_A,REV_B: variant A runs commit REV_A's efftx, B REV_B's.")
  _ROUNDS = flags.DEFINE_integer("rounds", 8, "Rounds (each runs both variants; the first is left out).")
  _STEPS = flags.DEFINE_integer("steps", 1, "Steps per variant per round (their mean is the round's time).")
  _JSON = flags.DEFINE_string("json", None, "Also write the report as JSON here.")


def variant(config: str = "", mixer: str = "", length: int = 0, tokens: int = 0, overrides: str = "",
            compiler: str = "") -> dict:
  """A variant as plain data (it crosses the pipe to a --commits worker); the strings as the flags take them."""
  return {"config": config, "mixer": mixer, "length": length, "tokens": tokens,
          "set": _pairs("overrides", overrides), "compiler": _pairs("compiler options", compiler)}


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
      raise UserError(f"{path}: {where} has no field '{part}'" + (f" (did you mean '{guess[0]}'?)" if guess else "")
                      + (f"; its fields: {', '.join(fields)}" if fields else ""))
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
      lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
               if os.path.realpath(f.filename) == os.path.realpath(path)]
      first = (str(e).strip().splitlines() or [""])[0]
      raise UserError(f"--config={spec['config']}: {type(e).__name__}: {first}"
                      + (f" ({path}, line {lines[-1]})" if lines else "")) from None
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


def _random_batch(model, objective, params, batch_size: int, length: int) -> dict:
  """Random tokens, every position real, and the objective's own keys: labels (as many classes as the model has
  outputs), targets, weights of 1."""
  keys = jax.random.split(jax.random.key(1), 3)
  out = {"tokens": jax.random.randint(keys[0], (batch_size, length), 0, model.vocab_size),
         "mask": jnp.ones((batch_size, length), bool)}
  logits = jax.eval_shape(lambda p: model.apply({"params": p}, out["tokens"][:1], mask=out["mask"][:1],
                                                deterministic=True), params)
  makers = {"label": lambda: jax.random.randint(keys[1], (batch_size,), 0, logits.shape[-1]),
            "targets": lambda: jax.random.randint(keys[2], (batch_size, length), 0, model.vocab_size),
            "weights": lambda: jnp.ones((batch_size, length), jnp.float32)}
  return {**out, **{k: makers[k]() for k in objective.batch_keys}}


def prepare(spec: dict) -> tuple[Callable[[int], float], dict]:
  """(run(n) → mean seconds of n more steps, the variant's description) for a variant compiled as efftx.train
  compiles its step; one step has run (its loss is in the description)."""
  config, devices = load_config(spec)
  batch_size, length = config.data.batch_size, config.model.max_len
  devices = devices or math.gcd(batch_size, jax.device_count())
  if devices > jax.device_count() or batch_size % devices:
    raise UserError(f"devices={devices}: there are {jax.device_count()} devices and the batch of {batch_size} "
                    "must split evenly over the ones used")
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
  mesh = sharding.make_mesh(config.mesh.fsdp, devices=jax.devices()[:devices])
  tx, schedule = trainer.make_optimizer(config)
  init_key, dropout_key = jax.random.split(jax.random.key(config.seed))
  state_sharding = sharding.shardings(mesh, jax.eval_shape(lambda: trainer.create_state(model, tx, init_key)))
  state = jax.jit(lambda: trainer.create_state(model, tx, init_key), out_shardings=state_sharding)()
  batch = jax.device_put(_random_batch(model, objective, state.params, batch_size, length), sharding.batch(mesh))
  train_options = getattr(sharding, "step_compiler_options", lambda *_: {})(batch_size, mesh)  # older trees: none
  options = {**train_options, **{k: _xla_value(v) for k, v in spec["compiler"].items()}}
  start = time.perf_counter()
  with jax.set_mesh(mesh):  # as efftx.train lowers its step: per-device kernels (splash attention) split by it
    compiled = jax.jit(trainer.make_train_step(model, objective, tx, schedule, dropout_key),
                       in_shardings=(state_sharding, sharding.batch(mesh)),
                       out_shardings=(state_sharding, sharding.replicated(mesh)), donate_argnums=0,
                       compiler_options=options).lower(state, batch).compile()
  info = {"overrides": spec["set"], "mixer": config.model.mixer, "batch": batch_size, "length": length,
          "devices": devices, "compiler_options": options, "compile_s": time.perf_counter() - start,
          "params": sum(x.size for x in jax.tree.leaves(state.params)),
          "matmul_params": sum(x.size for path, x in jax.tree_util.tree_leaves_with_path(state.params)
                               if getattr(path[-1], "key", None) == "kernel"),
          "efftx": str(pathlib.Path(config_lib.__file__).parent)}  # where the variant's code came from
  memory = compiled.memory_analysis()  # per device; None where the backend gives none
  if memory is not None:
    info.update(temp_bytes=memory.temp_size_in_bytes, argument_bytes=memory.argument_size_in_bytes)
  # The program without its source locations (metadata and the stack-frame tables), which differ between commits.
  program_text = compiled.as_text()
  program = re.sub(r"(?m), metadata=\{[^}]*\}|^(\d+ [{\"].*|FileNames|FunctionNames|FileLocations|StackFrames)\n", "",
                   program_text)
  info["program_sha1"] = hashlib.sha1(program.encode()).hexdigest()[:12]
  holder = {"state": state}

  def run(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
      holder["state"], metrics = compiled(holder["state"], batch)
    holder["loss"] = float(metrics["loss"])  # waits for the last step
    return (time.perf_counter() - start) / n

  run(1)
  # For a profile of the step (efftx.profiling): the compiled program and the paths of its dense layers.
  run.program_text = program_text
  run.params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), holder["state"].params)
  return run, {**info, "first_loss": holder["loss"]}


def _xla_value(text: str):
  return {"true": True, "false": False}.get(text.lower(), int(text) if text.lstrip("-").isdigit() else text)


def alternate(runs: dict[str, Callable[[int], float]], rounds: int, steps: int = 1) -> list[dict[str, float]]:
  """Seconds a step of each variant, per round: `rounds` rounds of `steps` steps each, every other round in
  reverse order (so neither always follows the other); the first round, a warm-up, is left out."""
  out = []
  for i in range(rounds):
    order = list(runs) if i % 2 == 0 else list(runs)[::-1]
    out.append({label: runs[label](steps) for label in order})
  return out[1:]


def report(info: dict[str, dict], times: list[dict[str, float]]) -> dict:
  """The two variants' median ms a step and B's speed-up: the median over rounds of A's time over B's."""
  ratios = [t["a"] / t["b"] for t in times]
  return {"a": {**info["a"], "median_ms": 1e3 * statistics.median(t["a"] for t in times)},
          "b": {**info["b"], "median_ms": 1e3 * statistics.median(t["b"] for t in times)},
          "same_program": info["a"]["program_sha1"] == info["b"]["program_sha1"],
          "rounds": [{"a_ms": 1e3 * t["a"], "b_ms": 1e3 * t["b"], "b_speedup": r} for t, r in zip(times, ratios)],
          "b_speedup": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}}


def compare(spec_a: dict, spec_b: dict, rounds: int = 8, steps: int = 1, commits: tuple[str, str] | None = None
            ) -> dict:
  """report() of variants A and B, in this process, or with `commits` in one worker process per commit."""
  if rounds < 2 or steps < 1:
    raise UserError(f"--rounds={rounds} must be >= 2 (the first is left out), --steps={steps} >= 1")
  if not commits:
    if spec_a == spec_b:
      raise UserError("A and B are the same: give --a/--b, --a_compiler/--b_compiler or --commits")
    (run_a, info_a), (run_b, info_b) = prepare(spec_a), prepare(spec_b)
    return report({"a": info_a, "b": info_b}, alternate({"a": run_a, "b": run_b}, rounds, steps))
  if len(commits) != 2:
    raise UserError(f"--commits={','.join(commits)}: give two revisions, REV_A,REV_B")
  with tempfile.TemporaryDirectory(prefix="efftx-ab-") as folder:
    workers = {}
    try:
      for label, rev, spec in zip("ab", commits, (spec_a, spec_b)):
        workers[label] = _Worker(label, _extract(rev, pathlib.Path(folder) / label), spec)
      out = report({k: w.info for k, w in workers.items()}, alternate(workers, rounds, steps))
    finally:
      for w in workers.values():
        w.close()
  for label, rev in zip("ab", commits):
    out[label]["commit"] = rev
  return out


def _extract(rev: str, folder: pathlib.Path) -> pathlib.Path:
  """The tree of commit `rev` of the checkout this efftx comes from, written into `folder`."""
  repo = pathlib.Path(__file__).resolve().parents[2]  # efftx/perf/ab.py → the checkout
  git = lambda *args: subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
  sha = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
  if sha.returncode:
    raise UserError(f"--commits: '{rev}' is not a commit of {repo}")
  archive = git("archive", sha.stdout.decode().strip())
  folder.mkdir(parents=True)
  with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
    if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse members that would land outside the folder
      tar.extractall(folder, filter="data")
    else:
      tar.extractall(folder)  # git's own archive of a commit: paths inside the tree
  return folder


class _Worker:
  """A process running prepare() on `tree`'s efftx (this file's code, loaded by path), one step batch a request."""

  def __init__(self, label: str, tree: pathlib.Path, spec: dict):
    self.label = label
    boot = (f"import importlib.util as u; s = u.spec_from_file_location('efftx_ab_worker', {__file__!r}); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); m.worker()")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    # cwd = the tree: sys.path's first entry is the current folder, so its efftx is the one imported.
    self.proc = subprocess.Popen([sys.executable, "-c", boot], cwd=tree, env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
    path, colon, arg = spec["config"].partition(":")
    repo = pathlib.Path(__file__).resolve().parents[2]  # efftx/perf/ab.py → the checkout
    if path and pathlib.Path(path).is_absolute() and pathlib.Path(path).resolve().is_relative_to(repo):
      path = str(pathlib.Path(path).resolve().relative_to(repo))  # a file of this checkout: read the commit's
    if path:  # read from the commit's tree where it has the file, else from here
      spec = {**spec, "config": (path if (tree / path).exists() else os.path.abspath(path)) + colon + arg}
    try:
      self.info = self._ask(spec)
      if not pathlib.Path(self.info["efftx"]).is_relative_to(tree):
        raise RuntimeError(f"variant {label}'s worker imported efftx from {self.info['efftx']}, not from {tree}")
    except BaseException:
      self.close()
      raise

  def __call__(self, steps: int) -> float:
    return self._ask(steps)["seconds"]

  def _ask(self, request) -> dict:
    self.proc.stdin.write(json.dumps(request) + "\n")
    self.proc.stdin.flush()
    for line in self.proc.stdout:
      if line.startswith("AB "):
        reply = json.loads(line[3:])
        if "error" in reply:
          raise UserError(f"variant {self.label}: {reply['error']}")
        return reply
    raise RuntimeError(f"variant {self.label}'s worker exited with {self.proc.wait()} (its errors are above)")

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.close()
      self.proc.wait()


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


def _describe(label: str, out: dict) -> str:
  v = out[label]
  changes = ",".join(f"{k}={x}" for k, x in v["overrides"].items())
  return " ".join(filter(None, [label.upper(), v.get("commit"), changes, (
      f"{v['mixer']}, batch {v['batch']} x {v['length']} on {v['devices']} device(s), XLA options "
      f"{v['compiler_options'] or '{}'}: {v['median_ms']:.1f} ms a step (first loss {v['first_loss']:.8g}, compiled "
      f"in {v['compile_s']:.0f} s)")]))


def main(argv: list[str]) -> None:
  from efftx import cli  # pylint: disable=g-import-not-at-top  (the parent only: older trees lack it)
  if len(argv) > 1:
    cli.exit_with("efftx.ab", f"unexpected arguments: {' '.join(argv[1:])}")
  with cli.one_line_errors("efftx.ab"):
    common = dict(config=_CONFIG.value, mixer=_MIXER.value, length=_LENGTH.value, tokens=_TOKENS.value)
    spec_a = variant(**common, overrides=f"{_SET.value},{_A.value}", compiler=_A_COMPILER.value)
    spec_b = variant(**common, overrides=f"{_SET.value},{_B.value}", compiler=_B_COMPILER.value)
    if not _COMMITS.value:
      sharding.use_cpu_cores()  # on a CPU: one device per core, as efftx.train sets up
    out = compare(spec_a, spec_b, _ROUNDS.value, _STEPS.value, tuple(_COMMITS.value) or None)
  s = out["b_speedup"]
  print(_describe("a", out) + "\n" + _describe("b", out))
  print(f"B's speed-up over A: {s['median']:.3f}x (the median of {len(out['rounds'])} rounds' paired ratios; min "
        f"{s['min']:.3f}, max {s['max']:.3f}); same compiled program: {'yes' if out['same_program'] else 'no'}")
  if _JSON.value:
    pathlib.Path(_JSON.value).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
  _define_flags()
  app.run(main)
