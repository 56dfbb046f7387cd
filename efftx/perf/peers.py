"""The peer benchmark: efftx's training step beside PyTorch/Hugging Face and plain Flax, at one shared shape.

    python -m efftx.peers --quick --out=/tmp/peers                           # lengths 256 and 1024
    python -m efftx.peers --out=/tmp/peers --ratio_to=hf-fnet                # lengths 128 … 4096
    python -m efftx.peers --peers=hf-bert-sdpa,efftx-attention --seqs=4096 --out=/tmp/peers --profile
    python -m efftx.peers --tiny --peers=flax-fnet,efftx-fnet --out=/tmp/peers_tiny      # seconds: a plumbing check
    python -m efftx.peers --peers=hf-mamba2,efftx-mamba2,hf-mamba,efftx-mamba --seqs=256,2048 --ratio_to=hf-mamba2 \
        --timeout=3600 --torch_python=/path/to/venv/bin/python --out=/tmp/peers_mamba  # torch in another venv

Every row times the training step (forward, backward, AdamW at lr 1e-4, weight decay 0.01) of one model at one
length, with mean cross-entropy over every position of a Linear(d, vocab) head, at d 256, 4 layers, 4 heads, FF 1024,
vocab 256, 8192 random tokens a step (batch = 8192 // length; --tiny: d 32, 1 layer, 2 heads, FF 64, 256 tokens).
Peers: hf-fnet (transformers FNetModel, torch's FFT), hf-bert-sdpa and hf-bert-eager (BertModel; eager only up to
--eager_max_seq: it holds the S × S scores), flax-attn and flax-fnet (a plain flax.linen post-LN encoder with
nn.MultiHeadDotProductAttention or fft2(x).real and FNet's embedding projection, jit + optax.adamw on JAX's default
device), and efftx-<mixer> for any key of efftx.mixers.MIXERS: efftx's own model and train step in the peers' block
(post-LN, exact GELU, LayerNorm epsilon 1e-12, FNet's embedding projection, dropout 0; efftx-mamba2 and efftx-mamba:
in Mamba's block, below), compiled as efftx.train compiles it (efftx.perf.step.prepare: the batch split over one
device per core, state replicated, its XLA options). Where they differ from the HF models: no token-type embedding,
position embeddings for exactly the length (HF: max(512, length)).

The Mamba peers are causal LMs in Mamba's own block, not the encoder block: hf-mamba2 and hf-mamba are transformers'
Mamba2Model and MambaModel (embeddings; pre-norm residual blocks x + mixer(RMSNorm(x)), no feed-forward, no
positions; a final RMSNorm) with the same Linear(d, vocab) head over every position, and efftx-mamba2 and
efftx-mamba are efftx's model built the same way (block_layout pre_ln, norm rms, d_ff 0, position_embedding none,
causal, norm_eps 1e-5 as transformers' layer_norm_epsilon). Both sides take MAMBA_OPTIONS, the efftx mixers'
defaults (mamba_ssm's): Mamba-2 d_state 128, expand 2, headdim 64 (d 256: 8 heads), ngroups 1 (transformers' default
is 8), d_conv 4, chunk 256; Mamba d_state 16, expand 2, d_conv 4, dt_rank ⌈d/16⌉. Their parameters are the same
arrays (d 256, 4 layers: 1,993,312 for Mamba-2, 1,883,648 for Mamba, head and embeddings included). transformers
runs its reference torch code on a CPU (mamba_ssm's and causal_conv1d's kernels are CUDA): Mamba-2's chunked SSD in
torch ops, Mamba's selective scan as a Python loop over positions (its associative scan only under torch.compile),
whose backward pass is quadratic in the length (each position's slice of the B×E×L×N discretized inputs gets a
gradient the size of the whole array: about 4× the time per doubling of the length from 256 to 2048 at d 64, one
layer, batch 1); so hf-mamba runs only up to --hf_mamba_max_seq (256), and at the full shape a step there takes
minutes: give it --timeout=3600. Both sides' mixing FLOPs are efftx's count of the mixer (MixerSpec.train_flops);
none is declared for these two yet, so their MFU is "n/a".

Each (peer, length) runs in its own process, so its peak RSS is its own and only torch or only JAX is loaded:
--warmup steps, then --steps timed ones, the median reported as tokens/s, and the share of the machine's CPU time
other processes took meanwhile (above a few per cent, repeat the run). MFU: achieved FLOP/s over the float32
2048³ matmul rate, the larger of JAX's and (with torch peers) torch's, measured first, each in its own process;
FLOPs per token are 6 × the matmul weights (head included, embeddings not) plus the mixer's: attention 12·L·d·S,
FFT 10·L·d·log2(S·d) (efftx rows: MixerSpec.train_flops). --ratio_to=PEER adds each row's tokens/s over PEER's.
Writes peers.json, peers.md and peers.png to --out; --profile also writes a trace per row under --out/profile
(JAX: jax.profiler's, for TensorBoard or Perfetto, and the ms per XLA kernel kind, for efftx rows also per category
of what the kernels compute, efftx.perf.profiling: matmuls, mixer core, LayerNorm, GELU, ...; torch: a Chrome trace
and the ops' self-time table).
torch and transformers are needed for the hf-* peers only: pip install -e '.[peers]'. Or keep them in another
Python environment and name its interpreter with --torch_python=PYTHON (or EFFTX_TORCH_PYTHON): the torch rows
(and torch's matmul peak) run there, the JAX rows here, each in its own process either way; that environment needs
torch and transformers only (efftx itself comes through PYTHONPATH, and a torch row imports no JAX).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import time

from efftx.errors import UserError

SHAPES = {
  "full": dict(d=256, layers=4, heads=4, ff=1024, vocab=256, tokens=8192, lr=1e-4),
  "tiny": dict(d=32, layers=1, heads=2, ff=64, vocab=256, tokens=256, lr=1e-4),
}
# transformers' Mamba models beside efftx's mixer of the same name, both in Mamba's block (see the docstring)
MAMBA_PEERS = {"hf-mamba2": "mamba2", "hf-mamba": "mamba"}
TORCH_PEERS = ("hf-fnet", "hf-bert-sdpa", "hf-bert-eager", *MAMBA_PEERS)
FLAX_PEERS = ("flax-attn", "flax-fnet")
WEIGHT_DECAY = 0.01  # torch.optim.AdamW's default, given to every peer
INSTALL_HINT = (
  "the hf-* peers need torch and transformers: pip install -e '.[peers]', or give a Python that has them: "
  "--torch_python=PYTHON (or EFFTX_TORCH_PYTHON)"
)
# The Mamba rows' mixer options, the same on both sides (transformers' Mamba2Config / MambaConfig in hf_model): the
# efftx mixers' defaults, which are mamba_ssm's. mamba's dt_rank 0 is ⌈d/16⌉, transformers' time_step_rank "auto".
MAMBA_OPTIONS = {
  "mamba2": dict(d_state=128, expand=2, headdim=64, ngroups=1, d_conv=4, chunk=256),
  "mamba": dict(d_state=16, expand=2, d_conv=4, dt_rank=0),
}
MAMBA_NORM_EPS = 1e-5  # transformers' layer_norm_epsilon: the blocks' RMSNorm, the final one, Mamba-2's gated one


def _maxrss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _cpu_snapshot() -> tuple[int, int, int]:
  """(the machine's busy jiffies, its total jiffies, this process's jiffies)."""
  with open("/proc/stat") as f:
    v = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
  with open("/proc/self/stat") as f:
    own = f.read().rsplit(")", 1)[1].split()
  return sum(v) - v[3] - v[4], sum(v), int(own[11]) + int(own[12])


def _foreign(a, b) -> float | None:
  """The share of all CPU time between snapshots a and b that other processes used."""
  total = b[1] - a[1]
  return max(0.0, (b[0] - a[0]) - (b[2] - a[2])) / total if total > 0 else None


def _timed(step, warmup: int, steps: int) -> tuple[list[float], float | None]:
  """step() blocks until its work is done; (seconds of each timed step, the other processes' CPU share)."""
  for _ in range(warmup):
    step()
  times, before = [], _cpu_snapshot()
  for _ in range(steps):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
  return times, _foreign(before, _cpu_snapshot())


# ----------------------------------------------------------------------------------------------- torch peers
def _torch_row(peer: str, c: dict, seq: int, a) -> dict:
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError(INSTALL_HINT) from None
  torch.set_num_threads(a.threads)
  model = hf_model(peer, c, seq)
  opt = torch.optim.AdamW(model.parameters(), lr=c["lr"], weight_decay=WEIGHT_DECAY)
  g = torch.Generator().manual_seed(1)
  batch = max(1, c["tokens"] // seq)
  ids, labels = (torch.randint(0, c["vocab"], (batch, seq), generator=g) for _ in range(2))
  losses = []

  def step():
    opt.zero_grad(set_to_none=True)
    logits = model["head"](model["base"](input_ids=ids).last_hidden_state)
    loss = F.cross_entropy(logits.reshape(-1, c["vocab"]), labels.reshape(-1))
    loss.backward()
    opt.step()
    losses.append(float(loss))

  times, foreign = _timed(step, a.warmup, a.steps)
  if a.profile:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
      for _ in range(3):
        step()
    prof.export_chrome_trace(f"{a.profile}.json")
    pathlib.Path(f"{a.profile}.txt").write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
  n_mm = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
  mixer = MAMBA_PEERS.get(peer) or ("fft" if peer == "hf-fnet" else "attn")
  return dict(
    batch=batch,
    step_times_s=times,
    foreign_cpu_frac=foreign,
    loss_first=losses[0],
    compile_s=None,
    # the Mamba peers' mixing is efftx's count of the same mixer, added by the parent (no JAX in this process)
    flops_per_token=None if peer in MAMBA_PEERS else 6 * n_mm + mixer_flops(mixer, c, seq),
    matmul_params=n_mm,
    n_params=sum(p.numel() for p in model.parameters()),
    lib=dict(torch=torch.__version__, transformers=transformers.__version__, threads=torch.get_num_threads()),
  )


def hf_model(peer: str, c: dict, seq: int):
  """The torch model of an hf-* peer at shape `c` and length `seq`, float32 on the CPU, in training mode, seeded:
  the encoder (FNetModel, BertModel with the peer's attention implementation, or Mamba2Model / MambaModel at
  MAMBA_OPTIONS) and a Linear(d, vocab) head."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  if peer in MAMBA_PEERS:
    o = MAMBA_OPTIONS[MAMBA_PEERS[peer]]
    common = dict(
      vocab_size=c["vocab"],
      hidden_size=c["d"],
      num_hidden_layers=c["layers"],
      state_size=o["d_state"],
      expand=o["expand"],
      conv_kernel=o["d_conv"],
      layer_norm_epsilon=MAMBA_NORM_EPS,
      use_cache=False,
      tie_word_embeddings=False,
    )
    if peer == "hf-mamba2":
      inner = o["expand"] * c["d"]
      base = transformers.Mamba2Model(
        transformers.Mamba2Config(
          num_heads=max(1, inner // o["headdim"]),  # efftx's mamba2: a width below headdim is one head of it
          head_dim=min(o["headdim"], inner),
          n_groups=o["ngroups"],  # transformers' default is 8
          chunk_size=o["chunk"],
          **common,
        )
      )
    else:
      base = transformers.MambaModel(
        transformers.MambaConfig(time_step_rank=o["dt_rank"] or math.ceil(c["d"] / 16), **common)
      )
    return torch.nn.ModuleDict(dict(base=base, head=torch.nn.Linear(c["d"], c["vocab"]))).train()
  common = dict(
    vocab_size=c["vocab"],
    hidden_size=c["d"],
    num_hidden_layers=c["layers"],
    intermediate_size=c["ff"],
    max_position_embeddings=max(512, seq),
    hidden_dropout_prob=0.0,
    hidden_act="gelu",
  )
  if peer == "hf-fnet":
    base = transformers.FNetModel(
      transformers.FNetConfig(use_tpu_fourier_optimizations=False, **common), add_pooling_layer=False
    )
  else:
    base = transformers.BertModel(
      transformers.BertConfig(
        num_attention_heads=c["heads"],
        attention_probs_dropout_prob=0.0,
        attn_implementation=peer.split("-")[-1],
        **common,
      ),
      add_pooling_layer=False,
    )
  return torch.nn.ModuleDict(dict(base=base, head=torch.nn.Linear(c["d"], c["vocab"]))).train()


def mixer_flops(kind: str, c: dict, seq: int) -> float:
  """Training FLOPs per token of the peers' mixers: QKᵀ and AV (2·S·d each forward, ×3), or the 2-D FFT
  (5·d·log2(S·d) a token, forward and its transpose)."""
  return {"attn": 12.0 * c["layers"] * c["d"] * seq, "fft": 10.0 * c["layers"] * c["d"] * math.log2(seq * c["d"])}[kind]


def mamba_mixing_flops(mixer: str, c: dict, seq: int) -> float | None:
  """Training FLOPs per token of one layer of efftx's `mixer` (mamba2 or mamba) at MAMBA_OPTIONS, causal: what a
  Mamba peer's torch row adds to its matmuls (computed in the parent, which has JAX)."""
  from efftx.mixers import MIXERS  # pylint: disable=g-import-not-at-top

  options = {**MIXERS[mixer].defaults(), **MAMBA_OPTIONS[mixer]}
  return MIXERS[mixer].train_flops(options, seq, c["d"], True)


# ------------------------------------------------------------------------------------------------- JAX peers
def _flax_encoder(c: dict, mixer: str, max_len: int):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  class Encoder(nn.Module):
    @nn.compact
    def __call__(self, ids_BxL):
      x = nn.Embed(c["vocab"], c["d"])(ids_BxL) + nn.Embed(max_len, c["d"])(jnp.arange(ids_BxL.shape[1]))[None]
      x = nn.LayerNorm(epsilon=1e-12)(x)
      if mixer == "fft":
        x = nn.Dense(c["d"])(x)  # FNet's embedding projection
      for _ in range(c["layers"]):
        if mixer == "attn":
          y = nn.MultiHeadDotProductAttention(num_heads=c["heads"], qkv_features=c["d"], deterministic=True)(x)
        else:
          y = jnp.fft.fft2(x).real  # over (length, width)
        x = nn.LayerNorm(epsilon=1e-12)(x + y)
        x = nn.LayerNorm(epsilon=1e-12)(x + nn.Dense(c["d"])(nn.gelu(nn.Dense(c["ff"])(x), approximate=False)))
      return nn.Dense(c["vocab"])(x)

  return Encoder()


def _jax_row(peer: str, c: dict, seq: int, a) -> dict:
  if peer.startswith("efftx-"):
    from efftx import sharding  # pylint: disable=g-import-not-at-top

    sharding.use_cpu_cores()  # on a CPU: one device per core, as efftx.train sets up
  import jax  # pylint: disable=g-import-not-at-top

  row = _efftx_row(peer[len("efftx-") :], c, seq, a) if peer.startswith("efftx-") else _flax_row(peer, c, seq, a)
  return {**row, "lib": dict(jax=jax.__version__, devices=str(jax.devices()))}


def _flax_row(peer: str, c: dict, seq: int, a) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  mixer = "attn" if peer == "flax-attn" else "fft"
  model = _flax_encoder(c, mixer, max(512, seq))
  batch = max(1, c["tokens"] // seq)
  ids, labels = (jax.random.randint(jax.random.key(i), (batch, seq), 0, c["vocab"]) for i in (0, 1))
  params = jax.jit(model.init)(jax.random.key(2), ids)["params"]
  tx = optax.adamw(c["lr"], weight_decay=WEIGHT_DECAY)

  def train_step(params, opt_state):
    loss_fn = lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, ids), labels).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  start = time.perf_counter()
  compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, tx.init(params)).compile()
  compile_s = time.perf_counter() - start
  n_mm = sum(x.size for p, x in jax.tree_util.tree_leaves_with_path(params) if getattr(p[-1], "key", None) == "kernel")
  n_params = sum(x.size for x in jax.tree.leaves(params))
  box, losses = {"state": (params, tx.init(params))}, []

  def step():
    *state, loss = compiled(*box["state"])
    box["state"] = state
    losses.append(float(loss))

  timed = _jax_timed(step, a)
  return dict(
    batch=batch,
    devices=1,
    compile_s=compile_s,
    loss_first=losses[0],
    **timed,
    flops_per_token=6 * n_mm + mixer_flops(mixer, c, seq),
    n_params=n_params,
  )


