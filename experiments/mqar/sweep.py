"""MQAR capability (Zoology, Arora et al. 2023, Figure 2): softmax attention recalls every key at every width;
where do the attention-free mixers fail?

    python -m efftx.sweep experiments/mqar/sweep.py --workdir=/tmp/efftx/mqar --parallel=2
    python -m efftx.sweep experiments/mqar/sweep.py --workdir=DIR --scale=paper     # accelerators

Claim tested (Figure 2, multi-query associative recall, vocab 8192, 2 layers): attention reaches ≈ 100 % query
accuracy in every setting (64x4, 128x8, 256x16) at every width (64 to 512); the attention-free and
gated-convolution mixers need far larger widths to approach it, and fail at width 64. Zoology reports best of its
learning rates {1e-4, 4.6e-4, 2.2e-3, 1e-2} per point; so does this table (one row per mixer × setting × width).
Zoology has no AFT, FNet-style or LSH rows: for those this is a measurement, not a replication.

Ours: configs/mqar.py (Zoology's task and schedule; efftx blocks keep a feed-forward sublayer, width 2·d), metric
the validation query accuracy at the last step; the head computes logits at the query positions only.
Scale "cpu": setting 64x4, widths 64 and 128, mixers attention, aft_full, aft_simple, aft_conv, linear, lsh,
learning rates {2.2e-3, 1e-2}, one seed, batch 128, 2,400 steps (about 3 epochs of the 100k examples; Zoology
trains 64 epochs at batch 512) — 24 runs. "paper": settings 64x4, 128x8, 256x16, widths 64–512, Zoology's four
learning rates and the full 64-epoch schedule.
Not run yet (README.md): at scale "cpu" attention reached 23.7 % on 64x4 at width 64 (2,400 steps, 7 min), far
from the ≈ 100 % anchor, so this grid cannot yet say where the other mixers fail.
"""
from efftx.sweep import grid

CONFIG = "configs/mqar.py"
METRIC = "eval_accuracy"
GOAL = "max"
SOURCE = "Arora et al., Zoology (2023), Figure 2 (attention: ≈ 1.0 in every setting and width)"

SCALES = {
    "cpu": {"mixers": ("attention", "aft_full", "aft_simple", "aft_conv", "linear", "lsh"), "settings": ("64x4",),
            "widths": (64, 128), "learning_rates": (2.2e-3, 1e-2),
            "overrides": {"data.batch_size": 128, "total_steps": 2_400, "optim.warmup_steps": 200,
                          "eval_every": 600, "checkpoint_every": 600}},
    "paper": {"mixers": ("attention", "aft_full", "aft_simple", "aft_conv", "linear", "lsh"),
              "settings": ("64x4", "128x8", "256x16"), "widths": (64, 128, 256, 512),
              "learning_rates": (1e-4, 4.6e-4, 2.2e-3, 1e-2), "overrides": {}},
}
_ALL = [(m, s, d) for m in SCALES["paper"]["mixers"] for s in SCALES["paper"]["settings"]
        for d in SCALES["paper"]["widths"]]


def _group(mixer, setting, width):
  return f"{mixer} {setting} d={width}"


X = ("d_model", {_group(*k): k[2] for k in _ALL})
SERIES = {_group(m, s, d): f"{m} {s}" for m, s, d in _ALL}
PAPER = {_group("attention", s, d): 1.0 for s in SCALES["paper"]["settings"] for d in SCALES["paper"]["widths"]}


def points(scale):
  s = SCALES[scale]
  groups = {_group(m, setting, d): {"arg": f"mixer={m},setting={setting},d_model={d}", "overrides": s["overrides"]}
            for m in s["mixers"] for setting in s["settings"] for d in s["widths"]}
  return grid(groups, learning_rates=s["learning_rates"])


def claim(rows):
  """Held if attention reaches ≥ 99 % at every measured width and setting and every other mixer stays below
  99 % at the smallest width."""
  accuracy = {r["group"]: r["mean"] for r in rows}
  attention = {g: a for g, a in accuracy.items() if g.startswith("attention ")}
  smallest = min(int(g.rsplit("d=", 1)[1]) for g in accuracy)
  others = {g: a for g, a in accuracy.items() if not g.startswith("attention ") and g.endswith(f"d={smallest}")}
  held = min(attention.values()) >= 0.99 and max(others.values()) < 0.99
  return (f"{'held' if held else 'did not hold'}: attention {min(attention.values()):.1%}–"
          f"{max(attention.values()):.1%}; at width {smallest}: "
          + ", ".join(f"{g.split()[0]} {a:.1%}" for g, a in others.items()))
