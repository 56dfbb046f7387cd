"""`python -m efftx.lowering`: runs efftx.perf.lowering (see there)."""

import runpy

if __name__ == "__main__":  # as `python -m efftx.perf.lowering`: its own __main__ block, its docstring as --help
  runpy.run_module("efftx.perf.lowering", run_name="__main__", alter_sys=True)
