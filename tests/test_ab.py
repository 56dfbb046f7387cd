"""efftx.ab: two variants of the training step timed in turn, B's speed-up the median of the rounds' paired
ratios; bad input refused in one line. No timing is asserted: only the report's arithmetic and plumbing."""

import os
import statistics

import pytest

from conftest import REPO
from conftest import run_in_process
from efftx.errors import UserError
from efftx.perf import ab
from efftx.perf import step

QUICKSTART = os.path.join(REPO, "configs", "quickstart.py") + ":smoke"


def _check_arithmetic(out: dict, rounds: int) -> None:
  """The report's medians and ratios are those of the rows it returns."""
  rows = out["rounds"]
  assert len(rows) == rounds - 1  # the first round is a warm-up
  for row in rows:
    assert row["b_speedup"] == pytest.approx(row["a_ms"] / row["b_ms"])
  ratios = [row["a_ms"] / row["b_ms"] for row in rows]
  assert out["b_speedup"]["median"] == pytest.approx(statistics.median(ratios))
  assert (out["b_speedup"]["min"], out["b_speedup"]["max"]) == pytest.approx((min(ratios), max(ratios)))
  for label in "ab":
    assert out[label]["median_ms"] == pytest.approx(statistics.median(row[f"{label}_ms"] for row in rows))


def test_two_config_variants_give_both_variants_and_the_median_of_the_paired_ratios():
  """Two overrides, another device count and an XLA option on B: the report's arithmetic, each variant's
  overrides, devices and compiler options (added to B's train step only), and two different programs."""
  out = ab.compare(
    step.variant(config=QUICKSTART, overrides="model.activation=gelu_tanh"),
    step.variant(config=QUICKSTART, overrides="model.activation=gelu,devices=4", compiler="xla_cpu_use_xnnpack=false"),
    rounds=4,
  )
  _check_arithmetic(out, rounds=4)
  assert out["a"]["overrides"] == {"model.activation": "gelu_tanh"}
  assert (out["a"]["batch"], out["a"]["length"], out["a"]["devices"], out["b"]["devices"]) == (32, 48, 8, 4)
  assert out["b"]["compiler_options"]["xla_cpu_use_xnnpack"] is False and not out["a"]["compiler_options"]
  assert not out["same_program"]  # exact and tanh GELU compile to different programs
  assert out["a"]["first_loss"] != out["b"]["first_loss"]


def test_an_empty_change_compiles_the_same_program():
  """A field the step does not read (the data folder): the same program and the same first loss (A is the
  previous test's A, so its program is compiled once for both)."""
  same = ab.compare(
    step.variant(config=QUICKSTART, overrides="model.activation=gelu_tanh"),
    step.variant(config=QUICKSTART, overrides="model.activation=gelu_tanh,data.data_dir=/nowhere"),
    rounds=2,
  )
  _check_arithmetic(same, rounds=2)
  assert same["same_program"] and same["a"]["first_loss"] == same["b"]["first_loss"]


@pytest.mark.parametrize(
  "overrides, words",
  [
    ("model.activaton=gelu", ["config.model has no field 'activaton'", "did you mean 'activation'"]),
    ("mixer.window=4", ["config.mixer has no field 'window'", "num_heads"]),
    ("modle.dropout=0", ["config has no field 'modle'"]),
    ("model.num_layers=two", ["model.num_layers=two", "int"]),
    ("model.causal=maybe", ["model.causal", "bool"]),
    ("model.activation", ["'model.activation' is not name=value"]),
  ],
)
def test_a_bad_override_is_refused_in_one_line(overrides, words):
  with pytest.raises(UserError) as error:
    step.load_config(step.variant(config=QUICKSTART, overrides=overrides))
  assert "\n" not in str(error.value)
  for word in words:
    assert word in str(error.value)


def test_other_bad_input_is_refused_in_one_line():
  cases = [
    (lambda: ab.compare(step.variant(config=QUICKSTART), step.variant(config=QUICKSTART)), "A and B are the same"),
    (lambda: ab.compare(step.variant(config=QUICKSTART), step.variant(config=QUICKSTART), rounds=1), "--rounds=1"),
    (lambda: step.load_config(step.variant(mixer="fnet", config=QUICKSTART)), "give one of"),
    (lambda: step.load_config(step.variant(config="nowhere.py")), "no such config file"),
    (lambda: step.load_config(step.variant(mixer="fnett")), "'fnett' is not a mixer"),
    (lambda: step.prepare(step.variant(config=QUICKSTART, overrides="devices=3")), "devices=3"),
    (
      lambda: ab.compare(
        step.variant(config=QUICKSTART), step.variant(config=QUICKSTART), commits=("no-such-rev", "HEAD")
      ),
      "'no-such-rev' is not a commit",
    ),
  ]
  for call, words in cases:
    with pytest.raises(UserError, match=words) as error:
      call()
    assert "\n" not in str(error.value)


def test_the_mixer_mode_has_the_peer_shape():
  config, devices = step.load_config(step.variant(mixer="attention", length=512, overrides="devices=2"))
  assert (config.model.d_model, config.model.num_layers, config.model.d_ff, config.mixer.num_heads) == (256, 4, 1024, 4)
  assert (config.model.max_len, config.data.batch_size, devices) == (512, 16, 2)
  config, _ = step.load_config(step.variant(mixer="attention", overrides="model.mixer=linear"))
  assert config.model.mixer == "linear" and "attention_impl" not in config.mixer


@pytest.mark.slow
def test_commits_mode_runs_each_commit_in_its_own_worker():
  """HEAD~1 and HEAD, each extracted and imported by its own process."""
  out = ab.compare(
    step.variant(config=QUICKSTART), step.variant(config=QUICKSTART), rounds=3, commits=("HEAD~1", "HEAD")
  )
  _check_arithmetic(out, rounds=3)
  assert (out["a"]["commit"], out["b"]["commit"]) == ("HEAD~1", "HEAD")
  for label in "ab":
    assert out[label]["efftx"].endswith(os.path.join(label, "efftx"))
  assert not out["a"]["efftx"].startswith(REPO)


def test_the_command_line_prints_one_line_for_a_bad_field(monkeypatch):
  """The command's error path (in this process: what a real process prints is tests/test_cli.py's): B's bad field
  is refused before A is compiled."""
  monkeypatch.setattr(step, "prepare", lambda spec: pytest.fail("a variant was compiled before B was read"))
  code, _, stderr = run_in_process("efftx.ab", [f"--config={QUICKSTART}", "--b=model.activaton=gelu"])
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr
  assert lines[0].startswith("efftx.ab: error: model.activaton: config.model has no field 'activaton'")
