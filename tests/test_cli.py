"""Bad input on the command line: non-zero exit, one clear line naming the problem and the choices, no traceback,
and the workdir as it was."""

import concurrent.futures
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from conftest import run_in_process
from conftest import snapshot

TRAIN_CASES = [
  # (extra arguments, words the one line must contain)
  (["--config.model.mixerr=fnet"], ["mixerr", "did you mean 'mixer'", "d_model"]),
  (["--config.model.mixer=fnett"], ["fnett", "did you mean 'fnet'", "attention, fnet"]),
  (["--config.data.task=listopz"], ["listopz", "listops"]),
  (["--config.model.d_model=abc"], ["d_model", "abc"]),
  (["--config.model.dropout=1.5"], ["dropout", "[0, 1)"]),
  (["--config=configs/quickstart.py:mixer=fnet", "--config.model.causal=true"], ["fnet", "cannot be causal"]),
  # Mixer options: only the chosen mixer's exist; the message names them.
  (["--config.mixer.window=4"], ["mixer 'attention' has no option 'window'", "attention_impl (", "num_heads ("]),
  (["--config.model.window=4"], ["'window' is a mixer option", "mixer 'attention' has options", "attention_impl"]),
  (["--config.model.num_heads=2"], ["config.mixer.num_heads", "attention_impl"]),
  (["--config={tmp}/option_it_lacks.py"], ["mixer 'fnet' has no option 'attention_dropout'", "fourier_impl ("]),
  (["--config=configs/quickstart.py:mixer=local", "--config.mixer.window=0"], ["window=0", "local", "≥ 1"]),
  (["--config=configs/quickstart.py:mixer=aft_local", "--config.mixer.window=0"], ["window=0", "aft_local"]),
  (["--config.mixer.num_heads=5"], ["d_model=64", "num_heads=5"]),
  (["--config.mixer.attention_impl=fused", "--config.mixer.attention_dropout=0.1"], ["fused", "dropout"]),
  (["--config.model.mixer=fnet"], ["options of mixer 'attention'", "--config=FILE:mixer=fnet"]),
  # Architecture conventions (issue 10)
  (["--config.model.block_layout=post"], ["block_layout='post'", "pre_ln, post_ln"]),
  (["--config.model.block_layout=post_ln", "--config.model.reversible=true"], ["reversible", "pre_ln"]),
  (["--config.model.reversible_recompute=false"], ["reversible_recompute=False", "reversible=True"]),
  (["--config=configs/lm_bytes.py", "--config.model.pooling=cls"], ["pooling='cls'", "classification"]),
  (["--config=configs/quickstart.py:mixr=fnet"], ["mixr", "valid: mixer, smoke"]),
  (["--config=configs/nope.py"], ["configs/nope.py", "no such config file"]),
  (["--config=configs/lm_bytes.py", "--config.model.max_len=2048"], ["max_len=2048", "at most 1024"]),
  (["--config=configs/lm_bytes.py", "--config.model.causal=false"], ["language modelling", "causal=True"]),
  # Data problems, found before anything is written in the workdir:
  (  # (the session's data, prepared: preparing a fresh data_dir, and its log lines, is the {tmp}/afile case's)
    ["--config=configs/quickstart.py:smoke", "--config.model.max_len=8", "--config.data.data_dir={data_dir}"],
    ["a ListOps example has", "max_len=8", "config.data.truncate=True"],
  ),
  (
    ["--config=configs/lm_bytes.py:smoke", "--config.data.corpus_dir={tmp}/empty", "--config.data.data_dir={tmp}/t"],
    ["empty is missing or empty", "folder of text files"],
  ),
  (
    [
      "--config=configs/lra_image.py:data=fashion_mnist,smoke",
      "--config.data.corpus_dir={tmp}/nowhere",
      "--config.data.data_dir={tmp}/tfds",
    ],
    ["nowhere is missing or empty", "apt-get install dataset-fashion-mnist"],
  ),
  (["--config.init_from={tmp}/nowhere"], ["init_from", "no such workdir or checkpoint"]),
  (["--config.data.objective=mlm"], ["listops", "no text to mask"]),
  (["--config.data.objective=nsp"], ["objective='nsp'", "mlm"]),
  (["--config.data.variant=huge"], ["variant='huge'", "full, small, tiny"]),
  (["--config.data.batch_size=12"], ["batch_size=12", "8 devices"]),
  # Issue 11: data folders, workdirs, config files, init_from.
  (
    ["--config=configs/quickstart.py:smoke", "--config.data.data_dir={tmp}/afile"],
    ["preparing listops/tiny", "failed", "afile"],
  ),
  (
    [
      "--config=configs/lra_image.py:data=fashion_mnist,smoke",
      "--config.data.corpus_dir={tmp}/garbage",
      "--config.data.data_dir={tmp}/tfds",
    ],
    ["garbage/train-images-idx3-ubyte.gz is not a gzipped idx file"],
  ),
  (
    ["--config=configs/quickstart.py:smoke", "--workdir={tmp}/afile", "--config.data.data_dir={data_dir}"],
    ["--workdir=", "afile is a file, not a folder"],
  ),
  (
    ["--config=configs/quickstart.py:smoke", "--workdir={tmp}/afile/run", "--config.data.data_dir={data_dir}"],
    ["cannot create --workdir=", "afile/run", "Not a directory"],
  ),
  (
    [
      "--config=configs/quickstart.py:smoke",
      "--workdir={run}",
      "--config.model.d_ff=128",
      "--config.data.data_dir={data_dir}",
    ],
    ["holds a run of another model or data (config.model.d_ff 64 → 128)", "another --workdir"],
  ),
  (
    [
      "--config=configs/quickstart.py:smoke",
      "--config.init_from={run}",
      "--config.model.d_model=48",
      "--config.data.data_dir={data_dir}",
    ],
    ["config.init_from", "encoders must match", "d_model=32"],
  ),
  (["--config={tmp}/raises.py"], ["raises.py", "no such corpus"]),
  (["--config={tmp}/no_get_config.py"], ["no_get_config.py: the file has no get_config function"]),
  # A config file that raises, at import or in get_config, or does not parse: the error and the file's line.
  (["--config={tmp}/get_config_raises.py"], ["get_config raised RuntimeError: boom", "get_config_raises.py, line 2)"]),
  (
    ["--config={tmp}/raises_on_import.py"],
    ["loading the file raised KeyError: EFFTX_NO_SUCH_VARIABLE", "raises_on_import.py, line 3)"],
  ),
  (["--config={tmp}/syntax_error.py"], ["SyntaxError: invalid syntax", "syntax_error.py, line 3)"]),
]

