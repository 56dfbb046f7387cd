"""GLUE fine-tuning from a Hugging Face FNet or BERT checkpoint, with its own tokenizer: the FNet paper's protocol.

    tfds build glue/sst2 --file_format=array_record          # once, where the network reaches
    python -m efftx.train --config=configs/glue_hf.py:hf=/ckpt/google-fnet-base,task=sst2 \
        --workdir=/tmp/efftx/sst2-fnet-base
    python -m efftx.train --config=configs/glue_hf.py:smoke --workdir=/tmp/efftx/glue-hf-smoke

Arguments: hf=<folder> (config.json, model.safetensors and the checkpoint's tokenizer: tokenizer.json, a
SentencePiece .model or vocab.txt; default: tests/fixtures/hf_fnet_tiny, a tiny random FNet for the smoke run, not
a pretrained model), task=<cola|sst2|mrpc|qqp|mnli|qnli|rte|wnli> (default sst2), epochs=<n> (3), lr=<peak> (1e-5),
max_len=<tokens> (512, or the checkpoint's positions if fewer), smoke (4 steps of batch 16; the tests run it under
tfds.testing.mock_data).

The model is the checkpoint's (efftx.hf.load: its widths, layers, post-LN layout, LayerNorm epsilon, GELU, token
types, dropout rates); --config.init_from is the folder, so the encoder and its pooler load from it and only the
classifier is new. Text is encoded by the checkpoint's tokenizer as [CLS] a [SEP] b [SEP] with token types, cut
longest first to max_len and padded with its pad id (FNet mixes the padding in, as it did in pre-training), and the
label is read from the first token's pooled state (pooling="first": dense + tanh, then a linear classifier, as
f_net's SequenceClassificationModel).

Hyperparameters (google-research f_net configs/classification.py, the paper's fine-tuning): batch 64, 3 epochs,
10 % linear warmup, learning rate 1e-5 (the paper searched {1e-5, 5e-5, 1e-4, 5e-4} per task: lr=<peak>), dropout
0.1 (the checkpoint's hidden_dropout_prob), sequences of 512 tokens (f_net's max_seq_length). Where efftx differs:
its schedule decays by a cosine, where f_net's decays linearly; AdamW with weight decay 0.01 on weights only; dropout
also on the feed-forward hidden layer (and FNet's Fourier branch), which f_net and HF leave undropped. Reference (FNet
paper, GLUE dev average): FNet-Base 76.7, BERT-Base 83.3.
"""

import os

from efftx import config as config_lib
from efftx import hf
from efftx.data import GLUE_TRAIN_EXAMPLES

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures", "hf_fnet_tiny")


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, hf=FIXTURE, task="sst2", epochs=3, lr=1e-5, max_len=512, smoke=False)
  if args.task not in GLUE_TRAIN_EXAMPLES:
    raise config_lib.UserError(f"task={args.task}: choose from {', '.join(GLUE_TRAIN_EXAMPLES)}")
  if not hf.is_checkpoint(args.hf):
    raise config_lib.UserError(
      f"hf={args.hf}: not a Hugging Face checkpoint folder (config.json naming a model_type, and model.safetensors)"
    )
  checkpoint = hf.load_config(args.hf)  # the weights themselves load once, at init_from
  config = config_lib.default_config(checkpoint.model.mixer)
  config.model.update(checkpoint.model)
  config.mixer.update(checkpoint.mixer)
  config.model.max_len = min(args.max_len, checkpoint.model.max_len)
  if not checkpoint.data.tokenizer:
    raise config_lib.UserError(
      f"hf={args.hf}: the folder has no tokenizer (tokenizer.json, a SentencePiece .model "
      "or vocab.txt); its ids are what the checkpoint's embeddings mean"
    )
  config.data.update(
    task="glue",
    variant=args.task,
    batch_size=64,
    truncate=True,
    tokenizer=checkpoint.data.tokenizer,
    vocab_size=checkpoint.data.vocab_size,
  )
  config.init_from = os.path.abspath(args.hf)
  config_lib.fine_tuning_schedule(config, args.epochs, GLUE_TRAIN_EXAMPLES[args.task], args.lr)
  if args.smoke:
    config.data.batch_size = 16
    config.optim.warmup_steps = 2
    config_lib.smoke_schedule(config)
  return config
