"""efftx.sweep: the grid, skip / resume / retry of points, a failing point, aggregation, the report, each
launcher's dry run, and the SLURM path through submitit's local executor."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO
from conftest import run_in_process
from efftx.errors import UserError
from efftx.sweep import launchers
from efftx.sweep import points as points_lib
from efftx.sweep import records as records_lib
from efftx.sweep import report
from efftx.sweep import study as study_lib


def _sweep_file(tmp_path, data_dir, groups: dict, extra: str = "") -> str:
  path = tmp_path / "study" / "sweep.py"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(f'''"""A test study."""
from efftx.sweep import grid
CONFIG = "configs/quickstart.py"
METRIC = "eval_accuracy"
GOAL = "max"

def points(scale):
  groups = {groups!r}
  for spec in groups.values():
    spec["overrides"] = {{**spec.get("overrides", {{}}), "data.data_dir": {str(data_dir)!r}}}
  return grid(groups)
{extra}''')
  return str(path)


def _sweep(*args, process=False):
  """`python -m efftx.sweep ARGS`, run in this process (its points still run as processes of their own), or as a
  process of its own where its launcher's threads outlive the run (submitit's local executor writes to stderr
  after the captured stream is closed)."""
  if process:
    return subprocess.run(
      [sys.executable, "-m", "efftx.sweep", *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=600
    )
  code, stdout, stderr = run_in_process("efftx.sweep", [str(a) for a in args])
  return subprocess.CompletedProcess(["efftx.sweep", *args], code, stdout, stderr)


def test_grid_names_and_commands():
  points = study_lib.grid(
    {"aft_local s=8": {"arg": "mixer=aft_local", "overrides": {"mixer.window": 8}}},
    seeds=(0, 1),
    learning_rates=(1e-3, 3e-4),
  )
  assert [p.name for p in points] == [
    "aft_local_s=8-lr0.001-seed0",
    "aft_local_s=8-lr0.001-seed1",
    "aft_local_s=8-lr0.0003-seed0",
    "aft_local_s=8-lr0.0003-seed1",
  ]
  assert points[3].command("configs/lm_bytes.py", "/w/x", python="python") == [
    "python",
    "-m",
    "efftx.train",
    "--config=configs/lm_bytes.py:mixer=aft_local",
    "--config.mixer.window=8",
    "--config.seed=1",
    "--config.optim.learning_rate=0.0003",
    "--workdir=/w/x",
  ]


def test_the_readme_lists_every_name_the_loader_reads_once():
  """efftx/sweep/README.md's table of a sweep file's names is the loader's NAMES, each once; its table of Plot's
  fields is Plot's."""
  text = open(os.path.join(REPO, "efftx", "sweep", "README.md")).read()
  names_section, plot_section = text.split("## A sweep file's names")[1].split("\n## ")[0].split("`Plot` fields")

  def listed(section):
    return [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]

  assert sorted(listed(names_section)) == sorted(study_lib.NAMES) and len(set(listed(names_section))) == len(
    listed(names_section)
  )
  assert listed(plot_section) == [f.name for f in dataclasses.fields(study_lib.Plot)]


def test_a_bench_points_list_flag_is_comma_joined():
  point = study_lib.grid({"fnet": {"bench": {"mixers": "fnet", "lengths": [256, 1024]}}})[0]
  assert point.flags("") == ["--mixers=fnet", "--lengths=256,1024"]


def test_a_group_may_start_from_its_own_config_file(tmp_path, data_dir):
  path = _sweep_file(
    tmp_path, data_dir, {"listops": {"arg": "smoke"}, "bytes": {"arg": "smoke", "config": "configs/lm_bytes.py"}}
  )
  study = study_lib.load(path)
  commands = launchers._commands(study, "/w", launchers.Launch())  # pylint: disable=protected-access
  assert commands["listops-seed0"][3] == "--config=configs/quickstart.py:smoke"  # relative to the checkout
  assert commands["bytes-seed0"][3] == "--config=configs/lm_bytes.py:smoke"


