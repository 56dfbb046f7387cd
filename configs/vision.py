"""Image classification through patches (ViT/DeiT): the model cuts an image's pixel tokens into patch_size ×
patch_size patches, embeds each, and mixes the grid of patches.

    python -m efftx.train --config=configs/vision.py --workdir=/tmp/efftx/vit-fmnist
    python -m efftx.train --config=configs/vision.py:mixer=aft_conv --workdir=/tmp/efftx/vit-fmnist-aft-conv
    tfds build cifar10 --file_format=array_record            # once, where the network reaches (~160 MB)
    python -m efftx.train --config=configs/vision.py:data=cifar10 --workdir=/tmp/efftx/vit-cifar10
    python -m efftx.train --config=configs/vision.py:data=imagenet,mixer=aft_conv --workdir=/tmp/efftx/deit-aft-conv
    python -m efftx.train --config=configs/vision.py:smoke --workdir=/tmp/efftx/vit-smoke

Arguments: data=fashion_mnist (default; offline: `apt-get install dataset-fashion-mnist`, or the idx files' folder
as --config.data.corpus_dir) | cifar10 | imagenet; mixer=<mixer name or layer pattern, efftx/patterns.py> (default
attention); smoke (a 2-layer, 32-wide model on a 4 × 4 grid of patches, a few steps, on the chosen data —
Fashion-MNIST's tiny variant by default: a plumbing check).

fashion_mnist: 28 × 28 grey pixels in 4 × 4 patches (a 7 × 7 grid), a small ViT (width 128, 4 layers, 4 heads),
3,000 steps of 64 (3.5 epochs of 55K images), sized for a 2-core CPU: about 10 min for attention, 8 for FNet, 15–20
for AFT-conv (estimated from 150-step runs on a busy 2-core x86-64 machine, scaled by the quickstart's speed
there; not yet run to the end). After those 150 steps, validation accuracy on 512 images: attention 64 %,
AFT-conv 67 %, FNet 34 % (chance 10 %). No paper reports this setting; it is efftx's offline check that patches
train.
cifar10: 32 × 32 RGB in 4 × 4 patches (an 8 × 8 grid), a wider ViT (192, 6 layers), 20,000 steps of 128 (57 epochs
of 45K images): for an accelerator, or a long CPU run; trains on train[:90%], validates on train[90%:] (as LRA Image).
imagenet: the AFT paper's ImageNet setting, DeiT-S (Touvron et al., 2021), for which it reports 79.9 % top-1, and
81.0 % for AFT-conv with 384 heads and k = 15: 224 × 224 RGB in 16 × 16 patches (a 14 × 14 grid), width 384,
12 layers, 6 heads, feed-forward 1,536, a [CLS] position, AdamW at 5e-4 · 1024 / 512 = 1e-3 with batch 1024,
weight decay 0.05, 5 warm-up epochs, 300 epochs of cosine decay. Prepare imagenet2012 once: its two tar files
(ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar, from https://image-net.org after registering) go in
<data_dir>/downloads/manual, then `tfds build imagenet2012 --file_format=array_record` (TFDS's ImageNet builder
needs TensorFlow). Not DeiT's recipe, so expect less than its numbers: every split gets DeiT's evaluation transform
(resize to 256, centre crop 224; efftx.data.images.encode_imagenet) — none of its training augmentations
(random-resized crop, flip, RandAugment, mixup, cutmix, random erasing, repeated augmentation) — and there is no
stochastic depth (DeiT-S: 0.1), label smoothing (0.1) or floor of the cosine (DeiT: 1e-5). Not run here yet.
"""

from efftx import config as config_lib
from efftx import patterns

