"""Memory against depth (Reformer, Kitaev et al. 2020): do reversible layers make a training step's memory
independent of the number of layers, and what does recomputing the activations cost?

    python -m efftx.sweep experiments/reversible/sweep.py --workdir=/tmp/efftx/reversible   # --parallel=1
    python -m efftx.sweep experiments/reversible/sweep.py --workdir=DIR --scale=paper        # accelerators

Each point is one `python -m efftx.bench` row: the whole training step (forward, backward, AdamW) of an attention
model (attention_impl=chunked), width 512, 8 heads, FF 2048 (a width where activations, not parameters, dominate a
layer's memory), 2,048 tokens a step (batch 8 at length 256, 2 at 1024), float32, in five variants: plain
residual blocks, reversible couplings (model.reversible), each with and without the chunked feed-forward
(model.ff_chunk_size=128), and the same couplings stored by autodiff ("stored": model.reversible_recompute=false).
Memory: XLA memory_analysis() of the compiled step (deterministic). Its growth per
layer holds one gradient copy of the layer's parameters whatever the blocks are; the activations a layer adds are
that growth minus the layer's parameter bytes (param_mib's growth per layer), which is what Reformer's claim is
about. Time: tokens/s after one warm-up step at depths 2, 8 and 24 (48 is compiled, not timed), 3 interleaved
repeats (8 for reversible and stored at depth 24, the points the time claim reads); the time claim's quantity is
the repeats' paired reversible ÷ stored ratios, with their t-interval.

Paper (Reformer, section 3 and Table 5; PAPERS.md): reversible layers store activations once, not per layer, so
activation memory is independent of depth (max(b·l·d, b·n_h·l·n_r·c) rather than n_l times that); the cost is
recomputing each layer's forward in the backward pass. The paper reports no per-depth memory numbers.

Scale "cpu": depths 2, 8, 24, 48 at lengths 256 and 1024 — the timed points × 3 repeats (the claim's 4 groups × 8)
and the depth-48 points compiled once (compiled memory is deterministic), about an hour and a half; run with
--parallel=1 (points that run together share the cores and each other's timings). The time claim compares
reversible couplings with the same couplings differentiated by plain autodiff ("stored":
model.reversible_recompute=false), one scanned program against the other, so the ratio is recomputation's cost
alone; plain residual blocks (a Python loop over layers) are the memory claim's baseline. The recomputation's
FLOPs (XLA's cost analysis, one layer): tests/test_reversible.py and experiments/reversible/flops.py.
"paper": width 1024, FF 4096, 16 heads, length 4096, depths 2 to 96, timed for 10 s (accelerators).
"""

from efftx.sweep import Panel
from efftx.sweep import Plot
from efftx.sweep import grid
from efftx.sweep import stats

METRIC = "temp_mib"
METRICS = ("tokens_per_sec", "param_mib")
GOAL = "min"
PAPER_SETTING = (
  "Reformer: enwik8 / imagenet64 models of 12–20 layers, width 1024, length 4096–65536, TPU; the claim "
  "is analytic (activation memory without a factor of layers), with no per-depth table"
)
SETTING = {
  "cpu": "attention, width 512, 8 heads, FF 2048, 2,048 tokens a step, lengths 256 and 1024, depths 2–48, "
  "float32, one CPU device; 3 interleaved repeats (8 for reversible and stored couplings at depth 24)",
  "paper": "width 1024, FF 4096, 16 heads, length 4096, depths 2–96 on an accelerator; 3 repeats (8 for reversible "
  "and stored couplings at depth 96)",
}
PAPER_SCALES = ()
REPEATS = 3
# The time claim's two groups per length (reversible and stored couplings at the deepest timed depth) get 8
# repeats, declared before their runs (DESIGN).
CLAIM_REPEATS = 8
VARIANTS = {  # name: (model.reversible, model.ff_chunk_size, model.reversible_recompute)
  "plain": (False, 0, True),
  "reversible": (True, 0, True),
  "stored": (True, 0, False),
  "plain+ff_chunk": (False, 128, True),
  "reversible+ff_chunk": (True, 128, True),
}
TIME_PAIR = ("reversible", "stored")  # the time claim: recomputing ÷ storing, the same scanned couplings
SCALES = {
  "cpu": {
    "lengths": (256, 1024),
    "depths": (2, 8, 24, 48),
    "timed": (2, 8, 24),
    "seconds": 2,
    "tokens": 2048,
    "shape": "d_model=512,d_ff=2048,num_heads=8",
  },
  "paper": {
    "lengths": (4096,),
    "depths": (2, 8, 24, 48, 96),
    "timed": (2, 8, 24, 48, 96),
    "seconds": 10,
    "tokens": 8192,
    "shape": "d_model=1024,d_ff=4096,num_heads=16",
  },
}


