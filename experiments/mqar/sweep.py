"""MQAR capability (Zoology, Arora et al. 2023, Figure 2): softmax attention recalls every key at every width;
where do the attention-free mixers fail?

    python -m efftx.sweep experiments/mqar/sweep.py --workdir=/tmp/efftx/mqar --parallel=2
    python -m efftx.sweep experiments/mqar/sweep.py --workdir=DIR --scale=paper     # accelerators

Claim tested (Figure 2, multi-query associative recall, vocab 8192, 2 layers): attention reaches ≈ 100 % query
accuracy in every setting (64x4, 128x8, 256x16) at every width (64 to 512); the attention-free and
gated-convolution mixers need far larger widths to approach it, and fail at width 64. Zoology reports best of its
learning rates {1e-4, 4.6e-4, 2.2e-3, 1e-2} per point; so does this table (one row per mixer × setting × width).
Zoology has no AFT, FNet-style or LSH rows: for those this is a measurement, not a replication.

Ours: configs/mqar.py (Zoology's task, schedule and N(0, 0.02²) initialisation; efftx blocks keep a feed-forward
sublayer, width 2·d), metric the validation query accuracy at the last step; the head computes logits at the
query positions only.
Scale "cpu": setting 64x4_v256 — Zoology's own first example (vocab 256, length 64, 4 pairs, 10k training
examples), not Figure 2's vocab of 8192 — widths 64 and 128, mixers attention, aft_full, aft_simple, aft_conv,
linear, lsh, learning rates {1e-3, 3e-3} (best of), one seed, batch 32, 2,000 steps (6.4 epochs) — 24 runs. The
Figure-2 settings at vocab 8192 need about 64 epochs of 100k examples per run: days on this CPU.
"paper": settings 64x4, 128x8, 256x16 (vocab 8192), widths 64–512, Zoology's four learning rates and the full
64-epoch schedule. PAPER marks 64x4_v256's attention rows 1.0 too: Zoology's claim is that attention solves
MQAR at every width, and this easier task is no exception.
"""
from efftx.sweep import grid

CONFIG = "configs/mqar.py"
METRIC = "eval_accuracy"
GOAL = "max"
SOURCE = "Arora et al., Zoology (2023), Figure 2 (attention: ≈ 1.0 in every setting and width)"

SCALES = {
    "cpu": {"mixers": ("attention", "aft_full", "aft_simple", "aft_conv", "linear", "lsh"),
            "settings": ("64x4_v256",), "widths": (64, 128), "learning_rates": (1e-3, 3e-3),
            "overrides": {"total_steps": 2_000, "eval_every": 500, "checkpoint_every": 1_000}},
    "paper": {"mixers": ("attention", "aft_full", "aft_simple", "aft_conv", "linear", "lsh"),
              "settings": ("64x4", "128x8", "256x16"), "widths": (64, 128, 256, 512),
              "learning_rates": (1e-4, 4.6e-4, 2.2e-3, 1e-2), "overrides": {}},
}
_ALL = [(m, s, d) for m in SCALES["paper"]["mixers"] for s in SCALES["paper"]["settings"] + ("64x4_v256",)
        for d in SCALES["paper"]["widths"]]


def _group(mixer, setting, width):
  return f"{mixer} {setting} d={width}"


X = ("d_model", {_group(*k): k[2] for k in _ALL})
SERIES = {_group(m, s, d): f"{m} {s}" for m, s, d in _ALL}
PAPER = {_group("attention", s, d): 1.0 for s in SCALES["paper"]["settings"] for d in SCALES["paper"]["widths"]}
PAPER.update({_group("attention", "64x4_v256", d): 1.0 for d in SCALES["paper"]["widths"]})  # see the docstring


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
