"""efftx.sweep.stats: Student-t intervals against the textbook table and their coverage by simulation, paired
differences, the verdict rule, a learning curve's last-fifth change; and the report's intervals, paired deltas
and learning curves from a study's workdirs."""
import json
import math

import numpy as np
import pytest

from efftx.sweep import report
from efftx.sweep import stats
from efftx.sweep import study as study_lib


def test_t_quantiles_are_students_table():
  # Student's t, two-sided 95 % (any statistics textbook's table).
  for df, t in ((1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042), (1000, 1.960)):
    assert stats.t975(df) == pytest.approx(t, abs=0.001)
  assert 2.045 <= stats.t975(29) <= 2.060  # between table entries (2.045): the wider one (df 25's)
  with pytest.raises(ValueError):
    stats.t975(0)


def test_interval_of_known_values_and_degenerate_ones():
  got = stats.interval([1.0, 2.0, 3.0])  # mean 2, s = 1: 2 ± 4.303 / √3
  assert (got.mean, got.n) == (2.0, 3)
  assert got.low == pytest.approx(2 - 4.303 / math.sqrt(3)) and got.high == pytest.approx(2 + 4.303 / math.sqrt(3))
  assert stats.interval([0.5]) == stats.Interval(0.5, None, None, 1)
  assert stats.interval([]) is None and stats.interval([float("nan"), None]) is None
  assert stats.interval([1.0, float("nan"), 3.0]).n == 2
  assert stats.interval([4.0, 4.0, 4.0]) == stats.Interval(4.0, 4.0, 4.0, 3)


@pytest.mark.parametrize("n", [3, 5])
def test_intervals_cover_the_true_mean_95_percent_of_the_time(n):
  """4,000 samples of n normal seeds: the interval holds the true mean in 95 % of them (± 1 %, ~3 standard errors
  of the simulation); a 90 % interval, or one from the normal quantile, would not."""
  rng = np.random.default_rng(n)
  samples = rng.normal(0.3, 2.0, size=(4000, n))
  covered = [(i := stats.interval(list(s))).low <= 0.3 <= i.high for s in samples]
  assert abs(np.mean(covered) - 0.95) < 0.011, np.mean(covered)
  normal_half = 1.960 * samples.std(axis=1, ddof=1) / math.sqrt(n)  # the normal quantile: too narrow for few seeds
  assert np.mean(np.abs(samples.mean(axis=1) - 0.3) <= normal_half) < 0.93


def test_paired_differences_take_out_what_the_seeds_share():
  """Seeds that move both groups alike (a large shared effect) hide a small difference from separate intervals;
  the paired one finds it. Seeds only one group finished are left out."""
  rng = np.random.default_rng(0)
  shared = rng.normal(0, 1.0, size=5)
  baseline = {s: 2.0 + shared[s] for s in range(5)}
  ours = {s: 2.1 + shared[s] + rng.normal(0, 0.01) for s in range(5)}
  ours[7] = 100.0  # no baseline for seed 7
  separate_ours, separate_base = stats.interval([ours[s] for s in range(5)]), stats.interval(list(baseline.values()))
  assert separate_ours.low < separate_base.high  # the separate intervals overlap
  difference = stats.paired(ours, baseline)
  assert difference.n == 5 and 0.05 < difference.low < 0.1 < difference.high < 0.15


def test_the_verdict_needs_an_interval_that_clears_the_effect_and_a_run_in_regime():
  above, below, across = (stats.Interval(m, m - 0.1, m + 0.1, 5) for m in (0.5, -0.5, 0.0))
  assert stats.verdict(above, 0.0, True)[0] == stats.HELD
  assert stats.verdict(below, 0.0, True)[0] == stats.DID_NOT_HOLD
  assert stats.verdict(across, 0.0, True)[0] == stats.INCONCLUSIVE
  assert stats.verdict(above, 0.45, True)[0] == stats.INCONCLUSIVE  # clears 0, not the paper's effect
  assert stats.verdict(above, 0.0, False, "loss still falling") == (stats.UNTESTED, "loss still falling")
  assert stats.verdict(stats.Interval(0.5, 0.4, 0.6, 2), 0.0, True)[0] == stats.UNTESTED  # two seeds
  assert stats.verdict(None, 0.0, True)[0] == stats.UNTESTED
  assert "[0.4, 0.6] against 0" in stats.verdict(above, 0.0, True)[1]


def test_last_fifth_change_of_a_learning_curve():
  curve = [(s, 1.0 / s) for s in range(100, 1100, 100)]  # steps 100 … 1000: the last fifth is 820 … 1000
  assert stats.last_fifth_change(curve) == pytest.approx(1 / 1000 - 1 / 900)
  assert stats.last_fifth_change([(10, 1.0)]) is None
  assert stats.last_fifth_change([(0, 1.0), (100, 0.5)]) is None  # one point in the last fifth: unknown
  assert stats.last_fifth_change([(0, 1.0), (80, 0.6), (100, 0.5)]) == pytest.approx(-0.1)


def _study(tmp_path) -> study_lib.Study:
  path = tmp_path / "study" / "sweep.py"
  path.parent.mkdir(parents=True)
  path.write_text('''"""A test study."""
from efftx.sweep import grid
CONFIG = "configs/quickstart.py"
METRIC = "eval_loss"
GOAL = "min"
BASELINE = {"attention": "attention", "fnet": "attention"}

def points(scale):
  return grid({"attention": {"arg": "smoke"}, "fnet": {"arg": "smoke,mixer=fnet"}}, seeds=(0, 1, 2))
''')
  return study_lib.load(str(path))


def test_the_report_gives_intervals_paired_deltas_and_learning_curves(tmp_path):
  study = _study(tmp_path)
  workdir = tmp_path / "runs"
  final = {}
  for p in study.points:
    offset = {"attention": 0.0, "fnet": 0.2}[p.group] + 0.05 * p.seed  # each seed moves both groups alike
    final[(p.group, p.seed)] = 1.0 + offset
    (workdir / p.name).mkdir(parents=True)
    (workdir / p.name / "config.json").write_text(json.dumps({"total_steps": 100}))
    (workdir / p.name / "metrics.jsonl").write_text("\n".join(
        json.dumps({"step": s, "eval_loss": 1.0 + offset + 1.0 / s}) for s in (10, 50, 90, 100)) + "\n")
    final[(p.group, p.seed)] += 1.0 / 100
  paths = report.report(study, str(workdir), "cpu", "test")
  rows = {r["group"]: r for r in json.loads(open(paths["json"]).read())["rows"]}
  values = [final[("fnet", s)] for s in range(3)]
  assert rows["fnet"]["mean"] == pytest.approx(np.mean(values))
  half = 4.303 * np.std(values, ddof=1) / math.sqrt(3)
  assert rows["fnet"]["ci95"] == pytest.approx([np.mean(values) - half, np.mean(values) + half])
  delta = rows["fnet"]["delta"]["eval_loss"]  # the same 0.2 on every seed: an interval of width 0
  assert delta["n"] == 3 and delta["mean"] == pytest.approx(0.2) and delta["ci95"] == pytest.approx([0.2, 0.2])
  assert rows["attention"]["delta"]["eval_loss"] is None  # the baseline itself
  assert rows["fnet"]["last_fifth_change"] == pytest.approx(1 / 100 - 1 / 90)
  table = open(paths["md"]).read()
  assert "| fnet |" in table and "0.2 [0.2, 0.2]" in table and "paired [95 % CI]" in table
  assert "over the last fifth of training" in table
  assert open(paths["curves"], "rb").read()[:8] == b"\x89PNG\r\n\x1a\n"
