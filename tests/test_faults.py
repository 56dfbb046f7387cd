"""Runs that survive: signals and kill -9 at any step (even mid-save), unreadable checkpoints, divergence, two runs
on one workdir — a real process where a signal or the kernel's lock is the property, then the same command again
(in this process, conftest.run_in_process, where a process is not the property)."""

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from conftest import REPO
from conftest import logged_step
from conftest import metrics_rows
from conftest import run_in_process
from conftest import summation_atol
from efftx import checkpoints
from efftx import run_files
from efftx import train
from efftx import trainer

# The smoke model, long enough to be interrupted several times; every step logged (the test watches the log).
OVERRIDES = {"total_steps": 30, "log_every": 1, "eval_every": 15, "checkpoint_every": 5, "keep_checkpoints": 3}


def _command(workdir, data_dir, overrides=OVERRIDES, module="efftx.train"):
  return [
    sys.executable,
    "-m",
    module,
    "--config=configs/quickstart.py:smoke",
    f"--workdir={workdir}",
    f"--config.data.data_dir={data_dir}",
  ] + [f"--config.{k}={v}" for k, v in overrides.items()]


def _steps(workdir):
  return sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())


def _steps_of(folders) -> set[int]:
  """The steps of checkpoint folders, complete ("10") or being written ("10.orbax-checkpoint-tmp-...")."""
  return {int(n.split(".")[0]) for n in folders}


def _start(command):
  return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(condition, proc, timeout=180):
  deadline = time.time() + timeout
  while not condition():
    assert proc.poll() is None, proc.communicate()[0]
    assert time.time() < deadline, "timed out"
    time.sleep(0.002)


@pytest.fixture(scope="module")
def straight(data_dir, tmp_path_factory):
  """(config, workdir) of the uninterrupted run of OVERRIDES (checkpoints kept at steps 20, 25 and 30), the
  reference the module's interrupted and damaged runs are compared with; tests copy it before changing it (they
  share the xdist group faults_straight, so that one worker trains it)."""
  from configs import quickstart  # pylint: disable=g-import-not-at-top

  config = quickstart.get_config("smoke")
  config.data.data_dir = data_dir
  config.update(OVERRIDES)
  workdir = str(tmp_path_factory.mktemp("straight"))
  train.train_and_evaluate(config, workdir)
  assert _steps(workdir) == [20, 25, 30]
  return config, workdir


def _assert_same_run(got_dir, want_dir, step):
  """Every step logged once with the same metrics, and the same final parameters, bit for bit."""
  got, want = metrics_rows(got_dir), metrics_rows(want_dir)
  assert [r["step"] for r in got] == [r["step"] for r in want]
  for g, w in zip(got, want):
    for key in ("loss", "accuracy", "grad_norm", "learning_rate", "eval_loss", "eval_accuracy"):
      assert g.get(key) == w.get(key), (g["step"], key)
  _, got_params, _ = checkpoints.restore_params(got_dir, step)
  _, want_params, _ = checkpoints.restore_params(want_dir, step)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(got_params), jax.device_get(want_params))


