"""GLUE fine-tuning (FNet's Table 1 protocol), byte-level, usually from a masked-LM run (configs/mlm_bytes.py).

    tfds build glue/sst2 --file_format=array_record          # once, where the network reaches
    python -m efftx.train --config=configs/glue.py:mixer=fnet,task=sst2 --workdir=/tmp/efftx/sst2-fnet \
        --config.init_from=/tmp/efftx/mlm-fnet
    python -m efftx.train --config=configs/glue.py:smoke --workdir=/tmp/efftx/glue-smoke

Arguments: mixer=<name> (default fnet), task=<cola|sst2|mrpc|qqp|mnli|qnli|rte|wnli> (default sst2; pairs are
joined by a SEP byte; MNLI validates on validation_matched), epochs=<n>, lr=<peak>, smoke (a tiny model, a few
steps; the tests run it under tfds.testing.mock_data, ~10 s). --config.init_from=<workdir> loads the encoder of a run
with the same encoder (ENCODER) and starts a new classifier; without it the model trains from scratch.

FNet's fine-tuning (google-research f_net/configs/classification.py): batch 64, 3 epochs, 10 % warmup, learning
rate 1e-5 for its 768-wide base model; 1e-4 here is efftx's untuned choice for the smaller encoder. Reference
(FNet paper, GLUE dev average): FNet-Base 76.7, BERT-Base 83.3; those need FNet's pre-training scale and
SentencePiece vocabulary. STS-B (regression) is not supported.
"""

from efftx import config as config_lib
from efftx.data import GLUE_TRAIN_EXAMPLES

# The encoder of configs/mlm_bytes.py (same numbers there; tests/test_configs.py checks they agree).
ENCODER = dict(d_model=256, num_layers=4, d_ff=1024, max_len=512)
NUM_HEADS = 4  # for mixers with heads


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, mixer="fnet", task="sst2", epochs=3, lr=1e-4, smoke=False)
  if args.task not in GLUE_TRAIN_EXAMPLES:
    raise config_lib.UserError(f"task={args.task}: choose from {', '.join(GLUE_TRAIN_EXAMPLES)}")
  config = config_lib.default_config(args.mixer)
  config.model.update(causal=False, dropout=0.1, **ENCODER)
  config_lib.set_where_declared(config.mixer, num_heads=NUM_HEADS)
  config.model.max_len = 128
  config.data.update(task="glue", variant=args.task, batch_size=64, truncate=True)
  config_lib.fine_tuning_schedule(config, args.epochs, GLUE_TRAIN_EXAMPLES[args.task], args.lr)
  if args.smoke:
    config.model.update(d_model=32, num_layers=2, d_ff=64, max_len=64)
    config.data.batch_size = 16
    config.optim.warmup_steps = 2
    config_lib.smoke_schedule(config)
  return config
