"""MQAR capability (Zoology, Arora et al. 2023, Figure 2): softmax attention recalls every key at every width;
where do the attention-free mixers fail?

    python -m efftx.sweep experiments/mqar/sweep.py --workdir=/tmp/efftx/mqar --parallel=2
    python -m efftx.sweep experiments/mqar/sweep.py --workdir=DIR --scale=paper     # accelerators

Claim tested (Figure 2, multi-query associative recall, vocab 8192, 2 layers): attention reaches ≈ 100 % query
accuracy in every setting (64x4, 128x8, 256x16) at every width (64 to 512); the attention-free and
gated-convolution mixers need far larger widths to approach it, and fail at width 64. Zoology reports best of its
learning rates {1e-4, 4.6e-4, 2.2e-3, 1e-2} per point; so does this table (one row per mixer × setting × width).
Zoology has no AFT, FNet-style or LSH rows: for those this is a measurement, not a replication.

Ours: configs/mqar.py (Zoology's task, schedule and N(0, 0.02²) initialisation), metric the validation query
accuracy at the last step; the head computes logits at the query positions only. Each mixer gets Zoology's
protocol (PROTOCOL): attention 2 layers, the other mixers 4, no feed-forward sublayer (model.d_ff=0), 1 head,
Zoology's four learning rates searched per mixer and width (best_then_seeds: every rate on seed 0, then seeds 1
and 2 at the best; LSH and attention, its pair, seeds 1–7: LSH's outcome is bimodal — of its first three seeds one
learned the task and two stayed at a guess — so three seeds cannot estimate how often it learns), the slow learners
(4-layer mixers) trained 3× attention's steps. LSH hashes into 4 buckets
with chunks of 16 positions, so that at length 64 a query sees its own bucket's keys, not all 64 (with efftx's
default chunk of 64 the sequence is one chunk: full shared-QK attention).
Scale "cpu": setting 64x4_v256 (Zoology's own first example: vocab 256, length 64, 4 pairs, 10k training
examples), width 64 (the claim's smallest width, where Figure 2 separates the mixers), batch 32, attention 2,000
steps (6.4 epochs), the others 6,000 — 24 search runs and 22 seed runs, about 2 hours on 2 cores with
--parallel=2 (the sweep resumes where it stopped); for Figure 2's x-axis on this easier task, set
SCALES["cpu"]["widths"] = (64, 128, 256) (about three times as long). "paper": Figure 2's settings 64x4, 128x8,
256x16 at vocab 8192, widths 64–512, 64 epochs for every mixer.
"""

from configs import mqar as mqar_config
from efftx.data import mqar as mqar_data
from efftx.sweep import Plot
from efftx.sweep import best_then_seeds
from efftx.sweep import stats

CONFIG = "configs/mqar.py"
METRIC = "eval_accuracy"
GOAL = "max"
SOURCE = "Arora et al., Zoology (2023), Figure 2 (attention: ≈ 1.0 in every setting and width)"

PAPER_SCALES = ("paper",)
PAPER_SETTING = (
  "Figure 2: vocab 8192, settings 64x4, 128x8, 256x16, 100k training examples, widths 64–512, "
  "attention 2 layers and the other mixers 4, no feed-forward, 64 epochs, best of 4 learning rates"
)
SETTING = {
  "cpu": "setting 64x4_v256 (vocab 256, 10k training examples: an easier task than Figure 2's), width 64, "
  "batch 32, attention 2,000 steps and the other mixers 6,000, best of Zoology's 4 learning rates on "
  "seed 0, then seeds 1 and 2 at it (LSH and attention 1–7)",
  "paper": "Figure 2's settings, widths and 64 epochs, best of the 4 learning rates on seed 0, then seeds 1–3 at it",
}
PROTOCOL = {
  s: "Zoology's per mixer: attention 2 layers, every other mixer 4; no feed-forward (d_ff=0); 1 head; "
  "AdamW (weight decay 0.1), cosine decay, learning rates {1e-4, 4.6e-4, 2.2e-3, 1e-2} searched on seed "
  "0 per mixer and width, "
  + (
    "seeds 1 and 2 at the best (LSH and attention: seeds 1–7, LSH's outcome being bimodal); attention 2,000 steps, "
    "the others 6,000 (the slow learners get 3×)."
    if s != "paper"
    else "seeds 1–3 at the best for every mixer; 64 epochs for every mixer."
  )
  + " LSH: 4 buckets, chunks of 16. Unlike Zoology, configs/mqar.py warms up for one epoch and clips gradients at "
  "norm 1 (Zoology: neither; experiments/zoology_fig2 runs its recipe exactly)."
  for s in ("cpu", "paper")
}
LEARNING_RATES = (1e-4, 4.6e-4, 2.2e-3, 1e-2)  # Zoology: logspace(1e-4, 1e-2, 4)
DEPTH = {"attention": 2}  # every other mixer: 4 (zoology experiments/iclr24_zoology_figure2/configs.py)
# LSH learns the task on some seeds and not on others; 8 seeds (attention too, for paired differences) estimate how
# often, where 3 give an interval wider than the range. Run so at the cpu scale, after a first look (the fixed design
# refuses a verdict from them); the paper's scale runs every mixer on DESIGN's seeds.
MORE_SEEDS = {"cpu": ("lsh", "attention"), "paper": ()}
# Where a group's seeds split into those that learned the task and those that did not, the report and the claims
# count them (stats.count, stats.paired_count) instead of putting a t-interval on their mean. At the cpu scale a
# seed learned where its validation accuracy passes one half: a guess among 64x4_v256's 4 values is 0.25 and recall
# of every key 1, and its runs' outcomes are bimodal (each seed ends at 0.24–0.28 or at 0.94 and above), so any
# threshold from 0.28 to 0.94 counts the same seeds (chosen after those runs were seen). At the paper's scale, where
# Figure 2's accuracies are graded and a guess is 1/4 to 1/16, Zoology's own criterion (it stops a run above 0.99).
SOLVED = {"cpu": {"eval_accuracy": 0.5}, "paper": {"eval_accuracy": 0.99}}
MIXER_OVERRIDES = {"lsh": {"mixer.lsh_chunk": 16, "mixer.lsh_buckets": 4}}
SCALES = {
  "cpu": {
    "mixers": ("attention", "aft_full", "aft_simple", "aft_conv", "linear", "lsh"),
    "settings": ("64x4_v256",),
    "widths": (64,),
    "steps": {"attention": 2_000, "others": 6_000},
  },
  "paper": {
    "mixers": ("attention", "aft_full", "aft_simple", "aft_conv", "linear", "lsh"),
    "settings": ("64x4", "128x8", "256x16"),
    "widths": (64, 128, 256, 512),
    "steps": {},
  },
}
_ALL = [
  (m, s, d)
  for m in SCALES["paper"]["mixers"]
  for s in SCALES["paper"]["settings"] + ("64x4_v256",)
  for d in SCALES["paper"]["widths"]
]


