"""LRA ListOps: the full task (96K/2K/2K expressions, 500 < length < 2000), model at LRA's ListOps size.

    python -m efftx.train --config=configs/lra_listops.py:mixer=attention --workdir=/tmp/efftx/listops-attention
    python -m efftx.train --config=configs/lra_listops.py:mixer=fnet --workdir=/tmp/efftx/listops-fnet
    python -m efftx.train --config=configs/lra_listops.py:smoke --workdir=/tmp/efftx/listops-smoke   # seconds

Arguments: mixer=<name> (default attention); smoke (tiny data and model, a few steps: a plumbing check).

Model: LRA's ListOps Transformer (lra_benchmarks/listops/configs/base_listops_config.py at its first import, 6d5e5ca: 6
layers, width 512, 8 heads, feed-forward 2048, sequences padded to 2000, batch 32, 5K steps, weight decay 0.1,
dropout 0.1; the code moved to 4 layers and feed-forward 1024 at 8d3dc39, 2021-03-22). LRA's schedule is 0.05 ·
linear warmup (1,000 steps) · rsqrt decay, a peak of 0.05/√1000 = 1.6e-3; here AdamW with that peak, the same
warmup and cosine decay; no gradient clipping (listops/train.py clips none). LRA pools a CLS token; efftx pools the
mean of real tokens. Reference accuracies (test, LRA Table 1): Transformer 36.37, Reformer 37.27, Linear
Transformer 16.13; FNet paper: FNet 35.33. A full run is for an accelerator: at length 2000 a step of the attention
model on the 2-core CPU takes seconds; preparing the data takes about two minutes of plain Python, once.
"""

from efftx import config as config_lib


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, mixer="attention", smoke=False)
  config = config_lib.default_config(args.mixer)
  config.model.update(d_model=512, num_layers=6, d_ff=2048, max_len=2000, dropout=0.1)
  # Every mixer with heads gets 8, every mixer with attention probabilities (attention, local, lsh) dropout 0.1.
  config_lib.set_where_declared(config.mixer, num_heads=8, attention_dropout=0.1)
  config.data.update(task="listops", variant="full", batch_size=32)
  config.optim.update(learning_rate=1.6e-3, warmup_steps=1_000, weight_decay=0.1, grad_clip=0.0)
  config.total_steps = 5_000
  config.log_every = 50
  config.eval_every = 500
  config.checkpoint_every = 500
  if args.smoke:
    config.data.variant = "tiny"
    config.model.update(d_model=32, num_layers=2, d_ff=64, max_len=48)
    config_lib.set_where_declared(config.mixer, num_heads=4)
    config.data.batch_size = 16
    config_lib.smoke_schedule(config)
  return config