def mamba_variant(mixer: str, c: dict, seq: int) -> dict:
  """The efftx.perf.step variant of the efftx-mamba2 and efftx-mamba rows: shape `c` at length `seq` in
  transformers' Mamba block (pre-norm RMSNorm residual blocks of the mixer alone, no positions, a final RMSNorm,
  causal) with MAMBA_OPTIONS."""
  from efftx.perf import step as step_lib  # pylint: disable=g-import-not-at-top

  options = "".join(f",mixer.{k}={v}" for k, v in MAMBA_OPTIONS[mixer].items())
  return step_lib.variant(
    mixer=mixer,
    length=seq,
    tokens=c["tokens"],
    overrides=(
      f"model.d_model={c['d']},model.num_layers={c['layers']},model.d_ff=0,model.block_layout=pre_ln,"
      f"model.norm=rms,model.norm_eps={MAMBA_NORM_EPS},model.position_embedding=none,model.causal=true,"
      f"optim.learning_rate={c['lr']},optim.warmup_steps=0,optim.weight_decay={WEIGHT_DECAY}" + options
    ),
  )


def efftx_variant(mixer: str, c: dict, seq: int) -> dict:
  """The efftx.perf.step variant of an efftx-<mixer> row: shape `c` at length `seq` in the peers' block."""
  from efftx import config as config_lib  # pylint: disable=g-import-not-at-top
  from efftx.perf import step as step_lib  # pylint: disable=g-import-not-at-top

  heads = f",mixer.num_heads={c['heads']}" if "num_heads" in config_lib.mixer_options(mixer) else ""
  return step_lib.variant(
    mixer=mixer,
    length=seq,
    tokens=c["tokens"],
    overrides=(
      f"model.d_model={c['d']},model.num_layers={c['layers']},model.d_ff={c['ff']},model.block_layout=post_ln,"
      f"model.activation=gelu,model.norm_eps=1e-12,model.embed_projection={str(mixer == 'fnet').lower()},"
      f"optim.learning_rate={c['lr']},optim.warmup_steps=0,optim.weight_decay={WEIGHT_DECAY}" + heads
    ),
  )