def _group(variant, length, depth):
  return f"{variant} L={length} depth={depth}"


_KEYS = [(v, L, d) for v in VARIANTS for s in SCALES.values() for L in s["lengths"] for d in s["depths"]]


def points(scale):
  s = SCALES[scale]
  groups = {}
  for length in s["lengths"]:
    for variant, (reversible, chunk, recompute) in VARIANTS.items():
      for depth in s["depths"]:
        overrides = (
          f"{s['shape']},attention_impl=chunked,num_layers={depth},"
          f"reversible={str(reversible).lower()},ff_chunk_size={chunk}"
          + ("" if recompute else ",reversible_recompute=false")
        )
        groups[_group(variant, length, depth)] = {
          "bench": {
            "mode": "mixers",
            "mixers": "attention",
            "lengths": length,
            "set": overrides,
            "tokens": s["tokens"],
            "seconds": s["seconds"] if depth in s["timed"] else 0,
            "data_parallel": False,
          }
        }  # one device: the whole batch's memory, as the table was measured
  deepest = max(s["timed"])
  judged = {
    g: spec for g, spec in groups.items() if any(g == _group(v, L, deepest) for v in TIME_PAIR for L in s["lengths"])
  }
  timed = {g: spec for g, spec in groups.items() if spec["bench"]["seconds"] and g not in judged}
  compiled_only = {g: spec for g, spec in groups.items() if not spec["bench"]["seconds"]}
  # Compiled memory is deterministic: a point that is not timed is measured once.
  return sorted(
    grid(timed, repeats=REPEATS) + grid(judged, repeats=CLAIM_REPEATS) + grid(compiled_only), key=lambda p: p.seed
  )


# The seeds (or repeats) each verdict rests on, fixed before the runs (efftx/sweep/README.md): the time claim's
# CLAIM_REPEATS paired repeats of reversible and stored couplings (the memory claims are exact).
DESIGN = {"cpu": CLAIM_REPEATS, "paper": CLAIM_REPEATS}


def _activations_per_layer(by_group, variant, length, depths):
  """{(d, d'): MiB} for consecutive depths d < d': the compiled temp memory a layer adds between them, net of the
  parameters' bytes (the gradient copy a training step holds of every layer): measured at each depth, not fitted."""
  temp = {d: by_group[_group(variant, length, d)]["mean"] for d in depths}
  params = {d: by_group[_group(variant, length, d)]["metrics"]["param_mib"]["mean"] for d in depths}
  return {(a, b): (temp[b] - temp[a] - (params[b] - params[a])) / (b - a) for a, b in zip(depths, depths[1:])}


def _memory_shares(by_group, length):
  """(reversible, plain) activations per added layer, {(d, d'): MiB}, at the depths both were measured; None
  with fewer than two such depths."""
  keys = [(v, L, d) for (v, L, d) in _KEYS if L == length and _group(v, L, d) in by_group]
  depths = {
    v: {d for (w, _, d) in keys if w == v and by_group[_group(w, length, d)]["mean"] is not None}
    for v in ("plain", "reversible")
  }
  common = sorted(depths["plain"] & depths["reversible"])
  if len(common) < 2:
    return None
  return tuple(_activations_per_layer(by_group, v, length, common) for v in ("reversible", "plain"))


def _time_ratios(by_group, length):
  """(depth, [reversible ÷ stored tokens/s of each paired repeat]) at the deepest depth with timed reversible
  couplings; None without timed ones, (depth, None) without stored couplings at it."""
  timed = sorted(
    d
    for (v, L, d) in _KEYS
    if v == TIME_PAIR[0]
    and L == length
    and _group(v, L, d) in by_group
    and by_group[_group(v, L, d)]["metrics"]["tokens_per_sec"]["mean"]
  )
  if not timed:
    return None
  d = timed[-1]
  if _group(TIME_PAIR[1], length, d) not in by_group:
    return d, None
  rev, stored = by_group[_group(TIME_PAIR[0], length, d)], by_group[_group(TIME_PAIR[1], length, d)]
  return d, [
    rev["seeds"][k]["tokens_per_sec"] / stored["seeds"][k]["tokens_per_sec"]
    for k in rev["seeds"]
    if k in stored["seeds"] and rev["seeds"][k].get("tokens_per_sec") and stored["seeds"][k].get("tokens_per_sec")
  ]