def test_aggregate_mean_std_over_seeds_and_best_learning_rate():
  """Every seed at every rate (a full grid): the best rate is chosen on those seeds, and since every seed took
  part in the choice none is left to judge it (n = 0, the row's values None; "search" keeps them). After a search
  on seed 0 (best_then_seeds), the row is the fresh seeds' at the rate the search chose."""
  rng = np.random.default_rng(0)
  values = rng.normal(size=(2, 3, 3))  # group × learning rate × seed
  points = [
    {"group": f"g{g}", "learning_rate": lr, "seed": s, "state": "done", "value": float(values[g, i, s])}
    for g in range(2)
    for i, lr in enumerate((1e-3, 3e-4, 1e-4))
    for s in range(3)
  ]
  points[0]["state"] = "failed"  # g0, lr 1e-3, seed 0: left out
  points[1]["value"] = float("nan")  # g0, lr 1e-3, seed 1: diverged, left out
  for goal, pick in (("max", np.argmax), ("min", np.argmin)):
    rows = report.aggregate(points, goal)
    for g, row in enumerate(rows):
      kept = [values[g, i, :] if (g, i) != (0, 0) else values[0, 0, 2:] for i in range(3)]
      # Only rates with the most finished seeds compete: g0's 1e-3 lost two of its three (failed, diverged).
      means = [k.mean() if len(k) == 3 else (np.inf if goal == "min" else -np.inf) for k in kept]
      best = int(pick(means))
      assert row["group"] == f"g{g}" and row["learning_rate"] == (1e-3, 3e-4, 1e-4)[best]
      assert row["by_learning_rate"][str((1e-3, 3e-4, 1e-4)[best])] == pytest.approx(means[best])
      assert row["mean"] is None and row["n"] == 0 and row["of"] == 0 and row["seeds"] == {}
      assert row["search"] == {"seeds": [0, 1, 2], "at_best": dict(enumerate(kept[best].tolist()))}
  # A search on seed 0, then seeds 1-3 at its best rate (3e-4): the row is theirs alone.
  searched = [
    {"group": "g", "learning_rate": lr, "seed": 0, "state": "done", "value": v}
    for lr, v in ((1e-3, 0.5), (3e-4, 0.9), (1e-4, 0.7))
  ]
  fresh = [{"group": "g", "learning_rate": 3e-4, "seed": s, "state": "done", "value": 0.6 + 0.1 * s} for s in (1, 2, 3)]
  (row,) = report.aggregate(searched + fresh, "max")
  assert row["learning_rate"] == 3e-4 and row["mean"] == pytest.approx(0.8) and (row["n"], row["of"]) == (3, 3)
  assert sorted(row["seeds"]) == [1, 2, 3] and row["search"] == {"seeds": [0], "at_best": {0: 0.9}}
  assert row["rate_at_edge"] is None  # 3e-4 lies inside the grid 1e-4 … 1e-3
  for rate, edge in ((1e-3, "highest"), (1e-4, "lowest")):
    moved = [{**p, "value": 1.0} if p["learning_rate"] == rate else p for p in searched]
    fresh_there = [{**p, "learning_rate": rate} for p in fresh]
    assert report.aggregate(moved + fresh_there, "max")[0]["rate_at_edge"] == edge
  assert row["ci95"] == pytest.approx([0.8 - 4.303 * 0.1 / np.sqrt(3), 0.8 + 4.303 * 0.1 / np.sqrt(3)])
  # Its convergence check reads the fresh seeds' curves too, not the search seed's at the chosen rate (which moved
  # by +0.4 over the last fifth where the fresh seeds moved by +0.1); the plot still draws all four.
  for p in searched + fresh:
    p["point"] = f"g-lr{p['learning_rate']}-seed{p['seed']}"
  found = {
    p["point"]: [(800, p["value"] - (0.4 if p["seed"] == 0 else 0.1)), (1000, p["value"])] for p in searched + fresh
  }
  drawn = report._with_curves(None, [row], searched + fresh, found, {})
  assert sorted(row["curves"]) == [1, 2, 3] and row["last_fifth_change"] == pytest.approx(0.1)
  assert row["last_fifth_from"] is None  # no rates logged: four fifths of the steps
  assert len(drawn["g"]) == 4
  # With the rates the runs logged (1 to step 500, then 0.5: a sum of 750), four fifths of the sum (600) are
  # applied by step 700, so the change is read from the evaluation at or before it, step 400.
  found = {p["point"]: [(400, p["value"] - 0.3), (800, p["value"] - 0.1), (1000, p["value"])] for p in fresh}
  rates = {p["point"]: [(500, 1.0), (1000, 0.5)] for p in fresh}
  report._with_curves(None, [row], searched + fresh, found, rates)
  assert row["last_fifth_from"] == pytest.approx(700.0) and row["last_fifth_change"] == pytest.approx(0.3)
  # Seeds whose logs put the mark at different steps: the earliest is the row's (seed 3's rates reach four fifths
  # of their sum at step 400). A run not finished (stopped in its warm-up: four fifths of its partial sum come
  # early) is left out of the mark and of the curves the check reads.
  rates[fresh[2]["point"]] = [(500, 1.0), (1000, 0.0)]
  stopped = {**fresh[0], "seed": 4, "state": "unfinished", "point": "g-lr0.0003-seed4"}
  found[stopped["point"]], rates[stopped["point"]] = [(400, 0.1)], [(100, 0.1), (400, 0.4)]
  report._with_curves(None, [row], searched + fresh + [stopped], found, rates)
  assert row["last_fifth_from"] == pytest.approx(400.0) and sorted(row["curves"]) == [1, 2, 3]