def _efftx_row(mixer: str, c: dict, seq: int, a) -> dict:
  from efftx.mixers import MIXERS  # pylint: disable=g-import-not-at-top
  from efftx.perf import step as step_lib  # pylint: disable=g-import-not-at-top

  if mixer not in MIXERS:
    raise UserError(f"peer 'efftx-{mixer}': '{mixer}' is not a mixer; choose from: {', '.join(MIXERS)}")
  spec = (mamba_variant if mixer in MAMBA_OPTIONS else efftx_variant)(mixer, c, seq)
  run, info = step_lib.prepare(spec)  # its one step is the first warm-up step
  config, _ = step_lib.load_config(spec)
  mixing = MIXERS[mixer].train_flops(dict(config.mixer), seq, c["d"], config.model.causal)  # None: MFU n/a
  a.warmup = max(0, a.warmup - 1)
  profiled = dict(program=run.program_text, params=run.params, devices=info["devices"]) if a.profile else None
  return dict(
    batch=info["batch"],
    devices=info["devices"],
    compile_s=info["compile_s"],
    loss_first=info["first_loss"],
    **_jax_timed(lambda: run(1), a, profiled),
    flops_per_token=None if mixing is None else 6 * info["matmul_params"] + c["layers"] * mixing,
    n_params=info["params"],
  )