OTHER_CASES = [  # (program, arguments, words)
  ("evaluate", ["--workdir={tmp}/empty"], ["empty is not a training run's workdir (no config.json)"]),
  ("evaluate", ["--workdir={tmp}/configured"], ["configured has no checkpoint yet"]),
  ("evaluate", ["--workdir={run}", "--checkpoint=3"], ["no checkpoint at step 3", "its checkpoints: 2, 4"]),
  ("evaluate", ["--workdir={run}", "--split=train"], ["--split=train", "validation, test"]),
  ("sample", ["--workdir={run}", "--prompt=[MAX"], ["trained task 'listops'", "nothing to sample"]),
  ("sample", ["--workdir={tmp}/nowhere"], ["nowhere: no such workdir or checkpoint"]),
]

CASES = [("train", a, w) for a, w in TRAIN_CASES] + OTHER_CASES


@pytest.fixture(scope="module")
def finished_run(data_dir, tmp_path_factory):
  """A finished smoke run (ListOps classifier, checkpoints at steps 2 and 4)."""
  from configs import quickstart  # pylint: disable=g-import-not-at-top
  from efftx import train  # pylint: disable=g-import-not-at-top

  config = quickstart.get_config("smoke")
  config.data.data_dir = data_dir
  workdir = str(tmp_path_factory.mktemp("finished"))
  train.train_and_evaluate(config, workdir)
  return workdir


