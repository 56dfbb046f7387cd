"""Cost against length (LRA Table 2, FNet's memory table): does every attention-free mixer's training step keep
its tokens/s flat and its memory per sequence linear as sequences grow, while softmax attention's grow
quadratically?

    python -m efftx.sweep experiments/cost_vs_length/sweep.py --workdir=/tmp/efftx/cost_vs_length   # --parallel=1
    python -m efftx.sweep experiments/cost_vs_length/sweep.py --workdir=DIR --scale=paper            # accelerators

Each point is one `python -m efftx.bench` row: the whole training step (forward, backward, AdamW) of one mixer at
one length, at the peer benchmark's shape (width 256, 4 layers, 4 heads, FF 1024, vocab 256, bidirectional,
float32, a per-token head) with one sequence a step at every length (a fixed batch, as LRA Table 2 fixes its 32;
softmax attention at 8,192 takes 10.6 GiB a sequence, two 21 of 23 GiB): train-step tokens/s (timed after one
warm-up step) and the compiled step's memory (XLA memory_analysis(), deterministic): memory_mib is temp +
arguments, temp_mib the temporaries alone (activations, gradients, workspace), which the memory exponents are
fitted to.
Both are shown as ratios to softmax attention in its O(L²) form (attention_impl=plain; "attention" below) at the same
length; "attention_chunked" is the same attention computed in key blocks (attention_impl=chunked).

Paper, as ratios to the Transformer at the same length (PAPERS.md): LRA Table 2 (byte text, batch 32, 4×4 TPU
v3) steps/s — Reformer 0.54 / 0.45 / 0.79 at 1K / 2K / 4K, Linear Transformer 1.12 / 1.90 / 5.57; peak memory —
Reformer 0.56 / 0.37 / 0.24. FNet paper (LRA) peak memory — FNet 0.50 / 0.33 / 0.18 at 512 / 1K / 2K (Transformer
out of memory at 4K and 8K). Here "lsh" is Reformer's LSH attention (without its reversible layers) and "linear"
the Linear Transformer's mixer. Those ratios belong to their platform and batch; what carries over to a CPU is
how cost grows with length, so the verdicts are on each mixer's exponent: the slope of log(time per sequence)
and log(temporaries per sequence) against log(length) from 1,024 to the longest length (1: linear, 2: quadratic).
"attention_chunked" computes softmax attention in key blocks: still quadratic work, so it is not one of the
linear-time mixers.

Scale "cpu": lengths 256, 1024, 2048, 4096, 8192, ten mixers, 3 interleaved repeats (150 measurements, about an
hour): every point once, then every point again, so that a slow spell of the shared machine touches all mixers
alike; ratios are medians of the repeats' paired ratios. Run with --parallel=1: points that run together share the
cores and each other's timings. "paper": the same grid plus 16384, timed for 10 s each.
"""

from efftx.sweep import Panel
from efftx.sweep import Plot
from efftx.sweep import grid
from efftx.sweep import stats

METRIC = "tokens_per_sec"
METRICS = ("memory_mib", "temp_mib")
GOAL = "max"
SOURCE = (
  "Tay et al., Long Range Arena (2021), Table 2 (steps/s and peak memory, byte text, batch 32, 4×4 TPU "
  "v3); Lee-Thorp et al., FNet (2022), LRA memory table; ratios to the Transformer at the same length"
)
PAPER_SCALES = ()  # no scale here runs the paper's platform and batch: its ratios are given in the text
PAPER_SETTING = "LRA's byte-text model, batch 32 at every length, 4×4 TPU v3 (LRA Table 2); FNet's on GPU"
SETTING = {
  "cpu": "width 256, 4 layers, 4 heads, FF 1024, float32, batch 1 at every length, one CPU device; 3 "
  "interleaved repeats, each timed ≥ 2 s after a warm-up step",
  "paper": "the cpu grid plus 16,384 on an accelerator, batch 1, timed 10 s; 3 interleaved repeats",
}
REPEATS = 3
LINEAR_TIME = ("fnet", "aft_simple", "aft_local", "aft_conv", "local", "linear", "lsh")
# What each mixer's paper (or construction) says of its cost per sequence: {"time"/"memory": (linear?, why)}.
EXPECTED = {
  "attention": {"time": (False, "L × L scores"), "memory": (False, "L × L scores kept for the backward pass")},
  "attention_chunked": {
    "time": (False, "the same L × L scores, a key block at a time"),
    "memory": (True, "key blocks with an online softmax: no L × L array"),
  },
  "aft_full": {"time": (False, "AFT paper: O(T²d) time"), "memory": (True, "AFT paper: memory linear in T")},
  **{
    m: {"time": (True, "linear-time mixer (its paper)"), "memory": (True, "linear-memory mixer (its paper)")}
    for m in LINEAR_TIME
  },
}

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
BATCH = 1  # sequences a step, at every length: memory and time per sequence are then the step's own
# The memory the exponents are fitted to: the compiled step's temporaries (activations kept for the backward pass,
# gradients, workspace), without its arguments (parameters, optimizer state, the batch), whose size does not grow
# with the sequence and would flatten every exponent at batch 1. memory_mib (both) is in the table.
MEMORY = "temp_mib"


def _group(label, length):
  return f"{label} L={length}"


