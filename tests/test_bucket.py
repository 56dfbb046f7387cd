"""A workdir on a bucket (gs://), end to end, against a local Cloud Storage emulator (gcp-storage-emulator).

Each library reaches the emulator through its own documented setting, exactly as it would reach Cloud Storage:
etils epath / gcsfs and tensorboardX's google-cloud-storage writer by STORAGE_EMULATOR_HOST, orbax's TensorStore
by TENSORSTORE_GCS_HTTP_URL. Nothing in efftx knows it is talking to an emulator. A real process where a signal
is the property; the other commands run in this process (conftest.run_in_process), with the same environment.
"""

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time

from etils import epath
import fsspec
import jax
import numpy as np
import pytest

from conftest import REPO
from conftest import free_port
from conftest import metrics_rows
from conftest import run_in_process
from conftest import summation_atol
from efftx import checkpoints
from efftx import train

pytestmark = pytest.mark.slow

BUCKET = "efftx-test"
OVERRIDES = {"total_steps": 12, "log_every": 1, "eval_every": 12, "checkpoint_every": 4, "keep_checkpoints": 3}


@pytest.fixture(scope="module")
def bucket_env(tmp_path_factory):
  """Starts the emulator with an empty bucket; the environment that points every library at it."""
  port = free_port()
  storage = tmp_path_factory.mktemp("gcs")
  log = tmp_path_factory.mktemp("gcs_log") / "emulator.log"
  with open(log, "w") as out:  # a file, not a pipe: it logs every request, and a full pipe would stall it
    server = subprocess.Popen(
      [
        sys.executable,
        os.path.join(REPO, "tests", "gcs_emulator.py"),
        "-d",
        str(storage),
        "start",
        "--port",
        str(port),
        "--default-bucket",
        BUCKET,
      ],
      stdout=out,
      stderr=subprocess.STDOUT,
    )
  env = {
    "STORAGE_EMULATOR_HOST": f"http://localhost:{port}",
    "TENSORSTORE_GCS_HTTP_URL": f"http://localhost:{port}",
    "GOOGLE_CLOUD_PROJECT": "efftx-test",
    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "anonymous",
  }
  deadline = time.time() + 60
  while "All services started" not in log.read_text():
    assert server.poll() is None and time.time() < deadline, f"the emulator did not start: {log.read_text()}"
    time.sleep(0.1)
  yield env
  # tensorboardX keeps every SummaryWriter until the interpreter exits (an atexit hook), and its bucket writer
  # uploads its file once more when collected then: against the stopped emulator that retries for minutes. Those
  # writers were closed (uploaded) by the runs; their last upload is dropped.
  from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top

  for writer in gc.get_objects():
    if isinstance(writer, record_writer.GCSRecordWriter):
      writer.close = lambda: None
  server.terminate()
  server.wait(timeout=30)


@pytest.fixture
def on_bucket(bucket_env, monkeypatch):
  for name, value in bucket_env.items():
    monkeypatch.setenv(name, value)
  return bucket_env


def _fresh(workdir) -> epath.Path:
  """workdir, with this process's cache of the bucket's listings dropped (gcsfs keeps them; the runs changed it)."""
  fsspec.filesystem("gs", finalize_on_close=True).invalidate_cache()  # the instance epath uses
  return epath.Path(workdir)


def _steps(workdir) -> list[int]:
  return sorted(int(p.name) for p in (_fresh(workdir) / "checkpoints").iterdir() if p.name.isdigit())


def _untimed(row: dict) -> dict:
  return {k: v for k, v in row.items() if k not in ("steps_per_sec", "tokens_per_sec")}


def _args(workdir, data_dir):
  return [
    "--config=configs/quickstart.py:smoke",
    f"--workdir={workdir}",
    f"--config.data.data_dir={data_dir}",
  ] + [f"--config.{k}={v}" for k, v in OVERRIDES.items()]


