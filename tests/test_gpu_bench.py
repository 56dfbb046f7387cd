"""efftx.gpu_bench: its rows measured in this process at the tiny shape, its tables and ratios from rows, a spent
budget, and (slow: real worker processes) the dry run end to end. No timing is asserted; no GPU or torch is needed."""

import importlib.util
import json

import pytest

from efftx import platform
from efftx.errors import UserError
from efftx.perf import gpu_bench

HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))


def test_kernels_are_found_by_their_custom_call_targets_and_ops():
  """efftx.platform.kernels, which the rows' "kernels" and efftx.train's log line come from."""
  assert platform.kernels("fusion(...) custom_call_target=\"__cudnn$fmhaSoftmax\"") == {"cuDNN fused attention": 1}
  assert platform.kernels("custom-call(x), custom_call_target=\"tpu_custom_call\"") == {"Pallas TPU kernel": 1}
  assert platform.kernels("custom_call_target=\"__gpu$xla.gpu.triton\"") == {"Pallas GPU kernel": 1}
  assert platform.kernels("%f = c64[2,16,8]{2,1,0} fft(c64[2,16,8] %x), fft_type=FFT") == {"FFT": 1}
  assert platform.kernels("%0 = stablehlo.fft %arg0, type =  RFFT") == {"FFT": 1}
  assert platform.kernels("ROOT fusion = f32[8] fusion(p0), kind=kLoop, fft_type_note") == {}


@pytest.mark.parametrize("mixer", ["attention", "fnet"])
def test_an_efftx_row_is_the_bfloat16_train_step_measured(mixer):
  """The row a JAX worker answers: efftx's step in bfloat16 at the dry-run shape, with its FLOPs, compiled memory and
  (on a CPU) no kernel beyond XLA's fusions but FNet's FFT."""
  c = gpu_bench.SHAPES["dry"]
  row = gpu_bench.jax_row(mixer, c, 64, warmup=1, steps=2)
  assert row["batch"] == c["tokens"] // 64 and len(row["step_times_s"]) == 2 and row["median_step_s"] > 0
  assert row["peak_mib"] > 0 and row["flops_per_token"] > 6 * c["d"] * c["vocab"] and row["first_loss"] > 0
  assert row["kernels"] == (["FFT"] if mixer == "fnet" else [])


def _row(model, seq, tokens_per_s=None, **extra):
  if tokens_per_s is None:
    return dict(model=model, seq=seq, status="oom", reason="RESOURCE_EXHAUSTED: out of memory", **extra)
  return dict(
    model=model,
    seq=seq,
    status="ok",
    batch=1,
    median_step_s=seq / tokens_per_s,
    flops_per_token=1e9,
    compile_s=1.0,
    first_loss=5.5,
    step_times_s=[seq / tokens_per_s],
    peak_mib=100.0,
    **extra,
  )


def test_tables_give_tokens_per_second_ratios_mfu_and_memory_per_length():
  rows = [
    _row("efftx-attention", 512, 4000, kernels=["cuDNN fused attention"]),
    _row("hf-bert-sdpa", 512, 2000),
    _row("hf-fnet", 512, 1000),
    _row("efftx-attention", 1024, None),
    _row("hf-bert-sdpa", 1024, 500),
  ]
  run = dict(
    meta=dict(dry_run=False, shape=gpu_bench.SHAPES["gpu"], steps=5, warmup=2, matmul_n=8192, versions={"jax": "0"}),
    peaks={
      "jax": dict(matmul_tflops=10.0, device_kind="GPU", backend="gpu"),
      "torch": dict(matmul_tflops=20.0, device_kind="GPU", backend="cuda"),
    },
    rows=rows,
  )
  gpu_bench.derive(rows, run["peaks"])
  assert rows[0]["tokens_per_s"] == pytest.approx(4000) and rows[0]["over_hf-bert-sdpa"] == pytest.approx(2.0)
  assert rows[0]["over_hf-fnet"] == pytest.approx(4.0) and rows[3]["over_hf-bert-sdpa"] is None
  assert rows[0]["mfu"] == pytest.approx(4000 * 1e9 / 20e12)  # over the larger of the two matmul rates
  text = gpu_bench.markdown(run)
  assert "| length | efftx-attention | hf-bert-sdpa | hf-fnet |" in text  # the peers last
  assert "| 512 | 4,000 | 2,000 | 1,000 |" in text and "| 1024 | oom | 500 | - |" in text
  assert "| 512 | 2.00 | 1.00 | 0.50 |" in text and "| 512 | 20.0 | 10.0 | 5.0 |" in text  # over BERT; MFU %
  assert "| efftx-attention | 1024 | oom | RESOURCE_EXHAUSTED: out of memory |" in text
  assert "cuDNN fused attention" in text


