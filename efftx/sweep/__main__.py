"""The command line: flags → load the sweep file → run its points → write the report (and publish it).

`--help` prints the package's docstring, which points to efftx/sweep/README.md (the sweep file's names)."""

from __future__ import annotations

import os
import shlex
import sys

from absl import app
from absl import flags
from etils import epath

from efftx import cli
from efftx import run_files
from efftx import sweep
from efftx.errors import UserError
from efftx.sweep.launchers import LAUNCHERS
from efftx.sweep.launchers import Launch
from efftx.sweep.launchers import run
from efftx.sweep.points import REPO
from efftx.sweep.points import state
from efftx.sweep.records import publish_records
from efftx.sweep.records import reuse_records
from efftx.sweep.records import unreproducible
from efftx.sweep.report import publish
from efftx.sweep.report import report
from efftx.sweep.study import load


def _define_flags() -> None:
  global _WORKDIR, _SCALE, _PARALLEL, _LAUNCHER, _DRY_RUN, _REPORT, _PUBLISH, _TPU, _ZONE, _REMOTE_DIR
  global _SLURM_PARTITION, _NODES, _GPUS_PER_NODE, _TIMEOUT_MIN, _SUBMITIT_CLUSTER, _REUSE_PUBLISHED
  _WORKDIR = flags.DEFINE_string("workdir", None, "The sweep's folder: one workdir per point, the report.")
  _SCALE = flags.DEFINE_enum("scale", "cpu", ["cpu", "paper"], "The grid: reduced (cpu) or the paper's.")
  _PARALLEL = flags.DEFINE_integer("parallel", 1, "Points at a time (launcher local).", lower_bound=1)
  _LAUNCHER = flags.DEFINE_enum("launcher", "local", LAUNCHERS, "Where points run.")
  _DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print each point's state and command; run nothing.")
  _REPORT = flags.DEFINE_bool("report", False, "Only write the report from the points' workdirs.")
  _PUBLISH = flags.DEFINE_bool(
    "publish",
    False,
    "Copy the report next to the sweep file (once every point is done) "
    "and each finished point's record into its runs/ folder.",
  )
  _REUSE_PUBLISHED = flags.DEFINE_bool(
    "reuse_published",
    False,
    "Points not started in --workdir whose published "
    "record (runs/ beside the sweep file) ran with the same flags count as done.",
  )
  _TPU = flags.DEFINE_string("tpu", "", "launcher tpu: the TPU VM slice's name.")
  _ZONE = flags.DEFINE_string("zone", "", "launcher tpu: its zone.")
  _REMOTE_DIR = flags.DEFINE_string("remote_dir", "efftx", "launcher tpu: the efftx checkout on the workers.")
  _SLURM_PARTITION = flags.DEFINE_string("slurm_partition", "", "launcher slurm: the partition.")
  _NODES = flags.DEFINE_integer("nodes", 1, "launcher slurm: nodes per point (one process per node).")
  _GPUS_PER_NODE = flags.DEFINE_integer("gpus_per_node", 0, "launcher slurm: GPUs per node.")
  _TIMEOUT_MIN = flags.DEFINE_integer("timeout_min", 24 * 60, "launcher slurm: a point's time limit (minutes).")
  _SUBMITIT_CLUSTER = flags.DEFINE_enum(
    "submitit_cluster",
    "slurm",
    ["slurm", "local"],
    "launcher slurm: submitit's executor (local: on this machine, for tests).",
  )