def test_there_are_at_least_20_bad_input_cases():
  assert len(CASES) >= 20


def _make_inputs(tmp, finished_run):
  """The files and folders the cases name under {tmp}."""
  (tmp / "empty").mkdir()
  (tmp / "afile").write_text("not a folder")
  (tmp / "configured").mkdir()
  (tmp / "configured" / "config.json").write_text(open(os.path.join(finished_run, "config.json")).read())
  (tmp / "garbage").mkdir()
  for name in (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
  ):
    (tmp / "garbage" / name).write_bytes(np.random.default_rng(0).bytes(5000))
  (tmp / "option_it_lacks.py").write_text(
    "from configs import quickstart\n\n\ndef get_config():\n  config = quickstart.get_config('mixer=fnet')\n"
    "  config.mixer.attention_dropout = 0.1  # fnet has no attention probabilities\n  return config\n"
  )
  (tmp / "raises.py").write_text("def get_config():\n  raise FileNotFoundError('no such corpus: /data/x')\n")
  (tmp / "no_get_config.py").write_text("def config():\n  return None\n")
  (tmp / "get_config_raises.py").write_text("def get_config(arg=None):\n  raise RuntimeError('boom')\n")
  (tmp / "raises_on_import.py").write_text("import os\n\nVALUE = os.environ['EFFTX_NO_SUCH_VARIABLE']\n")
  (tmp / "syntax_error.py").write_text("def get_config(arg=None):\n  x = 1\n  return x +\n")


# The cases run as real processes (two at a time): the exit code and stderr as a shell sees them, for each program
# that takes a workdir, and for train through a config file and through data preparation (which logs first). The
# others run in this process through the same __main__ path (conftest.run_in_process).
REAL_PROCESS_CASES = [
  ("train", ["--config={tmp}/syntax_error.py"]),
  ("train", ["--config=configs/quickstart.py:smoke", "--config.data.data_dir={tmp}/afile"]),
  ("evaluate", ["--workdir={tmp}/empty"]),
  ("sample", ["--workdir={tmp}/nowhere"]),
]


class _Run:
  """A finished case: returncode, stderr and args, as subprocess.CompletedProcess has them."""

  def __init__(self, args, returncode, stderr):
    self.args, self.returncode, self.stderr = args, returncode, stderr


@pytest.fixture(scope="module")
def bad_input_runs(data_dir, finished_run, tmp_path_factory):
  """Every case run, as a real process or in this process: a list of (finished run, workdir snapshot before,
  snapshot after). Snapshots are taken before the first case starts and after the last ends, so cases sharing the
  finished run's workdir cannot see each other."""
  jobs = []
  for i, (prog, args, _) in enumerate(CASES):
    tmp = tmp_path_factory.mktemp(f"bad_input_{i}")
    _make_inputs(tmp, finished_run)
    real = (prog, args) in REAL_PROCESS_CASES
    args = [a.replace("{tmp}", str(tmp)).replace("{run}", finished_run).replace("{data_dir}", data_dir) for a in args]
    if prog == "train" and not any(a.startswith("--config=") for a in args):
      args.insert(0, "--config=configs/quickstart.py")
    if prog == "train" and not any(a.startswith("--workdir=") for a in args):
      args.insert(0, f"--workdir={tmp / 'run'}")
    jobs.append(
      (
        real,
        [sys.executable, "-m", f"efftx.{prog}"] + args,
        next(a for a in args if a.startswith("--workdir=")).split("=", 1)[1],
      )
    )
  assert sum(real for real, _, _ in jobs) == len(REAL_PROCESS_CASES)
  before = [snapshot(workdir) for _, _, workdir in jobs]
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    procs = {
      i: pool.submit(subprocess.run, argv, cwd=REPO, capture_output=True, text=True, timeout=300)
      for i, (real, argv, _) in enumerate(jobs)
      if real
    }
    runs = []
    for real, argv, _ in jobs:
      if not real:
        code, _, stderr = run_in_process(argv[2], argv[3:])
        runs.append(_Run(argv, code, stderr))
      else:
        runs.append(None)
    runs = [procs[i].result() if run is None else run for i, run in enumerate(runs)]
  return list(zip(runs, before, [snapshot(workdir) for _, _, workdir in jobs]))


