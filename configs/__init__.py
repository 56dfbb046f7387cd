"""Runnable configs, one per task or paper setup: `--config=configs/<name>.py[:argument]`. Installed with the
package as `efftx.configs`, so `python -m efftx.train` finds its default (quickstart) without a checkout."""