def _jax_timed(step, a, profiled: dict | None = None) -> dict:
  """Times `step`; with --profile also traces 3 steps and writes the ms a step per XLA kernel kind, and (`profiled`:
  an efftx row's compiled program, parameters and device count) per category of what the kernels compute."""
  times, foreign = _timed(step, a.warmup, a.steps)
  out = dict(step_times_s=times, foreign_cpu_frac=foreign)
  if a.profile:
    import jax  # pylint: disable=g-import-not-at-top

    from efftx.perf import profiling  # pylint: disable=g-import-not-at-top

    with jax.profiler.trace(a.profile):
      for _ in range(3):
        step()
    program = profiling.instructions(profiled["program"]) if profiled else {}
    dense = profiling.dense_modules(profiled["params"]) if profiled else set()
    summary = profiling.summarize(a.profile, program, dense, steps=3, devices=profiled["devices"] if profiled else 1)
    lines = ["ms a step (per device), summed over kernels, which overlap on several threads"]
    if profiled:
      lines += ["by what they compute:"] + [f"{v:9.2f}  {k}" for k, v in summary["categories"].items()]
    lines += ["by XLA kernel kind:"] + [f"{v:9.2f}  {k}" for k, v in summary["kinds"].items()]
    pathlib.Path(f"{a.profile}.txt").write_text("\n".join(lines) + "\n")
    out["profile_ms"] = summary["categories"] if profiled else summary["kinds"]
  return out


