"""The attention kernel alone, forward and backward, efftx against PyTorch's SDPA, in one process (the peers'
environment has both): efftx's "flash" (attention._flash: query blocks of 256 against all keys, exact softmax, a
hand-written backward pass) and torch.nn.functional.scaled_dot_product_attention (on a CPU its fused flash kernel),
at the peer model's shape (8192 tokens: batch 8192 // length, 4 heads of 64), timed in alternation. efftx's kernel
gets an all-true key mask, as the model passes it (its `where`s over the scores run; SDPA gets no mask).

    ~/.cache/peers-venv/bin/python experiments/peers/attention_kernel.py 1024 4096 --rounds 8
    PJRT_NPROC=4 XLA_FLAGS=--xla_force_host_platform_device_count=2 ~/.cache/peers-venv/bin/python \\
        experiments/peers/attention_kernel.py 1024 4096      # efftx's batch split over 2 devices, as efftx.train

Torch runs with 2 intra-op threads (the harness's setting). GFLOP/s counts 3x the forward pass's 4·B·H·L²·K for
both (the backward's recomputation of the scores is not counted), so the ratio of rates is the ratio of times.
"""
import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

from efftx import sharding
from efftx.mixers import attention

HEADS, HEAD_DIM, TOKENS = 4, 64, 8192


def efftx_step(length: int):
  """A function running jit(grad) of attention._flash once (arguments on the devices that divide the batch)."""
  batch = TOKENS // length
  devices = jax.devices()[:np.gcd(batch, jax.device_count())]
  mesh = sharding.make_mesh(devices=devices)
  q, k, v, do = (jax.device_put(jax.random.normal(jax.random.key(i), (batch, length, HEADS, HEAD_DIM)),
                                sharding.batch(mesh)) for i in range(4))
  mask = jax.device_put(jnp.ones((batch, length), bool), sharding.batch(mesh))
  loss = lambda q, k, v: jnp.sum(attention._flash(q, k, v, mask, False, 256) * do)  # pylint: disable=protected-access
  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile(
      sharding.step_compiler_options(batch, mesh))
  return lambda: jax.block_until_ready(grads(q, k, v)), len(devices)


def torch_step(length: int):
  batch = TOKENS // length
  g = torch.Generator().manual_seed(0)
  q, k, v = (torch.randn(batch, HEADS, length, HEAD_DIM, generator=g, requires_grad=True) for _ in range(3))
  do = torch.randn(batch, HEADS, length, HEAD_DIM, generator=g)

  def step():
    for t in (q, k, v):
      t.grad = None
    F.scaled_dot_product_attention(q, k, v).backward(do)
  return step


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("lengths", type=int, nargs="+")
  ap.add_argument("--rounds", type=int, default=8)
  ap.add_argument("--threads", type=int, default=2)
  ap.add_argument("--separate", action="store_true", help="all of efftx's rounds, then all of torch's")
  ap.add_argument("--json", help="append the rows to this JSON file")
  args = ap.parse_args()
  torch.set_num_threads(args.threads)
  for length in args.lengths:
    run_efftx, devices = efftx_step(length)
    runs = {"efftx flash": run_efftx, "torch sdpa": torch_step(length)}
    times = {label: [] for label in runs}
    order = ([(label,) * args.rounds for label in runs] if args.separate
             else [tuple(runs)[::1 if i % 2 == 0 else -1] for i in range(args.rounds)])  # alternate who goes first
    for labels in order:
      for label in labels:
        start = time.perf_counter()
        runs[label]()
        times[label].append(time.perf_counter() - start)
    ms = {label: 1e3 * statistics.median(t[1:]) for label, t in times.items()}
    ratio = statistics.median(t / e for t, e in zip(times["torch sdpa"][1:], times["efftx flash"][1:]))
    flops = 3 * 4 * (TOKENS // length) * HEADS * length ** 2 * HEAD_DIM
    print(f"length {length} (batch {TOKENS // length}, efftx on {devices} device(s)): "
          + ", ".join(f"{label} {v:.0f} ms ({flops / v / 1e6:.0f} GFLOP/s)" for label, v in ms.items())
          + f"; efftx/torch speed {ratio:.2f}x (median of the rounds' ratios)", flush=True)
    if args.json:
      rows = json.load(open(args.json)) if os.path.exists(args.json) else []
      rows.append(dict(length=length, batch=TOKENS // length, efftx_devices=devices, separate=args.separate,
                       rounds=args.rounds, ms=ms, gflops={k: flops / v / 1e6 for k, v in ms.items()},
                       efftx_speed_over_torch=ratio))
      with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
