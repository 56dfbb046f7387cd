"""Autoregressive pixels (AFT, Zhai et al. 2021, Table 2): bits/dim of image density estimation for softmax
attention, AFT-local, AFT-simple, AFT-conv and linear attention, each at its own learning rate, 4 fresh seeds each.

    python -m efftx.sweep experiments/image_ar/sweep.py --workdir=/tmp/efftx/image_ar --parallel=2
    python -m efftx.sweep experiments/image_ar/sweep.py --workdir=DIR --scale=paper    # accelerators (CIFAR-10)

Claim tested (AFT Table 2, CIFAR-10 test bits/dim, 24 layers, width 256, raster order over 3,072 sub-pixels):
AFT-local (window 256) beats the Transformer, and AFT-simple, with no position-dependent mixing at all, comes
close to it — Transformer 2.86, AFT-local-256 2.74, AFT-simple 2.89 (a factorised position bias, d' = 64).
The paper has no AFT-conv or linear-attention row: for those this is a measurement, not a replication.

Ours: configs/image_ar.py, validation bits/dim. Scale "cpu" is NOT the paper's setting (SETTING): Fashion-MNIST
averaged to 14 × 14 (196 grey pixels; CIFAR-10 is not offline here), a size a 2-core CPU trains near convergence:
2 layers, width 64, FF 256, 4 heads, dropout 0, AFT-local window 37 (the paper's 256 sub-pixels are 2.67 of
CIFAR-10's rows; 2.67 of these rows are 37 pixels), batch 32, 1,500 steps (0.87 epoch), evaluated every 300 steps
on the first 1,000 validation images (the last 5,000 of Fashion-MNIST's training images); each mixer's learning
rate searched on seed 0 over {3e-4, 1e-3, 3e-3, 1e-2, 3e-2} (the same budget for every mixer; 3e-2 was added after
attention and AFT-local both chose 1e-2, before any fresh seed ran), then judged on fresh seeds 1–4 at its chosen
rate — 45 runs, about 2.5 h with --parallel=2. "paper": the config's CIFAR-10 defaults (24 layers,
width 256, 100k steps; the whole test split) at its one rate, 4 seeds.
"""

from efftx.sweep import Plot
from efftx.sweep import best_then_seeds
from efftx.sweep import stats

CONFIG = "configs/image_ar.py"
METRIC = "eval_bits_per_dim"
GOAL = "min"
SOURCE = "Zhai et al., An Attention Free Transformer (2021), Table 2 (CIFAR-10 test bits/dim; not Fashion-MNIST)"

MIXERS = ("attention", "aft_local", "aft_simple", "aft_conv", "linear")
PAPER = {"attention": 2.86, "aft_local": 2.74, "aft_simple": 2.89}
PAPER_SCALES = ("paper",)
PAPER_SETTING = (
  "CIFAR-10, 3,072 RGB sub-pixels in raster order, 24 layers × 256, AFT-local window 256, factorised "
  "position bias d' = 64, trained 100k+ steps; test bits/dim"
)
SETTING = {
  "cpu": "Fashion-MNIST at 14 × 14 (196 grey pixels), 2 layers × 64, FF 256, AFT-local window 37, batch "
  "32, 1,500 steps (0.87 epoch); bits/dim on 1,000 validation images every 300 steps; learning rate searched "
  "per mixer on seed 0, 4 fresh seeds judged",
  "paper": "the paper's CIFAR-10 setting (configs/image_ar.py defaults), 4 seeds",
}
PROTOCOL = {
  "cpu": "Every mixer: the same config (AdamW, 100 warmup steps, cosine decay, gradient clipping at 1, batch 32), "
  "the same seeds and data order; each mixer's learning rate chosen from {3e-4, 1e-3, 3e-3, 1e-2, 3e-2} on seed 0's "
  "final validation bits/dim (3e-2 added after two mixers chose 1e-2, before any fresh seed ran), the verdicts "
  "on seeds 1–4 at that rate alone (the paper gives no per-mixer protocol)."
}
BASELINE = {m: "attention" for m in MIXERS}
PLOT = Plot(chance={"eval_bits_per_dim": {"uniform over 256 values": 8.0}})
SCALES = {
  "cpu": (
    "data=fashion_mnist_14,",
    {
      "model.num_layers": 2,
      "model.d_model": 64,
      "model.d_ff": 256,
      "model.dropout": 0.0,
      "total_steps": 1_500,
      "optim.warmup_steps": 100,
      "eval_every": 300,
      "checkpoint_every": 300,
      "data.eval_examples": 1_000,
    },
  ),
  "paper": ("data=cifar10,", {}),
}


# Per mixer, on seed 0 (the final validation bits/dim); None: the config's rate.
LEARNING_RATES = {"cpu": (3e-4, 1e-3, 3e-3, 1e-2, 3e-2), "paper": (None,)}


def points(scale, finished):
  arg, overrides = SCALES[scale]
  groups = {m: {"arg": f"{arg}mixer={m}", "overrides": overrides} for m in MIXERS}
  seeds = (0, 1, 2, 3, 4) if len(LEARNING_RATES[scale]) > 1 else (0, 1, 2, 3)  # seed 0 searches where rates are
  return best_then_seeds(groups, LEARNING_RATES[scale], seeds, finished, GOAL)


# The convergence test's tolerance (stats.settled): a difference counts as settled only where its move over the
# last fifth of training lies within ±0.01 bits/dim (the paper's effects: −0.12 and +0.03).
SETTLED_WITHIN = 0.01


# The seeds (or repeats) each verdict rests on, fixed before the runs (efftx/sweep/README.md): at the cpu scale the
# 4 fresh seeds at each mixer's chosen rate (seed 0 chose it), at the paper's every seed of its one rate.
DESIGN = {"cpu": 4, "paper": 4}


def claim(rows, scale):
  """AFT-local below attention (the paper: −0.12 bits/dim) and AFT-simple within 0.1 bits/dim of it (the paper:
  +0.03), each a paired difference over the seeds; in the paper's regime only at its scale, once settled."""
  row = {r["group"]: r for r in rows}
  setting_why = "2 layers × 64 on 14 × 14 grey images, not 24 × 256 on CIFAR-10"
  out = []
  for mixer, paper, offset, text in (
    ("aft_local", "2.74 vs 2.86 (−0.12)", 0.0, "AFT-local has lower bits/dim than attention"),
    ("aft_simple", "2.89 vs 2.86 (+0.03)", 0.1, "AFT-simple is within 0.1 bits/dim of attention"),
  ):
    d = stats.between(row[mixer], row["attention"])
    ok, why = stats.regime(
      scale == "paper", setting_why, stats.settled_between(row[mixer], row["attention"], SETTLED_WITHIN)
    )
    out.append(
      stats.judge(
        text, paper, f"{mixer} − attention: {d.text(3)} bits/dim" if d else "—", d, offset, ok, why, above=False
      )
    )
  others = ", ".join(
    f"{m} − attention {stats.between(row[m], row['attention']).text(3)}"
    for m in MIXERS[3:]
    if m in row and stats.between(row[m], row["attention"])
  )
  if others:
    out.append(
      stats.Claim(
        "AFT-conv and linear attention against attention (not in the paper's table)",
        "—",
        others,
        stats.UNTESTED,
        "a measurement: the paper has no such rows",
      )
    )
  return out