def _peak(framework: str, n: int, threads: int) -> dict:
  """float32 n³ matmul GFLOP/s (the median of 10 after 2 warm-ups) of JAX's default device, or of torch."""

  def median_seconds(f):
    for _ in range(2):
      f()
    times = []
    for _ in range(10):
      start = time.perf_counter()
      f()
      times.append(time.perf_counter() - start)
    return statistics.median(times)

  if framework == "torch":
    import torch  # pylint: disable=g-import-not-at-top

    torch.set_num_threads(threads)
    x, y = torch.randn(n, n), torch.randn(n, n)
    seconds = median_seconds(lambda: x @ y)
  else:
    import jax  # pylint: disable=g-import-not-at-top

    x, y = (jax.random.normal(jax.random.key(i), (n, n)) for i in (0, 1))
    matmul = jax.jit(lambda x, y: x @ y)
    seconds = median_seconds(lambda: matmul(x, y).block_until_ready())
  return {"matmul_gflops": 2 * n**3 / seconds / 1e9, "n": n}


# ---------------------------------------------------------------------------------------------- the run
REPO = pathlib.Path(__file__).resolve().parents[2]  # the folder holding efftx/: on the rows' PYTHONPATH


def _child(argv: list[str], timeout: int, python: str = sys.executable) -> dict:
  """One measurement in a fresh process of `python` (--torch_python for the torch rows): its RESULT line, or an
  "error". efftx itself is found through PYTHONPATH, so `python` needs only what the row imports."""
  env = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TRANSFORMERS_VERBOSITY": "error",
  }
  start = time.perf_counter()
  try:
    p = subprocess.run([python, "-m", "efftx.peers", *argv], capture_output=True, text=True, timeout=timeout, env=env)
  except OSError as e:
    return {"error": f"{python}: {e.strerror or e}"}
  except subprocess.TimeoutExpired:
    return {"error": f"timeout after {timeout} s"}
  results = [json.loads(line[7:]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]
  if not results:
    lines = (p.stderr or "").strip().splitlines()
    return {"error": f"exit {p.returncode}: {lines[-1] if lines else ''}", "stderr": p.stderr[-3000:]}
  return {**results[-1], "wall_s": time.perf_counter() - start}


def _has_torch(python: str) -> bool:
  """Whether `python` (this interpreter, or another: --torch_python) imports torch and transformers."""
  if python == sys.executable:
    return all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
  try:
    check = subprocess.run([python, "-c", "import torch, transformers"], capture_output=True, timeout=300)
  except (OSError, subprocess.TimeoutExpired):
    return False
  return check.returncode == 0


def _table(rows: list[dict], peers: list[str], ratio_to: str | None, peak_line: str) -> str:
  lines = [
    peak_line,
    "",
    "| length | peer | batch | devices | tokens/s | step ms | compile s | peak RSS MiB | "
    "GFLOP/token | MFU % | other CPU % |",
    "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in sorted(rows, key=lambda r: (r["seq"], peers.index(r["peer"]))):
    if "error" in r:
      lines.append(f"| {r['seq']} | {r['peer']} | | | {r['error'][:60]} | | | | | | |")
      continue
    compile_s = "-" if r.get("compile_s") is None else f"{r['compile_s']:.1f}"
    foreign = "-" if r.get("foreign_cpu_frac") is None else f"{100 * r['foreign_cpu_frac']:.0f}"
    gflop = "n/a" if r["flops_per_token"] is None else f"{r['flops_per_token'] / 1e9:.4g}"  # a mixer without a count
    mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}"
    lines.append(
      f"| {r['seq']} | {r['peer']} | {r['batch']} | {r.get('devices') or '-'} | {r['tokens_per_s']:.0f} | "
      f"{1e3 * r['median_step_s']:.1f} | {compile_s} | {r['peak_rss_mib']:.0f} | "
      f"{gflop} | {mfu} | {foreign} |"
    )
  if ratio_to:
    by = {(r["peer"], r["seq"]): r.get("tokens_per_s") for r in rows}
    lines += [
      "",
      f"tokens/s over {ratio_to}'s:",
      "",
      "| length | " + " | ".join(peers) + " |",
      "|---:|" + "---:|" * len(peers),
    ]
    for seq in sorted({r["seq"] for r in rows}):
      ref = by.get((ratio_to, seq))
      lines.append(
        f"| {seq} | "
        + " | ".join(f"{by[(p, seq)] / ref:.2f}" if ref and by.get((p, seq)) else "-" for p in peers)
        + " |"
      )
  return "\n".join(lines) + "\n"


def _plot(rows: list[dict], path: pathlib.Path) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  rows = [r for r in rows if "tokens_per_s" in r]
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for peer in dict.fromkeys(r["peer"] for r in rows):
    points = sorted((r["seq"], r["tokens_per_s"]) for r in rows if r["peer"] == peer)
    ax.plot(*zip(*points), marker="o", label=peer, linestyle="--" if peer.startswith(("hf-", "flax-")) else "-")
  seqs = sorted({r["seq"] for r in rows})
  ax.set(
    xscale="log",
    yscale="log",
    xlabel="sequence length",
    ylabel="training-step tokens/s",
    title="efftx and its peers: same shape, same machine",
  )
  ax.set_xticks(seqs, [str(s) for s in seqs])
  ax.set_xticks([], minor=True)  # the log axis's own minor labels would sit over the lengths'
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def _parse(argv: list[str]) -> argparse.Namespace:
  ap = argparse.ArgumentParser(
    prog="python -m efftx.peers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  names = lambda text: [x for x in text.split(",") if x]
  ap.add_argument(
    "--peers",
    type=names,
    default=list(TORCH_PEERS + FLAX_PEERS) + ["efftx-fnet", "efftx-attention"],
    help="comma-separated: " + ", ".join(TORCH_PEERS + FLAX_PEERS) + ", efftx-<mixer>",
  )
  ap.add_argument(
    "--seqs",
    type=lambda t: [int(x) for x in names(t)],
    default=None,
    help="lengths (default 128,...,4096; --quick 256,1024; --tiny 64,128)",
  )
  ap.add_argument("--quick", action="store_true", help="lengths 256 and 1024")
  ap.add_argument("--tiny", action="store_true", help="d 32, 1 layer, 2 heads, FF 64, 256 tokens a step")
  ap.add_argument("--eager_max_seq", type=int, default=1024, help="hf-bert-eager only up to this length")
  ap.add_argument(
    "--hf_mamba_max_seq",
    type=int,
    default=256,
    help="hf-mamba only up to this length (its CPU backward pass is quadratic in the length)",
  )
  ap.add_argument("--warmup", type=int, default=2)
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch's intra-op threads")
  ap.add_argument("--timeout", type=int, default=600, help="seconds per row's process")
  ap.add_argument(
    "--torch_python",
    default=os.environ.get("EFFTX_TORCH_PYTHON") or sys.executable,
    help="the Python interpreter of the torch rows (hf-* peers, torch's matmul peak): one with torch and "
    "transformers, JAX not needed (default: $EFFTX_TORCH_PYTHON, else this one)",
  )
  ap.add_argument("--no_peak", action="store_true", help="skip the matmul peak (no MFU)")
  ap.add_argument("--ratio_to", default=None, help="a peer: every row's tokens/s over its, per length")
  ap.add_argument("--profile", action="store_true", help="also trace 3 steps of every row into OUT/profile")
  ap.add_argument("--out", help="the folder for peers.json, peers.md, peers.png (and profile/)")
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  ap.add_argument("--worker_peak", help=argparse.SUPPRESS)
  ap.add_argument("--seq", type=int, help=argparse.SUPPRESS)
  return ap.parse_args(argv)


def main(argv: list[str]) -> None:
  a = _parse(argv)
  c = SHAPES["tiny" if a.tiny else "full"]
  if a.worker_peak:
    return print("RESULT " + json.dumps(_peak(a.worker_peak, 512 if a.tiny else 2048, a.threads)), flush=True)
  if a.worker:
    a.profile = a.profile and str(pathlib.Path(a.out or ".") / "profile" / f"{a.worker}-{a.seq}")
    row = (_torch_row if a.worker in TORCH_PEERS else _jax_row)(a.worker, c, a.seq, a)
    return print("RESULT " + json.dumps({**row, "peak_rss_mib": _maxrss_mib()}), flush=True)

  if not a.out:
    raise UserError("--out=FOLDER is required (where peers.json, peers.md and peers.png go)")
  unknown = [p for p in a.peers if p not in TORCH_PEERS + FLAX_PEERS and not p.startswith("efftx-")]
  if unknown:
    raise UserError(f"--peers: {', '.join(unknown)}: choose from {', '.join(TORCH_PEERS + FLAX_PEERS)}, efftx-<mixer>")
  if a.ratio_to and a.ratio_to not in a.peers:
    raise UserError(f"--ratio_to={a.ratio_to} is not one of --peers")
  if set(a.peers) & set(TORCH_PEERS) and not _has_torch(a.torch_python):
    raise UserError(f"{INSTALL_HINT} ({a.torch_python} has not)" if a.torch_python != sys.executable else INSTALL_HINT)
  if a.warmup < 1 or a.steps < 1:
    raise UserError("--warmup and --steps must be >= 1")
  seqs = a.seqs or ([64, 128] if a.tiny else [256, 1024] if a.quick else [128, 256, 512, 1024, 2048, 4096])
  out = pathlib.Path(a.out)
  (out / "profile" if a.profile else out).mkdir(parents=True, exist_ok=True)
  common = ["--warmup", str(a.warmup), "--steps", str(a.steps), "--threads", str(a.threads), "--out", str(out)]
  common += ["--tiny"] * a.tiny + ["--profile"] * a.profile
  started = time.time()
  peak = {}
  for fw in [] if a.no_peak else ["jax"] + ["torch"] * bool(set(a.peers) & set(TORCH_PEERS)):
    peak[fw] = _child(["--worker_peak", fw] + common, a.timeout, a.torch_python if fw == "torch" else sys.executable)
    print(f"float32 matmul peak, {fw}: {peak[fw].get('matmul_gflops', float('nan')):.1f} GFLOP/s", flush=True)
  peak_gflops = max([p["matmul_gflops"] for p in peak.values() if "matmul_gflops" in p] or [float("nan")])
  rows, failed = [], set()
  for peer in a.peers:
    for seq in seqs:
      if (peer == "hf-bert-eager" and seq > a.eager_max_seq) or (peer == "hf-mamba" and seq > a.hf_mamba_max_seq):
        continue
      r = (
        {"error": "skipped (a shorter length failed)"}
        if peer in failed
        else _child(
          ["--worker", peer, "--seq", str(seq)] + common,
          a.timeout,
          a.torch_python if peer in TORCH_PEERS else sys.executable,
        )
      )
      r.update(peer=peer, seq=seq)
      if "error" in r:
        failed.add(peer)
        print(f"{peer:<16} {seq:>5}: FAILED: {r['error']}", flush=True)
      else:
        if peer in MAMBA_PEERS:  # efftx's count of the same mixer's mixing (the row's process has no JAX)
          mixing = mamba_mixing_flops(MAMBA_PEERS[peer], c, seq)
          r["flops_per_token"] = None if mixing is None else 6 * r["matmul_params"] + c["layers"] * mixing
        r["median_step_s"] = statistics.median(r["step_times_s"])
        r["tokens_per_s"] = r["batch"] * seq / r["median_step_s"]
        r["mfu"] = (
          None if r["flops_per_token"] is None else r["tokens_per_s"] * r["flops_per_token"] / 1e9 / peak_gflops
        )
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}"  # n/a: a mixer without a FLOP count
        print(
          f"{peer:<16} {seq:>5}: batch {r['batch']:>3}, {r['tokens_per_s']:>9.0f} tokens/s, step "
          f"{1e3 * r['median_step_s']:.1f} ms, MFU {mfu} %, peak RSS {r['peak_rss_mib']:.0f} MiB, "
          f"other CPU {100 * (r['foreign_cpu_frac'] or 0):.0f} %",
          flush=True,
        )
      rows.append(r)
  size = "512³" if a.tiny else "2048³ (MFU's denominator: the larger)"
  peak_line = f"float32 matmul {size}: " + ", ".join(
    f"{fw} {p.get('matmul_gflops', float('nan')):.1f} GFLOP/s" for fw, p in peak.items()
  )
  table = _table(rows, a.peers, a.ratio_to, peak_line)
  print("\n" + table)
  meta = dict(
    started=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
    total_s=time.time() - started,
    argv=argv,
    shape=c,
    seqs=seqs,
    warmup=a.warmup,
    steps=a.steps,
    threads=a.threads,
    python=platform.python_version(),
    torch_python=a.torch_python if set(a.peers) & set(TORCH_PEERS) else None,
    nproc=os.cpu_count(),
    peak_gflops=peak_gflops,
    cpu=next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), None),
  )
  (out / "peers.json").write_text(json.dumps(dict(meta=meta, peak=peak, results=rows), indent=1))
  (out / "peers.md").write_text(table)
  _plot(rows, out / "peers.png")
  print(f"wrote {out / 'peers.json'}, peers.md, peers.png")


if __name__ == "__main__":
  try:
    main(sys.argv[1:])
  except UserError as e:  # one line and exit code 2, as every efftx entry point
    print(f"efftx.peers: error: {e}", file=sys.stderr)
    sys.exit(2)
