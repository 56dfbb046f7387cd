"""Bad input on the command line: non-zero exit, one clear line naming the problem and the choices."""
import subprocess
import sys

import pytest

from conftest import REPO

CASES = [
    # (extra arguments, words the one line must contain)
    (["--config.model.mixerr=fnet"], ["mixerr", "did you mean 'mixer'", "d_model"]),
    (["--config.model.mixer=fnett"], ["fnett", "attention, fnet"]),
    (["--config.data.task=listopz"], ["listopz", "listops"]),
    (["--config.model.d_model=abc"], ["d_model", "abc"]),
    (["--config.model.dropout=1.5"], ["dropout", "[0, 1)"]),
    (["--config.model.mixer=fnet", "--config.model.causal=true"], ["fnet", "cannot be causal"]),
    (["--config=configs/quickstart.py:mixr=fnet"], ["mixr", "valid: mixer, smoke"]),
    (["--config=configs/nope.py"], ["configs/nope.py", "no such config file"]),
    (["--config=configs/lm_bytes.py", "--config.model.max_len=2048"], ["max_len=2048", "at most 1024"]),
    (["--config=configs/lm_bytes.py", "--config.model.causal=false"], ["language modelling", "causal=True"]),
    # Data problems, found before anything is written in the workdir:
    (["--config=configs/quickstart.py:smoke", "--config.model.max_len=8", "--config.data.data_dir={tmp}/tfds"],
     ["a ListOps example has", "max_len=8", "config.data.truncate=True"]),
    (["--config=configs/lm_bytes.py:smoke", "--config.data.corpus_dir={tmp}/empty", "--config.data.data_dir={tmp}/t"],
     ["empty is missing or empty", "folder of text files"]),
    (["--config=configs/lra_image.py:data=fashion_mnist,smoke", "--config.data.corpus_dir={tmp}/nowhere",
      "--config.data.data_dir={tmp}/tfds"],
     ["nowhere is missing or empty", "apt-get install dataset-fashion-mnist"]),
    (["--config.init_from={tmp}/nowhere"], ["init_from", "no such workdir or checkpoint"]),
    (["--config.data.objective=mlm"], ["listops", "no text to mask"]),
]


@pytest.mark.parametrize("args,words", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_exits_with_one_clear_line(args, words, tmp_path):
  (tmp_path / "empty").mkdir()
  raw_args, args = args, [a.replace("{tmp}", str(tmp_path)) for a in args]
  argv = [sys.executable, "-m", "efftx.train", f"--workdir={tmp_path / 'run'}"]
  if not any(a.startswith("--config=") for a in args):
    argv.append("--config=configs/quickstart.py")
  proc = subprocess.run(argv + args, cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  if not any("{tmp}/" in a and "data_dir" in a for a in raw_args):
    assert len(lines) == 1, proc.stderr  # (preparing a dataset logs its progress first)
  assert "Traceback" not in proc.stderr
  assert lines[-1].startswith("efftx.train: error: "), proc.stderr
  for word in words:
    assert word in lines[-1], lines[-1]
  assert not (tmp_path / "run").exists()  # nothing written
