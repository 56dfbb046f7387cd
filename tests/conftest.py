"""Tests run on 8 fake CPU devices (set before JAX is imported), like a small pod."""
import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # pylint: disable=g-import-not-at-top

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> str:
  """A TFDS data dir shared by the session's tests; datasets are prepared into it on first use."""
  return str(tmp_path_factory.mktemp("tensorflow_datasets"))


@pytest.fixture
def smoke_config(data_dir):
  """The quickstart's smoke config (ListOps "tiny", a 32-wide model) on the session's data dir."""
  from configs import quickstart  # pylint: disable=g-import-not-at-top

  def make(arg: str = "smoke"):
    config = quickstart.get_config(arg)
    config.data.data_dir = data_dir
    return config

  return make