def _panels(rows):
  """The claims' quantities: the share of a plain layer's activations a reversible layer adds at each pair of
  depths (exact), and the paired reversible ÷ stored tokens/s with its t-interval and each repeat."""
  by_group = {r["group"]: r for r in rows}
  lengths = sorted({L for (_, L, _) in _KEYS if any(_group(v, L, d) in by_group for v, _, d in _KEYS)})
  shares, pairs = {}, []
  for L in lengths:
    found = _memory_shares(by_group, L)
    if found:
      rev, plain = found
      shares[L] = {pair: rev[pair] / plain[pair] for pair in rev if plain[pair] > 0}
      pairs += [p for p in shares[L] if p not in pairs]
  x = {pair: i for i, pair in enumerate(sorted(pairs))}
  memory = Panel(
    "activations a reversible layer adds ÷ a plain layer's",
    "depths (d → d')",
    "share (exact: compiled memory)",
    {f"length {L}": [(x[p], v, v, v) for p, v in sorted(s.items())] for L, s in shares.items() if s},
    levels={"claim: < 0.1": 0.1},
    xticks={i: f"{a}→{b}" for (a, b), i in x.items()},
    yscale="log",  # the shares span six orders of magnitude (report: linear where one is not positive)
  )
  lines, dots, ticks = {}, {}, {}
  for i, L in enumerate(lengths):
    found = _time_ratios(by_group, L)
    if found and found[1]:
      d, ratios = found
      mean = stats.interval(ratios, unit="repeats")
      if mean is None:
        continue
      label = f"reversible ÷ stored couplings, {d} layers"
      lines.setdefault(label, []).append((i, mean.mean, mean.low or mean.mean, mean.high or mean.mean))
      dots.setdefault(label, []).append((i, ratios))
      ticks[i] = f"length {L}"
  time = Panel(
    "recomputation's cost in throughput",
    "",
    "tokens/s ratio (mean, 95 % t-interval, paired repeats)",
    lines,
    dots=dots,
    levels={"claim: ≥ 0.75 (one extra forward of three)": 0.75},
    xticks=ticks,
    join=False,
  )
  return [p for p in (memory, time) if p.lines]


# Compiled memory against depth (a straight line on a linear axis), and the two claims' own quantities.
PLOT = Plot(
  x=("layers", {_group(*k): k[2] for k in _KEYS}),
  series={_group(*k): f"{k[0]}, length {k[1]}" for k in _KEYS},
  xscale="linear",
  metrics=("temp_mib",),
  quantities=_panels,
)


def claim(rows, scale):
  """Reversible layers' activation memory has no factor of layers: between every two consecutive depths, the
  activations a reversible layer adds (memory growth per layer net of its parameters' bytes) are under a tenth of
  a plain layer's, at every length; the worst pair is the verdict (exact: compiled memory). And the time cost is
  at most one extra forward pass: reversible ÷ stored couplings tokens/s ≥ 0.75 (a step is about three forward
  passes' work, so one more makes four: 3/4) at the deepest timed depth, from the paired repeats."""
  by_group = {r["group"]: r for r in rows}
  lengths = sorted({L for (v, L, d) in _KEYS if _group(v, L, d) in by_group})
  out = []
  for L in lengths:
    found = _memory_shares(by_group, L)
    if found:
      rev, plain = found
      claim_text = f"reversible layers add no activation memory per layer (length {L})"
      if any(plain[pair] <= 0 for pair in plain):
        out.append(
          stats.judge(
            claim_text,
            "activations stored once, not per layer (analytic)",
            "plain: " + "; ".join(f"{a}→{b}: {plain[(a, b)]:.3g} MiB" for a, b in plain),
            stats.exact(float("nan")),
            0.1,
            False,
            "a plain layer adds no activation memory between some depths: no share to judge",
            above=False,
          )
        )
      else:
        shares = {pair: rev[pair] / plain[pair] for pair in rev}
        worst = max(shares, key=shares.get)
        out.append(
          stats.judge(
            claim_text,
            "activations stored once, not per layer (analytic)",
            "activations per added layer, reversible vs plain, by depths: "
            + "; ".join(f"{a}→{b}: {rev[(a, b)]:.3g} vs {plain[(a, b)]:.3g} MiB" for a, b in rev)
            + f" (worst {shares[worst]:.2%}, {worst[0]}→{worst[1]})",
            stats.exact(shares[worst]),
            0.1,
            True,
            above=False,
          )
        )
    timed = _time_ratios(by_group, L)
    if timed and timed[1] is None:
      out.append(
        stats.judge(
          f"recomputation costs at most one forward pass (length {L}, {timed[0]} layers)",
          "one extra forward in the backward pass",
          "—",
          stats.exact(float("nan")),
          0.75,
          False,
          "no stored-couplings runs to compare with (model.reversible_recompute=false)",
        )
      )
    elif timed:
      d, ratios = timed
      found = stats.interval(ratios, unit="repeats")
      out.append(
        stats.judge(
          f"recomputation costs at most one forward pass (length {L}, {d} layers)",
          "one extra forward in the backward pass",
          f"reversible ÷ stored couplings tokens/s {found.text(3) if found else '—'} (median "
          f"{stats.median(ratios):.3g} of {len(ratios)} paired repeats)"
          if ratios
          else "—",
          found,
          0.75,
          True,
        )
      )
  return out
