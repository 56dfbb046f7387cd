"""Where a training step's time goes: a jax.profiler trace of one peer-shape model's step (the harness's loss and
AdamW), summed per XLA kernel kind (ynn_fusion: the matmuls; the *_fusion kinds: elementwise passes) and per
category — what each kernel computes, read from the op_name metadata of the compiled program: the model's dense
layers' matmuls, its mixer's core (attention's score and value products and softmax, the FFT, AFT's sums),
LayerNorm, GELU, the embedding, the loss, AdamW, the gradients' all-reduce; "other" for the rest (residual sums,
copies XLA inserted). profile_torch.py sums a PyTorch peer's ops into the same categories, but for the mixer's core
(there "attention kernel" or "fft") and the dense layers' bias terms (there part of the matmuls, addmm).

    python experiments/peers/profile_step.py identity_one_device 1024 [--json OUT]   # factory, length
    PJRT_NPROC=4 XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
      python experiments/peers/profile_step.py attention 4096 [--train-options]      # split over 2 devices

Kernel times are summed per category; XLA runs independent kernels at once on its threads, so the sums can exceed
the step's wall time. With several devices the kernels of all of them are summed and divided by the device count
(ms per device; the devices run at once), and with PJRT_NPROC=4 (efftx's set-up: 2 threads a device, 4 on 2 cores)
each kernel's duration includes time its thread waited for a core: read those as shares, not times (the committed
profiles_xeon.json holds one-device runs). --train-options compiles with efftx.train's compiler options
(sharding.step_compiler_options), which the harness's own step does not have.
"""
import argparse
import collections
import glob
import gzip
import json
import math
import pathlib
import re
import sys
import tempfile

import jax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import factories  # pylint: disable=g-import-not-at-top,wrong-import-position
from efftx import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position


def _instructions(hlo_text: str) -> dict:
  """HLO instruction name → (op_name, whether it is or fuses a matmul)."""
  computations, current = {}, None
  for line in hlo_text.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if head:
      current = computations.setdefault(head.group(1), [])
    elif current is not None:
      current.append(line)
  has_dot = {name: any(re.search(r"\b(dot|convolution)\(", l) for l in lines) for name, lines in computations.items()}
  # A fusion without metadata of its own (some of XLA:CPU's YNNPACK fusions) is named by what it computes, or else
  # by the computation it is in (a loop's body: the flash-attention blocks).
  inner_name = {name: next(iter(re.findall(r'op_name="([^"]+)"', "\n".join(lines)) or [""]))
                for name, lines in computations.items()}
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
      dot = bool(re.search(r"\b(dot|convolution)\(", line)) or (calls is not None and has_dot.get(calls.group(1)))
      out[m.group(1)] = (op_name, dot)
  return out


def category(kernel: str, op_name: str, dot: bool, dense_modules: set) -> str:
  """What a kernel computes, from its name and its op_name (the jit/vjp path and the flax module path)."""
  if kernel.startswith(("all-reduce", "all-gather", "reduce-scatter", "collective")):
    return "all-reduce"
  if not op_name:
    return "other"
  path = op_name.split("/")
  roots = [i for i, p in enumerate(path) if re.search(r"\((Transformer|_DataParallel)\)", p)]
  if not roots:
    if any("take_along_axis" in p or p in ("jvp()", "transpose(jvp())") for p in path):
      return "loss"
    return "adamw" if len(path) == 2 else "other"  # optax's update: jit(step)/<primitive>
  modules = path[roots[0] + 1:]
  if "_DataParallel" in path[roots[0]] and modules[:1] == ["model"]:  # factories._DataParallel shares its scope
    modules = modules[1:]
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
  return "other"


def print_ms(counter: collections.Counter, title: str = "", limit: int | None = None, label=str) -> None:
  """`counter`'s entries, largest first, a line each: milliseconds, then label(key)."""
  if title:
    print(title)
  for key, ms in counter.most_common(limit):
    print(f"{ms:9.1f}  {label(key)}")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("name")
  ap.add_argument("length", type=int)
  ap.add_argument("--steps", type=int, default=3)
  ap.add_argument("--train-options", action="store_true")
  ap.add_argument("--kernels", type=int, default=0, help="also print the N slowest kernels with their op_name")
  ap.add_argument("--json", help="write the categories (ms per device and step) here")
  args = ap.parse_args()
  step, params, opt, ids, labels = factories.harness_step(args.name, args.length)
  batch = factories.CFG["tokens"] // args.length
  devices = 1 if args.name.endswith("_one_device") else math.gcd(batch, jax.local_device_count())  # as _DataParallel
  options = sharding.step_compiler_options(batch, sharding.make_mesh(devices=jax.local_devices()[:devices]))
  compiled = jax.jit(step).lower(params, opt, ids, labels).compile(options if args.train_options else None)
  instructions = _instructions(compiled.as_text())
  dense_modules = {"/".join(k.key for k in path[:-1]) for path, _ in jax.tree_util.tree_leaves_with_path(params)
                   if path[-1].key == "kernel"}

  for _ in range(2):
    params, opt, loss = compiled(params, opt, ids, labels)
    loss.block_until_ready()
  folder = tempfile.mkdtemp(prefix="efftx-profile-")
  with jax.profiler.trace(folder, create_perfetto_trace=True):
    for _ in range(args.steps):
      params, opt, loss = compiled(params, opt, ids, labels)
      loss.block_until_ready()
  trace = json.load(gzip.open(sorted(glob.glob(folder + "/**/*.json.gz", recursive=True))[-1]))
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  by_kind, by_category, unknown = collections.Counter(), collections.Counter(), collections.Counter()
  by_kernel = collections.Counter()
  wall = 0.0
  per = args.steps * devices
  for e in events:
    if e.get("ph") != "X" or "dur" not in e:
      continue
    if e["name"] == "ThunkExecutor::Execute (wait for completion)":
      wall += e["dur"] / 1e3 / per
    elif not (e["name"].startswith(("ThunkExecutor", "$")) or "Await" in e["name"]):
      ms = e["dur"] / 1e3 / per
      by_kind[re.sub(r"\.\d+$", "", e["name"])] += ms
      if e["name"] in instructions:
        by_kernel[e["name"]] += ms
        by_category[category(e["name"], *instructions[e["name"]], dense_modules)] += ms
      else:
        unknown[e["name"]] += ms
  by_category.update({"(not in the program's text)": sum(unknown.values())} if unknown else {})
  print(f"{args.name}, length {args.length}, {devices} device(s){', train options ' + str(options) if args.train_options else ''}: "
        f"step {wall:.0f} ms wall, {sum(by_kind.values()):.0f} ms in kernels (ms per device and step):")
  print_ms(by_category)
  print_ms(by_kind, "by kernel kind:", 12)
  print_ms(by_kernel, "", args.kernels,
           lambda k: f"{k} [{category(k, *instructions[k], dense_modules)}] {instructions[k][0]}")
  if unknown:
    print("not in the program's text:", ", ".join(f"{k} {v:.1f}" for k, v in unknown.most_common(5)))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(name=args.name, length=args.length, devices=devices, wall_ms=wall,
                     categories=dict(by_category), kinds=dict(by_kind)), f, indent=1)


if __name__ == "__main__":
  main()
