"""efftx.peers: the JAX peers at the tiny shape end to end (JSON, markdown, plot); a torch peer without torch says
how to install it, in one line. No timing is asserted."""

import importlib.util
import json

import pytest

from efftx.errors import UserError
from efftx.perf import peers

HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))


@pytest.mark.slow
def test_the_jax_peers_run_end_to_end_at_the_tiny_shape(tmp_path, capsys):
  """flax-fnet and efftx-fnet at one length, each in its own process: rows, ratios, MFU, the three files."""
  peers.main(
    [
      "--tiny",
      "--peers=flax-fnet,efftx-fnet",
      "--seqs=64",
      "--warmup=1",
      "--steps=2",
      "--ratio_to=flax-fnet",
      f"--out={tmp_path}",
    ]
  )
  run = json.loads((tmp_path / "peers.json").read_text())
  rows = {r["peer"]: r for r in run["results"]}
  assert set(rows) == {"flax-fnet", "efftx-fnet"} and all("error" not in r for r in rows.values()), rows
  for r in rows.values():
    assert r["seq"] == 64 and r["batch"] == 256 // 64 and len(r["step_times_s"]) == 2
    assert r["tokens_per_s"] == pytest.approx(r["batch"] * 64 / r["median_step_s"])
    assert r["mfu"] == pytest.approx(r["tokens_per_s"] * r["flops_per_token"] / 1e9 / run["meta"]["peak_gflops"])
    assert 0 < r["mfu"] < 1 and r["loss_first"] > 0
  assert rows["efftx-fnet"]["devices"] == 4  # the batch of 4 split over the tests' 8 devices, as efftx.train does
  table = (tmp_path / "peers.md").read_text()
  ratio = rows["efftx-fnet"]["tokens_per_s"] / rows["flax-fnet"]["tokens_per_s"]
  assert "| 64 | flax-fnet | 4 | 1 |" in table and "| 64 | efftx-fnet | 4 | 4 |" in table
  assert f"| 64 | 1.00 | {ratio:.2f} |" in table
  assert (tmp_path / "peers.png").stat().st_size > 0
  assert "efftx-fnet" in capsys.readouterr().out


@pytest.mark.skipif(HAS_TORCH, reason="torch is installed")
def test_a_torch_peer_without_torch_gives_the_install_hint(tmp_path):
  with pytest.raises(UserError, match=r"pip install -e '\.\[peers\]'") as error:
    peers.main(["--peers=flax-fnet,hf-fnet", f"--out={tmp_path}"])
  assert "\n" not in str(error.value) and not list(tmp_path.iterdir())  # refused before anything ran
  with pytest.raises(UserError, match=r"pip install -e '\.\[peers\]'"):  # the row's own process says the same
    peers.main(["--worker=hf-bert-sdpa", "--seq=64", "--tiny"])
  with pytest.raises(UserError, match=r"pip install -e '\.\[peers\]'"):
    peers.main(["--worker=hf-mamba2", "--seq=64", "--tiny"])


def test_a_torch_python_without_torch_is_refused_before_anything_runs(tmp_path):
  """--torch_python names the interpreter of the torch rows; one that cannot import torch is refused up front."""
  missing = str(tmp_path / "no-such-python")
  with pytest.raises(UserError, match=r"--torch_python=PYTHON .*no-such-python has not") as error:
    peers.main(["--peers=hf-mamba2,efftx-mamba2", f"--torch_python={missing}", f"--out={tmp_path / 'out'}"])
  assert "\n" not in str(error.value) and not (tmp_path / "out").exists()


def test_bad_peers_are_refused_in_one_line(tmp_path):
  for argv, words in (
    (["--peers=flax-fnett"], "flax-fnett: choose from"),
    (["--peers=flax-fnet", "--ratio_to=hf-fnet"], "--ratio_to=hf-fnet is not one of --peers"),
  ):
    with pytest.raises(UserError, match=words):
      peers.main(argv + [f"--out={tmp_path}"])
  with pytest.raises(UserError, match="'nomixer' is not a mixer"):
    peers.main(["--worker=efftx-nomixer", "--seq=64", "--tiny"])


def test_efftx_rows_are_the_flax_peers_block_built_by_efftx():
  """efftx-fnet and efftx-attention rows: post-LN, exact GELU, epsilon 1e-12, FNet's embedding projection, and the
  same matmul weights as the plain-flax peers (so the same dense FLOPs)."""
  import jax  # pylint: disable=g-import-not-at-top

  from efftx import model as model_lib  # pylint: disable=g-import-not-at-top
  from efftx.objectives import OBJECTIVES  # pylint: disable=g-import-not-at-top
  from efftx.perf import step  # pylint: disable=g-import-not-at-top

  c = peers.SHAPES["tiny"]
  kernels = lambda params: sum(x.size for p, x in jax.tree_util.tree_leaves_with_path(params) if p[-1].key == "kernel")
  ids = jax.numpy.zeros((1, 64), int)
  for mixer, flax_mixer in (("fnet", "fft"), ("attention", "attn")):
    config, _ = step.load_config(peers.efftx_variant(mixer, c, 64))
    m = config.model
    assert (m.d_model, m.num_layers, m.d_ff, m.max_len, config.data.batch_size) == (32, 1, 64, 64, 4)
    assert (m.block_layout, m.activation, m.norm_eps, m.embed_projection, m.dropout) == (
      "post_ln",
      "gelu",
      1e-12,
      mixer == "fnet",
      0.0,
    )
    model = model_lib.build_model(config, OBJECTIVES["lm"].head(256, 0), 256)
    ours = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, mask=ids == 0, deterministic=True))["params"]
    flax_model = peers._flax_encoder(c, flax_mixer, 512)  # pylint: disable=protected-access
    theirs = jax.eval_shape(flax_model.init, jax.random.key(0), ids)["params"]
    assert kernels(ours) == kernels(theirs), mixer