def main(argv: list[str]) -> None:
  if len(argv) != 2:
    cli.exit_with(
      "efftx.sweep", "give one sweep file: python -m efftx.sweep experiments/<study>/sweep.py --workdir=DIR"
    )
  if not _WORKDIR.value:
    cli.exit_with("efftx.sweep", "--workdir is required: the folder for the points' runs and the report")
  with cli.one_line_errors("efftx.sweep"):
    workdir = os.fspath(run_files.run_folder(_WORKDIR.value))  # as efftx.train reads each point's --workdir
    study = load(argv[1], _SCALE.value, workdir)
    launch = Launch(
      _LAUNCHER.value,
      _PARALLEL.value,
      tpu=_TPU.value,
      zone=_ZONE.value,
      remote_dir=_REMOTE_DIR.value,
      submitit_cluster=_SUBMITIT_CLUSTER.value,
    )
    if launch.launcher == "tpu" and not (launch.tpu and launch.zone):
      raise UserError("--launcher=tpu needs --tpu=<slice name> and --zone=<zone>")
    if launch.launcher == "tpu" and not workdir.startswith("gs://") and not _DRY_RUN.value:
      raise UserError("--launcher=tpu needs a --workdir every worker and this machine reach: gs://bucket/folder")
    if launch.launcher == "slurm":
      launch.slurm = {"timeout_min": _TIMEOUT_MIN.value, "nodes": _NODES.value, "tasks_per_node": 1}
      if _SLURM_PARTITION.value:
        launch.slurm["slurm_partition"] = _SLURM_PARTITION.value
      if _GPUS_PER_NODE.value:
        launch.slurm["gpus_per_node"] = _GPUS_PER_NODE.value
      if launch.submitit_cluster == "local":
        launch.slurm = {"timeout_min": _TIMEOUT_MIN.value}
    command = shlex.join(
      ["python", "-m", "efftx.sweep", os.path.relpath(os.path.abspath(argv[1]), REPO)]
      + ([f"--scale={_SCALE.value}"] if _SCALE.value != "cpu" else [])
      + ["--workdir=DIR"]
    )
    reused = set()
    if _REUSE_PUBLISHED.value:
      study, reused = _reuse(study, argv[1], workdir)
    if not _REPORT.value:
      # An adaptive grid's later points (the seeds after a search), counted in the summary line.
      later = (
        len(load(argv[1], _SCALE.value, every_point_done=True).points) - len(study.points) if study.adaptive else 0
      )
      states = run(study, workdir, launch, dry_run=_DRY_RUN.value, reused=reused, later=later)
      while not _DRY_RUN.value and study.adaptive:  # a grid that grows as its points finish (best_then_seeds)
        if any(s in ("unfinished", "pending") for s in states.values()):
          break  # stopped by a signal: the grid does not grow, and the same command goes on later
        grown = _grown(study, argv[1], workdir)
        if grown is None:
          break
        print(
          f"efftx.sweep: {len(grown.points) - len(study.points)} more points now that their search finished",
          file=sys.stderr,
          flush=True,
        )
        study = _reuse(grown, argv[1], workdir)[0] if _REUSE_PUBLISHED.value else grown
        later = len(load(argv[1], _SCALE.value, every_point_done=True).points) - len(study.points)
        states = run(study, workdir, launch, later=later)
      if _DRY_RUN.value:
        return
      unfinished = [n for n, s in states.items() if s != "done"]
      if unfinished:
        print(f"efftx.sweep: not finished: {', '.join(unfinished)}", file=sys.stderr)
    paths = report(study, workdir, _SCALE.value, command)
    print(epath.Path(paths["md"]).read_text())
    print(f"report: {', '.join(paths.values())}")
    if _PUBLISH.value:
      records = publish_records(study, workdir, _SCALE.value)
      print(f"published: {len(records)} points' records in {os.path.dirname(records[0]) if records else '—'}")
      if lacking := unreproducible(records):
        print(
          f"efftx.sweep: records name commits that this checkout's history lacks or that ran changed code "
          f"({', '.join(f'{c[:12]}: {n}' for c, n in lacking.items())}): their code cannot be checked out again; "
          "rerun those points from a landed commit, or say so in the study's README",
          file=sys.stderr,
        )
      unfinished = [p.name for p in study.points if state(epath.Path(workdir) / p.name) != "done"]
      if unfinished:
        print(
          f"efftx.sweep: the report is not published while {len(unfinished)} of {len(study.points)} points are "
          "not done (the committed one stays)",
          file=sys.stderr,
        )
      else:
        print(f"published: {', '.join(publish(study, paths))}")
  if not _REPORT.value and not _DRY_RUN.value and "failed" in states.values():
    sys.exit(1)  # after the report: a script running the sweep learns that a point failed


def _reuse(study, path: str, workdir: str):
  """Takes the published records of points not started in workdir (reuse_records), printing each once; an
  adaptive grid is loaded again while reused points grow it. Returns the study and the points reused (with
  --dry_run, those that would be: the dry run prints them as "reuse", and cannot show what they would grow)."""
  reported, reused = set(), set()
  while True:
    taken_here = reuse_records(study, workdir, _SCALE.value, dry_run=_DRY_RUN.value, any_machine=_REPORT.value)
    for name, (taken, why) in taken_here.items():
      if taken:
        reused.add(name)
      if name not in reported and not (taken and _DRY_RUN.value):
        print(f"{'reuse' if taken else 'not reused':12s} {name}: {why}", flush=True)
      reported.add(name)
    grown = None if _DRY_RUN.value else _grown(study, path, workdir)
    if grown is None:
      return study, reused
    study = grown


def _grown(study, path: str, workdir: str):
  """An adaptive grid loaded again from what is done in workdir, if it has grown; else None."""
  if not study.adaptive:
    return None
  grown = load(path, _SCALE.value, workdir)
  return None if {p.name for p in grown.points} <= {p.name for p in study.points} else grown


if __name__ == "__main__":
  __doc__ = sweep.__doc__  # what absl's --help prints
  _define_flags()
  app.run(main)
