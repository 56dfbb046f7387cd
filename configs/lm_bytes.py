"""Byte-level language modelling (the AFT/Reformer enwik8 protocol) on the Python standard library's source.

    python -m efftx.train --config=configs/lm_bytes.py:mixer=aft_simple --workdir=/tmp/efftx/lm-aft-simple
    python -m efftx.sample --workdir=/tmp/efftx/lm-aft-simple --prompt="def " --length=200
    python -m efftx.train --config=configs/lm_bytes.py:smoke --workdir=/tmp/efftx/lm-smoke     # seconds

Arguments: mixer=<name> (a causal mixer; default attention), smoke (the stdlib's json/ package as the corpus,
a tiny model, a few steps: a plumbing check). Another corpus: --config.data.variant=files
--config.data.corpus_dir=DIR --config.data.data_dir=ANOTHER_DIR (e.g. /usr/share/dictd text, or enwik8).

Data: the corpus is cut into 1,024-byte records (90/5/5 % contiguous train/validation/test); a sequence is
the first max_len bytes of a record, so at max_len 256 a quarter of each record is read.
Model: 4 layers, width 128, 256-byte context, causal, 3,000 steps of batch 32 — a CPU-sized cousin of the papers'
24-layer, 1024-byte enwik8 models. Papers' reference (enwik8 test bits per byte): Transformer L24 1.130,
AFT-local-32 1.154, AFT-simple 1.209, Reformer 1.195. The stdlib corpus is not enwik8: compare mixers with each
other here, not with those numbers.
"""

import os

from efftx import config as config_lib
from efftx.data import byte_text


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, mixer="attention", smoke=False)
  config = config_lib.default_config(args.mixer)
  config.model.update(causal=True, d_model=128, num_layers=4, d_ff=512, max_len=256, dropout=0.1)
  config_lib.set_where_declared(config.mixer, num_heads=4)  # mixers with heads
  config.data.update(task="bytes", variant="stdlib", batch_size=32)
  config.optim.update(learning_rate=1e-3, warmup_steps=200, weight_decay=0.01, grad_clip=1.0)
  config.total_steps = 3_000
  config.log_every = 50
  config.eval_every = 500
  config.checkpoint_every = 500
  if args.smoke:
    config.data.update(variant="files", corpus_dir=os.path.join(byte_text.stdlib_dir(), "json"), batch_size=16)
    config.model.update(d_model=32, num_layers=2, d_ff=64, max_len=64)
    config_lib.smoke_schedule(config)
  return config