def test_report_from_existing_workdirs(tmp_path, data_dir):
  path = _sweep_file(
    tmp_path,
    data_dir,
    {"a": {"arg": "smoke"}, "b": {"arg": "smoke,mixer=fnet"}},
    extra='PAPER = {"a": 0.5}\nSOURCE = "Somebody et al. (2020), Table 1"\n'
    'from efftx.sweep import Plot\nPLOT = Plot(x=("width", {"a": 1, "b": 2}))\n'
    'DESIGN = {"cpu": 1}\n'
    'def claim(rows):\n  return "held" if rows[0]["mean"] > rows[1]["mean"] else "did not hold"\n',
  )
  study = study_lib.load(path)
  workdir = tmp_path / "runs"
  for p, value in zip(study.points, (0.75, 0.25)):  # what two finished runs leave behind
    (workdir / p.name).mkdir(parents=True)
    (workdir / p.name / "config.json").write_text(json.dumps({"total_steps": 10}))
    (workdir / p.name / "metrics.jsonl").write_text(
      "\n".join(
        json.dumps(r)
        for r in ({"step": 5, "eval_accuracy": 0.1}, {"step": 10, "loss": 1.0}, {"step": 10, "eval_accuracy": value})
      )
      + "\n"
    )
  proc = _sweep(path, f"--workdir={workdir}", "--report", "--publish")
  assert proc.returncode == 0, proc.stderr
  table = (workdir / "report.md").read_text()
  assert "| a | 0.5 | 0.75 | 1/1 |" in table and "| b | — | 0.25 | 1/1 |" in table, table  # one seed: no ±
  assert "**Claim at our scale:** held" in table and "Somebody et al. (2020), Table 1" in table
  assert (workdir / "report.csv").read_text().splitlines()[1:] == ["a,0.5,0.75,0.0,1,1,", "b,,0.25,0.0,1,1,"]
  assert (workdir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  for name in ("table.md", "table.csv", "plot.png", "results.json"):
    assert (tmp_path / "study" / name).read_bytes() == (
      workdir / {"table.md": "report.md", "table.csv": "report.csv", "plot.png": "report.png"}.get(name, name)
    ).read_bytes()


def _finished(folder, steps, value, total=10, outcome=None):
  """What a run leaves behind: its config, metric rows up to `steps` (the last with eval_accuracy=value)."""
  folder.mkdir(parents=True)
  (folder / "config.json").write_text(json.dumps({"total_steps": total, "mixer": {"name": folder.name}}))
  (folder / "metrics.jsonl").write_text(
    "\n".join(
      json.dumps(r)
      for r in (
        {"step": 1, "eval_accuracy": 0.1},
        {"step": steps, "loss": 1.5},
        {"step": steps, "eval_accuracy": value},
      )
    )
  )
  if outcome:
    (folder / points_lib.POINT_FILE).write_text(json.dumps(outcome))


def test_a_point_extended_on_resume_is_done_at_its_new_total_steps_and_its_record_keeps_the_change(tmp_path):
  """A run whose total_steps was raised on resume (config_history.jsonl) is unfinished until it reaches the new
  total; its record holds the config in effect and the change, config.json is left as it was."""
  folder = tmp_path / "a-seed0"
  _finished(folder, 10, 0.5)
  assert points_lib.state(folder) == "done"
  change = {"step": 10, "time": "t", "changes": {"total_steps": [10, 20]}}
  (folder / "config_history.jsonl").write_text(json.dumps(change) + "\n")
  assert points_lib.state(folder) == "unfinished"
  record = records_lib.record(folder, [])
  assert record["config"]["total_steps"] == 20 and record["config_history"] == [change]
  assert json.loads((folder / "config.json").read_text())["total_steps"] == 10


def test_published_records_let_a_new_workdir_skip_finished_points(tmp_path, data_dir):
  path = _sweep_file(
    tmp_path,
    data_dir,
    {
      "a": {"arg": "smoke"},
      "b": {"arg": "smoke,mixer=fnet"},
      "c": {"arg": "smoke,mixer=aft_full"},
      "d": {"arg": "smoke,mixer=linear"},
    },
  )
  study = study_lib.load(path)
  first = tmp_path / "first"
  _finished(
    first / "a-seed0",
    10,
    0.75,
    outcome={"status": "done", "total_seconds": 12.5, "commits": ["abc"], "machine": "a test machine"},
  )
  _finished(first / "b-seed0", 10, 0.25)
  _finished(first / "c-seed0", 10, 0.5)
  _finished(first / "d-seed0", 5, 0.5)  # stopped halfway
  proc = _sweep(path, f"--workdir={first}", "--report", "--publish")
  assert proc.returncode == 0, proc.stderr
  records = tmp_path / "study" / records_lib.RECORDS / "cpu"  # one folder per scale: point names repeat across scales
  assert f"published: 3 points' records in {records}" in proc.stdout
  assert "the report is not published while 1 of 4 points are not done" in proc.stderr
  # a's record names a commit that is not in this checkout's history: its code cannot be checked out again.
  assert "records name commits that this checkout's history lacks or that ran changed code (abc: 1)" in proc.stderr
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
  assert points_lib.outside_history([head, head, "abc", f"{head}+dirty"]) == sorted(["abc", f"{head}+dirty"])
  assert not (tmp_path / "study" / "table.md").exists()  # a partial table does not replace the committed one
  assert sorted(os.listdir(records)) == ["a-seed0.json", "b-seed0.json", "c-seed0.json"]
  a = json.loads((records / "a-seed0.json").read_text())
  assert a["flags"] == study.points[0].flags("configs/quickstart.py") and "--config.seed=0" in a["flags"]
  assert (a["commits"], a["seconds"], a["machine"]) == (["abc"], 12.5, "a test machine")
  assert a["config"] == json.loads((first / "a-seed0" / "config.json").read_text())
  assert a["metrics"] == points_lib.metric_rows(first / "a-seed0")
  assert "Machine: a test machine (1 run); " in proc.stdout  # the others ran here, before outcomes named one
  # A record whose flags changed since (c's, edited by hand) or that cannot make its point done (d's) is not taken.
  (records / "c-seed0.json").write_text(json.dumps({**a, "flags": a["flags"][:-1] + ["--config.seed=7"]}))
  d_flags = study.points[3].flags("configs/quickstart.py")
  (records / "d-seed0.json").write_text(json.dumps({**a, "flags": d_flags, "metrics": a["metrics"][:1]}))

  # Another machine: a fresh workdir, where b has started on its own.
  second = tmp_path / "second"
  _finished(second / "b-seed0", 5, 0.4)
  dry = _sweep(path, f"--workdir={second}", "--dry_run", "--reuse_published")
  assert dry.returncode == 0, dry.stderr
  assert [l.split(":")[0] for l in dry.stdout.splitlines() if "a-seed0" in l] == ["reuse        a-seed0"]
  assert not (second / "a-seed0").exists()  # a dry run writes nothing
  proc = _sweep(path, f"--workdir={second}", "--report", "--reuse_published")
  assert proc.returncode == 0, proc.stderr
  head = points_lib.checkout_commit()[:12]
  assert proc.stdout.splitlines()[:4] == [
    f"reuse        a-seed0: its published record (commit abc; this checkout {head})",
    "not reused   b-seed0: unfinished in the workdir, which goes on with its own run",
    "not reused   c-seed0: its record ran with other flags",
    "not reused   d-seed0: its record is incomplete",
  ]
  assert points_lib.state(second / "a-seed0") == "done"
  assert points_lib.state(second / "c-seed0") == points_lib.state(second / "d-seed0") == "pending"
  assert points_lib.metric_rows(second / "a-seed0") == a["metrics"]
  assert json.loads((second / "a-seed0" / points_lib.POINT_FILE).read_text())["reused_record"] == (
    os.path.relpath(records / "a-seed0.json", REPO)
  )
  assert "| a | — | 0.75 | 1/1 |" in proc.stdout
  assert points_lib.metric_rows(second / "b-seed0")[-1]["eval_accuracy"] == 0.4  # the workdir's own run, untouched


def test_a_bench_record_is_reused_only_on_the_machine_that_measured_it(tmp_path):
  path = _bench_sweep_file(
    tmp_path, {"attention L=32": {"mixers": "attention", "lengths": 32}, "fnet L=32": {"mixers": "fnet", "lengths": 32}}
  )
  study = study_lib.load(path)
  first = tmp_path / "first"
  for p, where in zip(study.points, (points_lib.machine(), "another machine")):
    (first / p.name).mkdir(parents=True)
    (first / p.name / "bench.json").write_text(json.dumps({"rows": [{"temp_mib": 3.0, "argument_mib": 1.0}]}))
    (first / p.name / points_lib.POINT_FILE).write_text(json.dumps({"status": "done", "machine": where}))
  written = records_lib.publish_records(study, str(first), "cpu")
  assert [os.path.basename(w) for w in written] == ["attention_L=32.json", "fnet_L=32.json"]
  second = tmp_path / "second"
  assert records_lib.reuse_records(study, str(second), "cpu") == {
    "attention_L=32": (True, "its published record"),
    "fnet_L=32": (False, "a timing measured on another machine, not this one"),
  }
  assert json.loads((second / "attention_L=32" / "bench.json").read_text()) == {
    "rows": [{"temp_mib": 3.0, "argument_mib": 1.0}]
  }
  assert points_lib.state(second / "attention_L=32") == "done" and points_lib.state(second / "fnet_L=32") == "pending"
  # A report rebuilt from the records measures nothing here: it takes every machine's (the report names each).
  third = tmp_path / "third"
  assert records_lib.reuse_records(study, str(third), "cpu", any_machine=True)["fnet_L=32"] == (
    True,
    "its published record",
  )


def test_a_grown_grid_reuses_the_records_of_its_later_points(tmp_path, data_dir):
  """best_then_seeds: seed 1 at the best rate exists only once the search's records are reused; it is reused too."""
  path = tmp_path / "grown" / "sweep.py"
  path.parent.mkdir()
  path.write_text(f'''"""A test study."""
from efftx.sweep import best_then_seeds
CONFIG = "configs/quickstart.py"
METRIC = "eval_accuracy"
GOAL = "max"

def points(scale, finished):
  return best_then_seeds({{"a": {{"arg": "smoke", "overrides": {{"data.data_dir": {str(data_dir)!r}}}}}}},
                         (1e-3, 1e-2), (0, 1), finished, GOAL)
''')
  first = tmp_path / "first"
  for name, value in (("a-lr0.001-seed0", 0.3), ("a-lr0.01-seed0", 0.6), ("a-lr0.01-seed1", 0.7)):
    _finished(first / name, 10, value)
  assert [p.name for p in study_lib.load(str(path), "cpu", str(first)).points][-1] == "a-lr0.01-seed1"
  proc = _sweep(path, f"--workdir={first}", "--report", "--publish")
  assert proc.returncode == 0 and "published: 3 points' records" in proc.stdout, proc.stderr
  second = tmp_path / "second"
  proc = _sweep(path, f"--workdir={second}", "--report", "--reuse_published")
  assert proc.returncode == 0, proc.stderr
  assert [l.split(":")[0] for l in proc.stdout.splitlines()[:3]] == [
    "reuse        a-lr0.001-seed0",
    "reuse        a-lr0.01-seed0",
    "reuse        a-lr0.01-seed1",
  ]
  assert "| a | — | 0.7 | 1/1 | 0.01 (highest of the grid) |" in proc.stdout, proc.stdout  # seed 1 at seed 0's rate


def test_a_points_outcome_names_the_commit_it_ran():
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
  assert len(head) == 40 and points_lib.checkout_commit().split("+")[0] == head


def _bench_sweep_file(tmp_path, groups: dict) -> str:
  path = tmp_path / "costs" / "sweep.py"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(f'''"""A test cost study."""
from efftx.sweep import Plot
from efftx.sweep import grid
METRIC = "temp_mib"
METRICS = ("argument_mib",)
GOAL = "min"
GROUPS = {groups!r}
PLOT = Plot(x=("length", {{g: f["lengths"] for g, f in GROUPS.items()}}),
            series={{g: f["mixers"] for g, f in GROUPS.items()}})
BASELINE = {{g: "attention L=32" for g in GROUPS}}
PAPER = {{"fnet L=32": {{"argument_mib": 0.5}}}}

def points(scale):
  return grid({{g: {{"bench": f}} for g, f in GROUPS.items()}})
''')
  return str(path)


def test_bench_points_metrics_and_ratios_to_a_baseline(tmp_path):
  groups = {
    "attention L=32": {"mixers": "attention", "lengths": 32},
    "fnet L=32": {"mixers": "fnet", "lengths": 32},
    "fnet L=64": {"mixers": "fnet", "lengths": 64},
    "lsh L=32": {"mixers": "lsh", "lengths": 32},
  }
  path = _bench_sweep_file(tmp_path, groups)
  study = study_lib.load(path)
  assert [p.name for p in study.points] == ["attention_L=32", "fnet_L=32", "fnet_L=64", "lsh_L=32"]  # no seeds
  assert study.points[1].command("", "/w/fnet_L=32", python="python") == [
    "python",
    "-m",
    "efftx.bench",
    "--mixers=fnet",
    "--lengths=32",
    "--json=/w/fnet_L=32/bench.json",
  ]
  workdir = tmp_path / "runs"
  measured = {
    "attention_L=32": (40.0, 8.0),
    "fnet_L=32": (10.0, 2.0),
    "fnet_L=64": (12.0, 3.0),
    "lsh_L=32": (None, 1.0),
  }
  for name, (temp, argument) in measured.items():  # what four bench runs leave behind
    (workdir / name).mkdir(parents=True)
    row = {"argument_mib": argument, **({"temp_mib": temp} if temp is not None else {})}
    (workdir / name / "bench.json").write_text(json.dumps({"rows": [row]}))
  assert all(points_lib.state(workdir / name) == "done" for name in measured)
  proc = _sweep(path, f"--workdir={workdir}", "--report")
  assert proc.returncode == 0, proc.stderr
  table = (workdir / "report.md").read_text()
  # A paper column only for the metric the paper gives.
  assert (
    "| setting | ours: temp_mib ÷ baseline | ours: temp_mib | paper: argument_mib | "
    "ours: argument_mib ÷ baseline | ours: argument_mib | repeats |"
  ) in table, table
  assert "| fnet L=32 | 0.25 | 10 | 0.5 | 0.25 | 2 | 1/1 |" in table, table
  assert "| fnet L=64 | 0.3 | 12 | — | 0.375 | 3 | 1/1 |" in table, table
  assert "Done but without temp_mib in their output (left out): lsh_L=32" in table, table
  assert (workdir / "report.csv").read_text().splitlines()[0] == (
    "setting,paper,mean,std,seeds,runs,best_learning_rate,argument_mib_mean,argument_mib_std,temp_mib_ratio,"
    "argument_mib_ratio"
  )
  assert (workdir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_bench_point_runs_once_and_on_one_tpu_worker(tmp_path):
  tiny = {"mode": "mixers", "lengths": 32, "seconds": 0, "set": "d_model=32,d_ff=64,num_layers=1"}
  path = _bench_sweep_file(
    tmp_path, {"attention L=32": {"mixers": "attention", **tiny}, "fnet L=32": {"mixers": "fnet", **tiny}}
  )
  workdir = tmp_path / "runs"
  proc = _sweep(path, f"--workdir={workdir}")
  assert proc.returncode == 0, proc.stderr
  rows = {
    name: json.loads((workdir / name / "bench.json").read_text())["rows"] for name in ("attention_L=32", "fnet_L=32")
  }
  assert rows["fnet_L=32"][0]["mixer"] == "fnet" and rows["fnet_L=32"][0]["length"] == 32
  ratio = rows["fnet_L=32"][0]["temp_mib"] / rows["attention_L=32"][0]["temp_mib"]
  assert f"| fnet L=32 | {ratio:.3g} |" in (workdir / "report.md").read_text()
  assert "attention" in (workdir / "attention_L=32" / "bench.log").read_text()
  again = _sweep(path, f"--workdir={workdir}", "--dry_run", "--launcher=tpu", "--tpu=s", "--zone=z")
  assert again.returncode == 0, again.stderr
  assert again.stdout.startswith(
    "skip (done)  attention_L=32: gcloud compute tpus tpu-vm ssh s --zone=z --worker=0 "
    "'--command=cd efftx && python3 -m efftx.bench --mixers=attention --mode=mixers"
  )
  assert "--distributed" not in again.stdout


def test_dry_run_prints_each_launchers_commands(tmp_path, data_dir):
  path = _sweep_file(tmp_path, data_dir, {"a": {"arg": "smoke"}})
  workdir = tmp_path / "runs"
  local = _sweep(path, f"--workdir={workdir}", "--dry_run")
  assert local.returncode == 0, local.stderr
  line = local.stdout.splitlines()[0]
  assert line.startswith("run          a-seed0: ") and "-m efftx.train --config=configs/quickstart.py:smoke" in line
  assert f"--workdir={workdir}/a-seed0" in line and not workdir.exists()
  slurm = _sweep(
    path,
    f"--workdir={workdir}",
    "--dry_run",
    "--launcher=slurm",
    "--slurm_partition=gpu",
    "--nodes=2",
    "--gpus_per_node=8",
  )
  assert slurm.returncode == 0, slurm.stderr
  assert "--distributed" in slurm.stdout and "'slurm_partition': 'gpu'" in slurm.stdout
  assert "'gpus_per_node': 8" in slurm.stdout and "'nodes': 2" in slurm.stdout
  tpu = _sweep(
    path, f"--workdir={workdir}", "--dry_run", "--launcher=tpu", "--tpu=my-slice", "--zone=us-central2-b"
  )  # a dry run takes a local workdir too (a real one must be gs://)
  assert tpu.returncode == 0, tpu.stderr
  assert (
    "gcloud compute tpus tpu-vm ssh my-slice --zone=us-central2-b --worker=all '--command=cd efftx && "
    "python3 -m efftx.train --config=configs/quickstart.py:smoke"
  ) in tpu.stdout
  assert f"--workdir={workdir}/a-seed0 --distributed'" in tpu.stdout
  refused = _sweep(path, f"--workdir={workdir}", "--launcher=tpu", "--tpu=my-slice", "--zone=z")
  assert refused.returncode == 2
  assert refused.stderr.strip().splitlines()[-1] == (
    "efftx.sweep: error: --launcher=tpu needs a --workdir every worker and this machine reach: gs://bucket/folder"
  )


@pytest.mark.slow
def test_stop_resume_skip_and_a_failing_point(tmp_path, data_dir):
  long = {"total_steps": 40, "checkpoint_every": 10, "eval_every": 40, "log_every": 5}
  path = _sweep_file(
    tmp_path,
    data_dir,
    {
      "long": {"arg": "smoke", "overrides": long},
      "short": {"arg": "smoke,mixer=fnet", "overrides": {"total_steps": 6}},
      "broken": {"arg": "smoke", "overrides": {"model.d_model": -1}},
    },
  )
  workdir = tmp_path / "runs"
  # Stopped (SIGTERM to the sweep) once the first point has a checkpoint: it saves and stops, nothing else starts.
  first = subprocess.Popen(
    [sys.executable, "-m", "efftx.sweep", path, f"--workdir={workdir}"],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  deadline = time.time() + 180
  while not (workdir / "long-seed0" / "checkpoints" / "10").exists():
    assert first.poll() is None and time.time() < deadline, first.communicate()
    time.sleep(0.05)
  first.send_signal(signal.SIGTERM)
  out, err = first.communicate(timeout=120)
  assert first.returncode == 0, err
  assert "efftx.sweep: stopping" in err and "not finished: long-seed0, short-seed0, broken-seed0" in err
  assert points_lib.state(workdir / "long-seed0") == "unfinished" and not (workdir / "short-seed0").exists()

  again = _sweep(path, f"--workdir={workdir}", "--parallel=2")
  assert again.returncode == 1, again.stderr  # a point failed
  command = f"{sys.executable} -m efftx.train --config=configs/quickstart.py:smoke"
  assert again.stdout.splitlines()[:3] == [
    f"resume       long-seed0: {command} --config.total_steps=40 --config.checkpoint_every=10 "
    f"--config.eval_every=40 --config.log_every=5 --config.data.data_dir={data_dir} --config.seed=0 "
    f"--workdir={workdir}/long-seed0",
    f"run          short-seed0: {command},mixer=fnet --config.total_steps=6 --config.data.data_dir={data_dir} "
    f"--config.seed=0 --workdir={workdir}/short-seed0",
    f"run          broken-seed0: {command} --config.model.d_model=-1 --config.data.data_dir={data_dir} "
    f"--config.seed=0 --workdir={workdir}/broken-seed0",
  ]
  assert (
    "failed       broken-seed0: efftx.train: error: config.model.d_model=-1 must be a positive integer" in again.stderr
  )
  assert "sweep: 2 done, 0 running, 1 failed, 0 pending" in again.stderr
  assert "not finished: broken-seed0" in again.stderr
  long_log = (workdir / "long-seed0" / "train.log").read_text()
  assert long_log.count("$ ") == 2 and "resuming from" in long_log
  assert long_log.splitlines()[0] == "$ " + again.stdout.splitlines()[0].split(": ", 1)[1]  # the printed command
  train_steps = [
    json.loads(l)["step"]
    for l in (workdir / "long-seed0" / "metrics.jsonl").read_text().splitlines()
    if "loss" in json.loads(l)
  ]
  assert train_steps == sorted(set(train_steps)) and train_steps[-1] == 40  # every logged step once
  assert "| long | — |" in again.stdout and "| broken | — | — | 0/1 |" in again.stdout

  # Run again, the done points are skipped and the failed one retried: what the dry run lists is what runs (the
  # points not done, launchers.run).
  third = _sweep(path, f"--workdir={workdir}", "--dry_run")
  assert third.returncode == 0, third.stderr
  assert [l.split(":")[0].strip() for l in third.stdout.splitlines()[:3]] == [
    "skip (done)  long-seed0",
    "skip (done)  short-seed0",
    "retry        broken-seed0",
  ]


def test_points_to_retry_are_pending_in_the_status_line_not_failed(tmp_path, data_dir, monkeypatch, capsys):
  """A resumed sweep whose earlier attempt failed at two points: they wait as pending (and count in the ETA), and
  "failed" counts only this run's failures."""
  path = _sweep_file(tmp_path, data_dir, {g: {"arg": "smoke"} for g in ("a", "b", "c")})
  workdir = tmp_path / "runs"
  for name in ("a-seed0", "b-seed0"):
    (workdir / name).mkdir(parents=True)
    (workdir / name / points_lib.POINT_FILE).write_text(json.dumps({"status": "failed", "error": "killed"}))
  outcomes = {"a-seed0": "done", "b-seed0": "failed", "c-seed0": "done"}
  monkeypatch.setattr(
    launchers,
    "run_point",
    lambda command, folder: {"status": outcomes[os.path.basename(folder)], "error": "again", "seconds": 1.0},
  )
  states = launchers.run(study_lib.load(path, workdir=str(workdir)), str(workdir), launchers.Launch())
  lines = [l.split(";")[0].split(" (")[0] for l in capsys.readouterr().err.splitlines() if l.startswith("sweep:")]
  assert lines[:2] == ["sweep: 0 done, 1 running, 0 failed, 2 pending", "sweep: 1 done, 0 running, 0 failed, 2 pending"]
  assert lines[-1] == "sweep: 2 done, 0 running, 1 failed, 0 pending"
  assert states == {"a-seed0": "done", "b-seed0": "failed", "c-seed0": "done"}


@pytest.mark.slow
def test_slurm_launcher_through_submitits_local_executor(tmp_path, data_dir):
  path = _sweep_file(tmp_path, data_dir, {"fnet": {"arg": "smoke,mixer=fnet", "overrides": {"total_steps": 2}}})
  workdir = tmp_path / "runs"
  proc = _sweep(path, f"--workdir={workdir}", "--launcher=slurm", "--submitit_cluster=local", process=True)
  assert proc.returncode == 0, proc.stderr
  assert "submitted    fnet-seed0: job " in proc.stdout
  assert points_lib.state(workdir / "fnet-seed0") == "done"
  assert os.listdir(workdir / "submitit")  # submitit's own job folder and logs
  outcome = json.loads((workdir / "fnet-seed0" / points_lib.POINT_FILE).read_text())
  assert outcome["status"] == "done" and outcome["returncode"] == 0


def test_a_point_stopped_by_a_signal_is_resumable_and_one_killed_is_failed(tmp_path):
  die = "import os, signal, sys; print('starting'); sys.stdout.flush(); os.kill(os.getpid(), signal.{})"
  stopped = launchers.run_point([sys.executable, "-c", die.format("SIGTERM")], str(tmp_path / "a"))
  assert stopped["status"] == "stopped" and points_lib.state(tmp_path / "a") == "pending"
  killed = launchers.run_point([sys.executable, "-c", die.format("SIGKILL")], str(tmp_path / "b"))
  assert killed["status"] == "failed" and killed["error"] == "killed by SIGKILL; its last output: starting"
  silent = launchers.run_point(
    [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], str(tmp_path / "c")
  )
  assert silent["error"] == "killed by SIGKILL" and points_lib.state(tmp_path / "c") == "failed"
  outcome = json.loads((tmp_path / "c" / points_lib.POINT_FILE).read_text())
  assert outcome["commits"] == [points_lib.checkout_commit()] and outcome["machine"] == points_lib.machine()


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_every_committed_study_builds_a_valid_config_for_every_point(scale):
  """experiments/*/sweep.py at both scales: every training point's config file, argument and overrides give a
  config that efftx.train accepts (a renamed option or a bad value fails here, not hours into a sweep)."""
  import glob  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top

  from efftx import config as config_lib  # pylint: disable=g-import-not-at-top

  paths = sorted(glob.glob(os.path.join(REPO, "experiments", "*", "sweep.py")))
  assert len(paths) >= 6  # one per study
  checked = 0
  for path in paths:
    study = study_lib.load(path, scale)
    for point in study.points:
      if point.program != "train":
        continue
      get_config = runpy.run_path(os.path.join(REPO, point.config or study.config))["get_config"]
      config = get_config(*([point.arg] if point.arg else []))
      config.update_from_flattened_dict(
        {
          **dict(point.overrides),
          "seed": point.seed,
          **({"optim.learning_rate": point.learning_rate} if point.learning_rate is not None else {}),
        }
      )
      config_lib.validate(config, num_devices=1)
      checked += 1
  assert checked > 100


def test_the_dry_run_counts_the_whole_grid_and_estimates_the_time_left(tmp_path):
  """A dry run's last line: the points by what a run would do, an adaptive grid's later points (mqar's learning-rate
  search: 24 now, 22 once the searches finish, as its published study has 46), and the time left at the mean of
  the points done so far (their records' total_seconds), `parallel` at a time."""
  proc = _sweep(os.path.join(REPO, "experiments", "mqar", "sweep.py"), f"--workdir={tmp_path / 'mqar'}", "--dry_run")
  assert proc.returncode == 0, proc.stderr
  assert (
    proc.stdout.splitlines()[-1] == "grid: 24 points: 0 done, 24 to run; 22 more once their searches finish (46 in all)"
  )
  for name, seconds in (("a", 100.0), ("b", 300.0)):
    (tmp_path / name).mkdir()
    (tmp_path / name / points_lib.POINT_FILE).write_text(json.dumps({"status": "done", "total_seconds": seconds}))
  verbs = {"a": "skip (done)", "b": "skip (done)", "c": "run", "d": "resume", "e": "retry", "f": "run"}
  assert launchers.grid_summary(str(tmp_path), verbs, parallel=2, later=2) == (
    "grid: 6 points: 2 done, 4 to run (1 to resume, 1 to retry); 2 more once their searches finish (8 in all); "
    "about 0:10:00 left at 2 at a time (the 2 done points' mean, 0:03:20)"
  )


def test_a_points_half_written_last_row_is_left_out_and_a_bad_row_named(tmp_path):
  """The sweep reads a point's metrics.jsonl as train and the plot command do (efftx.metrics_file): a last line
  half written by a running or killed run is left out; any other line that is not a row is one clear error."""
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
  assert points_lib.metric_rows(tmp_path) == [{"step": 1, "loss": 2.0}]
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\nnot json\n{"step": 2}\n')
  with pytest.raises(UserError, match="metrics.jsonl, line 2, cannot be read"):
    points_lib.metric_rows(tmp_path)


def test_a_stopped_adaptive_sweep_does_not_grow_its_grid(tmp_path, data_dir):
  """best_then_seeds: a SIGTERM that stops the wave stops the sweep, even where a group's search finished in that
  wave (its fresh seeds are not started; the same command starts them later)."""
  path = tmp_path / "adaptive" / "sweep.py"
  path.parent.mkdir()
  data = str(data_dir)
  path.write_text(f'''"""A test study."""
from efftx.sweep import best_then_seeds
CONFIG = "configs/quickstart.py"
METRIC = "eval_accuracy"
GOAL = "max"

def points(scale, finished):
  quick = {{"total_steps": 4, "eval_every": 4, "data.data_dir": {data!r}}}
  slow = {{"total_steps": 400, "checkpoint_every": 5, "eval_every": 400, "data.data_dir": {data!r}}}
  return best_then_seeds({{"a": {{"arg": "smoke", "overrides": quick}}, "b": {{"arg": "smoke", "overrides": slow}}}},
                         (1e-3, 1e-2), (0, 1), finished, GOAL)
''')
  workdir = tmp_path / "runs"
  proc = subprocess.Popen(
    [sys.executable, "-m", "efftx.sweep", str(path), f"--workdir={workdir}", "--parallel=1"],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  deadline = time.time() + 300
  while not (workdir / "b-lr0.001-seed0" / "checkpoints" / "5").exists():
    assert proc.poll() is None and time.time() < deadline, proc.communicate()
    time.sleep(0.05)
  assert all(points_lib.state(workdir / f"a-lr{lr}-seed0") == "done" for lr in ("0.001", "0.01"))
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err
  assert "efftx.sweep: stopping" in err and "more points now that their search finished" not in err, err
  assert not list(workdir.glob("a-*-seed1")) and not (workdir / "b-lr0.01-seed0").exists()
