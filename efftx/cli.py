"""What every entry point shares on the command line: one-line errors and exit code 2, the check of its flags, the
explanation of a bad --config or override, the default config file, and quieter library logs."""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import os
import runpy
import sys
import traceback

import ml_collections

from efftx.errors import UserError


def explain_flag_error(argv: list[str], error: Exception) -> str | None:
  """One line for an error raised while parsing --config and its overrides, or None for a bug (keep its traceback).

  For a config file that fails to load or whose get_config raises, the error and the file's line it came from (None
  when the error was raised in efftx's or a library's code, and is not a UserError: a bug, not the file's); for a
  mistyped override key (`--config.model.mixerr=...`), the field and the valid fields beside it; otherwise the
  first line of the error.
  """
  config_arg = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if config_arg is None:
    config_arg = default_config_file()
    if config_arg is None:
      return NO_DEFAULT_CONFIG
  overrides = [a[2:].split("=", 1)[0] for a in argv if a.startswith("--config.")]
  if config_arg:
    path, _, arg = config_arg.partition(":")
    if not os.path.exists(path):
      return f"--config={config_arg}: no such config file"
    try:
      module = runpy.run_path(path)
    except Exception as e:  # pylint: disable=broad-except
      message = raised_by(path, "loading the file", e)
      return message and f"--config={config_arg}: {message}"
    if "get_config" not in module:
      return (
        f"--config={config_arg}: the file has no get_config function (a config file defines "
        "get_config(arg=None) returning its ConfigDict)"
      )
    try:
      config = module["get_config"](*([arg] if arg else []))
    except Exception as e:  # pylint: disable=broad-except
      message = raised_by(path, "get_config", e)
      return message and f"--config={config_arg}: {message}"
    if not isinstance(config, ml_collections.ConfigDict):
      return f"--config={config_arg}: get_config returned {type(config).__name__}, not a ConfigDict"
    for key in overrides:
      node, parts = config, key.split(".")[1:]
      for depth, part in enumerate(parts):
        if not isinstance(node, ml_collections.ConfigDict):
          break
        if part not in node:
          return f"--{key}: " + _missing_field(config, ".".join(["config"] + parts[:depth]), node, part)
        node = node[part]
  return _first_line(error)


def _missing_field(config: ml_collections.ConfigDict, parent: str, node: ml_collections.ConfigDict, part: str) -> str:
  """Why `parent.part` does not exist: a mixer option the chosen mixer lacks, a mixer option set in the wrong
  section, or a typo (with the closest field)."""
  from efftx.mixers import MIXERS  # pylint: disable=g-import-not-at-top

  mixer = config.model.mixer
  spec = MIXERS.get(mixer)
  if parent == "config.mixer" and spec:
    return f"mixer '{mixer}' has no option '{part}'; its options: {spec.describe()}"
  if parent == "config.model" and spec and any(part in s.options for s in MIXERS.values()):
    where = f"config.mixer.{part}" if part in spec.options else f"not an option of mixer '{mixer}'"
    return f"'{part}' is a mixer option ({where}); mixer '{mixer}' has options: {spec.describe()}"
  guess = difflib.get_close_matches(part, list(node.keys()), n=1)
  hint = f" (did you mean '{guess[0]}'?)" if guess else ""
  return f"{parent} has no field '{part}'{hint}; fields of {parent}: {', '.join(sorted(node.keys()))}"


def raised_by(path: str, what: str, error: Exception) -> str | None:
  """What a config file's error says, in one line: a UserError's message as it is; a syntax error; or an error
  raised while `what` (loading the file, get_config) ran — by the file's own code or by a library it called
  (ml_collections on a mistyped section, ...) — with its type, message and the file's innermost line in the
  traceback. None for an error that efftx's own code raised and that is not a UserError: a bug, whose traceback
  is kept."""
  if isinstance(error, UserError):
    return _first_line(error)
  if isinstance(error, SyntaxError):  # the file (or a module it imports) does not parse
    return f"{type(error).__name__}: {error.msg} ({error.filename}, line {error.lineno})"
  frames = traceback.extract_tb(error.__traceback__)
  package = os.path.dirname(os.path.realpath(__file__)) + os.sep
  if frames and os.path.realpath(frames[-1].filename).startswith(package):
    return None
  lines = [f.lineno for f in frames if os.path.realpath(f.filename) == os.path.realpath(path)]
  where = f" ({path}, line {lines[-1]})" if lines else ""
  return f"{what} raised {type(error).__name__}: {_first_line(error)}{where}"


