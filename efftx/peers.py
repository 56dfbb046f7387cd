"""`python -m efftx.peers`: runs efftx.perf.peers (see there)."""

import runpy

if __name__ == "__main__":  # as `python -m efftx.perf.peers`: its own __main__ block, its docstring as --help
  runpy.run_module("efftx.perf.peers", run_name="__main__", alter_sys=True)
