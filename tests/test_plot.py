"""efftx.plot: the curves of several runs side by side, from their metrics.jsonl (written here by hand, as
efftx.train writes them: train rows, and eval rows at evaluation steps)."""

import json

import pytest

from conftest import run_in_process
from efftx import plot

TRAIN = ("accuracy", "grad_norm", "learning_rate", "loss", "steps_per_sec", "tokens_per_sec")


def _write_run(folder, steps: int, evaluate_at: tuple[int, ...], half_written: bool = False) -> None:
  rows = [{"step": s, **{m: 1.0 / s + i for i, m in enumerate(TRAIN)}} for s in range(1, steps + 1)]
  rows += [{"step": s, "eval_accuracy": 0.5, "eval_loss": 2.0 / s} for s in evaluate_at]
  folder.mkdir(parents=True)
  text = "".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["step"]))
  (folder / "metrics.jsonl").write_text(text + ('{"step": 9, "lo' if half_written else ""))


@pytest.fixture
def two_runs(tmp_path):
  """Two runs of the same name in different studies; the second evaluated only at its last step, and still
  writing its last row."""
  _write_run(tmp_path / "study_a" / "fnet", 8, (4, 8))
  _write_run(tmp_path / "study_b" / "fnet", 6, (6,), half_written=True)
  return [str(tmp_path / "study_a" / "fnet"), str(tmp_path / "study_b" / "fnet") + "/"]


def test_two_runs_get_one_panel_per_metric_and_one_line_per_run(two_runs, tmp_path):
  fig = plot.runs_figure(two_runs)
  titles = [ax.get_title() for ax in fig.axes]
  # loss first, each eval_ metric after its training one, the optimizer's and throughput last; steps_per_sec left out
  want = ["loss", "eval_loss", "accuracy", "eval_accuracy", "grad_norm", "learning_rate", "tokens_per_sec"]
  assert titles == want
  for ax in fig.axes:
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["study_a/fnet", "study_b/fnet"], ax.get_title()
    a, b = (list(zip(line.get_xdata(), line.get_ydata())) for line in lines)
    if ax.get_title() == "eval_loss":
      assert a == [(4, 0.5), (8, 0.25)] and b == [(6, 2.0 / 6)]
    if ax.get_title() == "loss":
      assert a == [(s, 1.0 / s + 3) for s in range(1, 9)] and len(b) == 6  # the half-written row left out
  fig = plot.runs_figure(two_runs, ["eval_accuracy"])
  assert [ax.get_title() for ax in fig.axes] == ["eval_accuracy"] and len(fig.axes[0].get_lines()) == 2

  out = tmp_path / "curves.png"
  code, stdout, stderr = run_in_process("efftx.plot", [*two_runs, f"--out={out}", "--metrics=loss,eval_loss"])
  assert code == 0, stderr
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {out}: 2 metrics of 2 runs" in stdout


@pytest.mark.parametrize(
  "args,message",
  [
    (["{tmp}/nowhere"], "{tmp}/nowhere: no such workdir"),
    (["{tmp}/study_a/fnet", "{tmp}/empty"], "{tmp}/empty has no metrics.jsonl"),
    (["{tmp}/study_a/fnet", "--metrics=loss,bleu"], "--metrics: no run logged bleu; they logged: loss, eval_loss,"),
    (["{tmp}/study_a/fnet", "--outt=x.png"], "unrecognized arguments: --outt=x.png (usage: python -m efftx.plot"),
    ([], "the following arguments are required: WORKDIR"),
  ],
)
def test_bad_input_is_one_line(args, message, two_runs, tmp_path):
  (tmp_path / "empty").mkdir()
  code, stdout, stderr = run_in_process("efftx.plot", [a.replace("{tmp}", str(tmp_path)) for a in args])
  assert code == 2 and not stdout
  assert stderr.count("\n") == 1 and stderr.startswith("efftx.plot: error: " + message.replace("{tmp}", str(tmp_path)))
