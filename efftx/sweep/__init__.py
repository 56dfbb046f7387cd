"""Sweeps: run a study's grid of training runs, then turn them into the study's table and plot.

    python -m efftx.sweep experiments/<study>/sweep.py --workdir=/tmp/efftx/<study> [--parallel=2]
    python -m efftx.sweep experiments/<study>/sweep.py --workdir=DIR --report [--publish]
    python -m efftx.sweep ... --launcher=slurm [--slurm_partition=gpu --gpus_per_node=8 --timeout_min=600]
    python -m efftx.sweep ... --launcher=tpu --tpu=my-slice --zone=us-central2-b   # needs a gs:// --workdir
    python -m efftx.sweep ... --dry_run                                          # what would run, any launcher
    python -m efftx.sweep ... --workdir=NEW --reuse_published [--report]          # from the published records

A sweep file is plain Python that defines:
  CONFIG          the config file its training points start from, e.g. "configs/lm_bytes.py" (a group may name
                  its own: {"config": ...})
  points(scale)   -> list[Point]: the grid at scale "cpu" (what this repository's tables ran) or "paper";
                  points(scale, finished) for a grid that grows as points finish (finished(point): its final
                  METRIC or None), e.g. best_then_seeds: every learning rate on one seed, then more seeds at the best
  METRIC, GOAL    the metric each point contributes (its last value in the point's metrics.jsonl, or in a bench
                  point's bench.json), "min" or "max"
  METRICS         optional: more metrics shown beside METRIC (a bench point's memory beside its tokens/s)
  BASELINE        optional {group: baseline group}: every metric is also shown divided by the baseline's (a
                  measurement study's plot draws the ratios, e.g. tokens/s ÷ softmax attention's at the same length;
                  a training study's adds a panel of the paired differences from the baseline)
  PAPER           optional {group: the paper's number} ({group: {metric: number}} for several metrics; a ratio
                  where BASELINE is set); SOURCE says where they come from
  X               optional (axis label, {group: x}): the plot draws ours against x; else one labelled dot per
                  group, each with its 95 % interval
  SERIES          optional {group: line}: with X, one line per series (e.g. per mixer, against length)
  XSCALE          optional "linear" or "log" (default: log where X spans 16× or more)
  PAPER_SETTING   optional: what the paper trained (data, depth, width, steps); SETTING {scale: what that scale
                  trains}; PROTOCOL {scale: how each group is trained (depth, learning-rate search) and why}
  PAPER_SCALES    optional: the scales whose setting is the paper's; only there are the paper's numbers put beside
                  ours in the table (elsewhere the report gives them in its text)
  CHANCE          optional {metric: {label: value}}: chance and majority lines, drawn and stated
  PANEL           optional function group -> panel title: the learning curves get one panel per title (per task)
  claim(rows, scale)  optional: the paper's claims judged, a list of efftx.sweep.stats.Claim (claim, paper, ours,
                  verdict, why), from the aggregated rows: each has the group's mean, std, "ci95" (95 % interval over
                  seeds), "n", its seeds' values ("seeds"), the paired difference from its baseline ("delta"), its
                  seeds' learning curves ("curves") and "last_fifth_change"; stats.judge / stats.verdict say held /
                  did not hold only where the interval clears the paper's effect and the run is in the claim's
                  regime (stats.regime, stats.settled), else inconclusive or untested at this scale
and holds in its docstring the claim being tested and the paper's numbers with their source.

Every point is one `python -m efftx.train` command (Point.command; printed before it runs, runnable by hand) with
its own workdir DIR/<point>: a re-run skips points that reached their total_steps, resumes the others from their
checkpoints, and retries failed ones. A bench point is one `python -m efftx.bench` command writing
DIR/<point>/bench.json (done once that file exists; run them with --parallel=1, or their timings share the cores).
A failing point is reported with its one-line error; the others go on. `--publish` writes each finished point's
record (flags, config, metric rows or bench row, seconds, commits, machine) to runs/<scale>/<point>.json beside the
sweep file, and copies the report there once every point is done; `--reuse_published` takes a record whose flags are
the point's as done in a workdir where the point has not started (a bench record only on the machine that measured
it).
On one machine `--parallel` points run at a time; `--launcher=slurm` submits each point as a SLURM job through
submitit; `--launcher=tpu` runs each point on every worker of a TPU VM slice with `gcloud compute tpus tpu-vm ssh
--worker=all` (one point at a time, in order). Seeds of a group are aggregated as mean, sample std and 95 % interval,
and learning rates as the best mean (a group's row is its best learning rate, as Zoology reports); a group with a
baseline also gets the paired difference from it over the seeds both ran, with its interval, and every training
study's learning curves are drawn (curves.png, the seeds' band). The report is
written after every run (and alone with --report); the exit status is 1 when a point failed.
"""
from efftx.sweep.study import Plot  # what sweep files use
from efftx.sweep.study import Point
from efftx.sweep.study import best_then_seeds
from efftx.sweep.study import grid

__all__ = ["Plot", "Point", "best_then_seeds", "grid"]
