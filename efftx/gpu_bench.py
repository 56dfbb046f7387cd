"""`python -m efftx.gpu_bench`: runs efftx.perf.gpu_bench (see there)."""

import runpy

if __name__ == "__main__":  # as `python -m efftx.perf.gpu_bench`: its own __main__ block, its docstring as --help
  runpy.run_module("efftx.perf.gpu_bench", run_name="__main__", alter_sys=True)