def test_a_profile_of_an_efftx_step_puts_its_kernels_in_the_categories_of_what_they_compute(tmp_path):
  """efftx.perf.profiling on efftx-attention's real compiled step (tiny shape): every kernel of the trace is an
  instruction of the program, and the model's parts — the dense layers' matmuls, attention's core, LayerNorm, GELU,
  the embedding, the loss, the optimizer — each get time; "other" is a small share."""
  import jax  # pylint: disable=g-import-not-at-top

  from efftx.perf import profiling  # pylint: disable=g-import-not-at-top
  from efftx.perf import step  # pylint: disable=g-import-not-at-top

  run, info = step.prepare(peers.efftx_variant("attention", peers.SHAPES["tiny"], 64))
  program, dense = profiling.instructions(run.program_text), profiling.dense_modules(run.params)
  assert {"block_0/mixing/mixer/qkv", "block_0/feed_forward/ff/up", "lm_head"} <= dense
  with jax.profiler.trace(str(tmp_path)):
    for _ in range(2):
      run(1)
  summary = profiling.summarize(str(tmp_path), program, dense, steps=2, devices=info["devices"])
  ms = summary["categories"]
  assert "(not in the program)" not in ms, ms
  for part in ("matmul", "mixer core", "layernorm", "gelu", "embedding", "loss", "optimizer, metrics"):
    assert ms.get(part, 0) > 0, (part, ms)
  assert ms.get("other", 0) < 0.5 * sum(ms.values()), ms
  assert sum(ms.values()) == pytest.approx(sum(summary["kinds"].values()), rel=0.05)  # kinds: the top 40 only
  assert profiling.category("all-reduce.3", "", False, dense) == "all-reduce"


def _hf_mamba_params(mixer: str, c: dict) -> int:
  """transformers' Mamba2Model / MambaModel + the Linear head at MAMBA_OPTIONS, counted from its parameter shapes
  (transformers 5.25: in_proj, conv1d weight and bias, dt_bias, A_log, D, gated norm, out_proj; Mamba: x_proj,
  dt_proj weight and bias instead of dt_bias; A_log E×N, D E)."""
  o, d = peers.MAMBA_OPTIONS[mixer], c["d"]
  inner, W, N = o["expand"] * d, o["d_conv"], o["d_state"]
  if mixer == "mamba2":
    H, G = max(1, inner // o["headdim"]), o["ngroups"]
    mixing = d * (2 * inner + 2 * G * N + H) + (inner + 2 * G * N) * (W + 1) + 3 * H + inner + inner * d
  else:
    R = o["dt_rank"] or -(-d // 16)
    mixing = d * 2 * inner + inner * (W + 1) + inner * (R + 2 * N) + (R + 1) * inner + inner * N + inner + inner * d
  return c["layers"] * (d + mixing) + 2 * c["vocab"] * d + d + c["vocab"]


def test_mamba_rows_are_transformers_mamba_block_built_by_efftx():
  """efftx-mamba2 and efftx-mamba: pre-norm RMSNorm blocks of the mixer alone, no positions, causal, eps 1e-5, the
  peers' options, and exactly as many parameters as transformers' model with its head (1,993,312 and 1,883,648 at
  the full shape)."""
  import jax  # pylint: disable=g-import-not-at-top

  from efftx import model as model_lib  # pylint: disable=g-import-not-at-top
  from efftx.objectives import OBJECTIVES  # pylint: disable=g-import-not-at-top
  from efftx.perf import step  # pylint: disable=g-import-not-at-top

  c = peers.SHAPES["full"]
  ids = jax.numpy.zeros((1, 64), int)
  for mixer, count in (("mamba2", 1_993_312), ("mamba", 1_883_648)):
    config, _ = step.load_config(peers.mamba_variant(mixer, c, 64))
    m = config.model
    assert (m.block_layout, m.norm, m.norm_eps, m.d_ff, m.position_embedding, m.causal, m.dropout) == (
      "pre_ln",
      "rms",
      1e-5,
      0,
      "none",
      True,
      0.0,
    )
    assert {k: config.mixer[k] for k in peers.MAMBA_OPTIONS[mixer]} == peers.MAMBA_OPTIONS[mixer]
    model = model_lib.build_model(config, OBJECTIVES["lm"].head(256, 0), 256)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, deterministic=True))["params"]
    assert sum(x.size for x in jax.tree.leaves(params)) == _hf_mamba_params(mixer, c) == count, mixer
    flops = peers.mamba_mixing_flops(mixer, c, 256)  # the hf row's mixing: efftx's count (None: MFU "n/a")
    assert flops is None or flops > 0
