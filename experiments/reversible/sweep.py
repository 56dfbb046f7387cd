"""Memory against depth (Reformer, Kitaev et al. 2020): do reversible layers make a training step's memory
independent of the number of layers, and what does recomputing the activations cost?

    python -m efftx.sweep experiments/reversible/sweep.py --workdir=/tmp/efftx/reversible   # --parallel=1
    python -m efftx.sweep experiments/reversible/sweep.py --workdir=DIR --scale=paper        # accelerators

Each point is one `python -m efftx.bench` row: the whole training step (forward, backward, AdamW) of an attention
model (attention_impl=chunked: what "auto" chose on CPU when the table was made), width 128, 4 heads, FF 512,
8192 tokens a step (batch 32 at length 256, 8 at 1024), float32, in four variants: plain residual blocks,
reversible couplings (model.reversible), each with and without the chunked feed-forward (model.ff_chunk_size=128). Memory: XLA
memory_analysis() of the compiled step, temp (activations and scratch; deterministic). tokens/s: timed after one
warm-up step at depths 2, 8 and 24 (48 is compiled, not timed).

Paper (Reformer, section 3 and Table 5; PAPERS.md): reversible layers store activations once, not per layer, so
memory is independent of depth (max(b·l·d, b·n_h·l·n_r·c) rather than n_l times that); the cost is recomputing
each layer's forward in the backward pass. The paper reports no per-depth memory numbers to compare with.

Scale "cpu": depths 2, 8, 24, 48 at lengths 256 and 1024, 32 points, one measurement each; run with --parallel=1
(points that run together share the cores and each other's timings). "paper": width 1024, FF 4096, 16 heads,
length 4096, depths 2 to 96, timed for 10 s (accelerators).
Expected (scale cpu, 2-core CPU, 14.4 min, 2026-11-30): reversible memory grows 1.23× (length 256) and 1.14×
(1024) from 2 to 48 layers against plain's 21.7× and 17.0×; reversible ÷ plain tokens/s 0.64–0.97, so the
sweep's verdict is "did not hold" on the time bound at one point (README.md).
"""
from efftx.sweep import grid

METRIC = "temp_mib"
METRICS = ("tokens_per_sec",)
GOAL = "min"

VARIANTS = {"plain": (False, 0), "reversible": (True, 0), "plain+ff_chunk": (False, 128),
            "reversible+ff_chunk": (True, 128)}
SCALES = {
    "cpu": {"lengths": (256, 1024), "depths": (2, 8, 24, 48), "timed": (2, 8, 24), "seconds": 2,
            "shape": "d_model=128,d_ff=512,num_heads=4"},
    "paper": {"lengths": (4096,), "depths": (2, 8, 24, 48, 96), "timed": (2, 8, 24, 48, 96), "seconds": 10,
              "shape": "d_model=1024,d_ff=4096,num_heads=16"},
}


def _group(variant, length, depth):
  return f"{variant} L={length} depth={depth}"


_KEYS = [(v, L, d) for v in VARIANTS for s in SCALES.values() for L in s["lengths"] for d in s["depths"]]
X = ("layers", {_group(*k): k[2] for k in _KEYS})
XSCALE = "linear"  # memory grows linearly with depth: a straight line on this axis
SERIES = {_group(*k): f"{k[0]}, length {k[1]}" for k in _KEYS}


def points(scale):
  s = SCALES[scale]
  groups = {}
  for length in s["lengths"]:
    for variant, (reversible, chunk) in VARIANTS.items():
      for depth in s["depths"]:
        overrides = (f"{s['shape']},attention_impl=chunked,num_layers={depth},"
                     f"reversible={str(reversible).lower()},ff_chunk_size={chunk}")
        groups[_group(variant, length, depth)] = {"bench": {
            "mode": "mixers", "mixers": "attention", "lengths": length, "set": overrides,
            "seconds": s["seconds"] if depth in s["timed"] else 0,
            "data_parallel": False}}  # one device: the whole batch's memory, as the table was measured
  return grid(groups)


def claim(rows):
  """Held if reversible memory grows by less than 1.5× from the shallowest to the deepest model at every length
  (plain grows about linearly), at a time cost of at most one extra forward pass (reversible ÷ plain tokens/s
  ≥ 0.67 at every timed depth: a step is about three forward passes, recomputation adds one)."""
  by_group = {r["group"]: r for r in rows}
  keys = [(v, L, d) for (v, L, d) in _KEYS if _group(v, L, d) in by_group]
  lengths = sorted({L for _, L, _ in keys})
  depths = sorted({d for _, _, d in keys})
  mem = lambda v, L, d: by_group[_group(v, L, d)]["mean"]
  speed = lambda v, L, d: by_group[_group(v, L, d)]["metrics"]["tokens_per_sec"]["mean"]
  growth = {L: mem("reversible", L, depths[-1]) / mem("reversible", L, depths[0]) for L in lengths}
  plain_growth = {L: mem("plain", L, depths[-1]) / mem("plain", L, depths[0]) for L in lengths}
  ratios = [speed("reversible", L, d) / speed("plain", L, d) for L in lengths for d in depths
            if speed("plain", L, d) and speed("reversible", L, d)]
  held = all(g < 1.5 for g in growth.values()) and min(ratios) >= 0.67
  saving = {L: mem("plain", L, depths[-1]) / mem("reversible", L, depths[-1]) for L in lengths}
  return (f"{'held' if held else 'did not hold'}: from {depths[0]} to {depths[-1]} layers reversible memory grows "
          + ", ".join(f"{growth[L]:.2f}× at length {L}" for L in lengths) + " (plain: "
          + ", ".join(f"{plain_growth[L]:.1f}×" for L in lengths) + f"); at {depths[-1]} layers it needs "
          + ", ".join(f"{saving[L]:.0f}×" for L in lengths) + " less than plain; reversible ÷ plain tokens/s "
          f"{min(ratios):.2f}–{max(ratios):.2f}")
