"""Preparing a registered TFDS dataset: one that is not in data_dir and whose download hosts do not answer is
refused at once with the command that builds it; a prepared one, or one under tfds.testing.mock_data, is not
refused; the probe follows a proxy and gives up on a host that hangs."""

import os
import signal
import socket
import threading
import time

import pytest
import tensorflow_datasets as tfds

from efftx import config as config_lib
from efftx.data import pipeline
from efftx.errors import UserError


@pytest.fixture(autouse=True)
def deadline():
  """Fails a test that runs past 30 s, instead of letting it sit in TFDS's download retries (minutes)."""

  def fail(signum, frame):  # pylint: disable=unused-argument
    raise TimeoutError("ran past 30 s: preparing did not stop at the probe")

  previous = signal.signal(signal.SIGALRM, fail)
  signal.alarm(30)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def offline(monkeypatch):
  """No host answers (every connection is refused at once), and a TFDS download that starts fails the test: the
  (host, port) pairs the probe asked for are in the returned list."""
  asked = []

  def refuse(address, *args, **kwargs):
    asked.append(tuple(address))
    raise ConnectionRefusedError(f"refused: {address}")

  def download_and_prepare(self, *args, **kwargs):
    raise AssertionError(f"TFDS started downloading {self.name} instead of being stopped by the probe")

  monkeypatch.setattr(socket, "create_connection", refuse)
  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", download_and_prepare)
  return asked


def _config(task: str, variant: str, data_dir: str):
  config = config_lib.default_config("attention")
  config.data.update(task=task, variant=variant, data_dir=data_dir)
  return config


@pytest.mark.parametrize(
  "task,variant,name,host",
  [
    ("imdb_bytes", "plain_text", "imdb_reviews/plain_text", ("ai.stanford.edu", 80)),
    ("cifar10_grey", "default", "cifar10", ("www.cs.toronto.edu", 443)),
    ("glue", "sst2", "glue/sst2", ("dl.fbaipublicfiles.com", 443)),
  ],
)
def test_an_unprepared_dataset_whose_hosts_do_not_answer_is_refused_at_once(
  task, variant, name, host, offline, tmp_path
):
  data_dir = str(tmp_path / "empty_tfds")
  start = time.monotonic()
  with pytest.raises(UserError) as refused:
    pipeline.prepare(_config(task, variant, data_dir))
  assert time.monotonic() - start < 5
  message = str(refused.value)
  assert "\n" not in message
  assert f"{name} is not prepared in {data_dir}" in message
  assert "where the network reaches, efftx downloads and prepares it itself" in message
  assert message.endswith(f"tfds build {name} --file_format=array_record --data_dir={data_dir}")
  assert host in offline and f"{host[0]}:{host[1]}" in message


def test_a_prepared_dataset_is_read_without_asking_the_network(offline, tmp_path):
  config = _config("imdb_bytes", "plain_text", str(tmp_path))
  builder = tfds.builder("imdb_reviews/plain_text", data_dir=str(tmp_path), file_format="array_record")
  os.makedirs(builder.data_dir)
  builder.info.write_to_directory(builder.data_dir)  # what `tfds build` leaves beside the data files
  assert tfds.builder("imdb_reviews/plain_text", data_dir=str(tmp_path)).is_prepared()
  pipeline.prepare(config)
  assert not offline


def test_mocked_tfds_is_not_refused(tmp_path, monkeypatch):
  """tfds.testing.mock_data downloads nothing, so an unreachable host does not matter (the tests of the configs
  on registered datasets run this way)."""
  monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed under mock_data"))
  config = _config("imdb_bytes", "plain_text", str(tmp_path))
  with tfds.testing.mock_data(num_examples=4):
    pipeline.prepare(config)
    assert len(pipeline.source(config, "train")) == 4


def test_the_probe_connects_to_a_listening_port_and_not_to_a_closed_one():
  with socket.socket() as listening, socket.socket() as closed:
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    closed.bind(("127.0.0.1", 0))  # bound but not listening: a connection is refused at once
    targets = [("127.0.0.1", listening.getsockname()[1]), ("127.0.0.1", closed.getsockname()[1])]
    assert pipeline._reachable(targets, 2.0)  # pylint: disable=protected-access
    start = time.monotonic()
    assert not pipeline._reachable(targets[1:], 2.0)  # pylint: disable=protected-access
    assert time.monotonic() - start < 1


def test_the_probe_gives_up_on_a_host_that_hangs(monkeypatch):
  """A name lookup that never returns (an unreachable DNS server) is abandoned at the deadline."""
  released = threading.Event()

  def hang(*args, **kwargs):
    released.wait(20)
    raise TimeoutError("released")

  monkeypatch.setattr(socket, "create_connection", hang)
  start = time.monotonic()
  try:
    assert not pipeline._reachable([("hangs.example", 443)], 0.5)  # pylint: disable=protected-access
    assert time.monotonic() - start < 2
  finally:
    released.set()


def test_the_probe_asks_the_proxy_the_environment_sets(monkeypatch, tmp_path):
  for variable in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY", "HTTP_PROXY", "HTTPS_PROXY", "https_proxy"):
    monkeypatch.delenv(variable, raising=False)
  monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
  imdb = tfds.builder("imdb_reviews/plain_text", data_dir=str(tmp_path))  # downloads over http
  cifar10 = tfds.builder("cifar10", data_dir=str(tmp_path))  # over https: no proxy set for it
  assert pipeline._download_targets(imdb) == [("proxy.example", 3128)]  # pylint: disable=protected-access
  assert pipeline._download_targets(cifar10) == [("www.cs.toronto.edu", 443)]  # pylint: disable=protected-access
  monkeypatch.setenv("no_proxy", "stanford.edu")
  assert pipeline._download_targets(imdb) == [("ai.stanford.edu", 80)]  # pylint: disable=protected-access
