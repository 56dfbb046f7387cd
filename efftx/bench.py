"""`python -m efftx.bench`: runs efftx.perf.bench (see there)."""

import runpy

if __name__ == "__main__":  # as `python -m efftx.perf.bench`: its own __main__ block, its docstring as --help
  runpy.run_module("efftx.perf.bench", run_name="__main__", alter_sys=True)
