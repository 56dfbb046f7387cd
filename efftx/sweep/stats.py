"""What a study's numbers support: a mean's 95 % confidence interval over seeds, a paired difference against the
baseline (the same seeds, so the same data order and initialisation), a learning curve's change over the last fifth
of its summed learning rate (is the run still improving?), and the verdict rule every claim uses.

Intervals are Student-t intervals (mean ± t₀.₉₇₅(n − 1) · s / √n): exact for normal per-seed values, the usual
reading for seeds. With one seed there is no interval (None), and no verdict either way. Where seeds split into
solved and unsolved, a count: k of n with its exact (Clopper–Pearson) interval and the exact binomial test.

Each judged claim carries its test's two-sided p-value; `holm` adjusts a study's claims together (Holm's step-down
correction over the claims that were tested), so a study of twenty claims does not hold one by chance. Each also
carries its number of seeds: `fixed_design` keeps a verdict only where that is the number the study fixed before
its runs.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from scipy import stats as scipy_stats  # scipy comes with jax

# t quantiles 0.975 by degrees of freedom (Student's table); between entries the smaller df's (wider: conservative).
_T975 = {
  1: 12.706,
  2: 4.303,
  3: 3.182,
  4: 2.776,
  5: 2.571,
  6: 2.447,
  7: 2.365,
  8: 2.306,
  9: 2.262,
  10: 2.228,
  11: 2.201,
  12: 2.179,
  13: 2.160,
  14: 2.145,
  15: 2.131,
  16: 2.120,
  17: 2.110,
  18: 2.101,
  19: 2.093,
  20: 2.086,
  25: 2.060,
  30: 2.042,
  40: 2.021,
  60: 2.000,
  120: 1.980,
}

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
  seeded: bool = True  # False: a deterministic measurement (exact), n only lets a verdict rest on it
  df: int | None = None  # the t quantile's degrees of freedom where not n − 1 (a fitted slope's n − 2)
  test: str = "t"  # the test the interval is of, as a verdict names it: "t" over values, "paired t" over differences
  unit: str = "seeds"  # what the n values are, as a verdict names them: "seeds", or "repeats" of a measurement

  def as_dict(self) -> dict:
    return {"mean": self.mean, "ci95": None if self.low is None else [self.low, self.high], "n": self.n}

  def text(self, digits: int = 4) -> str:
    """ "mean [low, high]" (just the mean with one value)."""
    fmt = lambda v: f"{v:.{digits}g}"
    return fmt(self.mean) + ("" if self.low is None else f" [{fmt(self.low)}, {fmt(self.high)}]")


def interval(values: list[float], unit: str = "seeds") -> Interval | None:
  """The mean of the finite values and its 95 % interval; None without any. unit names what the values are
  (seeds, or a measurement's repeats)."""
  values = [v for v in values if v is not None and math.isfinite(v)]
  if not values:
    return None
  n = len(values)
  mean = sum(values) / n
  if n == 1:
    return Interval(mean, None, None, 1, unit=unit)
  half = t975(n - 1) * math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
  return Interval(mean, mean - half, mean + half, n, unit=unit)


def paired(ours: dict, baseline: dict) -> Interval | None:
  """The interval of ours[seed] − baseline[seed] over the seeds both have ({seed: value}): the difference with the
  seed-to-seed variation the two share taken out."""
  seeds = sorted(s for s in ours if s in baseline and ours[s] is not None and baseline[s] is not None)
  found = interval([ours[s] - baseline[s] for s in seeds])
  return None if found is None else dataclasses.replace(found, test="paired t")


def between(row: dict, baseline_row: dict, key: str = "value") -> Interval | None:
  """The paired difference row − baseline_row of two report rows (their "seeds": {seed: {"value": ..., metric:
  ...}}), over the seeds both finished."""
  return paired(
    {s: v.get(key) for s, v in row.get("seeds", {}).items()},
    {s: v.get(key) for s, v in baseline_row.get("seeds", {}).items()},
  )


@dataclasses.dataclass(frozen=True)
class Count:
  """k successes (seeds that solved the task) of n, with the exact 95 % Clopper–Pearson interval of the rate.
  `seeds`: where the n trials are a subset of the seeds run (`paired_count`: the seeds where exactly one of two
  solved), how many seeds they came from; None where every seed is a trial."""

  k: int
  n: int
  seeds: int | None = None

  @property
  def of_seeds(self) -> int:
    """The seeds the count rests on (for MIN_SEEDS and a study's DESIGN)."""
    return self.n if self.seeds is None else self.seeds

  def __post_init__(self):
    if not 0 <= self.k <= self.n:
      raise ValueError(f"a count of {self.k} of {self.n}")

  @property
  def mean(self) -> float:
    return self.k / self.n if self.n else float("nan")

  @property
  def low(self) -> float:
    return 0.0 if self.k == 0 else float(scipy_stats.beta.ppf(0.025, self.k, self.n - self.k + 1))

  @property
  def high(self) -> float:
    return 1.0 if self.k == self.n else float(scipy_stats.beta.ppf(0.975, self.k + 1, self.n - self.k))

  def as_dict(self) -> dict:
    return {"k": self.k, "n": self.n, "rate": self.mean, "ci95": [self.low, self.high], "seeds": self.of_seeds}

  def text(self, digits: int = 3) -> str:
    """ "k/n [low, high]": the count and its rate's interval."""
    return f"{self.k}/{self.n} [{self.low:.{digits}g}, {self.high:.{digits}g}]"


def count(values: list[float | None], solved: float) -> Count | None:
  """The seeds whose value reaches `solved` (≥), of the seeds that finished; None without any."""
  values = [v for v in values if v is not None and math.isfinite(v)]
  return Count(sum(v >= solved for v in values), len(values)) if values else None


def paired_count(ours: dict, baseline: dict, solved: float) -> Count | None:
  """McNemar's exact test for two arms whose seeds ({seed: value}, paired) solve (≥ solved) or not: of the seeds
  where exactly one of the two solved, the count where `ours` did, with `seeds` the paired seeds. Against a rate of
  1/2 it is the exact sign test of "ours solves where the baseline does not more often than the reverse"; the
  seeds where both or neither solved say nothing about the difference. None without paired seeds."""
  seeds = [s for s in ours if s in baseline and ours[s] is not None and baseline[s] is not None]
  if not seeds:
    return None
  split = [s for s in seeds if (ours[s] >= solved) != (baseline[s] >= solved)]
  return Count(sum(ours[s] >= solved for s in split), len(split), seeds=len(seeds))


def p_value(measured: Interval | Count, threshold: float) -> float:
  """The two-sided p-value of "the true mean (or rate) equals threshold": Student's t on n − 1 degrees of freedom
  (a fitted slope's n − 2) for an Interval (its standard error read back from the interval), the exact binomial
  test for a Count (twice the smaller tail: the test whose 95 % acceptance region is the Clopper–Pearson
  interval); 0 or 1 for a zero-width Interval (a deterministic measurement) off or on the threshold."""
  if isinstance(measured, Count):
    rate = min(max(threshold, 0.0), 1.0)
    tails = scipy_stats.binom.sf(measured.k - 1, measured.n, rate), scipy_stats.binom.cdf(measured.k, measured.n, rate)
    return float(min(1.0, 2 * min(tails)))
  if measured.low is None:
    return 1.0
  half = (measured.high - measured.low) / 2
  if half == 0:
    return 1.0 if measured.mean == threshold else 0.0
  df = measured.n - 1 if measured.df is None else measured.df
  t = (measured.mean - threshold) / (half / t975(df))
  return float(2 * scipy_stats.t.sf(abs(t), df))


def exact(value: float) -> Interval:
  """A deterministic measurement (compiled memory, a count) as an interval of zero width: a verdict may rest on
  it without seeds."""
  return Interval(value, value, value, MIN_SEEDS, seeded=False)


def verdict(
  difference: Interval | Count | None, threshold: float, in_regime: bool, why_not: str = "", above: bool = True
) -> tuple[str, str]:
  """(verdict, reason) of a claim "the difference exceeds threshold" (above=False: "lies below it"): held where the
  whole interval lies on the claimed side of the threshold, did not hold where it lies on the other, inconclusive
  where it straddles it; untested at this scale where the run is not in the claim's regime (why_not says how) or
  has fewer than MIN_SEEDS seeds. A Count is judged by its rate's Clopper–Pearson interval."""
  if not in_regime:  # the first reason: more seeds would not make the run the paper's
    return UNTESTED, why_not or "the run is not in the claim's regime"
  seeds = difference.of_seeds if isinstance(difference, Count) else None if difference is None else difference.n
  if difference is None or seeds < MIN_SEEDS:
    unit = difference.unit if isinstance(difference, Interval) else "seeds"
    return UNTESTED, f"{seeds or 0} {unit} (a verdict needs {MIN_SEEDS})"
  if isinstance(difference, Count) and difference.n == 0:  # a paired count where no seed split the two arms
    return UNTESTED, f"no seed of {difference.of_seeds} where exactly one of the two solved"
  if isinstance(difference, Interval) and not difference.seeded and difference.df is None:  # stats.exact
    if not math.isfinite(difference.mean):
      return UNTESTED, f"the measurement is {difference.mean}"
    side = ">" if above else "<"
    where = f"exact (a deterministic measurement): {difference.mean:.3g}, the claim {side} {threshold:.3g}"
    if (difference.mean > threshold) == above and difference.mean != threshold:
      return HELD, where
    return (DID_NOT_HOLD if difference.mean != threshold else INCONCLUSIVE), where
  if isinstance(difference, Count) and difference.seeds is not None:
    test = (
      f"{difference.k} of the {difference.n} of {difference.seeds} paired seeds where exactly one solved, exact "
      "sign test (McNemar), Clopper–Pearson"
    )
  elif isinstance(difference, Count):
    test = f"{difference.k} of {difference.n} seeds, Clopper–Pearson"
  elif difference.df is not None:
    test = f"least-squares fit over {difference.n} points, t on {difference.df} df"
  else:
    test = f"{difference.test}, {difference.n} {difference.unit}"
  where = (
    f"95 % interval [{difference.low:.3g}, {difference.high:.3g}] ({test}), the claim {'>' if above else '<'} "
    f"{threshold:.3g}"
  )
  if difference.low > threshold:
    return (HELD if above else DID_NOT_HOLD), where
  if difference.high < threshold:
    return (DID_NOT_HOLD if above else HELD), where
  return INCONCLUSIVE, where


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim of a paper, judged: what the paper says and in what setting, what we measured (with its interval
  and regime), the verdict (HELD, DID_NOT_HOLD, INCONCLUSIVE or UNTESTED) and why."""

  claim: str
  paper: str
  ours: str
  verdict: str
  why: str
  # The two-sided p-value of "the difference equals the threshold" (p_value), after `holm` the adjusted one: None
  # where the claim was not tested.
  p: float | None = None
  # The seeds (or repeats) the tested interval or count rests on, for `fixed_design`: None where no seed-to-seed
  # variation is in it (a deterministic measurement, stats.exact) or nothing was tested.
  n: int | None = None
  # What was measured, [mean, low, high] (low and high None with one value), and the threshold the claim puts it
  # against: the report's claims figure draws them. None where nothing was measured.
  measured: list | None = None
  threshold: float | None = None

  def __post_init__(self):
    if self.verdict not in (HELD, DID_NOT_HOLD, INCONCLUSIVE, UNTESTED):
      raise ValueError(f"verdict '{self.verdict}' is not one of {HELD}, {DID_NOT_HOLD}, {INCONCLUSIVE}, {UNTESTED}")


def holm(claims: list, alpha: float = 0.05) -> list:
  """The claims with Holm's step-down correction over those tested (p not None; other entries unchanged): the
  i-th smallest of m p-values is multiplied by m − i + 1 (made monotone, capped at 1), and a claim that held or did
  not hold keeps its verdict only where its adjusted p-value stays below alpha; else it becomes inconclusive (the
  correction never strengthens a verdict). With one tested claim nothing changes. The reason gives the p-value
  and names the correction."""
  tested = sorted((c.p, i) for i, c in enumerate(claims) if isinstance(c, Claim) and c.p is not None)
  m = len(tested)
  out = list(claims)
  running = 0.0
  for rank, (p, i) in enumerate(tested):
    running = max(running, min(1.0, (m - rank) * p))
    c = claims[i]
    decided = c.verdict if running < alpha or m == 1 else INCONCLUSIVE
    note = f"; Holm over {m} claims: adjusted p = {running:.2g}" if m > 1 else f"; p = {p:.2g}"
    out[i] = dataclasses.replace(c, verdict=decided, why=c.why + note, p=running)
  return out


def regime(setting_ok: bool, setting_why: str, converged: tuple[bool, str] = (True, "")) -> tuple[bool, str]:
  """Whether a run is in a claim's regime: its setting resembles the paper's (depth, width, data; setting_why says
  how it does not) and the compared runs have converged (`settled`'s answer). Returns (in regime, why not)."""
  if not setting_ok:
    return False, setting_why + (f"; {converged[1]}" if converged[1] else "")
  if not converged[0]:
    return False, f"not converged: {converged[1]}"
  return True, converged[1]


def judge(
  claim: str,
  paper: str,
  ours: str,
  difference: Interval | None,
  threshold: float,
  in_regime: bool,
  why_not: str = "",
  above: bool = True,
) -> Claim:
  """A Claim whose verdict is verdict(difference, threshold, in_regime, why_not, above), with its test's p-value
  where it was tested (for `holm`). A tested claim's reason also says how its regime was checked: why_not's text
  where the study checked it (`regime`: e.g. the settled difference), else that none was (the claim is judged on
  the setting as measured)."""
  decided, why = verdict(difference, threshold, in_regime, why_not, above)
  p = None if decided == UNTESTED else p_value(difference, threshold)
  if p is not None:
    why += f"; regime: {why_not}" if why_not else "; regime: none checked (judged on the setting as measured)"
  seeded = isinstance(difference, Count) or isinstance(difference, Interval) and difference.seeded
  measured = (
    [difference.mean, difference.low, difference.high]
    if difference is not None and math.isfinite(difference.mean)
    else None
  )
  return Claim(
    claim,
    paper,
    ours,
    decided,
    why,
    p=p,
    n=(difference.of_seeds if isinstance(difference, Count) else difference.n) if seeded and p is not None else None,
    measured=measured,
    threshold=threshold,
  )


def fixed_design(claims: list, declared: int) -> list:
  """The claims with a verdict kept only where its test rests on the declared number of seeds (or repeats), the
  number a sweep file fixes before its runs (DESIGN): a claim tested on more (seeds added after a look) or fewer
  (runs lost) becomes untested at this scale and says why, so that no verdict comes from stopping when it suited.
  Claims without seeds (n None) are unchanged. Apply before `holm`: a claim it unmakes is not among the tested."""
  out = []
  for c in claims:
    if isinstance(c, Claim) and c.n is not None and c.n != declared:
      c = dataclasses.replace(
        c, verdict=UNTESTED, why=f"{c.n} seeds where the design fixed {declared} before the runs ({c.why})", p=None
      )
    out.append(c)
  return out


def at_fraction(curve: list[tuple[int, float]], fraction: float) -> tuple[int, float] | None:
  """The (step, value) logged last at or before `fraction` of the way from the curve's first step to its last."""
  if not curve:
    return None
  mark = curve[0][0] + fraction * (curve[-1][0] - curve[0][0])
  before = [(s, v) for s, v in curve if s <= mark]
  return before[-1] if before else None


def learning_fraction_step(rates: list[tuple[int, float]], fraction: float = 0.8) -> float | None:
  """The step by which a run had applied `fraction` of its summed learning rate, from the rates it logged
  ([(step, rate)] in step order, each rate standing for the steps since the one logged before, from step 0).
  Under a constant rate it is `fraction` of the steps; under cosine decay to 0 (after 0–20 % of warm-up) the last
  fifth of the summed rate starts at 48–55 % of the steps, where the last fifth of the steps holds 1–2 % of it.
  None without a positive sum."""
  spans, before = [], 0
  for step, rate in rates:
    if step > before:
      spans.append((before, step, max(float(rate), 0.0)))
      before = step
  total = sum((b - a) * r for a, b, r in spans)
  if not spans or total <= 0:
    return None
  goal, summed = fraction * total, 0.0
  for a, b, r in spans:
    if r > 0 and summed + (b - a) * r >= goal:
      return a + (goal - summed) / r
    summed += (b - a) * r
  return float(spans[-1][1])


def _before(curve: list[tuple[int, float]], start: float | None) -> tuple[int, float] | None:
  """The (step, value) logged last at or before `start` (four fifths of the curve's steps where None)."""
  if start is None:
    return at_fraction(curve, 0.8)
  before = [(s, v) for s, v in curve if s <= start]
  return before[-1] if before else None


def last_fifth_change(curve: list[tuple[int, float]], start: float | None = None) -> float | None:
  """A learning curve's ([(step, value)], in step order) change over the last fifth of training: the final value
  minus the one logged last at or before `start`, the step from which the run applied the last fifth of its
  summed learning rate (`learning_fraction_step`; four fifths of the curve's steps where None). Evaluations are
  coarse (every few hundred steps), so the span is at least that fifth. What says whether a run is still
  improving, i.e. short of the converged regime a paper reports. None without a value logged before that mark."""
  if len(curve) < 2:
    return None
  before = _before(curve, start)
  return None if before is None or before[0] == curve[-1][0] else curve[-1][1] - before[1]


def settled(curves: dict, baseline_curves: dict, within: float, start: float | None = None) -> tuple[bool, str]:
  """Whether a paired difference has been shown to stop moving: (ours − baseline) over the seeds both logged
  ({seed: curve}), at the end against at `start`, seed by seed. `start` is the step from which the runs applied
  the last fifth of their summed learning rate (a row's "last_fifth_from"; four fifths of the steps where None):
  under a schedule that decays the rate to 0 the last fifth of the steps trains at a few per cent of the peak
  and every curve flattens there, so the fifth is counted in learning rate, not in steps. Settled only where the
  95 % interval of those moves lies inside ±within (an equivalence test, two one-sided t-tests at 2.5 % each):
  the tolerance is the study's, fixed before the runs (a fraction of the effect its claim is about). Noisy seeds
  widen the interval and so fail it, as a curve still moving does; fewer than MIN_SEEDS seeds cannot show it.
  It shows that the difference stopped moving within the run, not that a longer run would not move it. Returns
  (settled, a phrase saying by how much it moved)."""
  if within <= 0:
    raise ValueError(f"settled: the tolerance within={within} must be > 0")
  seeds = sorted(s for s in curves if s in baseline_curves and curves[s] and baseline_curves[s])
  if not seeds:
    return False, "no learning curves"
  moves, marks = [], set()
  for s in seeds:
    ours, theirs = dict(curves[s]), dict(baseline_curves[s])
    steps = sorted(set(ours) & set(theirs))
    if len(steps) < 2:
      return False, "fewer than two evaluations"
    mark = _before([(t, 0.0) for t in steps], start)
    if mark is None or mark[0] == steps[-1]:
      return False, "no evaluation before the last fifth"
    mark = mark[0]
    marks.add(mark)
    moves.append((ours[steps[-1]] - theirs[steps[-1]]) - (ours[mark] - theirs[mark]))
  moved = interval(moves)
  if moved.n < MIN_SEEDS:
    return False, f"the difference moved {moved.mean:+.3g} over the last fifth on {moved.n} seeds (too few to show)"
  ok = -within < moved.low and moved.high < within
  since = f", from step {min(marks)}" if len(marks) == 1 else f", from steps {min(marks)}–{max(marks)}"
  return ok, (
    f"the difference moved {moved.text(3)} over the last fifth{since} ("
    + ("inside" if ok else "not inside")
    + f" ±{within:.3g})"
  )


def settled_between(row: dict, baseline: dict, within: float) -> tuple[bool, str]:
  """`settled` for two of the report's rows (as `between` is `paired` for them): their judged seeds' curves, from
  the earlier of their "last_fifth_from" steps. The rows must share a schedule: starts more than 5 % apart (runs
  of different lengths or warm-ups) raise ValueError, as one step cannot mark both runs' last fifth."""
  starts = [r.get("last_fifth_from") for r in (row, baseline) if r.get("last_fifth_from") is not None]
  if len(starts) == 2 and abs(starts[0] - starts[1]) > 0.05 * max(starts):
    raise ValueError(
      f"settled_between: the rows' last fifths start at steps {starts[0]:.0f} and {starts[1]:.0f}: their schedules "
      "differ, so their differences' moves cannot be read from one step"
    )
  return settled(row["curves"], baseline["curves"], within, min(starts) if starts else None)


def slope(xs: list[float], ys: list[float]) -> float:
  """The least-squares slope of ys against xs."""
  return statistics.linear_regression(xs, ys).slope


def loglog_slope(xs: list[float], ys: list[float]) -> float:
  """The slope of log y against log x: the exponent p of y ∝ x^p."""
  return slope([math.log(x) for x in xs], [math.log(y) for y in ys])


def fitted_slope(xs: list[float], ys: list[float], log: bool = False) -> Interval | None:
  """The least-squares slope of ys against xs (log=True: of log y against log x, an exponent) with its 95 %
  interval from the regression's standard error, slope ± t₀.₉₇₅(n − 2) · √(Σ residual² / (n − 2) / Σ (x − x̄)²):
  a curved relation leaves residuals and widens it, where a slope alone would read as exact. n is the number of
  points, not of seeds (seeded False: a study's DESIGN does not count them); None below 3 points, where no error
  can be estimated."""
  if log:
    xs, ys = [math.log(x) for x in xs], [math.log(y) for y in ys]
  n = len(xs)
  if n < 3 or len(ys) != n:
    return None
  fit = statistics.linear_regression(xs, ys)
  x_mean = sum(xs) / n
  sxx = sum((x - x_mean) ** 2 for x in xs)
  residuals = sum((y - fit.intercept - fit.slope * x) ** 2 for x, y in zip(xs, ys))
  half = t975(n - 2) * math.sqrt(residuals / (n - 2) / sxx)
  return Interval(fit.slope, fit.slope - half, fit.slope + half, n, seeded=False, df=n - 2)


median = statistics.median
