"""What a study's numbers support: a mean's 95 % confidence interval over seeds, a paired difference against the
baseline (the same seeds, so the same data order and initialisation), a learning curve's change over its last fifth
(is the run still improving?), and the verdict rule every claim uses.

Intervals are Student-t intervals (mean ± t₀.₉₇₅(n − 1) · s / √n): exact for normal per-seed values, the usual
reading for seeds. With one seed there is no interval (None), and no verdict either way.
"""
from __future__ import annotations

import dataclasses
import math

# t quantiles 0.975 by degrees of freedom (Student's table); between entries the smaller df's (wider: conservative).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}

HELD, DID_NOT_HOLD, INCONCLUSIVE, UNTESTED = "held", "did not hold", "inconclusive", "untested at this scale"
MIN_SEEDS = 3  # fewer seeds than this: no verdict


def t975(df: int) -> float:
  """Student's t quantile 0.975 with df degrees of freedom (df ≥ 1)."""
  if df < 1:
    raise ValueError(f"degrees of freedom {df} < 1")
  return _T975[max(k for k in _T975 if k <= df)] if df <= 120 else 1.960


@dataclasses.dataclass(frozen=True)
class Interval:
  """A mean over n values with its 95 % confidence interval (low, high: None with one value)."""
  mean: float
  low: float | None
  high: float | None
  n: int

  def as_dict(self) -> dict:
    return {"mean": self.mean, "ci95": None if self.low is None else [self.low, self.high], "n": self.n}

  def text(self, digits: int = 4) -> str:
    """"mean [low, high]" (just the mean with one value)."""
    fmt = lambda v: f"{v:.{digits}g}"
    return fmt(self.mean) + ("" if self.low is None else f" [{fmt(self.low)}, {fmt(self.high)}]")


def interval(values: list[float]) -> Interval | None:
  """The mean of the finite values and its 95 % interval; None without any."""
  values = [v for v in values if v is not None and math.isfinite(v)]
  if not values:
    return None
  n = len(values)
  mean = sum(values) / n
  if n == 1:
    return Interval(mean, None, None, 1)
  half = t975(n - 1) * math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
  return Interval(mean, mean - half, mean + half, n)


def paired(ours: dict, baseline: dict) -> Interval | None:
  """The interval of ours[seed] − baseline[seed] over the seeds both have ({seed: value}): the difference with the
  seed-to-seed variation the two share taken out."""
  seeds = sorted(s for s in ours if s in baseline and ours[s] is not None and baseline[s] is not None)
  return interval([ours[s] - baseline[s] for s in seeds])


def verdict(difference: Interval | None, threshold: float, in_regime: bool, why_not: str = "") -> tuple[str, str]:
  """(verdict, reason) of a claim "the difference exceeds threshold" (write a claim the other way round with
  the difference negated): held where the whole interval lies above the threshold, did not hold where it lies
  below, inconclusive where it straddles it; untested at this scale where the run is not in the claim's regime
  (why_not says how) or has fewer than MIN_SEEDS seeds."""
  if not in_regime:
    return UNTESTED, why_not or "the run is not in the claim's regime"
  if difference is None or difference.n < MIN_SEEDS:
    return UNTESTED, f"{0 if difference is None else difference.n} seeds (a verdict needs {MIN_SEEDS})"
  where = f"95 % interval [{difference.low:.3g}, {difference.high:.3g}] against {threshold:.3g}"
  if difference.low > threshold:
    return HELD, where
  if difference.high < threshold:
    return DID_NOT_HOLD, where
  return INCONCLUSIVE, where


def last_fifth_change(curve: list[tuple[int, float]]) -> float | None:
  """A learning curve's ([(step, value)], in step order) change over the last fifth of its steps: what says whether
  a run is still improving, i.e. short of the converged regime a paper reports. None with fewer than two points
  in that fifth."""
  if len(curve) < 2:
    return None
  tail = [v for s, v in curve if s >= curve[-1][0] - (curve[-1][0] - curve[0][0]) / 5]
  return tail[-1] - tail[0] if len(tail) > 1 else None