def test_a_spent_budget_records_every_row_as_skipped_and_starts_no_worker(tmp_path):
  with pytest.raises(UserError, match="no row was measured: the run's budget"):
    gpu_bench.main(["--dry_run", "--budget_s=0", "--peers=hf-fnet", f"--out={tmp_path}"])
  run = json.loads((tmp_path / "gpu_bench.json").read_text())
  assert [(r["model"], r["seq"], r["status"]) for r in run["rows"]] == [
    (m, s, "skipped") for m in ("efftx-attention", "efftx-fnet", "hf-fnet") for s in (64, 128)
  ]
  assert not run["peaks"] and not list((tmp_path / "logs").iterdir())
  assert (tmp_path / "gpu_bench.md").exists() and (tmp_path / "gpu_bench.png").stat().st_size > 0


def test_unknown_mixers_and_peers_are_refused_in_one_line(tmp_path):
  with pytest.raises(UserError, match="unknown: atention, hf-bert"):
    gpu_bench.main(["--mixers=atention", "--peers=hf-bert", f"--out={tmp_path}"])


@pytest.mark.slow
def test_the_dry_run_measures_every_row_in_its_workers(tmp_path):
  """attention and fnet in a JAX worker, the peers in a torch worker (or skipped without torch): the JSON, the
  tables and the plot. At length 64 only, the rows above (the default lengths: the spent-budget test)."""
  gpu_bench.main(["--dry_run", "--lengths=64", "--warmup=1", "--steps=2", f"--out={tmp_path}"])
  run = json.loads((tmp_path / "gpu_bench.json").read_text())
  rows = {(r["model"], r["seq"]): r for r in run["rows"]}
  assert set(rows) == {(m, 64) for m in ("efftx-attention", "efftx-fnet", "hf-bert-sdpa", "hf-fnet")}
  for (model, seq), r in rows.items():
    if model.startswith("hf-") and not HAS_TORCH:
      assert r["status"] == "skipped" and "torch not installed" in r["reason"]
      continue
    assert r["status"] == "ok", r
    assert r["tokens_per_s"] > 0 and r["batch"] == 256 // seq and 0 < r["mfu"] and len(r["step_times_s"]) == 2
    if model.startswith("efftx-"):
      assert r["backend"] == "cpu" and r["jax"] and r["peak_mib"] > 0
      assert r["kernels"] == (["FFT"] if model == "efftx-fnet" else [])
    else:
      assert r["over_hf-bert-sdpa"] > 0 and r["over_hf-fnet"] > 0
  assert set(run["peaks"]) == ({"jax", "torch"} if HAS_TORCH else {"jax"})
  text = (tmp_path / "gpu_bench.md").read_text()
  assert "## tokens/s" in text and "## MFU %" in text and "| 64 |" in text
  assert (tmp_path / "gpu_bench.png").stat().st_size > 0


@pytest.mark.slow
def test_a_gpu_run_without_a_gpu_stops_in_one_line(tmp_path):
  with pytest.raises(UserError, match=r"^no GPU: JAX's backend is cpu \(--dry_run runs the same path on the CPU\)$"):
    gpu_bench.main(["--mixers=fnet", "--peers=", "--lengths=64", f"--out={tmp_path}"])