def test_a_run_on_a_bucket_stops_resumes_falls_back_and_equals_a_local_run(
  smoke_config, data_dir, tmp_path, on_bucket, caplog
):
  local = str(tmp_path / "local")
  config = smoke_config()
  config.update(OVERRIDES)
  train.train_and_evaluate(config, local)

  workdir = f"gs://{BUCKET}/runs/smoke"
  env = {**os.environ, **on_bucket}
  # Started, stopped by SIGTERM after step 5 (it saves where it stops), then the same command again.
  first = subprocess.Popen(
    [sys.executable, "-m", "efftx.train", *_args(workdir, data_dir)],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  log = []
  while not any("] step 5:" in line for line in log[-1:]):
    log.append(first.stdout.readline())
    assert log[-1] or first.poll() is None, "".join(log)
  first.send_signal(signal.SIGTERM)
  out = "".join(log) + first.communicate(timeout=120)[0]
  assert first.returncode == 0, out
  stopped_at = max(_steps(workdir))
  assert 5 <= stopped_at < 12, out
  caplog.set_level(logging.INFO, logger="absl")
  _fresh(workdir)
  code, _, stderr = run_in_process("efftx.train", _args(workdir, data_dir))
  assert code == 0, stderr
  assert any(f"resuming from {workdir}/checkpoints at step {stopped_at}" in r.getMessage() for r in caplog.records)
  metrics = _fresh(workdir) / "metrics.jsonl"

  # Every step once, each metric (but the timings) equal to the local run's; the parameters bit for bit.
  got = [json.loads(line) for line in metrics.read_text().splitlines()]
  want = metrics_rows(local)
  assert [r["step"] for r in got] == [r["step"] for r in want]  # step 12 twice: its train row and its eval row
  assert sorted({r["step"] for r in got}) == list(range(1, 13))
  assert [_untimed(r) for r in got] == [_untimed(r) for r in want]
  _, got_params, _ = checkpoints.restore_params(workdir, 12)
  _, want_params, _ = checkpoints.restore_params(local, 12)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(got_params), jax.device_get(want_params))
  events = list((_fresh(workdir) / "tensorboard").glob("events.out.tfevents.*"))
  assert events and all(e.stat().length > 0 for e in events), events
  assert (
    json.loads((_fresh(workdir) / "config.json").read_text())["model"]
    == json.loads(config.to_json_best_effort())["model"]
  )
  assert not (_fresh(workdir) / "running.json").exists()

  # The evaluation of the bucket run writes its record beside it.
  code, stdout, stderr = run_in_process("efftx.evaluate", [f"--workdir={workdir}"])
  assert code == 0, stdout + stderr
  record = json.loads((_fresh(workdir) / "eval_validation_12.json").read_text())
  assert record["step"] == 12 and record["loss"] == pytest.approx(
    want[-1]["eval_loss"], abs=summation_atol(record["examples"], want[-1]["eval_loss"])
  )

  # A damaged latest checkpoint on the bucket: set aside (a move inside the bucket), the run goes on from step 8.
  sizes = json.loads((_fresh(workdir) / "checkpoints" / "12" / checkpoints.SIZES_FILE).read_text())
  largest = max((n for n in sizes if "/d/" in n), key=sizes.get)
  (epath.Path(workdir) / "checkpoints" / "12" / largest).unlink()
  caplog.clear()
  _fresh(workdir)
  code, _, stderr = run_in_process("efftx.train", _args(workdir, data_dir))
  assert code == 0, stderr
  warning = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
  assert len(warning) == 1 and "checkpoint 12 cannot be read" in warning[0], warning
  assert "resuming from step 8 instead" in warning[0]
  aside = sorted(p.name for p in (_fresh(workdir) / "unreadable_checkpoints").iterdir())
  assert len(aside) == 2 and aside[0].startswith("12-") and aside[1] == "README.txt", aside
  assert [_untimed(json.loads(line)) for line in (_fresh(workdir) / "metrics.jsonl").read_text().splitlines()] == [
    _untimed(r) for r in want
  ]
  assert _steps(workdir)[-2:] == [8, 12]
  _, again_params, _ = checkpoints.restore_params(workdir, 12)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(again_params), jax.device_get(want_params))


def test_a_bucket_that_does_not_exist_is_refused_not_created(data_dir, on_bucket):
  code, _, stderr = run_in_process("efftx.train", _args("gs://no-such-bucket/run", data_dir))
  assert code == 2
  assert stderr.strip().splitlines()[-1] == (
    "efftx.train: error: --workdir=gs://no-such-bucket/run: the bucket "
    "gs://no-such-bucket does not exist or cannot be reached"
  )
  assert not epath.Path("gs://no-such-bucket").exists()


def test_data_dir_on_a_bucket_is_refused_with_the_way_around(data_dir, tmp_path):
  code, _, stderr = run_in_process("efftx.train", _args(tmp_path, "gs://some-bucket/tensorflow_datasets"))
  assert code == 2
  assert (
    stderr.strip()
    .splitlines()[-1]
    .startswith("efftx.train: error: config.data.data_dir='gs://some-bucket/tensorflow_datasets': array_record")
  )
  assert "gcsfuse" in stderr