def _group(mixer, setting, width):
  return f"{mixer} {setting} d={width}"


PLOT = Plot(
  x=("d_model", {_group(*k): k[2] for k in _ALL}),
  series={_group(m, s, d): f"{m} {s}" for m, s, d in _ALL},
  chance={"eval_accuracy": {"a guess among the example's 4 values (64x4)": 0.25}},
)
PAPER = {_group("attention", s, d): 1.0 for s in SCALES["paper"]["settings"] for d in SCALES["paper"]["widths"]}


# The seeds (or repeats) each verdict rests on, fixed before the runs (efftx/sweep/README.md): the fresh seeds at the
# chosen rate (seed 0 chose it): 1 and 2 at the cpu scale (as run; fewer than a verdict needs, and out of Figure 2's
# regime anyway), 1–3 at the paper's. LSH's and attention's seeds 3–7 were added after a first look: the report
# refuses a verdict from them.
DESIGN = {"cpu": 2, "paper": 3}


def points(scale, finished):
  s = SCALES[scale]
  groups = {}
  for d in s["widths"]:  # the smaller width first: its verdicts come first
    for setting in s["settings"]:
      for m in s["mixers"]:
        steps = s["steps"].get("attention" if m == "attention" else "others")
        overrides = {"model.num_layers": DEPTH.get(m, 4), "model.d_ff": 0, **MIXER_OVERRIDES.get(m, {})}
        if steps:
          overrides.update({"total_steps": steps, "eval_every": steps // 8, "checkpoint_every": steps // 4})
        groups[_group(m, setting, d)] = {"arg": f"mixer={m},setting={setting},d_model={d}", "overrides": overrides}
  many = {g: spec for g, spec in groups.items() if g.split()[0] in MORE_SEEDS[scale]}
  rest = {g: spec for g, spec in groups.items() if g not in many}
  seeds = tuple(range(DESIGN[scale] + 1))  # seed 0 searches, the others are judged
  return best_then_seeds(rest, LEARNING_RATES, seeds, finished, GOAL) + best_then_seeds(
    many, LEARNING_RATES, tuple(range(8)), finished, GOAL
  )


# Figure 2's regime (Zoology's configs): what a run must match before its verdict speaks to the figure's claims.
FIGURE2 = {"vocab_size": 8192, "num_train": 100_000, "epochs": 64, "widths": (64, 128, 256, 512)}


def regime(scale: str, across_widths: bool = True) -> tuple[bool, str]:
  """Whether `scale`'s runs are in Figure 2's regime, computed from the settings, batches and steps they run (not
  declared): vocabulary 8,192, 100k training examples, 64 epochs of them, widths among Figure 2's (64–512), and more
  than one of them (the claim is that the attention-free mixers need larger widths; across_widths=False for a claim
  about each width on its own). Returns (in regime, why not; in it, what was checked)."""
  s = SCALES[scale]
  settings = {c.name: c for c in mqar_data.Mqar.BUILDER_CONFIGS}
  gaps = []
  for name in s["settings"]:
    c = settings[name]
    if c.vocab_size != FIGURE2["vocab_size"]:
      gaps.append(f"{name}: vocabulary {c.vocab_size:,}, not {FIGURE2['vocab_size']:,}")
    if c.num_train < FIGURE2["num_train"]:
      gaps.append(f"{name}: {c.num_train:,} training examples, not {FIGURE2['num_train']:,}")
    for kind in ("attention", "others"):
      mixer = "attention" if kind == "attention" else next(m for m in s["mixers"] if m != "attention")
      config = mqar_config.get_config(f"mixer={mixer},setting={name},d_model={s['widths'][0]}")
      steps = s["steps"].get(kind) or config.total_steps
      epochs = steps / (c.num_train // config.data.batch_size)  # full batches, as the training stream cuts them
      if epochs < FIGURE2["epochs"]:
        gaps.append(
          f"{name}, {'attention' if kind == 'attention' else 'the other mixers'}: {epochs:.3g} epochs of "
          f"{c.num_train:,} examples ({epochs * c.num_train / (FIGURE2['epochs'] * FIGURE2['num_train']):.1%} of "
          f"Figure 2's examples seen)"
        )
  outside = [d for d in s["widths"] if d not in FIGURE2["widths"]]
  if outside:
    gaps.append(f"widths {outside}, not among Figure 2's {list(FIGURE2['widths'])}")
  if across_widths and len(s["widths"]) < 2:
    gaps.append(f"one width ({s['widths'][0]}): 'needs larger widths' needs more than one")
  if gaps:
    return False, "not Figure 2's regime: " + "; ".join(dict.fromkeys(gaps))
  return True, "Figure 2's vocabulary, examples, epochs and widths, computed from the runs"


def claim(rows, scale):
  """Attention ≥ 99 % at every width and setting; every other mixer below attention at the smallest width (a
  paired difference over the seeds). Where seeds split into learned (SOLVED) and not, a mean is no seed's outcome:
  attention's claim is then its count of seeds that learned (Clopper–Pearson, against 0.99), a mixer's shortfall
  the exact sign test on the seeds where exactly one of the pair learned (stats.paired_count, against 1/2). This
  rule is fixed before the runs, and a split can only weaken a verdict at DESIGN's 3 seeds: the sign test holds
  only from 6 such seeds (p = 2/64), so a split shortfall is inconclusive, and a split attention row cannot hold
  (it did not hold where few of its seeds learned: with 1 of 3 the rate lies below 0.91). Judged only in
  Figure 2's regime, computed from what the runs ran (`regime`): outside it, every claim is untested at this scale
  and says why."""
  row = {r["group"]: r for r in rows}
  solved = SOLVED[scale][METRIC]
  in_regime, why_not = regime(scale, across_widths=False)
  out = []
  for g, r in row.items():
    if not g.startswith("attention "):
      continue
    values = [v["value"] for v in r["seeds"].values()]
    found = stats.count(values, solved)
    if found is not None and 0 < found.k < found.n:
      measured, ours = found, f"{found.k} of {found.n} seeds learned (≥ {solved:g}), rate {found.text(2)}"
    else:
      measured = stats.interval(values)
      ours = f"{measured.text(3) if measured else '—'}"
    out.append(
      stats.judge(
        f"attention solves MQAR ({g.split(' ', 1)[1]})",
        "≈ 1.0 at every width",
        f"{ours} at learning rate {r['learning_rate']:g}",
        measured,
        0.99,
        in_regime,
        why_not,
      )
    )
  smallest = min(int(g.rsplit("d=", 1)[1]) for g in row)
  in_regime, why_not = regime(scale)
  for g, r in row.items():
    if g.startswith("attention ") or not g.endswith(f"d={smallest}"):
      continue
    base = row.get("attention " + g.split(" ", 1)[1])
    m = g.split()[0]
    ours_values = {s: v["value"] for s, v in r["seeds"].items()}
    base_values = {s: v["value"] for s, v in base["seeds"].items()} if base else {}
    counts = [stats.count(list(v.values()), solved) for v in (ours_values, base_values)]
    split = None not in counts and any(0 < c.k < c.n for c in counts)
    d = stats.paired_count(base_values, ours_values, solved) if split else None  # of the split seeds: attention's
    if d is not None:
      ours, threshold = (
        f"learned (≥ {solved:g}): attention {counts[1].k} of {counts[1].n} seeds, {m} {counts[0].k} of "
        f"{counts[0].n} (rate {counts[0].text(2)}); of the {d.n} paired seeds where one learned, attention on {d.k}",
        0.5,
      )
    else:
      d = stats.between(base, r) if base else None  # attention − mixer: positive where the mixer falls short
      ours, threshold = f"attention − {m}: {d.text(3) if d else '—'}", 0.0
    out.append(
      stats.judge(
        f"{m} falls short of attention at width {smallest}",
        "attention-free mixers need larger widths (Figure 2)",
        f"{ours} (lr {r['learning_rate']:g})",
        d,
        threshold,
        in_regime,
        why_not,
      )
    )
  return out