# ImageNet's schedule, in epochs of its train split (efftx's data stream reshuffles endlessly, so an epoch is
# IMAGENET_TRAIN_IMAGES examples rather than a whole number of batches).
IMAGENET_TRAIN_IMAGES = 1_281_167
IMAGENET_EPOCHS = 300
IMAGENET_WARMUP_EPOCHS = 5
IMAGENET_BATCH = 1024


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, data="fashion_mnist", mixer="attention", smoke=False)
  if args.data not in ("fashion_mnist", "cifar10", "imagenet"):
    raise config_lib.UserError(f"data={args.data}: choose fashion_mnist, cifar10 or imagenet")
  config = config_lib.default_config(args.mixer)
  config.model.pooling = "mean"
  config.optim.update(learning_rate=1e-3, weight_decay=0.05, grad_clip=1.0)
  config_lib.set_where_declared(config.mixer, num_heads=4)  # mixers with heads
  config.log_every = 50
  if args.data == "fashion_mnist":
    side = 28  # 28 × 28 × 1 pixel tokens
    config.data.update(task="fashion_mnist", variant="full")
    config.model.update(max_len=28 * 28, patch_size=4, d_model=128, num_layers=4, d_ff=256, dropout=0.1)
    config.data.batch_size = 64
    config.optim.warmup_steps = 200
    config.total_steps = 3_000
    config.eval_every = config.checkpoint_every = 500
    config_lib.set_where_declared(config.mixer, kernel_size=3)  # AFT-conv: a 3 × 3 kernel on the 7 × 7 grid
  elif args.data == "cifar10":
    side = 32  # 32 × 32 × 3 sub-pixel tokens, R, G, B interleaved
    config.data.update(task="cifar10", variant="default")
    config.model.update(max_len=32 * 32 * 3, patch_size=4, d_model=192, num_layers=6, d_ff=384, dropout=0.1)
    config.data.batch_size = 128
    config.optim.warmup_steps = 500
    config.total_steps = 20_000
    config.eval_every = config.checkpoint_every = 1_000
    config_lib.set_where_declared(config.mixer, kernel_size=3)  # AFT-conv: a 3 × 3 kernel on the 8 × 8 grid
  else:
    side = 224  # 224 × 224 × 3 sub-pixel tokens after DeiT's resize and centre crop
    config.data.update(task="imagenet", variant="default")
    # DeiT-S (deit/models.py: deit_small_patch16_224): patch 16, width 384, depth 12, 6 heads, MLP ratio 4,
    # LayerNorm eps 1e-6, exact GELU, a [CLS] token; no dropout (its stochastic depth 0.1 is not available here).
    config.model.update(
      max_len=224 * 224 * 3,
      patch_size=16,
      d_model=384,
      num_layers=12,
      d_ff=1536,
      dropout=0.0,
      pooling="cls",
      norm_eps=1e-6,
      activation="gelu",
      dtype="bfloat16",
    )  # DeiT trains in mixed precision (torch AMP)
    config_lib.set_where_declared(config.mixer, num_heads=6)  # DeiT-S's heads, for every mixer with heads ...
    mixers = patterns.mixer_names(config.model.mixer)
    if "aft_conv" in mixers:  # ... but AFT-conv: one key channel per head, the paper's "384 heads"
      (config.mixer.aft_conv if len(mixers) > 1 else config.mixer).num_heads = config.model.d_model
    # AFT-conv's kernel: k = 15 (15 × 15 on the 14 × 14 grid), the paper's best ImageNet row (it also mentions
    # k = 11); AFT-full/local: the factorised position bias of rank d' = 128 that the paper uses on ImageNet.
    config_lib.set_where_declared(config.mixer, kernel_size=15, aft_bias_dim=128)
    config.data.batch_size = IMAGENET_BATCH
    config.data.worker_count = 16  # decoding and resizing ~1K JPEGs a step needs worker processes
    # lr 5e-4 · batch / 512 (DeiT's scaling rule) = 1e-3; no gradient clipping in DeiT.
    config.optim.update(learning_rate=5e-4 * IMAGENET_BATCH / 512, weight_decay=0.05, grad_clip=0.0)
    # 5 · 1,281,167 / 1024 = 6,255.7 → 6,255 warm-up steps; 300 · 1,281,167 / 1024 = 375,341.9 → 375,341 steps.
    config.optim.warmup_steps = IMAGENET_WARMUP_EPOCHS * IMAGENET_TRAIN_IMAGES // IMAGENET_BATCH
    config.total_steps = IMAGENET_EPOCHS * IMAGENET_TRAIN_IMAGES // IMAGENET_BATCH
    config.log_every = 100
    config.eval_every = 12_500  # ~10 epochs (the 50,000 validation images)
    config.checkpoint_every = 2_500  # ~2 epochs
  # Windowed mixers (local, aft_local): the window reaches the patches one grid row above and below in raster order
  # (|t − t'| ≤ the grid's width).
  config_lib.set_where_declared(config.mixer, window=side // config.model.patch_size + 1)
  if args.smoke:
    if args.data == "fashion_mnist":
      config.data.variant = "tiny"
    config.model.update(d_model=32, num_layers=2, d_ff=64, patch_size=side // 4)  # a 4 × 4 grid of patches
    config_lib.set_where_declared(config.mixer, num_heads=4, kernel_size=3, window=5)
    config.data.update(batch_size=16, worker_count=0)
    config.optim.warmup_steps = 2
    config_lib.smoke_schedule(config)
  return config
