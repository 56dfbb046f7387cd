"""Where a compiled training step's time goes: a jax.profiler trace's XLA kernels summed by what they compute.

Each kernel of the trace is an instruction of the compiled program; its op_name metadata (the jit/vjp path and the
flax module path) says what it computes. The categories: the model's dense layers' matmuls ("matmul") and their
bias terms, the mixer's core (attention's score and value products and softmax, the FFT, AFT's sums), LayerNorm,
GELU (the feed-forward's elementwise part), the embedding, the loss, the optimizer update with the gradient norm
and the metrics, the gradients' all-reduce, and "other" (residual sums, copies XLA inserted). XLA runs
independent kernels at once on its threads, so the sums can exceed the step's wall time; with several devices the
sums are per device (divided by the device count). Used by `python -m efftx.peers --profile`.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import re

_DOT = re.compile(r"\b(dot|convolution)\(")


def instructions(hlo_text: str) -> dict[str, tuple[str, bool]]:
  """HLO instruction name → (its op_name, whether it is or fuses a matmul), from a compiled program's text. A fusion
  without metadata of its own is named by what it computes, or else by the computation it is in (a loop body)."""
  computations, current = {}, None
  for line in hlo_text.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if head:
      current = computations.setdefault(head.group(1), [])
    elif current is not None:
      current.append(line)
  has_dot = {name: any(_DOT.search(line) for line in lines) for name, lines in computations.items()}
  inner_name = {
    name: next(iter(re.findall(r'op_name="([^"]+)"', "\n".join(lines))), "") for name, lines in computations.items()
  }
  out = {}
  for computation, lines in computations.items():
    for line in lines:
      m = re.match(r"^\s*(?:ROOT )?%?([\w.\-]+) = ", line)
      if not m:
        continue
      calls = re.search(r"calls=%?([\w.\-]+)", line)
      op_name = re.search(r'op_name="([^"]*)"', line)
      op_name = op_name.group(1) if op_name else (inner_name.get(calls.group(1), "") if calls else "")
      op_name = op_name or ("" if computation.startswith("main") else inner_name[computation])
      dot = bool(_DOT.search(line)) or bool(calls and has_dot.get(calls.group(1)))
      out[m.group(1)] = (op_name, dot)
  return out


def category(kernel: str, op_name: str, dot: bool, dense_modules: set[str]) -> str:
  """What a kernel computes, from its name and op_name; dense_modules: the flax paths ("block_0/feed_forward/ff/up")
  of the modules that hold a dense kernel."""
  if kernel.startswith(("all-reduce", "all-gather", "reduce-scatter", "collective")):
    return "all-reduce"
  path = op_name.split("/") if op_name else []
  root = next((i for i, p in enumerate(path) if "(Transformer)" in p), None)
  if root is None:
    # The objective's loss around the model (differentiated: jvp() and its transpose), its label lookups.
    if any(p in ("jvp()", "transpose(jvp())") or re.search(r"_take\b|take_along_axis", p) for p in path):
      return "loss"
    # The step's own primitives, outside the model: AdamW's update, the gradient norm and clipping, the metrics.
    return "optimizer, metrics" if len(path) == 2 else "other"
  modules = [re.sub(r"^\w+\((\w+)\)$", r"\1", p) for p in path[root + 1 :]]
  for depth in range(len(modules), 0, -1):  # the innermost dense layer the op belongs to
    if "/".join(modules[:depth]) in dense_modules:
      return "matmul" if dot else "dense bias"
  if "mixer" in modules:
    return "mixer core"
  if any(m.endswith("norm") for m in modules):
    return "layernorm"
  if "ff" in modules:
    return "gelu"
  if modules and modules[0] in ("embed", "pos_embed"):
    return "embedding"
  return "loss" if "head" in modules or "classifier" in modules else "other"


def summarize(
  trace_folder: str, program: dict[str, tuple[str, bool]], dense_modules: set[str], steps: int, devices: int
) -> dict[str, dict[str, float]]:
  """ms a step (per device) by category and by kernel kind (an HLO name without its number), from the newest
  jax.profiler trace under trace_folder of `steps` steps of the program whose `instructions` are `program`."""
  trace = json.load(gzip.open(sorted(pathlib.Path(trace_folder).glob("**/*.trace.json.gz"))[-1]))
  by_category, by_kind = collections.Counter(), collections.Counter()
  for e in trace["traceEvents"] if isinstance(trace, dict) else trace:
    if e.get("ph") != "X" or "dur" not in e or not re.fullmatch(r"[a-z][\w\-]*(\.\d+)?", e["name"]):
      continue  # HLO kernels only (not the runtime's own events)
    ms = e["dur"] / 1e3 / steps / devices
    by_kind[re.sub(r"\.\d+$", "", e["name"])] += ms
    if e["name"] in program:
      by_category[category(e["name"], *program[e["name"]], dense_modules)] += ms
    else:
      by_category["(not in the program)"] += ms
  return {"categories": dict(by_category.most_common()), "kinds": dict(by_kind.most_common(40))}


def dense_modules(params) -> set[str]:
  """The flax paths of the modules that hold a dense layer's kernel ("kernel" beside a "bias")."""
  import jax  # pylint: disable=g-import-not-at-top

  out = set()
  for path, _ in jax.tree_util.tree_leaves_with_path(params):
    keys = [getattr(k, "key", str(k)) for k in path]
    if keys[-1] == "kernel":
      out.add("/".join(keys[:-1]))
  return out
