"""Sweeps: a study's grid of training runs (or bench measurements), run where --launcher says, then turned into
the study's table and plot.

    python -m efftx.sweep experiments/<study>/sweep.py --workdir=DIR [--parallel=2] [--report [--publish]]

Every point is one runnable command with its own folder: a re-run skips done points, resumes unfinished ones and
retries failed ones, and the report is rebuilt from the folders (or the published records) alone. A sweep file's
names, their types and defaults, the launchers and the records: efftx/sweep/README.md.
"""

from efftx.sweep.study import Panel  # what sweep files use
from efftx.sweep.study import Plot
from efftx.sweep.study import Point
from efftx.sweep.study import best_then_seeds
from efftx.sweep.study import grid

__all__ = ["Panel", "Plot", "Point", "best_then_seeds", "grid"]
