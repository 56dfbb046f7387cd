"""`python -m efftx.ab`: runs efftx.perf.ab (see there)."""

import runpy

if __name__ == "__main__":  # as `python -m efftx.perf.ab`: its own __main__ block, its docstring as --help
  runpy.run_module("efftx.perf.ab", run_name="__main__", alter_sys=True)
