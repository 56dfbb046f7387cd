"""MQAR — Zoology's multi-query associative recall (Figure 2): can a mixer look up many keys in one pass?

    python -m efftx.train --config=configs/mqar.py:mixer=attention --workdir=/tmp/efftx/mqar-attention
    python -m efftx.train --config=configs/mqar.py:mixer=aft_simple,setting=256x16,d_model=128 --workdir=...
    python -m efftx.train --config=configs/mqar.py:smoke --workdir=/tmp/efftx/mqar-smoke      # ~15 s

Arguments: mixer=<name> (a causal mixer; default attention), setting=<L>x<kv> (64x4, 128x8, 256x16, 512x64;
default 64x4) or 64x4_v256, d_model=<width> (Zoology sweeps 64, 128, 256, 512), lr=<peak learning
rate>, smoke.

Figure 2's exact protocol (identity state mixers, tied head, early stopping, Zoology's optimizer) is
configs/zoology_fig2.py; this config is the looser setup of experiments/mqar.
Setup from Zoology (zoology/experiments/.../iclr24_zoology_figure2/configs.py, zoology/model.py): vocab 8192,
100k training and 3k test examples, 2 layers, 1 attention head, AdamW (weight decay 0.1) with cosine decay,
learning rates swept over {1e-4, 4.6e-4, 2.2e-3, 1e-2}, 64 epochs, batch 512 (256 at length 256), every linear
layer initialised N(0, 0.02²) (config.model.init_std). Differences: Zoology's blocks have no MLP, efftx blocks
always have a feed-forward sublayer (here width 2·d_model); Zoology drops 10 % of the embeddings and nothing
else, efftx has one dropout rate for both, here 0; Zoology scales its output projections' init by 1/√(2·layers)
and ties the head to the embedding, efftx does neither. Setting 64x4_v256 is Zoology's own first example
(zoology/experiments/examples/basic.py: vocab 256, 10k training and 1k test examples, batch 32, lr 1e-3): a task
attention learns on a CPU. Metric: accuracy over query positions (eval_accuracy). Paper's reference (Figure 2):
attention solves every setting at every width (accuracy ≈ 100 %); attention-free and gated-convolution mixers
need a much larger width.
The initialisation decides whether attention learns the task at all: on 64x4_v256 at width 64 (lr 1e-3, batch
32), attention reached 97.8 % validation accuracy after 1,500 steps with init_std 0.02, and stayed at 25.6 %
after 3,000 steps with flax's default LeCun-normal kernels (init_std 0) — guessing among the example's four
values; an independent plain-JAX model showed the same split (100 % vs 25.2 % at 1,500 steps;
experiments/mqar/init_check.py, experiments/mqar/README.md).
"""

from efftx import config as config_lib
from efftx.data import mqar


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, mixer="attention", setting="64x4", d_model=64, lr=2.2e-3, smoke=False)
  settings = {c.name: c for c in mqar.Mqar.BUILDER_CONFIGS}
  if args.setting not in settings:
    raise config_lib.UserError(f"setting={args.setting}: choose from {', '.join(settings)}")
  setting = settings[args.setting]
  config = config_lib.default_config(args.mixer)
  config.model.update(
    causal=True,
    d_model=args.d_model,
    num_layers=2,
    d_ff=2 * args.d_model,
    max_len=setting.seq_len,
    dropout=0.0,
    init_std=0.02,
  )
  config_lib.set_where_declared(config.mixer, num_heads=1, window=setting.seq_len)  # where the mixer has them
  # Zoology: batch 32 in its first example (64x4_v256), 512 in Figure 2 (256 at length 256 and above)
  batch_size = 32 if setting.name == "64x4_v256" else 256 if setting.seq_len >= 256 else 512
  config.data.update(task="mqar", variant=args.setting, batch_size=batch_size)
  steps_per_epoch = setting.num_train // config.data.batch_size
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
