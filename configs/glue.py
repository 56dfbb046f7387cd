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

# The encoder of configs/mlm_bytes.py (same numbers there; tests/test_configs.py checks they agree).
ENCODER = dict(d_model=256, num_layers=4, d_ff=1024, max_len=512)
NUM_HEADS = 4  # for mixers with heads

TRAIN_EXAMPLES = {"cola": 8_551, "sst2": 67_349, "mrpc": 3_668, "qqp": 363_846, "mnli": 392_702,
                  "qnli": 104_743, "rte": 2_490, "wnli": 635}


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, mixer="fnet", task="sst2", epochs=3, lr=1e-4, smoke=False)
  if args.task not in TRAIN_EXAMPLES:
    raise config_lib.UserError(f"task={args.task}: choose from {', '.join(TRAIN_EXAMPLES)}")
  config = config_lib.default_config(args.mixer)
  config.model.update(causal=False, dropout=0.1, **ENCODER)
  config_lib.set_where_declared(config.mixer, num_heads=NUM_HEADS)
  config.model.max_len = 128
  config.data.update(task="glue", variant=args.task, batch_size=64, truncate=True)
  config.total_steps = max(1, args.epochs * TRAIN_EXAMPLES[args.task] // config.data.batch_size)
  config.optim.update(learning_rate=args.lr, warmup_steps=config.total_steps // 10, weight_decay=0.01,
                      grad_clip=1.0)
  config.log_every = 50
  config.eval_every = max(1, config.total_steps // 3)
  config.checkpoint_every = config.eval_every
  if args.smoke:
    config.model.update(d_model=32, num_layers=2, d_ff=64, max_len=64)
    config.data.batch_size = 16
    config.optim.warmup_steps = 2
    config_lib.smoke_schedule(config)
  return config