_ALL_LENGTHS = sorted(set(LENGTHS["cpu"] + LENGTHS["paper"]))
_LENGTH = {_group(m, L): L for m in MIXERS for L in _ALL_LENGTHS}  # group -> its length
_MIXER = {_group(m, L): m for m in MIXERS for L in _ALL_LENGTHS}  # group -> its mixer's label
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
      # One device (efftx.bench's default splits the batch over the cores; one sequence cannot be split).
      flags = {
        "mode": "mixers",
        "mixers": mixer,
        "lengths": length,
        "tokens": BATCH * length,
        "seconds": SECONDS[scale],
        "data_parallel": False,
      }
      if overrides:
        flags["set"] = overrides
      groups[_group(label, length)] = {"bench": flags}
  # Repeats in the outer loop, then lengths: a length's mixers are measured one after another, close in time.
  return sorted(
    grid(groups, repeats=REPEATS), key=lambda p: (p.seed, _LENGTH[p.group], list(MIXERS).index(_MIXER[p.group]))
  )


def _costs(rows, label, metric, shortest=1024):
  """(lengths, [cost per sequence at each length] per repeat) of one mixer: time per sequence is L / tokens/s,
  memory per sequence is the step's memory ÷ BATCH."""
  by_length = {
    _LENGTH[r["group"]]: r for r in rows if _MIXER.get(r["group"]) == label and _LENGTH[r["group"]] >= shortest
  }
  lengths = sorted(by_length)
  repeats = set.intersection(*(set(by_length[L]["seeds"]) for L in lengths)) if lengths else set()
  out = []
  for k in sorted(repeats):
    key = "value" if metric == METRIC else metric
    cost = [
      L / by_length[L]["seeds"][k][key] if metric == METRIC else by_length[L]["seeds"][k][key] / BATCH for L in lengths
    ]
    out.append(cost)
  return lengths, out


# The seeds (or repeats) each verdict rests on, fixed before the runs (efftx/sweep/README.md): the exponents' repeats.
DESIGN = {"cpu": REPEATS, "paper": REPEATS}


def _exponent(rows, label, metric):
  """(lengths, the exponent of cost per sequence in length with its interval, or None where it cannot be computed)
  of one mixer: time from the repeats (one log-log slope per repeat, their t-interval), memory (compiled, the same
  in every repeat) from the log-log fit's own interval over the lengths, which a curved growth widens. None where
  there are fewer than two lengths or no repeats: nothing to judge."""
  lengths, costs = _costs(rows, label, metric)
  if len(lengths) < 2 or not costs:
    return None
  if metric == METRIC:
    return lengths, stats.interval([stats.loglog_slope(lengths, c) for c in costs], unit="repeats")
  return lengths, stats.fitted_slope(lengths, costs[0], log=True)


_JUDGED = ("attention", "attention_chunked", "aft_full", *LINEAR_TIME)


def _panels(rows):
  """The exponents the verdicts judge, every mixer on one axis with its interval, against the threshold 1.5."""
  lines = {}
  for i, label in enumerate(_JUDGED):
    for metric, what, shift in ((METRIC, "time (t over repeats)", -0.12), (MEMORY, "working memory (fit)", 0.12)):
      found = (_exponent(rows, label, metric) or (None, None))[1]
      if found is not None:
        low, high = (found.low, found.high) if found.low is not None else (found.mean, found.mean)
        lines.setdefault(what, []).append((i + shift, found.mean, low, high))
  return [
    Panel(
      "exponent of cost per sequence in length (log-log)",
      "",
      "exponent (95 % interval)",
      lines,
      levels={"claim: above / below 1.5": 1.5},
      xticks=dict(enumerate(_JUDGED)),
      join=False,
    )
  ]


PLOT = Plot(x=("sequence length (one sequence a step)", _LENGTH), series=_MIXER, quantities=_panels)


def claim(rows, scale):
  """Each mixer's cost per sequence grows as its paper says (EXPECTED): an exponent below 1.5 (between linear and
  quadratic) for linear cost, above it for quadratic; time from the repeats (an interval), memory from the
  log-log fit's standard error over the lengths (compiled memory is deterministic; the fit is not). Then LRA's
  own ratios beside ours: their platform and batch are not ours, so no verdict."""
  out = []
  for label in _JUDGED:
    for metric, what in ((METRIC, "time"), (MEMORY, "memory")):
      exponent = _exponent(rows, label, metric)
      if exponent is None:
        continue
      lengths, found = exponent
      linear, paper = EXPECTED[label][what]
      out.append(
        stats.judge(
          f"{label}: {'time' if what == 'time' else 'working memory (XLA temporaries)'} per sequence grows "
          + ("sub-quadratically (exponent < 1.5)" if linear else "about quadratically (exponent > 1.5)"),
          paper,
          f"exponent {found.text(3) if found else '—'} over lengths {lengths[0]}–{lengths[-1]}",
          found,
          1.5,
          True,
          above=not linear,
        )
      )
  by_group = {r["group"]: r for r in rows}
  shown = []
  for g, value in PAPER.items():
    if g in by_group:
      for m, paper_ratio in value.items():
        ours, spread = by_group[g]["ratio"].get(m), (by_group[g].get("ratio_range") or {}).get(m)
        if ours is not None:
          shown.append(
            f"{g} {m} {paper_ratio:g} vs ours {ours:.3g}"
            + (f" [range {spread[0]:.3g}–{spread[1]:.3g}]" if spread else "")
          )
  if shown:
    out.append(
      stats.Claim(
        "LRA's and FNet's ratios to the Transformer",
        "TPU v3 / GPU, batch 32",
        "; ".join(shown),
        stats.UNTESTED,
        "another platform and batch: ratios do not carry over, exponents do",
      )
    )
  return out
