"""Zoology's Figure 2 (Arora et al., ICLR 2024): multi-query associative recall, one cell of the figure per run.

    python -m efftx.train --config=configs/zoology_fig2.py:mixer=attention,L=64,d_model=64,lr=1e-3 --workdir=DIR
    python -m efftx.train --config=configs/zoology_fig2.py:mixer=base_conv,L=128,d_model=128 --workdir=DIR
    python -m efftx.train --config=configs/zoology_fig2.py:smoke --workdir=/tmp/efftx/fig2-smoke   # seconds

Arguments: mixer= attention, hyena, rwkv, h3 or base_conv (Figure 2's rows; any causal mixer or layer pattern
runs too); L= 64, 128, 256 or 512 (with 4, 8, 16, 64 key-value pairs); d_model= (Figure 2: 64, 128, 256,
512); lr= (Figure 2 sweeps np.logspace(-4, -2, 4): 1e-4, 4.64e-4, 2.15e-3, 1e-2, and plots the best); layers= (2,
as Zoology's config has had since its "Fix number of layers" commit; the config first published with the figure
gave the non-attention mixers 4); smoke.

Everything follows zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py, zoology/config.py,
zoology/model.py and zoology/train.py:
- data: the mqar task's variant LxKV (Zoology's own examples, bit for bit: efftx/data/mqar.py), vocabulary 8,192,
  100k training examples, its 3k test set as the validation split; batch 512 (256 at L 256, 128 at L 512);
- model: 2 layers of [mixer, identity state mixer] (each block adds LN(x) after its mixer: Zoology's
  torch.nn.Identity state mixer), pre-LN with eps 1e-5, head tied to the token embeddings; learned positions for
  attention only; dropout 0.1 on the embeddings and nowhere else (attention: 0.1 on its probabilities too);
  every dense kernel N(0, 0.02²), biases 0, the mixers' output projections (out_proj) N(0, 0.02²/(2·2));
- mixers: attention 1 head; Hyena and RWKV at their defaults with l_max = L; H3 with d_state = L and head_dim 2;
  BaseConv with kernel sizes [3, -1]: a short convolution in layer 1, an implicit long one in layer 2
  (the pattern zoology_base_conv: base_conv+base_conv_long);
- training: AdamW (torch's defaults, weight decay 0.1 on every parameter), no warmup, no clipping, cosine from
  lr to 0 over 64 epochs stepped once per epoch; validation after every epoch on all 3k examples, stopping when
  its accuracy is above 0.99 (config.stop_metric). Figure 2 plots the final validation accuracy, best of the 4 rates.

Differences: the training stream is reshuffled every pass (Zoology reads its training set in one order) and cut
into full batches only: the schedule's epoch is 100,000 // batch steps (195 at batch 512), where Zoology's epoch
also has a last, smaller batch (160 examples at 512), so the learning rate's epochs drift from the passes over the
data by that remainder each epoch. Expected (Figure 2): attention
above 0.99 at every cell; the attention-free rows need more width as L grows (experiments/zoology_fig2).
"""

import numpy as np

from efftx import config as config_lib

SETTINGS = {64: "64x4", 128: "128x8", 256: "256x16", 512: "512x64"}
BATCH = {64: 512, 128: 512, 256: 256, 512: 128}
TRAIN_EXAMPLES = 100_000
EPOCHS = 64
LEARNING_RATES = tuple(float(x) for x in np.logspace(-4, -2, 4))  # 1e-4, 4.64e-4, 2.15e-3, 1e-2, exactly Zoology's
# Figure 2's mixer keyword arguments, per row: the efftx mixer (or layer pattern) and its options.
ROWS = {
  "attention": ("attention", {"num_heads": 1, "attention_dropout": 0.1}),
  "hyena": ("hyena", {}),
  "rwkv": ("rwkv", {}),
  "h3": ("h3", {"d_state": 0, "head_dim": 2}),  # d_state 0: the sequence length (Figure 2: d_state = L)
  "base_conv": ("zoology_base_conv", {}),
}


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, mixer="attention", L=64, d_model=64, lr=1e-3, layers=2, smoke=False)
  if args.L not in SETTINGS:
    raise config_lib.UserError(f"L={args.L}: Figure 2's lengths are {', '.join(map(str, SETTINGS))}")
  mixer, options = ROWS.get(args.mixer, (args.mixer, {}))
  config = config_lib.default_config(mixer)
  config.model.update(
    causal=True,
    d_model=args.d_model,
    num_layers=args.layers,
    d_ff=0,
    state_mixer="identity",
    max_len=args.L,
    dropout=0.0,
    embed_dropout=0.1,
    norm_eps=1e-5,
    init_std=0.02,
    init_rescale_out=True,
    tie_embeddings=True,
    position_embedding="learned" if mixer == "attention" else "none",
  )
  config_lib.set_where_declared(config.mixer, **options)
  batch_size = BATCH[args.L]
  config.data.update(task="mqar", variant=SETTINGS[args.L], batch_size=batch_size, eval_examples=0, in_memory=True)
  steps_per_epoch = TRAIN_EXAMPLES // batch_size
  config.optim.update(
    learning_rate=args.lr,
    warmup_steps=0,
    weight_decay=0.1,
    decay_all=True,
    grad_clip=0.0,
    schedule_every=steps_per_epoch,
  )
  config.total_steps = EPOCHS * steps_per_epoch
  config.log_every = 50
  config.eval_every = steps_per_epoch
  config.checkpoint_every = steps_per_epoch
  config.stop_metric = "eval_accuracy"
  config.stop_above = 0.99
  if args.smoke:
    config.data.update(variant="tiny", batch_size=32)
    config.model.update(d_model=32, max_len=64)
    config_lib.smoke_schedule(config)
    config.optim.schedule_every = 1
  return config