def test_the_real_process_cases_are_cases():
  assert all(any((prog, args) == (p, a) for p, a, _ in CASES) for prog, args in REAL_PROCESS_CASES)


@pytest.mark.slow
@pytest.mark.xdist_group("bad_input")  # one worker runs the fixture (every case), not each worker
@pytest.mark.parametrize("case", range(len(CASES)), ids=[" ".join([p] + a) for p, a, _ in CASES])
def test_bad_input_exits_with_one_clear_line(case, bad_input_runs):
  prog, raw_args, words = CASES[case]
  proc, before, after = bad_input_runs[case]
  assert proc.returncode != 0
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  if not any("{tmp}/" in a and "data_dir" in a for a in raw_args):
    assert len(lines) == 1, proc.stderr  # (preparing a dataset logs its progress first)
  assert "Traceback" not in proc.stderr
  assert lines[-1].startswith(f"efftx.{prog}: error: "), proc.stderr
  for word in words:
    assert word in lines[-1], lines[-1]
  assert after == before  # the workdir as it was (absent if it was)


@pytest.mark.slow
@pytest.mark.xdist_group("bad_input")
@pytest.mark.parametrize(
  "name,error,line",
  [
    ("get_config_raises.py", "get_config raised RuntimeError: boom", 2),
    ("raises_on_import.py", "loading the file raised KeyError: EFFTX_NO_SUCH_VARIABLE", 3),
    ("syntax_error.py", "SyntaxError: invalid syntax", 3),
  ],
)
def test_a_config_file_that_raises_is_one_line_naming_its_line(name, error, line, bad_input_runs):
  """Exit code 2 and exactly the line `efftx.train: error: --config=FILE: ERROR (FILE, line N)`."""
  case = next(i for i, (_, args, _) in enumerate(CASES) if args == [f"--config={{tmp}}/{name}"])
  proc = bad_input_runs[case][0]
  path = next(a for a in proc.args if a.startswith("--config=")).split("=", 1)[1]
  assert os.path.basename(path) == name
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.splitlines() == [f"efftx.train: error: --config={path}: {error} ({path}, line {line})"]


def test_without_config_flag_an_override_error_is_one_line_too(tmp_path):
  """The default config (the quickstart, found from where efftx was imported) gets the same messages."""
  code, _, stderr = run_in_process("efftx.train", [f"--workdir={tmp_path / 'run'}", "--config.mixer.window=4"])
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr
  assert "mixer 'attention' has no option 'window'" in lines[0]
  assert not (tmp_path / "run").exists()


def test_a_bug_keeps_its_traceback(tmp_path, data_dir, monkeypatch):
  """Only user errors become one line: a ValueError from inside the code (here planted by the config file, which
  runs in the training program) is not turned into a tidy message that hides it; it leaves the program, which
  python then prints with its traceback."""
  from efftx import trainer  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(trainer, "make_train_step", trainer.make_train_step)  # put back after the test
  (tmp_path / "planted.py").write_text(
    "from configs import quickstart\nfrom efftx import trainer\n\n\n"
    "def boom(*args, **kwargs):\n  raise ValueError('an internal error, not the user\\'s')\n\n\n"
    "def get_config():\n  trainer.make_train_step = boom\n  return quickstart.get_config('smoke')\n"
  )
  with pytest.raises(ValueError, match="an internal error"):
    run_in_process(
      "efftx.train",
      [f"--config={tmp_path / 'planted.py'}", f"--workdir={tmp_path / 'run'}", f"--config.data.data_dir={data_dir}"],
    )


