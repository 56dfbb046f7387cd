"""Cost against length (LRA Table 2, FNet's memory table): does every attention-free mixer's training step keep
its speed and memory flat as sequences grow, while softmax attention's fall quadratically?

    python -m efftx.sweep experiments/cost_vs_length/sweep.py --workdir=/tmp/efftx/cost_vs_length   # --parallel=1
    python -m efftx.sweep experiments/cost_vs_length/sweep.py --workdir=DIR --scale=paper            # accelerators

Each point is one `python -m efftx.bench` row: the whole training step (forward, backward, AdamW) of one mixer at
one length, at the peer benchmark's shape (width 256, 4 layers, 4 heads, FF 1024, vocab 256, bidirectional,
float32, a per-token head) with a fixed 8192 tokens a step (batch = 8192 // length): train-step tokens/s (timed
after one warm-up step) and the compiled step's memory (XLA memory_analysis(): temp + arguments; deterministic).
Both are shown as ratios to softmax attention in its O(L²) form (attention_impl=plain; "attention" below) at the same
length; "attention_chunked" is the same attention computed in key blocks (attention_impl=chunked).

Paper, as ratios to the Transformer at the same length (PAPERS.md): LRA Table 2 (byte text, batch 32, GPU)
steps/s — Reformer 0.54 / 0.45 / 0.79 at 1K / 2K / 4K, Linear Transformer 1.12 / 1.90 / 5.57; peak memory —
Reformer 0.56 / 0.37 / 0.24. FNet paper (LRA, GPU) peak memory — FNet 0.50 / 0.33 / 0.18 at 512 / 1K / 2K
(Transformer out of memory at 4K and 8K). Here "lsh" is Reformer's LSH attention (without its reversible
layers) and "linear" the Linear Transformer's mixer.

Scale "cpu": lengths 256, 1024, 2048, 4096, 8192, ten mixers, 50 points, one measurement each (the timings are
one run on a shared machine: ratios within it, not absolute numbers). Run with --parallel=1: points that run
together share the cores and each other's timings. "paper": the same grid plus 16384, timed for 10 s each.
Expected (scale cpu, 2-core CPU, 17.6 min, 2026-11-30): the claim holds; at 8192 plain attention runs 215
tokens/s in 14.1 GiB, FNet 28.8× faster in 0.056× the memory, AFT-simple 18.6×, linear 19.5× (table.md).
"""
from efftx.sweep import grid

METRIC = "tokens_per_sec"
METRICS = ("memory_mib",)
GOAL = "max"
SOURCE = ("Tay et al., Long Range Arena (2021), Table 2 (steps/s and peak memory, byte text, GPU); Lee-Thorp et "
          "al., FNet (2022), LRA memory table (GPU); ratios to the Transformer at the same length")

MIXERS = {  # group label -> (mixer, bench --set overrides)
    "attention": ("attention", "attention_impl=plain"),
    "attention_chunked": ("attention", "attention_impl=chunked"),
    "fnet": ("fnet", ""),
    "aft_full": ("aft_full", ""),
    "aft_simple": ("aft_simple", ""),
    "aft_local": ("aft_local", ""),
    "aft_conv": ("aft_conv", ""),
    "local": ("local", ""),
    "linear": ("linear", ""),
    "lsh": ("lsh", ""),
}
BASELINE_MIXER = "attention"
LENGTHS = {"cpu": (256, 1024, 2048, 4096, 8192), "paper": (256, 1024, 2048, 4096, 8192, 16384)}
SECONDS = {"cpu": 2, "paper": 10}


def _group(label, length):
  return f"{label} L={length}"


_ALL_LENGTHS = sorted(set(LENGTHS["cpu"] + LENGTHS["paper"]))
X = ("sequence length (8192 tokens a step)", {_group(m, L): L for m in MIXERS for L in _ALL_LENGTHS})
SERIES = {_group(m, L): m for m in MIXERS for L in _ALL_LENGTHS}
BASELINE = {_group(m, L): _group(BASELINE_MIXER, L) for m in MIXERS for L in _ALL_LENGTHS}
PAPER = {
    _group("lsh", 1024): {"tokens_per_sec": 0.54, "memory_mib": 0.56},
    _group("lsh", 2048): {"tokens_per_sec": 0.45, "memory_mib": 0.37},
    _group("lsh", 4096): {"tokens_per_sec": 0.79, "memory_mib": 0.24},
    _group("linear", 1024): {"tokens_per_sec": 1.12},
    _group("linear", 2048): {"tokens_per_sec": 1.90},
    _group("linear", 4096): {"tokens_per_sec": 5.57},
    _group("fnet", 1024): {"memory_mib": 0.33},
    _group("fnet", 2048): {"memory_mib": 0.18},
}


def points(scale):
  groups = {}
  for label, (mixer, overrides) in MIXERS.items():
    for length in LENGTHS[scale]:
      # One device, as the table and the expectations above were measured (efftx.bench's default splits the
      # batch over the cores, and 8192 positions, one sequence, could not be split: rows would differ in kind).
      flags = {"mode": "mixers", "mixers": mixer, "lengths": length, "seconds": SECONDS[scale],
               "data_parallel": False}
      if overrides:
        flags["set"] = overrides
      groups[_group(label, length)] = {"bench": flags}
  # Lengths in the outer loop: a length's mixers are measured one after another, close in time.
  return sorted(grid(groups), key=lambda p: (X[1][p.group], list(MIXERS).index(SERIES[p.group])))


def claim(rows):
  """Held if, for every linear-time mixer, both ratios to plain attention improve from 1024 to the longest length
  measured (tokens/s ratio up, memory ratio down)."""
  by_group = {r["group"]: r for r in rows}
  longest = max(X[1][r["group"]] for r in rows)
  linear_time = ["fnet", "aft_simple", "aft_local", "aft_conv", "local", "linear", "lsh", "attention_chunked"]
  failed, speed = [], []
  for m in linear_time:
    short, long = by_group[_group(m, 1024)]["ratio"], by_group[_group(m, longest)]["ratio"]
    if not (long["tokens_per_sec"] > short["tokens_per_sec"] and long["memory_mib"] < short["memory_mib"]):
      failed.append(m)
    speed.append(f"{m} {long['tokens_per_sec']:.1f}×")
  verdict = "held" if not failed else f"did not hold for {', '.join(failed)}"
  return (f"{verdict}: tokens/s as a multiple of plain attention's at length {longest}: {', '.join(speed)}")
