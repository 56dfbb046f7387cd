"""LRA Text: IMDb sentiment from raw bytes (no tokenizer), each review cut at max_len bytes.

    tfds build imdb_reviews --file_format=array_record      # once, where the network reaches (~80 MB)
    python -m efftx.train --config=configs/lra_text.py:mixer=fnet --workdir=/tmp/efftx/lra-text-fnet
    python -m efftx.train --config=configs/lra_text.py:mixer=attention,len=4000 --workdir=...  # the paper's 4K
    python -m efftx.train --config=configs/lra_text.py:smoke --workdir=/tmp/efftx/lra-text-smoke

Arguments: mixer=<name> (default attention), len=<bytes> (default 1000, LRA's configs; the paper reports 4K),
smoke (a tiny model, a few steps; needs the dataset built; the tests run it under tfds.testing.mock_data, ~10 s).

From LRA (lra_benchmarks/text_classification/configs/base_tc_config.py): 4 layers, width 256, 4 heads,
feed-forward 1024, dropout 0.1 and attention dropout 0.1, batch 32, 20K steps, weight decay 0.1, reviews cut
at 1,000 bytes and padded; LRA evaluates on the test split. LRA's schedule 0.05 · warmup(8,000) · rsqrt decay
peaks at 0.05/√8000 = 5.6e-4: here AdamW with that peak, the same warmup, cosine decay. LRA pools a CLS token;
efftx the mean of real tokens. Reference accuracy (LRA Table 1): Transformer 64.27, Linear Transformer 65.90,
Reformer 56.10, Local attention 52.98; FNet paper: FNet 65.11.
"""

from efftx import config as config_lib


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, mixer="attention", len=1000, smoke=False)
  config = config_lib.default_config(args.mixer)
  config.model.update(d_model=256, num_layers=4, d_ff=1024, max_len=args.len, dropout=0.1)
  # Every mixer with heads gets 4, every mixer with attention probabilities (attention, local, lsh) dropout 0.1.
  config_lib.set_where_declared(config.mixer, num_heads=4, attention_dropout=0.1)
  config.data.update(task="imdb_bytes", variant="plain_text", batch_size=32, truncate=True)
  config.optim.update(learning_rate=5.6e-4, warmup_steps=8_000, weight_decay=0.1, grad_clip=1.0)
  config.total_steps = 20_000
  config.log_every = 100
  config.eval_every = 2_000
  config.checkpoint_every = 2_000
  if args.smoke:
    config.model.update(d_model=32, num_layers=2, d_ff=64, max_len=128)
    config.data.batch_size = 16
    config.optim.warmup_steps = 2
    config_lib.smoke_schedule(config)
  return config
