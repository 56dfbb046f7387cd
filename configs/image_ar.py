"""Autoregressive image modelling (AFT's CIFAR-10 density estimation): predict every sub-pixel from the ones
before it, in raster order; report bits per dim.

    tfds build cifar10 --file_format=array_record            # once, where the network reaches
    python -m efftx.train --config=configs/image_ar.py:mixer=aft_local --workdir=/tmp/efftx/cifar-ar-aft-local
    python -m efftx.train --config=configs/image_ar.py:data=fashion_mnist,mixer=aft_simple --workdir=...
    python -m efftx.train --config=configs/image_ar.py:data=fashion_mnist,smoke --workdir=/tmp/efftx/ar-smoke

Arguments: mixer=<name> (a causal mixer; default attention); data=cifar10 (3,072 RGB sub-pixels; needs the TFDS
dataset), data=fashion_mnist (784 grey pixels, offline) or data=fashion_mnist_14 (the same images averaged over
2 × 2 blocks: 14 × 14, 196 tokens, AFT-local's window 37 — the paper's 256 sub-pixels are 2.67 of CIFAR-10's
rows of 96, and 2.67 rows of 14 are 37); steps=<training steps>; smoke (a tiny model, a few
steps; ~20 s for CIFAR-10's 3,072 tokens under the tests' mock data, ~15 s on Fashion-MNIST).

From the AFT paper (Zhai et al. 2021, CIFAR-10): 24 layers, width 256; AFT-local window 256; factorised position
bias d' = 64. Its batch size, learning rate and schedule are not in the text available here (shared/PAPERS.md):
batch 32, AdamW 1e-3 with warmup and cosine decay are efftx's choice. Reference (test bits/dim): Transformer
2.86, AFT-local-256 2.74, AFT-simple 2.89. Fashion-MNIST: 4 layers, width 128 (a CPU-sized model; no paper
reference). Measured here: experiments/tasks/README.md (one run), experiments/image_ar/ (five mixers, 2 seeds, a
smaller model: `python -m efftx.sweep experiments/image_ar/sweep.py`).
"""

from efftx import config as config_lib


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, mixer="attention", data="cifar10", steps=0, smoke=False)
  if args.data not in ("cifar10", "fashion_mnist", "fashion_mnist_14"):
    raise config_lib.UserError(f"data={args.data}: choose cifar10, fashion_mnist or fashion_mnist_14")
  config = config_lib.default_config(args.mixer)
  config.model.update(causal=True, dropout=0.1)
  config_lib.set_where_declared(config.mixer, num_heads=4, window=256, aft_bias_dim=64)  # where the mixer has them
  config.optim.update(learning_rate=1e-3, warmup_steps=1_000, weight_decay=0.01, grad_clip=1.0)
  config.data.batch_size = 32
  if args.data == "cifar10":
    config.data.update(task="cifar10_ar", variant="default")
    config.model.update(d_model=256, num_layers=24, d_ff=1024, max_len=3072)
    config.total_steps = 100_000
  elif args.data == "fashion_mnist":
    config.data.update(task="fashion_mnist_ar", variant="full")
    config.model.update(d_model=128, num_layers=4, d_ff=512, max_len=784)
    config.total_steps = 5_000
  else:
    config.data.update(task="fashion_mnist_ar_14", variant="full")
    config.model.update(d_model=128, num_layers=4, d_ff=512, max_len=196)
    config_lib.set_where_declared(config.mixer, window=37)
    config.total_steps = 5_000
  config.total_steps = args.steps or config.total_steps
  config.log_every = 50
  config.eval_every = 1_000
  config.checkpoint_every = 1_000
  if args.smoke:
    if args.data == "fashion_mnist":
      config.data.variant = "tiny"
    config.model.update(d_model=32, num_layers=2, d_ff=64)
    config.data.batch_size = 8
    config.optim.warmup_steps = 2
    config_lib.smoke_schedule(config)
  return config