@pytest.mark.slow
@pytest.mark.xdist_group("faults_straight")
def test_one_run_per_workdir_kill_9_before_a_checkpoint_and_mid_save_then_sigterm_resumes_bitwise(
  straight, tmp_path, caplog
):
  """A second run on a workdir in use is refused in one line naming the holder; kill -9 (before the first
  checkpoint, and mid-save after a complete one) leaves running.json behind but the kernel releases the lock, so the
  same command resumes from the last complete checkpoint; SIGTERM saves where it stops; the resumed run equals the
  straight one bit for bit, and once finished the command trains nothing more."""
  config, straight = straight
  workdir = str(tmp_path / "faulty")
  command = _command(workdir, config.data.data_dir)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  temporary = lambda: {n for n in os.listdir(ckpt_dir) if "tmp" in n} if os.path.isdir(ckpt_dir) else set()
  running = os.path.join(workdir, "running.json")
  # A killed run leaves rows logged after its last checkpoint (and maybe a half-written checkpoint) behind until the
  # next run starts: each wait below asks for progress beyond them.

  # kill -9 before the first checkpoint: the same command starts (the dead run's lock does not block it).
  proc = _start(command)
  _wait_for(lambda: os.path.exists(running), proc)  # while it holds the workdir, the same command is refused
  code, _, stderr = run_in_process("efftx.train", command[3:])
  lines = stderr.strip().splitlines()
  assert code == 2 and len(lines) == 1, stderr
  assert f"is in use by another run (pid {proc.pid} on {socket.gethostname()}" in lines[0]
  _wait_for(lambda: logged_step(workdir) >= 2, proc)
  before = sorted(os.listdir(workdir))
  proc.kill()  # no chance to clean up; the kernel releases the lock
  proc.wait()
  assert "running.json" in before and sorted(os.listdir(workdir)) == before  # running.json stays behind, stale
  print("killed after logging step", logged_step(workdir), "; complete checkpoints then:", _steps(workdir))

  # kill -9 while a checkpoint after the first (step 5) is being written (orbax writes it into a temporary folder,
  # then renames it), with rows logged beyond the last complete one: the checkpoints complete before it stay as
  # they were, and the next run resumes from the last of them. (Retried if the save completed between seeing the
  # temporary folder and the kill.)
  for _ in range(3):
    stale_rows, stale_temporary = logged_step(workdir), temporary()
    proc = _start(command)
    saving_after_5 = lambda: max(_steps_of(temporary() - stale_temporary), default=0) > 5
    _wait_for(lambda: logged_step(workdir) > stale_rows and saving_after_5(), proc)
    complete = _steps(workdir)
    proc.kill()
    proc.wait()
    if temporary() - stale_temporary and _steps(workdir) == complete:
      break
  else:
    pytest.fail("three kills came after the save had completed")
  assert complete, "the kill came before a checkpoint was complete"
  print("killed while saving; complete checkpoints:", complete, "; being written:", sorted(temporary()))

  # SIGTERM: a checkpoint at the step it stops at.
  stale_rows = logged_step(workdir)
  proc = _start(command)
  _wait_for(lambda: logged_step(workdir) >= stale_rows + 2, proc)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 0, out
  stopped_at = _steps(workdir)[-1]
  assert stopped_at < 30 and f"stopped by signal at step {stopped_at}" in out
  assert not temporary()  # the half-written save was cleaned up

  caplog.set_level(logging.INFO, logger="absl")
  code, _, _ = run_in_process("efftx.train", command[3:])
  assert code == 0
  assert any(f"at step {stopped_at}" in r.getMessage() for r in caplog.records)  # "resuming from ... at step k"
  _assert_same_run(workdir, straight, 30)
  assert not os.path.exists(running)

  # Once finished, the same command again trains nothing more.
  rows = metrics_rows(workdir)
  caplog.clear()
  code, _, _ = run_in_process("efftx.train", command[3:])
  assert code == 0 and metrics_rows(workdir) == rows
  assert any("already trained to step 30" in r.getMessage() for r in caplog.records)


def _damage(step_dir, how):
  """Truncates the data files of a checkpoint's train state to half their size, or deletes them, as a disk that
  filled up or a copy cut short would leave them. (One file alone may not matter: orbax's OCDBT layout keeps
  some data twice, so a restore can succeed — and return the right values — without it.) "unrecorded": truncated,
  and the file sizes efftx recorded for the checkpoint are gone too (as for a run killed right after saving), so
  only orbax's own read can find the damage."""
  if how == "unrecorded":
    os.remove(os.path.join(step_dir, checkpoints.SIZES_FILE))
    how = "truncate"
  files = [
    os.path.join(d, f)
    for d, _, fs in os.walk(os.path.join(step_dir, "state"))
    for f in fs
    if os.path.basename(d) == "d"
  ]
  assert files
  for path in files:
    if how == "truncate":
      with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    else:
      os.remove(path)


@pytest.mark.xdist_group("faults_straight")
@pytest.mark.parametrize("how", ["truncate", "delete", "unrecorded"])
def test_an_unreadable_latest_checkpoint_falls_back_to_the_previous(straight, tmp_path, how, caplog):
  """The latest checkpoint damaged each way: found unreadable with its reason, set aside, and the previous one
  restored (checkpoints.restore_latest_readable, what train resumes through). Truncated, the run itself resumes from
  the previous checkpoint and equals the straight run bit for bit (what follows the fallback does not depend on
  how the checkpoint was damaged)."""
  config, straight = straight
  workdir = str(tmp_path / "damaged")
  shutil.copytree(straight, workdir)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "30"))  # as if stopped at step 25 ...
  _damage(os.path.join(workdir, "checkpoints", "25"), how)  # ... with its last checkpoint damaged

  if how == "truncate":
    train.train_and_evaluate(config, workdir)
    _assert_same_run(workdir, straight, 30)  # steps 21–30 trained again from step 20, as in the straight run
  else:
    parts = trainer.parts(config)
    tx, _ = trainer.make_optimizer(config)
    abstract_state = jax.eval_shape(lambda: trainer.create_state(parts.model, tx, jax.random.key(0)))
    state, step = checkpoints.restore_latest_readable(
      checkpoints.manager(workdir, config.keep_checkpoints), abstract_state
    )
    assert step == 20 and int(state.step) == 20
    _, want_params, _ = checkpoints.restore_params(straight, 20)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), jax.device_get(want_params))
  warning = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
  assert len(warning) == 1 and "checkpoint 25 cannot be read" in warning[0], warning
  assert ("OCDBT" if how == "unrecorded" else "when written" if how == "truncate" else "is missing") in warning[0]
  assert "resuming from step 20 instead" in warning[0]
  set_aside = sorted(os.listdir(os.path.join(workdir, "unreadable_checkpoints")))
  assert len(set_aside) == 2 and set_aside[0].startswith("25-") and set_aside[1] == "README.txt", set_aside