def test_an_error_inside_efftx_reached_from_get_config_is_a_bug_and_keeps_its_traceback(tmp_path):
  """explain_flag_error: an error the config file's own code raises, or a library it calls (ml_collections on a
  mistyped section), is one line naming the file's line; one raised inside efftx's code (not a UserError) is a
  bug: None, so efftx.train re-raises it with its traceback."""
  from efftx import cli  # pylint: disable=g-import-not-at-top

  (tmp_path / "typo.py").write_text(
    "from efftx import config as config_lib\n\n\ndef get_config(arg=None):\n"
    "  c = config_lib.default_config()\n  c.mdoel.d_model = 3\n  return c\n"
  )
  (tmp_path / "misuse.py").write_text(
    "from efftx import config as config_lib\n\n\ndef get_config(arg=None):\n"
    "  config_lib.set_where_declared(None, window=3)\n"
  )
  typo = cli.explain_flag_error([f"--config={tmp_path / 'typo.py'}"], RuntimeError("flags"))
  assert typo == (
    f"--config={tmp_path / 'typo.py'}: get_config raised AttributeError: 'mdoel'; Did you mean "
    f"\"model\" instead of \"mdoel\"? ({tmp_path / 'typo.py'}, line 6)"
  )
  assert cli.explain_flag_error([f"--config={tmp_path / 'misuse.py'}"], RuntimeError("flags")) is None


