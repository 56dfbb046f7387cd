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

from collections.abc import Callable
import io
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tarfile
import tempfile

from absl import app
from absl import flags

from efftx import sharding
from efftx.errors import UserError
from efftx.perf import step as step_lib


def _define_flags() -> None:
  """The command-line flags, defined only when run as a program (so that efftx.bench and efftx.peers, whose flags
  share names with these, can be imported beside this module)."""
  global _CONFIG, _MIXER, _LENGTH, _TOKENS, _SET, _A, _B, _A_COMPILER, _B_COMPILER, _COMMITS, _ROUNDS, _STEPS, _JSON
  _CONFIG = flags.DEFINE_string("config", "", "Config file[:argument string] (or give --mixer).")
  _MIXER = flags.DEFINE_string("mixer", "", "A mixer at efftx.bench's peer shape (instead of --config).")
  _LENGTH = flags.DEFINE_integer(
    "length", 0, "Sequence length (config.model.max_len); 0: the config's (--mixer: 1024)."
  )
  _TOKENS = flags.DEFINE_integer(
    "tokens", 0, "Tokens per step, batch = tokens // length; 0: the config's batch (--mixer: 8192)."
  )
  _SET = flags.DEFINE_string("set", "", "Overrides for both variants (before --a and --b): path=value,...")
  _A = flags.DEFINE_string("a", "", "Variant A's overrides: path=value,... (and devices=N).")
  _B = flags.DEFINE_string("b", "", "Variant B's overrides.")
  _A_COMPILER = flags.DEFINE_string("a_compiler", "", "Variant A's extra XLA options: name=value,...")
  _B_COMPILER = flags.DEFINE_string("b_compiler", "", "Variant B's extra XLA options.")
  _COMMITS = flags.DEFINE_list("commits", [], "REV_A,REV_B: variant A runs commit REV_A's efftx, B REV_B's.")
  _ROUNDS = flags.DEFINE_integer("rounds", 8, "Rounds (each runs both variants; the first is left out).")
  _STEPS = flags.DEFINE_integer("steps", 1, "Steps per variant per round (their mean is the round's time).")
  _JSON = flags.DEFINE_string("json", None, "Also write the report as JSON here.")


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
  return {
    "a": {**info["a"], "median_ms": 1e3 * statistics.median(t["a"] for t in times)},
    "b": {**info["b"], "median_ms": 1e3 * statistics.median(t["b"] for t in times)},
    "same_program": info["a"]["program_sha1"] == info["b"]["program_sha1"],
    "rounds": [{"a_ms": 1e3 * t["a"], "b_ms": 1e3 * t["b"], "b_speedup": r} for t, r in zip(times, ratios)],
    "b_speedup": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
  }


def compare(
  spec_a: dict, spec_b: dict, rounds: int = 8, steps: int = 1, commits: tuple[str, str] | None = None
) -> dict:
  """report() of variants A and B, in this process, or with `commits` in one worker process per commit."""
  if rounds < 2 or steps < 1:
    raise UserError(f"--rounds={rounds} must be >= 2 (the first is left out), --steps={steps} >= 1")
  if not commits:
    if spec_a == spec_b:
      raise UserError("A and B are the same: give --a/--b, --a_compiler/--b_compiler or --commits")
    for spec in (spec_a, spec_b):  # both read before either compiles: a bad field in B is refused at once
      step_lib.load_config(spec)
    (run_a, info_a), (run_b, info_b) = step_lib.prepare(spec_a), step_lib.prepare(spec_b)
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
  """A process running prepare() on `tree`'s efftx (efftx.perf.step's code from this checkout, loaded by path, so
  that a tree from before efftx.perf works too), one step batch a request."""

  def __init__(self, label: str, tree: pathlib.Path, spec: dict):
    self.label = label
    boot = (
      f"import importlib.util as u; s = u.spec_from_file_location('efftx_ab_worker', {step_lib.__file__!r}); "
      "m = u.module_from_spec(s); s.loader.exec_module(m); m.worker()"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    # cwd = the tree: sys.path's first entry is the current folder, so its efftx is the one imported.
    self.proc = subprocess.Popen(
      [sys.executable, "-c", boot], cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
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


def _describe(label: str, out: dict) -> str:
  v = out[label]
  changes = ",".join(f"{k}={x}" for k, x in v["overrides"].items())
  return " ".join(
    filter(
      None,
      [
        label.upper(),
        v.get("commit"),
        changes,
        (
          f"{v['mixer']}, batch {v['batch']} x {v['length']} on {v['devices']} device(s), XLA options "
          f"{v['compiler_options'] or '{}'}: {v['median_ms']:.1f} ms a step (first loss {v['first_loss']:.8g}, "
          f"compiled in {v['compile_s']:.0f} s)"
        ),
      ],
    )
  )


def main(argv: list[str]) -> None:
  from efftx import cli  # pylint: disable=g-import-not-at-top  (the parent only: older trees lack it)

  if len(argv) > 1:
    cli.exit_with("efftx.ab", f"unexpected arguments: {' '.join(argv[1:])}")
  with cli.one_line_errors("efftx.ab"):
    common = dict(config=_CONFIG.value, mixer=_MIXER.value, length=_LENGTH.value, tokens=_TOKENS.value)
    spec_a = step_lib.variant(**common, overrides=f"{_SET.value},{_A.value}", compiler=_A_COMPILER.value)
    spec_b = step_lib.variant(**common, overrides=f"{_SET.value},{_B.value}", compiler=_B_COMPILER.value)
    if not _COMMITS.value:
      sharding.use_cpu_cores()  # on a CPU: one device per core, as efftx.train sets up
    out = compare(spec_a, spec_b, _ROUNDS.value, _STEPS.value, tuple(_COMMITS.value) or None)
  s = out["b_speedup"]
  print(_describe("a", out) + "\n" + _describe("b", out))
  print(
    f"B's speed-up over A: {s['median']:.3f}x (the median of {len(out['rounds'])} rounds' paired ratios; min "
    f"{s['min']:.3f}, max {s['max']:.3f}); same compiled program: {'yes' if out['same_program'] else 'no'}"
  )
  if _JSON.value:
    pathlib.Path(_JSON.value).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
  _define_flags()
  app.run(main)
