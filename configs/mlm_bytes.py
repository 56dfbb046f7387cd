"""Masked-LM pre-training (FNet's/BERT's protocol) on byte-level text, for fine-tuning with configs/glue.py.

    python -m efftx.train --config=configs/mlm_bytes.py:mixer=fnet --workdir=/tmp/efftx/mlm-fnet
    python -m efftx.train --config=configs/glue.py:mixer=fnet,task=sst2 --workdir=/tmp/efftx/sst2-fnet \
        --config.init_from=/tmp/efftx/mlm-fnet
    python -m efftx.train --config=configs/mlm_bytes.py:smoke --workdir=/tmp/efftx/mlm-smoke      # ~15 s

Arguments: mixer=<name> (default fnet; any non-causal mixer), smoke (stdlib json/ as the corpus, tiny model).
Another corpus: --config.data.variant=files --config.data.corpus_dir=DIR --config.data.data_dir=ANOTHER_DIR
(e.g. Debian's dict-gcide text).

FNet's pre-training (google-research f_net/configs/pretraining.py): 15 % of tokens chosen, of those 80 % [MASK],
10 % a random token, 10 % unchanged; sequences of 512; Adam(W) at 1e-4 with 10,000 warmup steps, weight decay
0.01, dropout 0.1; 1M steps at batch 64 on C4 with a SentencePiece vocabulary, plus next-sentence prediction.
Here: bytes of the Python standard library (no NSP), a 4-layer, 256-wide encoder, 20K steps, warmup 1,000 — a
CPU/GPU-sized version. FNet-Base's GLUE average after its pre-training: 76.7 (BERT-Base 83.3); those numbers
need the real scale and vocabulary.
"""

import os

from efftx import config as config_lib
from efftx.data import byte_text

# configs/glue.py fine-tunes this encoder and repeats these numbers (tests/test_configs.py checks they agree).
ENCODER = dict(d_model=256, num_layers=4, d_ff=1024, max_len=512)
NUM_HEADS = 4  # for mixers with heads


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, mixer="fnet", smoke=False)
  config = config_lib.default_config(args.mixer)
  config.model.update(causal=False, dropout=0.1, **ENCODER)
  config_lib.set_where_declared(config.mixer, num_heads=NUM_HEADS)
  config.data.update(task="bytes", variant="stdlib", objective="mlm", batch_size=64)
  config.optim.update(learning_rate=1e-4, warmup_steps=1_000, weight_decay=0.01, grad_clip=1.0)
  config.total_steps = 20_000
  config.log_every = 100
  config.eval_every = 2_000
  config.checkpoint_every = 2_000
  if args.smoke:
    config.data.update(variant="files", corpus_dir=os.path.join(byte_text.stdlib_dir(), "json"), batch_size=16)
    config.model.update(d_model=32, num_layers=2, d_ff=64, max_len=64)
    config.optim.warmup_steps = 2
    config_lib.smoke_schedule(config)
  return config
