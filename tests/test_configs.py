"""Every config under configs/ builds, validates, and trains one step in its smoke variant."""
import glob
import os
import runpy

import jax
import numpy as np
import pytest

from conftest import REPO
from efftx import config as config_lib
from efftx import train

CONFIG_FILES = sorted(p for p in glob.glob(os.path.join(REPO, "configs", "*.py")) if not p.endswith("__init__.py"))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=os.path.basename)
def test_config_builds_validates_and_trains_a_step(path, data_dir, tmp_path):
  get_config = runpy.run_path(path)["get_config"]
  config_lib.validate(get_config(), jax.device_count())  # the full-size config is valid too
  config = get_config("smoke")
  config.data.data_dir = data_dir
  config.total_steps = 1
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result["step"] == 1 and np.isfinite(result["loss"]) and np.isfinite(result["eval_loss"])


def test_parse_arg():
  args = config_lib.parse_arg("mixer=fnet,smoke", mixer="attention", smoke=False, steps=10)
  assert (args.mixer, args.smoke, args.steps) == ("fnet", True, 10)
  assert config_lib.parse_arg("steps=5,smoke=false", smoke=True, steps=1).to_dict() == {"smoke": False, "steps": 5}
  with pytest.raises(ValueError, match="must be int"):
    config_lib.parse_arg("steps=x", steps=1)
  with pytest.raises(ValueError, match="unknown config argument 'foo'"):
    config_lib.parse_arg("foo", steps=1)
