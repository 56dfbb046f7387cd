"""Where a PyTorch peer's training step spends its time: torch.profiler over the HF model the peer harness builds
(../shared/bench/peers.py torch_worker: the same config, head, loss and AdamW, 2 intra-op threads), summed into
profile_step.py's categories for efftx's step, so the two can be read side by side — but for the mixer's core
("attention kernel" or "fft" here, "mixer core" there) and the dense layers' bias terms (inside addmm here).

    ~/.cache/peers-venv/bin/python experiments/peers/profile_torch.py hf-bert-sdpa 4096 [--json OUT]

Each op's self time is wall time on the calling thread (torch's CPU kernels run their own 2 threads inside), so
the categories add up to the step.
"""
import argparse
import collections
import json
import pathlib
import sys
import time

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel, FNetConfig, FNetModel

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import profile_step  # pylint: disable=g-import-not-at-top,wrong-import-position  (its table printing)

CFG = dict(d=256, layers=4, heads=4, ff=1024, vocab=256, tokens=8192, lr=1e-4)  # peers.py's CFG

# torch op (self time) → category (profile_step.py's names, but for the mixer's core).
CATEGORIES = (
    ("attention kernel", ("scaled_dot_product", "flash_attention")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
    ("fft", ("fft",)),
    ("layernorm", ("layer_norm",)),
    ("gelu", ("gelu",)),
    ("adamw", ("_foreach", "lerp", "addcdiv", "addcmul", "aten::sqrt")),
    ("embedding", ("embedding",)),
    ("loss", ("log_softmax", "nll_loss", "cross_entropy")),
)


def category(op: str) -> str:
  for name, keys in CATEGORIES:
    if any(k in op for k in keys):
      return name
  return "other"


def build(peer: str, seq: int):
  """The model of peers.py's torch_worker (its `common` config, add_pooling_layer=False, a Linear head)."""
  c = CFG
  torch.manual_seed(0)
  common = dict(vocab_size=c["vocab"], hidden_size=c["d"], num_hidden_layers=c["layers"], intermediate_size=c["ff"],
                max_position_embeddings=max(512, seq), hidden_dropout_prob=0.0, hidden_act="gelu")
  if peer == "hf-fnet":
    base = FNetModel(FNetConfig(use_tpu_fourier_optimizations=False, **common), add_pooling_layer=False)
  else:
    base = BertModel(BertConfig(num_attention_heads=c["heads"], attention_probs_dropout_prob=0.0,
                                attn_implementation=peer.split("-")[-1], **common), add_pooling_layer=False)
  head = torch.nn.Linear(c["d"], c["vocab"])
  model = torch.nn.ModuleDict(dict(base=base, head=head)).train()
  return model


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("peer", choices=("hf-fnet", "hf-bert-sdpa", "hf-bert-eager"))
  ap.add_argument("length", type=int)
  ap.add_argument("--steps", type=int, default=3)
  ap.add_argument("--threads", type=int, default=2)
  ap.add_argument("--json", help="write the categories (ms per step) here")
  args = ap.parse_args()
  torch.set_num_threads(args.threads)
  model = build(args.peer, args.length)
  opt = torch.optim.AdamW(model.parameters(), lr=CFG["lr"])
  B = max(1, CFG["tokens"] // args.length)
  g = torch.Generator().manual_seed(1)
  ids = torch.randint(0, CFG["vocab"], (B, args.length), generator=g)
  labels = torch.randint(0, CFG["vocab"], (B, args.length), generator=g)

  def step():
    opt.zero_grad(set_to_none=True)
    logits = model["head"](model["base"](input_ids=ids).last_hidden_state)
    loss = F.cross_entropy(logits.reshape(-1, CFG["vocab"]), labels.reshape(-1))
    loss.backward()
    opt.step()
    return float(loss)

  for _ in range(2):
    step()
  t0 = time.perf_counter()
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for _ in range(args.steps):
      step()
  wall = (time.perf_counter() - t0) * 1e3 / args.steps
  by_cat = collections.Counter()
  by_op = collections.Counter()
  for e in prof.key_averages():
    ms = e.self_cpu_time_total / 1e3 / args.steps
    by_cat[category(e.key)] += ms
    by_op[e.key] += ms
  print(f"{args.peer}, length {args.length}, batch {B}: step {wall:.0f} ms wall (profiled), "
        f"{sum(by_cat.values()):.0f} ms of op self time (ms per step):")
  profile_step.print_ms(by_cat)
  profile_step.print_ms(by_op, "top ops:", 15, lambda op: f"{op}  [{category(op)}]")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(peer=args.peer, length=args.length, batch=B, wall_ms=wall, categories=dict(by_cat),
                     ops=dict(by_op.most_common(40))), f, indent=1)


if __name__ == "__main__":
  main()
