"""MQAR — Zoology's multi-query associative recall (Figure 2): can a mixer look up many keys in one pass?

    python -m efftx.train --config=configs/mqar.py:mixer=attention --workdir=/tmp/efftx/mqar-attention
    python -m efftx.train --config=configs/mqar.py:mixer=aft_simple,setting=256x16,d_model=128 --workdir=...
    python -m efftx.train --config=configs/mqar.py:smoke --workdir=/tmp/efftx/mqar-smoke      # ~15 s

Arguments: mixer=<name> (a causal mixer; default attention), setting=<L>x<kv> (64x4, 128x8, 256x16, 512x32,
1024x64; default 64x4), d_model=<width> (Zoology sweeps 64, 128, 256, 512), lr=<peak learning rate>, smoke.

Setup from Zoology (zoology/experiments/.../iclr24_zoology_figure2/configs.py): vocab 8192, 100k training and
3k test examples, 2 layers, 1 attention head, AdamW (weight decay 0.1) with cosine decay, learning rates swept
over {1e-4, 4.6e-4, 2.2e-3, 1e-2}, 64 epochs, batch 512 (256 at length 256), embedding dropout 0.1. Zoology's
blocks have no MLP; efftx blocks always have a feed-forward sublayer (here width 2·d_model). Metric: accuracy
over query positions (eval_accuracy). Paper's reference (Figure 2): attention solves every setting at every
width (accuracy ≈ 100 %); attention-free and gated-convolution mixers need a much larger width.
Measured here (2-core CPU, 64x4, width 64, only 1,000 steps of batch 64 — 0.64 epoch): query accuracy attention
18.7 %, aft_simple 15.6 % (experiments/tasks/README.md); the full schedule is for an accelerator.
"""
from efftx import config as config_lib


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, mixer="attention", setting="64x4", d_model=64, lr=2.2e-3, smoke=False)
  seq_len = int(args.setting.split("x")[0]) if "x" in args.setting else 64
  config = config_lib.default_config(args.mixer)
  config.model.update(causal=True, d_model=args.d_model, num_layers=2, d_ff=2 * args.d_model, max_len=seq_len,
                      dropout=0.1)
  config_lib.set_where_declared(config.mixer, num_heads=1, window=seq_len)  # where the mixer has them
  config.data.update(task="mqar", variant=args.setting, batch_size=256 if seq_len >= 256 else 512)
  steps_per_epoch = 100_000 // config.data.batch_size
  config.optim.update(learning_rate=args.lr, warmup_steps=steps_per_epoch, weight_decay=0.1, grad_clip=1.0)
  config.total_steps = 64 * steps_per_epoch
  config.log_every = 50
  config.eval_every = 4 * steps_per_epoch
  config.checkpoint_every = 4 * steps_per_epoch
  if args.smoke:
    config.data.update(variant="tiny", batch_size=32)
    config.model.update(d_model=32, d_ff=64, max_len=64)
    config_lib.smoke_schedule(config)
  return config
