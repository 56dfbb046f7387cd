"""Each judged mixer's time exponent two ways, from the published results.json: the verdicts' interval (one log-log
slope per repeat, a t-interval over the repeats: the timing noise), the least-squares fit on the repeats' means with
the regression's interval (t on lengths − 2 degrees of freedom: a curved growth widens it), and the local exponents
between successive lengths.

    PYTHONPATH=. python experiments/cost_vs_length/check.py
"""

import importlib.util
import json
import math
import pathlib
import statistics

from efftx.sweep import stats

HERE = pathlib.Path(__file__).parent


def main():
  spec = importlib.util.spec_from_file_location("cost_vs_length_sweep", HERE / "sweep.py")
  sweep = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(sweep)
  rows = json.loads((HERE / "results.json").read_text())["rows"]
  print("mixer | repeats' t-interval | fit on the means | local exponents")
  for label in sweep._JUDGED:
    lengths, costs = sweep._costs(rows, label, sweep.METRIC)
    repeats = stats.interval([stats.loglog_slope(lengths, c) for c in costs], unit="repeats")
    means = [statistics.mean(c) for c in zip(*costs)]
    fit = stats.fitted_slope(lengths, means, log=True)
    local = [math.log(means[i + 1] / means[i]) / math.log(lengths[i + 1] / lengths[i]) for i in range(len(means) - 1)]
    print(f"{label} | {repeats.text(3)} | {fit.text(3)} | {', '.join(f'{x:.2f}' for x in local)}")


if __name__ == "__main__":
  main()
