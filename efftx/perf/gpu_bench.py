"""The GPU benchmark: every mixer's training step in bfloat16 beside Hugging Face's BERT (SDPA) and FNet in torch,
at lengths 512 … 16,384 on one GPU, in one command.

    python -m efftx.gpu_bench --out=/tmp/gpu_bench                     # on a GPU: within 440 s (the budget)
    python -m efftx.gpu_bench --out=/tmp/gpu_bench --mixers=attention,fnet --lengths=4096,16384
    python -m efftx.gpu_bench --dry_run --out=/tmp/gpu_dry             # the same path on the CPU, tiny shapes
    python -m efftx.gpu_bench --replot --out=/tmp/gpu_bench            # gpu_bench.md and .png again from the JSON

A row is one model's training step (forward, backward, AdamW at lr 1e-4, weight decay 0.01, mean cross-entropy of
a Linear(d, vocab) head at every position) at one length, at efftx.peers' shape — d 256, 4 layers, 4 heads, FF 1024,
vocab 256 — with 32,768 random tokens a step (batch = 32768 // length), on one GPU:
  - efftx-<mixer>, every mixer of efftx.mixers.MIXERS: efftx's model in the peers' block (post-LN, exact GELU,
    LayerNorm epsilon 1e-12, FNet's embedding projection; efftx.perf.peers.efftx_variant) with config.model.dtype
    bfloat16 (bfloat16 compute, float32 parameters and AdamW), compiled as efftx.train compiles its step
    (efftx.perf.step.prepare: state replicated on the one device, donated, efftx.train's compiler options);
  - hf-bert-sdpa (transformers BertModel, attn_implementation="sdpa") and hf-fnet (FNetModel, torch's FFT), eager
    PyTorch under torch.autocast(bfloat16): float32 parameters and AdamW, bfloat16 matmuls and attention, as
    efftx's bfloat16; efftx.perf.peers.hf_model builds them.
Per row: tokens/s (the median of --steps timed steps after --warmup, each waited for), MFU (achieved FLOP/s over the
chip's bfloat16 matmul rate: the larger of JAX's and torch's 8192³ matmul, measured at each worker's start; FLOPs
per token as efftx.peers counts them), peak memory (efftx: the compiled step's temp + argument bytes, XLA's
memory_analysis, exact per row; torch: max_memory_allocated from model creation to the last step), the ratio of its
tokens/s to hf-bert-sdpa's and to hf-fnet's at the same length, and for efftx rows the backend, device kind, JAX
version and the kernels beyond XLA's own that the compiled step calls (cuDNN fused attention, Pallas on TPU or GPU;
none: XLA's fusions).

One worker process per framework and group of rows — attention and fnet first, then the Hugging Face peers, then
the other mixers — each model's lengths in increasing order; JAX and torch never share the GPU. The run has a
deadline (--budget_s): no row starts after it (the rest are recorded as skipped), and a row that takes longer than
--row_timeout is stopped with its worker, which is started again for the next row. A row that runs out of memory,
times out or fails skips its model's longer lengths. gpu_bench.json and gpu_bench.md are rewritten after every row,
gpu_bench.png after every group, so a run cut short still leaves what it measured. Workers' logs: --out/logs/.
--dry_run: the same path on the CPU at efftx.peers' tiny shape (d 32, 1 layer, 2 heads, FF 64, 256 tokens a step),
lengths 64 and 128, a 256³ matmul, attention and fnet (--mixers=all: every mixer); the torch rows only where torch
and transformers are installed. Without --dry_run, a machine whose JAX or torch sees no GPU stops the run.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import pathlib
import platform
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time

from efftx import platform as platform_lib
from efftx.errors import UserError
from efftx.perf import peers

SHAPES = {"gpu": {**peers.SHAPES["full"], "tokens": 32768}, "dry": peers.SHAPES["tiny"]}
LENGTHS = {"gpu": [512, 1024, 2048, 4096, 8192, 16384], "dry": [64, 128]}
MATMUL_N = {"gpu": 8192, "dry": 256}
HF_PEERS = ("hf-bert-sdpa", "hf-fnet")
FIRST = ("attention", "fnet")  # run before the peers; the other mixers after them
LAST = ("random",)  # its W_seq is a max_len² constant per layer, compiled into the program: slowest to compile
_TAG = "GPU_BENCH "  # a worker's protocol lines on its stdout start with it
TORCH_HINT = "torch not installed (the hf-* rows need torch and transformers: pip install -e '.[peers]')"


class NoGPU(UserError):
  """A GPU run on a machine whose framework sees no GPU: the run stops."""


def _is_oom(error: BaseException) -> bool:
  text = f"{type(error).__name__} {error}".lower()
  return "resource_exhausted" in text or "out of memory" in text or "outofmemory" in text


def _median_seconds(fn, warmup: int, steps: int) -> tuple[float, list[float]]:
  """fn() waits for its work; (the median seconds of `steps` calls after `warmup`, every call's seconds)."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times), times


# ------------------------------------------------------------------------------------------ the JAX worker
def jax_setup(dry_run: bool) -> dict:
  """What the JAX rows run on; on a GPU run, stops unless JAX sees a GPU."""
  import jax  # pylint: disable=g-import-not-at-top

  if not dry_run and jax.default_backend() != "gpu":
    raise NoGPU(f"no GPU: JAX's backend is {jax.default_backend()} (--dry_run runs the same path on the CPU)")
  device = jax.devices()[0]
  return dict(
    backend=jax.default_backend(), device_kind=device.device_kind, jax=jax.__version__, devices=jax.device_count()
  )


def jax_matmul_tflops(n: int) -> float:
  """bfloat16 n×n by n×n matmul TFLOP/s of JAX's default device: the median of 10 calls after 2."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  x, y = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in (0, 1))
  matmul = jax.jit(jnp.matmul)
  seconds, _ = _median_seconds(lambda: matmul(x, y).block_until_ready(), 2, 10)
  return 2 * n**3 / seconds / 1e12


def jax_row(mixer: str, c: dict, seq: int, warmup: int, steps: int) -> dict:
  """An efftx-<mixer> row: efftx's train step in bfloat16, compiled as efftx.train compiles it, timed."""
  import jax  # pylint: disable=g-import-not-at-top

  from efftx.mixers import MIXERS  # pylint: disable=g-import-not-at-top
  from efftx.perf import step as step_lib  # pylint: disable=g-import-not-at-top

  spec = peers.efftx_variant(mixer, c, seq)
  spec["set"]["model.dtype"] = "bfloat16"
  run, info = step_lib.prepare(spec)  # compiled, and one step run
  config, _ = step_lib.load_config(spec)
  median_s, times = _median_seconds(lambda: run(1), max(0, warmup - 1), steps)
  mixing = MIXERS[mixer].train_flops(dict(config.mixer), seq, c["d"], False)  # None: not counted, MFU n/a
  stats = jax.local_devices()[0].memory_stats() or {}
  row = dict(
    batch=info["batch"],
    devices=info["devices"],
    median_step_s=median_s,
    step_times_s=times,
    compile_s=info["compile_s"],
    first_loss=info["first_loss"],
    n_params=info["params"],
    flops_per_token=None if mixing is None else 6 * info["matmul_params"] + c["layers"] * mixing,
    peak_mib=(info["temp_bytes"] + info["argument_bytes"]) / 2**20 if "temp_bytes" in info else None,
    peak_how="compiled temp + argument bytes",
    # the worker's device peak so far (its earlier rows included: it never goes down); None on a CPU
    process_peak_mib=stats["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in stats else None,
    kernels=sorted(platform_lib.kernels(run.program_text)),
    program_sha1=info["program_sha1"],
  )
  run = None  # frees the compiled step (the closure above holds it)
  gc.collect()
  return row


# ---------------------------------------------------------------------------------------- the torch worker
def _torch_device(dry_run: bool):
  import torch  # pylint: disable=g-import-not-at-top

  return torch.device("cpu" if dry_run else "cuda")


def torch_setup(dry_run: bool) -> dict:
  """What the torch rows run on; on a GPU run, stops unless torch sees a GPU."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError(TORCH_HINT) from None
  if dry_run:
    torch.set_num_threads(1)  # the tiny steps: more threads wait on each other (and on any other busy core)
  elif not torch.cuda.is_available():
    raise NoGPU("no GPU: torch.cuda.is_available() is False (--dry_run runs the same path on the CPU)")
  kind = "cpu" if dry_run else torch.cuda.get_device_name(0)
  return dict(
    backend="cpu" if dry_run else "cuda",
    device_kind=kind,
    torch=torch.__version__,
    transformers=transformers.__version__,
    cuda=torch.version.cuda,
  )


def torch_matmul_tflops(n: int, dry_run: bool) -> float:
  """bfloat16 n×n by n×n matmul TFLOP/s of torch's device: the median of 10 calls after 2."""
  import torch  # pylint: disable=g-import-not-at-top

  device = _torch_device(dry_run)
  x, y = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
  sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

  def matmul():
    x @ y  # pylint: disable=pointless-statement
    sync()

  seconds, _ = _median_seconds(matmul, 2, 10)
  return 2 * n**3 / seconds / 1e12


def torch_row(peer: str, c: dict, seq: int, warmup: int, steps: int, dry_run: bool) -> dict:
  """An hf-* row: the Hugging Face model under torch.autocast(bfloat16), eager, AdamW in float32, timed."""
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top

  device = _torch_device(dry_run)
  cuda = device.type == "cuda"
  if cuda:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
  model = peers.hf_model(peer, c, seq).to(device)
  opt = torch.optim.AdamW(model.parameters(), lr=c["lr"], weight_decay=peers.WEIGHT_DECAY)
  g = torch.Generator().manual_seed(1)
  batch = max(1, c["tokens"] // seq)
  ids, labels = (torch.randint(0, c["vocab"], (batch, seq), generator=g).to(device) for _ in range(2))
  losses = []

  def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
      logits = model["head"](model["base"](input_ids=ids).last_hidden_state)
      loss = F.cross_entropy(logits.reshape(-1, c["vocab"]), labels.reshape(-1))
    loss.backward()
    opt.step()
    losses.append(loss.item())  # waits for the step

  start = time.perf_counter()
  step()
  first_step_s = time.perf_counter() - start
  median_s, times = _median_seconds(step, max(0, warmup - 1), steps)
  n_mm = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
  row = dict(
    batch=batch,
    devices=1,
    median_step_s=median_s,
    step_times_s=times,
    compile_s=None,
    first_step_s=first_step_s,
    first_loss=losses[0],
    n_params=sum(p.numel() for p in model.parameters()),
    flops_per_token=6 * n_mm + peers.mixer_flops("fft" if peer == "hf-fnet" else "attn", c, seq),
    peak_mib=torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
    peak_how="torch.cuda.max_memory_allocated",
  )
  model = opt = None  # frees them (the step closure holds them)
  gc.collect()
  return row


def _release(kind: str) -> None:
  """After a row that failed: what it held goes back to the device (its exception, which held it, is gone)."""
  gc.collect()
  if kind == "jax":
    import jax  # pylint: disable=g-import-not-at-top

    jax.clear_caches()
  else:
    import torch  # pylint: disable=g-import-not-at-top

    if torch.cuda.is_initialized():
      torch.cuda.empty_cache()


def worker(kind: str, dry_run: bool, warmup: int, steps: int) -> None:
  """A worker: sets up its framework (and measures the matmul rate), then measures one row per stdin line
  "MODEL LENGTH" and answers each on stdout, until stdin closes."""
  size = "dry" if dry_run else "gpu"
  c = SHAPES[size]
  say = lambda what, obj: print(_TAG + what + " " + json.dumps(obj), flush=True)
  try:
    setup = jax_setup(dry_run) if kind == "jax" else torch_setup(dry_run)
    n = MATMUL_N[size]
    tflops = jax_matmul_tflops(n) if kind == "jax" else torch_matmul_tflops(n, dry_run)
  except UserError as e:
    return say("FATAL", {"error": str(e), "no_gpu": isinstance(e, NoGPU)})
  say("READY", {**setup, "matmul_tflops": tflops, "matmul_n": n, "pid": os.getpid()})
  for line in sys.stdin:
    model, seq = line.split()
    seq = int(seq)
    try:
      if kind == "jax":
        row = jax_row(model[len("efftx-") :], c, seq, warmup, steps)
      else:
        row = torch_row(model, c, seq, warmup, steps, dry_run)
      row = {"status": "ok", **row}
    except Exception as e:  # pylint: disable=broad-except  (recorded as the row's result; the worker goes on)
      first = (str(e).strip().splitlines() or [""])[0][:300]
      row = {"status": "oom" if _is_oom(e) else "failed", "reason": f"{type(e).__name__}: {first}"}
      print(f"{model} {seq}: {row['reason']}", file=sys.stderr, flush=True)
    if row["status"] != "ok":
      _release(kind)
    say("ROW", {**row, **setup})


# ---------------------------------------------------------------------------------------------- the parent
class _Worker:
  """A worker process; ask() sends it one row and waits for the answer, or for `timeout` seconds."""

  def __init__(self, kind: str, a: argparse.Namespace, log: pathlib.Path):
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "PYTHONUNBUFFERED": "1"}
    if a.dry_run:
      env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    argv = [
      sys.executable,
      "-m",
      "efftx.gpu_bench",
      f"--worker={kind}",
      f"--warmup={a.warmup}",
      f"--steps={a.steps}",
    ] + ["--dry_run"] * a.dry_run
    self.log = log
    with open(log, "ab") as err:
      self.proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env, start_new_session=True
      )  # its own group: killed with its children
    self.lines = queue.Queue()
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      if line.startswith(_TAG):
        what, _, body = line[len(_TAG) :].partition(" ")
        self.lines.put((what, json.loads(body)))
    self.lines.put(("EXIT", {}))

  def reply(self, timeout: float) -> tuple[str, dict]:
    """The next message: (READY | FATAL | ROW | EXIT | TIMEOUT, its body)."""
    try:
      return self.lines.get(timeout=max(timeout, 0.1))
    except queue.Empty:
      return "TIMEOUT", {}

  def ask(self, model: str, seq: int, timeout: float) -> tuple[str, dict]:
    try:
      self.proc.stdin.write(f"{model} {seq}\n")
      self.proc.stdin.flush()
    except BrokenPipeError:
      return "EXIT", {}
    return self.reply(timeout)

  def why_exited(self) -> str:
    code = self.proc.wait()
    lines = [l for l in self.log.read_text(errors="replace").splitlines() if l.strip()]
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return f"the worker {how}" + (f": {lines[-1][:300]}" if lines else "")

  def close(self) -> None:
    if self.proc.poll() is None:
      try:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
      except (BrokenPipeError, subprocess.TimeoutExpired):
        self.kill()

  def kill(self) -> None:
    if self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except ProcessLookupError:  # it has just exited
        pass
      self.proc.wait()


def _stages(mixers: list[str], hf: list[str]) -> list[tuple[str, list[str]]]:
  """(worker kind, its models in order): attention and fnet, the Hugging Face peers, the other mixers."""
  efftx = lambda names: [f"efftx-{m}" for m in names]
  first = [m for m in mixers if m in FIRST]
  rest = [m for m in mixers if m not in FIRST]
  return [s for s in (("jax", efftx(first)), ("torch", list(hf)), ("jax", efftx(rest))) if s[1]]


def derive(rows: list[dict], peaks: dict[str, dict]) -> None:
  """Adds tokens/s, MFU (over the larger matmul rate) and the ratios to the peers' tokens/s at each length."""
  rate = max([p["matmul_tflops"] for p in peaks.values()] or [float("nan")])
  for r in rows:
    if r["status"] == "ok":
      r["tokens_per_s"] = r["batch"] * r["seq"] / r["median_step_s"]
      r["mfu"] = None if r["flops_per_token"] is None else r["tokens_per_s"] * r["flops_per_token"] / 1e12 / rate
  speed = {(r["model"], r["seq"]): r.get("tokens_per_s") for r in rows}
  for r in rows:
    for peer in HF_PEERS:
      ref = speed.get((peer, r["seq"]))
      r[f"over_{peer}"] = r["tokens_per_s"] / ref if ref and r.get("tokens_per_s") else None


def _models(rows: list[dict]) -> list[str]:
  """The rows' models in the order they ran, the Hugging Face peers last."""
  models = list(dict.fromkeys(r["model"] for r in rows))
  return [m for m in models if m not in HF_PEERS] + [m for m in models if m in HF_PEERS]


def markdown(run: dict) -> str:
  """Tables with a row per length and a column per model: tokens/s, the ratios to the peers, MFU %, peak MiB; then
  the rows not measured and each row's details."""
  rows, meta = run["rows"], run["meta"]
  models = _models(rows)
  seqs = sorted({r["seq"] for r in rows})
  at = {(r["model"], r["seq"]): r for r in rows}
  c = meta["shape"]
  peaks = ", ".join(
    f"{fw} {p['matmul_tflops']:.3g} TFLOP/s ({p['device_kind']}, {p['backend']})" for fw, p in run["peaks"].items()
  )
  lines = [
    f"# efftx.gpu_bench{' --dry_run' if meta['dry_run'] else ''}",
    "",
    f"Training step in bfloat16, d {c['d']}, {c['layers']} layer{'s' * (c['layers'] > 1)}, {c['heads']} "
    f"heads, FF {c['ff']}, vocab {c['vocab']}, {c['tokens']} tokens a step (batch = {c['tokens']} // "
    f"length); median of {meta['steps']} steps after {meta['warmup']}. bfloat16 {meta['matmul_n']}³ matmul: "
    f"{peaks or 'not measured'} (MFU's denominator: the larger). "
    + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    + ".",
    "",
  ]

  def table(title: str, value) -> None:
    lines.extend([f"## {title}", "", "| length | " + " | ".join(models) + " |", "|---:|" + "---:|" * len(models)])
    for seq in seqs:
      cells = []
      for m in models:
        r = at.get((m, seq))
        v = value(r) if r and r["status"] == "ok" else None
        cells.append(v if v is not None else ("-" if not r or r["status"] == "ok" else r["status"]))
      lines.append(f"| {seq} | " + " | ".join(cells) + " |")
    lines.append("")

  fmt = lambda x, f: None if x is None else format(x, f)
  table("tokens/s", lambda r: fmt(r["tokens_per_s"], ",.0f"))
  for peer in HF_PEERS:
    if peer in models:
      table(f"tokens/s over {peer}'s", lambda r, p=peer: fmt(r.get(f"over_{p}"), ".2f"))
  table("MFU %", lambda r: "n/a" if r["mfu"] is None else fmt(100 * r["mfu"], ".1f"))
  table(
    "peak memory, MiB (efftx: the compiled step's temp + arguments; torch: max allocated)",
    lambda r: fmt(r.get("peak_mib"), ",.0f"),
  )
  missing = [r for r in rows if r["status"] != "ok"]
  if missing:
    lines.extend(["## not measured", "", "| model | length | status | reason |", "|---|---:|---|---|"])
    lines.extend(f"| {r['model']} | {r['seq']} | {r['status']} | {r.get('reason', '')} |" for r in missing)
    lines.append("")
  lines.extend(
    [
      "## rows",
      "",
      "| model | length | batch | step ms | GFLOP/token | compile s | first loss | kernels beyond XLA's |",
      "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
  )
  for r in rows:
    if r["status"] == "ok":
      compile_s = "-" if r.get("compile_s") is None else f"{r['compile_s']:.1f}"
      kernels = (", ".join(r["kernels"]) or "none") if "kernels" in r else "(torch)"
      gflop = "n/a" if r["flops_per_token"] is None else f"{r['flops_per_token'] / 1e9:.4g}"  # a mixer without a count
      lines.append(
        f"| {r['model']} | {r['seq']} | {r['batch']} | {1e3 * r['median_step_s']:.2f} | "
        f"{gflop} | {compile_s} | {r['first_loss']:.4f} | {kernels} |"
      )
  return "\n".join(lines) + "\n"


def plot(run: dict, path: pathlib.Path) -> None:
  """tokens/s against length (log-log), and tokens/s over hf-bert-sdpa's, one line per model."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  rows = [r for r in run["rows"] if r["status"] == "ok"]
  models = _models(rows)
  seqs = sorted({r["seq"] for r in run["rows"]})
  fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
  tab20 = plt.get_cmap("tab20")
  colours = [tab20(2 * k) for k in range(10)] + [tab20(2 * k + 1) for k in range(10)]  # the dark ones first
  mixers = [m for m in models if not m.startswith("hf-")]
  for model in models:
    peer = model.startswith("hf-")
    i = mixers.index(model) if not peer else 0
    style = dict(
      color=("black" if model == "hf-bert-sdpa" else "dimgrey") if peer else colours[i % 20],
      linestyle=(0, (5, 2)) if peer else "-",
      marker="os^vDP"[i % 6] if not peer else "o",
      markersize=4,
      linewidth=2.5 if peer or model in ("efftx-attention", "efftx-fnet") else 1.3,
    )
    points = sorted((r["seq"], r["tokens_per_s"]) for r in rows if r["model"] == model)
    axes[0].plot(*zip(*points), label=model, **style)
    ratios = sorted(
      (r["seq"], r["over_hf-bert-sdpa"]) for r in rows if r["model"] == model and r.get("over_hf-bert-sdpa")
    )
    if ratios:
      axes[1].plot(*zip(*ratios), label=model, **style)
  where = "CPU, dry run" if run["meta"]["dry_run"] else next((p["device_kind"] for p in run["peaks"].values()), "GPU")
  axes[0].set(
    xscale="log",
    yscale="log",
    xlabel="sequence length",
    ylabel="training-step tokens/s",
    title=f"tokens/s, bfloat16 ({where})",
  )
  axes[1].set(
    xscale="log",
    yscale="log",
    xlabel="sequence length",
    ylabel="tokens/s over hf-bert-sdpa's",
    title="relative to Hugging Face BERT (SDPA)",
  )
  for ax in axes:
    ax.set_xticks(seqs, [str(s) for s in seqs])
    ax.set_xticks([], minor=True)
    ax.grid(alpha=0.3, which="both")
  axes[1].axhline(1.0, color="grey", linewidth=0.8)
  handles, labels = axes[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="center right", fontsize=9, frameon=False)
  fig.tight_layout(rect=(0, 0, 0.86, 1))
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _write(out: pathlib.Path, run: dict, with_plot: bool, replot: bool = False) -> None:
  derive(run["rows"], run["peaks"])
  if not replot:
    run["meta"]["total_s"] = time.time() - run["meta"]["started_unix"]
  for name, text in (("gpu_bench.json", json.dumps(run, indent=1)), ("gpu_bench.md", markdown(run))):
    tmp = out / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, out / name)  # whole or not at all
  if with_plot:
    plot(run, out / "gpu_bench.png")


def _parse(argv: list[str]) -> argparse.Namespace:
  ap = argparse.ArgumentParser(
    prog="python -m efftx.gpu_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  names = lambda text: [x for x in text.split(",") if x]
  ap.add_argument("--out", help="the folder for gpu_bench.json, gpu_bench.md, gpu_bench.png and logs/")
  ap.add_argument(
    "--mixers",
    type=names,
    default=None,
    help="efftx mixers, or 'all' (default: all, attention and fnet first, random last; --dry_run: attention,fnet)",
  )
  ap.add_argument("--peers", type=names, default=list(HF_PEERS), help="Hugging Face peers: " + ", ".join(HF_PEERS))
  ap.add_argument(
    "--lengths",
    type=lambda t: [int(x) for x in names(t)],
    default=None,
    help="default 512,...,16384 (--dry_run: 64,128)",
  )
  ap.add_argument("--warmup", type=int, default=2, help="steps before timing (efftx: the compiling step included)")
  ap.add_argument("--steps", type=int, default=5, help="timed steps a row (the median is reported)")
  ap.add_argument("--budget_s", type=float, default=380, help="no row starts after this many seconds of the run")
  ap.add_argument("--row_timeout", type=float, default=60, help="seconds a row may take, compiling included")
  ap.add_argument("--start_timeout", type=float, default=180, help="seconds a worker may take to start")
  ap.add_argument("--dry_run", action="store_true", help="the same path on the CPU at tiny shapes")
  ap.add_argument("--replot", action="store_true", help="gpu_bench.md and gpu_bench.png from --out/gpu_bench.json")
  ap.add_argument("--worker", choices=("jax", "torch"), help=argparse.SUPPRESS)
  return ap.parse_args(argv)


def main(argv: list[str]) -> None:
  a = _parse(argv)
  if a.worker:
    return worker(a.worker, a.dry_run, a.warmup, a.steps)
  if not a.out:
    raise UserError("--out=FOLDER is required (where gpu_bench.json, gpu_bench.md and gpu_bench.png go)")
  out = pathlib.Path(a.out)
  if a.replot:
    if not (out / "gpu_bench.json").exists():
      raise UserError(f"--replot: {out / 'gpu_bench.json'} does not exist")
    run = json.loads((out / "gpu_bench.json").read_text())
    return _write(out, run, with_plot=True, replot=True)
  from efftx.mixers import MIXERS  # pylint: disable=g-import-not-at-top  (jax, not its backends)

  default = [m for m in FIRST if m in MIXERS] + [m for m in MIXERS if m not in FIRST + LAST] + list(LAST)
  if a.mixers is None:
    mixers = list(FIRST) if a.dry_run else default
  else:
    mixers = default if a.mixers == ["all"] else a.mixers
  unknown = [m for m in mixers if m not in MIXERS] + [p for p in a.peers if p not in HF_PEERS]
  if unknown:
    raise UserError(f"unknown: {', '.join(unknown)}; --mixers: {', '.join(MIXERS)}; --peers: {', '.join(HF_PEERS)}")
  if a.warmup < 1 or a.steps < 1:
    raise UserError("--warmup and --steps must be >= 1")
  size = "dry" if a.dry_run else "gpu"
  lengths = sorted(a.lengths or LENGTHS[size])
  (out / "logs").mkdir(parents=True, exist_ok=True)
  started = time.time()
  deadline = started + a.budget_s
  has_torch = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
  run = dict(
    meta=dict(
      argv=argv,
      dry_run=a.dry_run,
      shape=SHAPES[size],
      lengths=lengths,
      warmup=a.warmup,
      steps=a.steps,
      budget_s=a.budget_s,
      row_timeout=a.row_timeout,
      matmul_n=MATMUL_N[size],
      started=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
      started_unix=started,
      python=platform.python_version(),
      versions={},
    ),
    peaks={},
    rows=[],
  )
  print(
    f"efftx.gpu_bench{' --dry_run' if a.dry_run else ''}: {len(mixers)} mixers and {len(a.peers)} peers at "
    f"lengths {', '.join(map(str, lengths))}; budget {a.budget_s:.0f} s; writing {out}",
    flush=True,
  )
  try:
    for n, (kind, models) in enumerate(_stages(mixers, a.peers)):
      _stage(kind, models, lengths, a, run, out, deadline, has_torch, log=out / "logs" / f"{n}-{kind}.log")
      _write(out, run, with_plot=True)
  finally:
    _write(out, run, with_plot=True)
  ok = [r for r in run["rows"] if r["status"] == "ok"]
  print("\n" + markdown(run))
  print(
    f"{len(ok)} of {len(run['rows'])} rows measured in {time.time() - started:.0f} s; wrote "
    f"{out / 'gpu_bench.json'}, gpu_bench.md, gpu_bench.png",
    flush=True,
  )
  if run["rows"] and not ok:
    raise UserError(f"no row was measured: {run['rows'][0].get('reason', '')}")


def _stage(
  kind: str,
  models: list[str],
  lengths: list[int],
  a: argparse.Namespace,
  run: dict,
  out: pathlib.Path,
  deadline: float,
  has_torch: bool,
  log: pathlib.Path,
) -> None:
  """Measures `models` × `lengths` in workers of `kind`, one row at a time, appending every row to run["rows"]
  and rewriting the JSON and markdown after each."""
  hard_stop = deadline + a.row_timeout  # nothing waits past it: a row started at the deadline may still finish
  failed: dict[str, str] = {}  # model → why one of its lengths was not measured
  w = None
  try:
    for model in models:
      for seq in lengths:
        row = dict(model=model, seq=seq)
        if kind == "torch" and not has_torch:
          row.update(status="skipped", reason=TORCH_HINT)
        elif model in failed:
          row.update(status="skipped", reason=failed[model])
        elif time.time() > deadline:
          row.update(status="skipped", reason=f"the run's budget (--budget_s={a.budget_s:g}) was spent")
        else:
          if w is None:
            w, why = _start(kind, a, log, run, min(a.start_timeout, hard_stop - time.time()))
            if w is None:
              failed.update({m: f"the {kind} worker did not start: {why}" for m in models})
              row.update(status="failed", reason=failed[model])
          if w is not None:
            w, answer = _measure(w, model, seq, min(a.row_timeout, hard_stop - time.time()))
            row.update(answer)
          if row["status"] != "ok":
            failed.setdefault(model, f"a shorter length: {row['status']} at {seq}")
        run["rows"].append(row)
        _write(out, run, with_plot=False)
        _print_row(run["rows"][-1])
  except BaseException:  # SIGTERM, Ctrl-C: the worker goes too
    if w is not None:
      w.kill()
    raise
  if w is not None:
    w.close()


def _start(
  kind: str, a: argparse.Namespace, log: pathlib.Path, run: dict, timeout: float
) -> tuple[_Worker | None, str]:
  """(a started worker, "") after recording its framework's matmul rate and versions, or (None, why not)."""
  w = _Worker(kind, a, log)
  what, body = w.reply(timeout)
  if what != "READY":
    why = body.get("error") or (f"no answer in {timeout:.0f} s" if what == "TIMEOUT" else w.why_exited())
    w.kill()
    if body.get("no_gpu"):
      raise NoGPU(why)
    return None, why
  run["peaks"].setdefault(kind, body)
  run["meta"]["versions"].update({k: body[k] for k in ("jax", "torch", "transformers", "cuda") if body.get(k)})
  print(
    f"{kind} worker: {body['device_kind']} ({body['backend']}), bfloat16 {body['matmul_n']}³ matmul "
    f"{body['matmul_tflops']:.3g} TFLOP/s",
    flush=True,
  )
  return w, ""


def _measure(w: _Worker, model: str, seq: int, timeout: float) -> tuple[_Worker | None, dict]:
  """(the worker, or None where it was lost, and the row's answer): its measurements, or why there are none."""
  what, body = w.ask(model, seq, timeout)
  if what == "ROW":
    return w, body
  why = f"no answer in {timeout:.0f} s (--row_timeout, or the run's end)" if what == "TIMEOUT" else w.why_exited()
  w.kill()
  return None, dict(status="timeout" if what == "TIMEOUT" else "failed", reason=why)


def _print_row(r: dict) -> None:
  if r["status"] != "ok":
    return print(f"{r['model']:<22}{r['seq']:>6}: {r['status']}: {r.get('reason', '')}", flush=True)
  memory = "-" if r.get("peak_mib") is None else f"{r['peak_mib']:,.0f}"
  kernels = f", {', '.join(r['kernels']) or 'XLA fusions only'}" if "kernels" in r else ""
  print(
    f"{r['model']:<22}{r['seq']:>6}: {r['tokens_per_s']:>12,.0f} tokens/s, step {1e3 * r['median_step_s']:8.2f} "
    f"ms, MFU {'n/a' if r['mfu'] is None else format(100 * r['mfu'], '5.1f')} %, peak {memory} MiB{kernels}",
    flush=True,
  )


if __name__ == "__main__":
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # from `timeout`: write, then exit
  try:
    main(sys.argv[1:])
  except UserError as e:  # one line and exit code 2, as every efftx entry point
    print(f"efftx.gpu_bench: error: {e}", file=sys.stderr)
    sys.exit(2)