def _first_line(error: Exception) -> str:
  """The error's message as one line: its message argument without repr quotes (KeyError, ml_collections'
  AttributeError), the first line, or its lines joined where the first is only a quoted name."""
  while len(error.args) == 1 and isinstance(error.args[0], Exception):  # AttributeError(KeyError(...))
    error = error.args[0]
  text = error.args[0] if len(error.args) == 1 and isinstance(error.args[0], str) else str(error)
  lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
  if not lines:
    return type(error).__name__
  return "; ".join(lines) if len(lines[0]) < 24 and len(lines) > 1 else lines[0]


def default_config_file() -> str | None:
  """The quickstart config's path, or None where there is none: the configs/ of the source tree efftx was imported
  from (the folder holding efftx/ and a pyproject.toml naming it), so that a second checkout or worktree uses its
  own configs rather than the installed one's; else the installed package efftx.configs (pyproject.toml maps
  configs/ to it)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  beside = os.path.join(root, "configs", "quickstart.py")
  if os.path.isfile(beside) and _names_efftx(os.path.join(root, "pyproject.toml")):
    return beside
  try:
    spec = importlib.util.find_spec("efftx.configs.quickstart")
  except ModuleNotFoundError:  # efftx imported from a tree that is not the installed one, and has no configs/
    spec = None
  return spec.origin if spec is not None and spec.origin is not None else None


NO_DEFAULT_CONFIG = (
  "no --config given, and no default: efftx.configs is not installed and no configs/ is beside "
  "the efftx package; pass --config=PATH/TO/configs/quickstart.py"
)


def _names_efftx(pyproject: str) -> bool:
  try:
    with open(pyproject, encoding="utf-8") as f:
      return any(line.replace(" ", "") == 'name="efftx"' for line in f.read().splitlines())
  except OSError:
    return False


def quiet_library_logs() -> None:
  """Orbax logs every step of every save and restore at INFO (and warns that a manager opened read-only to read a
  run's parameters is read-only), TFDS every dataset it opens (and that a dataset not yet prepared has no
  dataset_info.json), JAX each backend it probes and does not find (libtpu on a machine without a TPU): keep the
  entry points' own lines readable."""
  from absl import logging  # pylint: disable=g-import-not-at-top

  logging.get_absl_handler().addFilter(keep_log_record)


def keep_log_record(record) -> bool:
  """Whether quiet_library_logs lets a log record through."""
  path, message = record.pathname.replace(os.sep, "/"), record.getMessage()
  if path.endswith("/jax/_src/xla_bridge.py"):
    return record.levelno >= 30
  if any(f"/{lib}/" in path for lib in ("orbax", "tensorflow_datasets")):
    return (
      record.levelno >= 30
      and "read only" not in message.replace("_", " ")
      and "has no dataset_info.json" not in message
    )
  return True


def exit_with(prog: str, message: str) -> None:
  print(f"{prog}: error: {message}", file=sys.stderr)
  sys.exit(2)


def start_program(prog: str, argv: list[str], workdir: str | None, workdir_help: str) -> None:
  """What every entry point does first: quiet the libraries' logs, refuse stray arguments, require --workdir."""
  quiet_library_logs()
  if len(argv) > 1:
    exit_with(prog, f"unexpected arguments: {' '.join(argv[1:])}")
  if not workdir:
    exit_with(prog, f"--workdir is required ({workdir_help})")


@contextlib.contextmanager
def one_line_errors(prog: str):
  """A UserError inside becomes one line on stderr and exit code 2; anything else is a bug and keeps its
  traceback."""
  try:
    yield
  except UserError as e:
    exit_with(prog, str(e))
