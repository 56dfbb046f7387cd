"""FNet's model set (Lee-Thorp et al., 2022; google-research f_net configs/base.py): BERT-style attention, FNet,
Linear, Random, FF-only, and the hybrids with attention in 2 of the layers at the bottom, middle, top or mixed.

    python -m efftx.sweep experiments/fnet_model_set/sweep.py --workdir=/tmp/efftx/fnet_model_set --parallel=2
    python -m efftx.sweep experiments/fnet_model_set/sweep.py --workdir=DIR --scale=paper     # accelerators

Claim tested (the paper's GLUE ordering, Base models): attention > FNet-Hybrid (attention in the last two layers)
> FNet ≈ Linear > Random > FF-only — attention's accuracy is mostly recovered by two attention layers, and
learned or Fourier mixing beats fixed random mixing, which beats none. The paper measures it on GLUE after C4
pre-training (BERT-Base 83.3 vs FNet-Base 76.7 average); no such data exists offline, so both scales here are
NOT the paper's regime and the verdict at them is "untested at this scale" whatever the ordering.

Scale "cpu" (a first run, smoke scale): ListOps-small (configs/quickstart.py: expressions of 11–127 tokens),
4 layers of width 64, 600 steps of batch 32, seed 0 only; the hybrids put attention in 2 of the 4 layers
(bottom: 0, 1; middle: 1, 2; top: 2, 3; mixed: 0, 2). Scale "paper": LRA ListOps (configs/lra_listops.py, 6 layers,
width 512, lengths up to 2000), hybrids with 2 attention layers of 6, 3 seeds. Metric: validation accuracy at the
last step.
"""
from efftx.sweep import grid

CONFIG = "configs/quickstart.py"
METRIC = "eval_accuracy"
GOAL = "max"
SOURCE = ("Lee-Thorp et al., FNet (2022), GLUE dev results of the model set (BERT, FNet, Linear, Random, FF-only, "
          "FNet-Hybrid) after C4 pre-training; this sweep trains on ListOps from scratch, a different regime")

MODELS = ("attention", "fnet", "linear_mixing", "random", "ff_only")
LAYOUTS = ("bottom", "middle", "top", "mixed")
SCALES = {  # scale -> (config file, config argument prefix, overrides, seeds)
    "cpu": ("configs/quickstart.py", "", {"model.num_layers": 4, "total_steps": 600, "eval_every": 600,
                                          "checkpoint_every": 300}, (0,)),
    "paper": ("configs/lra_listops.py", "", {}, (0, 1, 2)),
}


def points(scale):
  config, prefix, overrides, seeds = SCALES[scale]
  mixers = list(MODELS) + [f"fnet+attention*2@{layout}" for layout in LAYOUTS]
  groups = {m: {"config": config, "arg": f"{prefix}mixer={m}", "overrides": overrides} for m in mixers}
  return grid(groups, seeds=seeds)


def claim(rows):
  """The paper's ordering, checked on the means: attention ≥ the top hybrid ≥ max(fnet, linear_mixing) ≥ random ≥
  ff_only. Reported with the measured accuracies; the regime is not the paper's, so the verdict is always
  "untested at this scale", followed by whether the ordering appeared."""
  acc = {r["group"]: r["mean"] for r in rows}
  order = [acc["attention"], acc["fnet+attention*2@top"], max(acc["fnet"], acc["linear_mixing"]), acc["random"],
           acc["ff_only"]]
  appeared = all(a >= b for a, b in zip(order, order[1:]))
  listed = ", ".join(f"{g} {100 * v:.1f}" for g, v in sorted(acc.items(), key=lambda kv: -kv[1]))
  return (f"untested at this scale (not GLUE after pre-training); the paper's ordering "
          f"{'appeared' if appeared else 'did not appear'}: {listed} (% validation accuracy)")