@pytest.mark.slow
def test_the_default_config_is_the_imported_trees_own(tmp_path):
  """A second source tree (a worktree frozen for a sweep, a fork) run from its root takes its own
  configs/quickstart.py as the default, not the installed checkout's."""
  import shutil  # pylint: disable=g-import-not-at-top

  tree = tmp_path / "tree"
  for folder in ("efftx", "configs"):
    shutil.copytree(os.path.join(REPO, folder), tree / folder, ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copy(os.path.join(REPO, "pyproject.toml"), tree)
  proc = subprocess.run(
    [sys.executable, "-c", "from efftx import cli; print(cli.default_config_file())"],
    cwd=tree,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == str(tree / "configs" / "quickstart.py")


@pytest.mark.slow
def test_without_a_default_config_an_explicit_one_still_works(tmp_path):
  """efftx imported from a copy of the package alone, with no efftx.configs installed (site-packages on the path,
  its .pth files, the editable install's finder among them, not run: python -S): --config works as given, and
  without it the error is one line naming the flag."""
  import shutil  # pylint: disable=g-import-not-at-top
  import sysconfig  # pylint: disable=g-import-not-at-top

  shutil.copytree(os.path.join(REPO, "efftx"), tmp_path / "efftx", ignore=shutil.ignore_patterns("__pycache__"))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), sysconfig.get_paths()["purelib"]])}
  run = lambda *flags: subprocess.run(
    [sys.executable, "-S", "-m", "efftx.train", *flags, f"--workdir={tmp_path / 'run'}"],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  given = run(f"--config={REPO}/configs/quickstart.py:smoke", "--config.model.mixerr=1")
  assert given.returncode == 2 and given.stderr.startswith(
    "efftx.train: error: --config.model.mixerr: config.model has no field 'mixerr'"
  ), given.stderr
  proc = run("--config.model.d_model=3")  # an override without a config: still the missing config
  assert proc.returncode == 2 and proc.stderr.splitlines() == [
    "efftx.train: error: no --config given, and no default: efftx.configs is not installed and no configs/ is "
    "beside the efftx package; pass --config=PATH/TO/configs/quickstart.py"
  ], proc.stderr
  assert not (tmp_path / "run").exists()


def test_a_configs_folder_beside_an_installed_efftx_is_not_taken_for_its_own(tmp_path, monkeypatch):
  """In site-packages, a configs/quickstart.py of another package beside efftx/ is not efftx's default; with no
  efftx.configs importable either, there is no default (None)."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  from efftx import cli  # pylint: disable=g-import-not-at-top

  (tmp_path / "efftx").mkdir()
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "quickstart.py").write_text("")
  monkeypatch.setattr(cli, "__file__", str(tmp_path / "efftx" / "cli.py"))

  def missing(name, *args):
    raise ModuleNotFoundError(f"No module named '{name.rsplit('.', 1)[0]}'")

  monkeypatch.setattr(importlib.util, "find_spec", missing)
  assert cli.default_config_file() is None
  (tmp_path / "pyproject.toml").write_text('[project]\nname = "efftx"\n')
  assert cli.default_config_file() == str(tmp_path / "configs" / "quickstart.py")


def test_library_logs_keep_warnings_and_drop_the_noise():
  """cli.quiet_library_logs' filter: JAX's note of a backend it could not start (libtpu on a machine without a
  TPU), orbax's and TFDS's INFO lines and TFDS's warning that a dataset not yet prepared has no dataset_info.json
  are dropped; their other warnings and every other library's lines are kept."""
  import logging  # pylint: disable=g-import-not-at-top

  from efftx import cli  # pylint: disable=g-import-not-at-top

  def record(path, level, message):
    return logging.LogRecord("absl", level, path, 1, message, None, None)

  site = "/usr/lib/python3.11/site-packages"
  dropped = [
    record(f"{site}/jax/_src/xla_bridge.py", logging.INFO, "Unable to initialize backend 'tpu': libtpu.so"),
    record(f"{site}/orbax/checkpoint/manager.py", logging.INFO, "Saving checkpoint at step 2"),
    record(f"{site}/tensorflow_datasets/core/read_only_builder.py", logging.WARNING, "x has no dataset_info.json"),
  ]
  kept = [
    record(f"{site}/jax/_src/xla_bridge.py", logging.WARNING, "An NVIDIA GPU may be present but is not used"),
    record(f"{site}/orbax/checkpoint/manager.py", logging.WARNING, "Checkpoint 4 is incomplete"),
    record(f"{REPO}/efftx/train.py", logging.INFO, "data: listops (tiny) in /data"),
    record(f"{site}/grain/_src/python/data_loader.py", logging.INFO, "Starting workers"),
  ]
  assert [cli.keep_log_record(r) for r in dropped + kept] == [False] * len(dropped) + [True] * len(kept)


def test_a_failed_preparation_leaves_no_data_dir_behind(tmp_path):
  """A corpus folder that is missing stops the run in one line and leaves nothing behind: not the data_dir it would
  have prepared into, nor its lock file; in a data_dir that existed, the lock file it created is removed."""
  existing = tmp_path / "existing"
  existing.mkdir()
  for data_dir in (tmp_path / "new", existing):
    args = [
      "--config=configs/lm_bytes.py:smoke",
      f"--config.data.corpus_dir={tmp_path / 'nowhere'}",
      f"--config.data.data_dir={data_dir}",
      f"--workdir={tmp_path / 'run'}",
    ]
    code, _, stderr = run_in_process("efftx.train", args)
    assert code == 2 and "nowhere is missing or empty" in stderr, stderr
  assert sorted(os.listdir(tmp_path)) == ["existing"] and os.listdir(existing) == []


GARBAGE = b"\x00\x93 not json {\n"


def _workdir_programs(workdir, data_dir):
  """(program, arguments) of each entry point that reads a run's workdir; train with the finished run's config."""
  smoke = ["--config=configs/quickstart.py:smoke", f"--config.data.data_dir={data_dir}"]
  return [
    ("train", [*smoke, f"--workdir={workdir}"]),
    ("evaluate", [f"--workdir={workdir}"]),
    ("sample", [f"--workdir={workdir}"]),
  ]


@pytest.mark.xdist_group("bad_input")  # the worker that holds finished_run
@pytest.mark.parametrize("name", ["config.json", "config_history.jsonl"])
def test_an_unreadable_config_is_one_line_from_train_evaluate_and_sample(name, finished_run, data_dir, tmp_path):
  """The run's config (config.json, and the changes accepted on resume): garbage in either file stops every program
  that reads the run with one line naming the file and what to do, exit 2, and the workdir as it was."""
  run = tmp_path / "run"
  shutil.copytree(finished_run, run)
  (run / name).write_bytes(GARBAGE)
  before = snapshot(run)
  for prog, args in _workdir_programs(run, data_dir):
    code, _, stderr = run_in_process(f"efftx.{prog}", args)
    lines = stderr.splitlines()
    assert code == 2 and len(lines) == 1, (prog, stderr)
    assert lines[0].startswith(f"efftx.{prog}: error: {run / name} cannot be read ("), (prog, stderr)
    assert "put back a good copy of it" in lines[0]
  assert snapshot(run) == before


@pytest.mark.xdist_group("bad_input")
def test_metrics_jsonl_a_bad_line_stops_train_in_one_line_a_half_written_last_line_is_dropped(
  finished_run, data_dir, tmp_path
):
  """metrics.jsonl, which train reads on resume: a line that is not a row stops it with one line naming the line
  (exit 2, the workdir as it was); the half-written last row a kill -9 leaves behind is dropped and the run goes on
  (here: already finished, the rows before it kept)."""
  run = tmp_path / "run"
  shutil.copytree(finished_run, run)
  rows = (run / "metrics.jsonl").read_bytes()
  (run / "metrics.jsonl").write_bytes(rows + GARBAGE + rows)
  before = snapshot(run)
  bad_line = len(rows.splitlines()) + 1
  train_args = _workdir_programs(run, data_dir)[0][1]
  code, _, stderr = run_in_process("efftx.train", train_args)
  assert code == 2 and stderr.splitlines() == [
    f"efftx.train: error: {run / 'metrics.jsonl'}, line {bad_line}, cannot be read (Expecting value: "
    "line 1 column 1 (char 0)): delete that line, or put back a good copy of the file, and re-run"
  ], stderr
  assert snapshot(run) == before

  (run / "metrics.jsonl").write_bytes(rows + b'{"step": 5, "accuracy": 0.1')
  code, _, stderr = run_in_process("efftx.train", train_args)
  assert code == 0, stderr
  assert (run / "metrics.jsonl").read_bytes() == rows


@pytest.mark.xdist_group("bad_input")
def test_evaluate_and_sample_read_neither_metrics_nor_running_json_and_train_writes_over_running_json(
  finished_run, data_dir, tmp_path
):
  """running.json is a note of who holds the workdir's lock, not the run's record: train writes over an unreadable
  one (and removes it at the end); evaluate and sample read neither it nor metrics.jsonl."""
  run = tmp_path / "run"
  shutil.copytree(finished_run, run)
  (run / "running.json").write_bytes(GARBAGE)
  code, _, stderr = run_in_process("efftx.train", _workdir_programs(run, data_dir)[0][1])
  assert code == 0, stderr
  assert not (run / "running.json").exists()
  (run / "running.json").write_bytes(GARBAGE)
  (run / "metrics.jsonl").write_bytes(GARBAGE)
  code, stdout, stderr = run_in_process("efftx.evaluate", [f"--workdir={run}"])
  assert code == 0 and stdout.startswith("validation at step 4: "), stderr
  code, _, stderr = run_in_process("efftx.sample", [f"--workdir={run}"])
  assert code == 2 and "trained task 'listops', not a text language model" in stderr, stderr