@pytest.mark.xdist_group("faults_straight")
def test_when_no_checkpoint_is_readable_the_run_stops_with_one_line(straight, tmp_path):
  config, straight = straight
  shutil.copytree(straight, tmp_path, dirs_exist_ok=True)
  for step in (20, 25, 30):
    _damage(str(tmp_path / "checkpoints" / str(step)), "truncate")
  config = config.copy_and_resolve_references()
  config.total_steps = 35
  with pytest.raises(
    ValueError,
    match=r"no checkpoint in .* can be read \(step 30: .*; step 25: .*; step 20: .*\): "
    r"to start over, remove .*checkpoints or use another --workdir",
  ):
    train.train_and_evaluate(config, str(tmp_path), resume_changes=["total_steps"])
  assert _steps(str(tmp_path)) == [20, 25, 30]  # nothing moved or removed
  assert not (tmp_path / run_files.HISTORY_FILE).exists()  # the change is recorded only once a checkpoint restores


def test_divergence_stops_with_one_line_and_keeps_the_good_checkpoint(data_dir, tmp_path):
  # A learning rate of 1e4 without clipping, warmed up over 40 steps: finite for a few steps, then NaN. With the
  # L×L attention path: there the first bad step has a NaN loss and a non-finite gradient leaf to name ("flash",
  # the default, overflows the gradient norm first, with every gradient finite: the line then names none).
  overrides = {
    "total_steps": 60,
    "log_every": 5,
    "eval_every": 60,
    "checkpoint_every": 2,
    "optim.learning_rate": 1e4,
    "optim.grad_clip": 0,
    "optim.warmup_steps": 40,
    "mixer.attention_impl": "plain",
  }
  code, _, stderr = run_in_process("efftx.train", _command(tmp_path, data_dir, overrides)[3:])
  assert code == 2 and "Traceback" not in stderr
  line = stderr.strip().splitlines()[-1]
  assert line.startswith("efftx.train: error: diverged at step "), stderr
  at = int(line.split("diverged at step ")[1].split(":")[0])
  assert "first non-finite gradient: " in line and "loss=nan" in line.lower()
  rows = metrics_rows(tmp_path)
  assert all(np.isfinite(r["loss"]) for r in rows if r["step"] < at - 4)  # logged windows before it were finite
  saved = _steps(tmp_path)
  assert saved and saved[-1] < at and f"The last checkpoint (step {saved[-1]}) is good" in line
  for step in saved:  # every kept checkpoint is finite and restores
    _, params, _ = checkpoints.restore_params(str(tmp_path), step)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(params)))


@pytest.mark.xdist_group("faults_straight")
def test_evaluate_equals_the_runs_own_last_eval_and_reads_the_test_split(straight, tmp_path):
  shutil.copytree(straight[1], tmp_path, dirs_exist_ok=True)
  last_eval = [r for r in metrics_rows(tmp_path) if "eval_loss" in r][-1]
  code, stdout, stderr = run_in_process("efftx.evaluate", [f"--workdir={tmp_path}"])
  assert code == 0, stderr
  assert stdout.startswith("validation at step 30: accuracy=")
  record = json.loads((tmp_path / "eval_validation_30.json").read_text())
  # The same model on the same examples; the mean over the split may be reduced in another order.
  assert record["loss"] == pytest.approx(
    last_eval["eval_loss"], abs=summation_atol(record["examples"], last_eval["eval_loss"])
  )
  assert record["accuracy"] == last_eval["eval_accuracy"]

  code, _, stderr = run_in_process("efftx.evaluate", [f"--workdir={tmp_path}", "--checkpoint=25", "--split=test"])
  assert code == 0, stderr
  record = json.loads((tmp_path / "eval_test_25.json").read_text())
  assert record["tfds_split"] == "test" and record["examples"] == 200  # ListOps tiny: 200 test expressions
  assert 0 <= record["accuracy"] <= 1 and record["step"] == 25
