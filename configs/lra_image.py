"""LRA Image: classify an image from its grey pixels as a flat sequence (no 2-D structure given to the model).

    tfds build cifar10 --file_format=array_record            # once, where the network reaches (~160 MB)
    python -m efftx.train --config=configs/lra_image.py:mixer=fnet --workdir=/tmp/efftx/lra-image-fnet
    python -m efftx.train --config=configs/lra_image.py:data=fashion_mnist --workdir=/tmp/efftx/fmnist-attention
    python -m efftx.train --config=configs/lra_image.py:data=fashion_mnist,smoke --workdir=/tmp/efftx/fm-smoke

Arguments: mixer=<name> (default attention); data=cifar10 (LRA's task: 1,024 tokens; needs the TFDS dataset) or
data=fashion_mnist (784 tokens, offline: `apt-get install dataset-fashion-mnist`, or the idx files' folder as
--config.data.corpus_dir); steps=<training steps>; smoke (tiny model and data, a few steps, ~15 s).

From LRA (lra_benchmarks/image/configs/cifar10/base_cifar10_config.py): 1 layer, width 32, 1 head, feed-forward 64,
dropout 0.3, attention dropout 0.2, batch 256, 35K steps (200 epochs of 45K images), AdamW-style Adam at 5e-4 with
warmup 175 and cosine decay, no weight decay, no gradient clipping (grad_clip_norm = None); pixels are
tf.image.rgb_to_grayscale values 0–255 (vocab 256); train on train[:90%], validate on train[90%:]. Reference accuracy
(LRA Table 1): Transformer 42.44, Linear Transformer 42.34, Reformer 38.07; FNet paper: FNet 38.67. That base size is
not what LRA's rows ran: its Transformer file sets width 128, qkv 64, feed-forward 128, 8 heads (added to the public
code at ee6649e, "the missing config ... for transformer on image tasks"), and each other model file its own sizes
(experiments/lra_reduced/lra_configs.md); this config keeps the base size for every mixer.
Fashion-MNIST uses the same model for 4,300 steps (20 epochs of 55K images); no paper reports this
sequence-classification setting — it is efftx's offline stand-in. Measured here: see experiments/tasks/README.md.
"""

from efftx import config as config_lib


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, mixer="attention", data="cifar10", steps=0, smoke=False)
  if args.data not in ("cifar10", "fashion_mnist"):
    raise config_lib.UserError(f"data={args.data}: choose cifar10 or fashion_mnist")
  config = config_lib.default_config(args.mixer)
  config.model.update(d_model=32, num_layers=1, d_ff=64, dropout=0.3)
  # One head for every mixer with heads; attention dropout 0.2 wherever there are attention probabilities.
  config_lib.set_where_declared(config.mixer, num_heads=1, attention_dropout=0.2)
  config.optim.update(learning_rate=5e-4, warmup_steps=175, weight_decay=0.0, grad_clip=0.0)
  config.data.batch_size = 256
  if args.data == "cifar10":
    config.data.update(task="cifar10_grey", variant="default")
    config.model.max_len = 1024
    config.total_steps = 35_000
  else:
    config.data.update(task="fashion_mnist", variant="full")
    config.model.max_len = 784
    config.total_steps = 4_300
  config.total_steps = args.steps or config.total_steps
  config.log_every = 50
  config.eval_every = 1_000
  config.checkpoint_every = 1_000
  if args.smoke:
    if args.data == "fashion_mnist":
      config.data.variant = "tiny"
    config.data.batch_size = 16
    config.optim.warmup_steps = 2
    config_lib.smoke_schedule(config)
  return config
