"""The report: a study's points aggregated per group (mean, sample std and 95 % interval over seeds, the best
learning rate, ratios to a baseline and the paired difference from it over the same seeds), written as markdown,
CSV, JSON and plots (the metrics; the learning curves), and published into the study's folder."""

from __future__ import annotations

import csv
import dataclasses
import datetime
import inspect
import io
import json
import math
import os
from typing import Any

from etils import epath

from efftx import plot
from efftx.sweep import stats
from efftx.sweep.points import POINT_FILE
from efftx.sweep.points import final_value
from efftx.sweep.points import machine
from efftx.sweep.points import metric_rows
from efftx.sweep.points import read_json
from efftx.sweep.points import state
from efftx.sweep.study import Panel
from efftx.sweep.study import Study


def collect(study: Study, workdir: str) -> list[dict]:
  """One row per point: group, seed, learning rate, state, the last logged value of its metric ("value") and of
  each of study.metrics ("values"), and its seconds."""
  rows = []
  for p in study.points:
    folder = epath.Path(workdir) / p.name
    logged = metric_rows(folder)
    last = {m: final_value(folder, m, logged) for m in (study.metric, *study.metrics)}
    outcome = read_json(folder / POINT_FILE) or {}
    rows.append(
      {
        "point": p.name,
        "group": p.group,
        "seed": p.seed,
        "learning_rate": p.learning_rate,
        "state": state(folder),
        "value": last[study.metric],
        "values": {m: last[m] for m in study.metrics},
        "seconds": outcome.get("total_seconds"),
        "error": outcome.get("error"),
        "machine": outcome.get("machine"),
      }
    )
  return rows


def curves(study: Study, workdir: str, metrics: tuple[str, ...] = ()) -> dict[str, dict[str, list]]:
  """Each finished or started training point's curves of METRIC and of `metrics` from its metrics.jsonl, read once:
  {metric: {point name: [(step, value), ...]}} in step order (bench points have none)."""
  out = {m: {} for m in (study.metric, *metrics)}
  for p in study.points:
    if p.program != "train":
      continue
    logged = metric_rows(epath.Path(workdir) / p.name)
    for metric, found in out.items():
      curve = sorted(
        (int(r["step"]), float(r[metric])) for r in logged if metric in r and "step" in r and r[metric] is not None
      )
      if curve:
        found[p.name] = curve
  return out


def _mean_std(values: list[float]) -> tuple[float, float]:
  mean = sum(values) / len(values)
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0


def aggregate(
  points: list[dict],
  goal: str,
  groups: list[str] | None = None,
  metrics: tuple[str, ...] = (),
) -> list[dict]:
  """Per group: for each learning rate the mean and sample std of the finished seeds' values; the group's row is
  the learning rate with the best mean ("min" or "max" by goal) among those with the most finished seeds (after
  study.best_then_seeds' search, the chosen rate), with the 95 % interval of its mean ("ci95", None
  with one seed) and its seeds' values ("seeds": {seed: {"value": ..., metric: ...}}). Groups in the order given
  (default: first seen). Each of `metrics` (points' "values") is aggregated over the same runs, into the row's
  "metrics"; "seconds" is the run time of every finished run of the group, searched rates included.

  Selection apart from judgement: where seeds of a group ran more than one learning rate (a search), the rate is
  chosen on those seeds alone ("by_learning_rate": their means), and the row's values, interval and "seeds" are
  the other seeds' at that rate (fresh seeds; none yet: n = 0). "search" keeps the search seeds and their values
  at the chosen rate ({"seeds": [...], "at_best": {seed: value}}); None where nothing was searched. "rate_at_edge"
  is "lowest" or "highest" where the chosen rate is the grid's lowest or highest of several (the best rate may lie
  beyond the grid), else None."""
  order = groups or list(dict.fromkeys(p["group"] for p in points))
  out = []
  for group in order:
    rates_of: dict[Any, set] = {}
    for p in points:
      if p["group"] == group:
        rates_of.setdefault(p["seed"], set()).add(p["learning_rate"])
    searched = {seed for seed, rates in rates_of.items() if len(rates) > 1}
    by_lr: dict[Any, list[dict]] = {}
    fresh_by_lr: dict[Any, list[dict]] = {}
    for p in points:
      if p["group"] == group and p["state"] == "done" and p["value"] is not None and math.isfinite(p["value"]):
        (by_lr if not searched or p["seed"] in searched else fresh_by_lr).setdefault(p["learning_rate"], []).append(p)
    total = sum(1 for p in points if p["group"] == group and p["seed"] not in searched)
    if not by_lr:
      out.append(
        {
          "group": group,
          "mean": None,
          "std": None,
          "ci95": None,
          "n": 0,
          "of": total,
          "learning_rate": None,
          "by_learning_rate": {},
          "seeds": {},
          "search": {"seeds": sorted(searched), "at_best": {}} if searched else None,
          "rate_at_edge": None,
          "metrics": {m: {"mean": None, "std": None, "ci95": None} for m in metrics},
          "seconds": sum(p.get("seconds") or 0 for p in points if p["group"] == group),
        }
      )
      continue
    means = {lr: _mean_std([p["value"] for p in runs])[0] for lr, runs in by_lr.items()}
    most = max(len(runs) for runs in by_lr.values())  # rates with every seed run (a search's chosen rate) first
    best = (min if goal == "min" else max)((lr for lr in means if len(by_lr[lr]) == most), key=means.get)
    search = None
    planned = {p["learning_rate"] for p in points if p["group"] == group and p["seed"] not in searched}
    if searched and len(planned) == 1 and next(iter(planned)) in by_lr:
      best = next(iter(planned))  # the rate the sweep chose for the fresh seeds (best_then_seeds)
    grid_rates = sorted(lr for lr in {p["learning_rate"] for p in points if p["group"] == group} if lr is not None)
    edge = None
    if len(grid_rates) > 1 and best in (grid_rates[0], grid_rates[-1]):
      edge = "lowest" if best == grid_rates[0] else "highest"
    runs = by_lr[best]
    if searched:
      search = {"seeds": sorted(searched), "at_best": {p["seed"]: p["value"] for p in runs}}
      runs = fresh_by_lr.get(best, [])
    mean, std = _mean_std([p["value"] for p in runs]) if runs else (None, None)
    extra = {}
    for m in metrics:
      values = [p["values"][m] for p in runs if p["values"].get(m) is not None and math.isfinite(p["values"][m])]
      extra[m] = (
        {**dict(zip(("mean", "std"), _mean_std(values))), "ci95": _ci95(values)}
        if values
        else {"mean": None, "std": None, "ci95": None}
      )
    of = sum(  # seeds judged at that rate
      1 for p in points if p["group"] == group and p["learning_rate"] == best and p["seed"] not in searched
    )
    out.append(
      {
        "group": group,
        "mean": mean,
        "std": std,
        "ci95": _ci95([p["value"] for p in runs]),
        "n": len(runs),
        "of": of,
        "learning_rate": best,
        "by_learning_rate": {str(lr): m for lr, m in means.items()},
        "metrics": extra,
        "seeds": {p["seed"]: {"value": p["value"], **p.get("values", {})} for p in runs},
        "search": search,
        "rate_at_edge": edge,
        "seconds": sum(p.get("seconds") or 0 for p in points if p["group"] == group),  # every run of the group
      }
    )
  return out


def _ci95(values: list[float]) -> list[float] | None:
  found = stats.interval(values)
  return None if found is None or found.low is None else [found.low, found.high]


def _with_ratios(study: Study, rows: list[dict]) -> list[dict]:
  """Puts METRIC beside the others in each row's "metrics", and adds "ratio": {metric: its mean ÷ the mean of its
  BASELINE group} (None without a baseline) and "delta": {metric: the paired difference from the baseline over the
  seeds both finished, each at its best learning rate, as stats.Interval.as_dict()} (None without a baseline or
  for the baseline itself)."""
  for r in rows:
    r["metrics"][study.metric] = {"mean": r["mean"], "std": r["std"], "ci95": r["ci95"]}
  by_group = {r["group"]: r for r in rows}
  for r in rows:
    base = by_group.get(study.baseline.get(r["group"], ""))
    r["ratio"], r["delta"], r["ratio_range"] = {}, {}, {}
    for m in (study.metric, *study.metrics):
      key = "value" if m == study.metric else m
      ours, theirs = (r["metrics"][m]["mean"], base["metrics"][m]["mean"]) if base else (None, None)
      r["ratio"][m] = ours / theirs if ours is not None and theirs else None
      pairs = (
        [
          r["seeds"][k][key] / base["seeds"][k][key]
          for k in r.get("seeds", {})
          if base and k in base.get("seeds", {}) and r["seeds"][k].get(key) is not None and base["seeds"][k].get(key)
        ]
        if base
        else []
      )
      if study.measured and len(pairs) > 1:  # repeats: the median of ratios between measurements made close in time
        r["ratio"][m] = stats.median(pairs)
      r["ratio_range"][m] = [min(pairs), max(pairs)] if len(pairs) > 1 else None
      difference = stats.between(r, base, key) if base and base is not r else None
      r["delta"][m] = difference.as_dict() if difference else None
  return rows


def split_counts(study: Study, rows: list[dict]) -> list[dict]:
  """Each row with "solved": {metric: Count.as_dict()} for the metrics the study counts (SOLVED: metric -> the value
  from which a seed solved the task) where its judged seeds split into solved and not: such outcomes are a count
  with its exact (Clopper–Pearson) interval, not a mean with a t-interval. Rows whose seeds all solved, or none
  did, get an empty dict."""
  out = []
  for r in rows:
    found = {}
    for m, threshold in study.solved.items():
      key = "value" if m == study.metric else m
      c = stats.count([v.get(key) for v in r.get("seeds", {}).values()], threshold)
      if c is not None and 0 < c.k < c.n:
        found[m] = c.as_dict()
    out.append({**r, "solved": found})
  return out


def _baseline_split(study: Study, rows: list[dict], row: dict, metric: str) -> bool:
  """Whether row's baseline row has split outcomes in metric (its paired difference is then no t-interval either)."""
  base = study.baseline.get(row["group"])
  return any(r["group"] == base and (r.get("solved") or {}).get(metric) for r in rows)


def _fmt(value: float | None) -> str:
  return "—" if value is None else f"{value:.4g}"


def _columns(study: Study, scale: str) -> list[tuple[str, str, str]]:
  """The table's columns after "setting": (header, kind, metric), kind one of paper (only where the scale's setting
  is the paper's) / ours / ratio / delta (the paired difference, where the study has several seeds)."""
  several = bool(study.metrics) or bool(study.baseline)
  seeded = study.several_seeds and not study.measured  # seeds, not repeats: paired differences
  out = []
  for m in (study.metric, *study.metrics):
    has_paper = study.paper_in_table(scale) and (
      any(study.paper_value(g, m) is not None for g in study.paper) or (m == study.metric and not several)
    )
    if has_paper:
      out.append((f"paper: {m}" if several else "paper", "paper", m))
    if study.baseline:
      repeated = study.several_seeds and study.measured
      # The brackets after a ratio are the range of the per-seed (or per-repeat) ratios, min–max, not an interval.
      label = (
        " (median of paired repeats [min–max])" if repeated else " (of the means [per-seed min–max])" if seeded else ""
      )
      out.append((f"ours: {m} ÷ baseline{label}", "ratio", m))
      if seeded:
        out.append((f"ours: {m} − baseline, paired [95 % CI]", "delta", m))
    interval = " [95 % CI]" if study.several_seeds else ""
    out.append((f"ours: {m}{interval}" if several else f"ours (mean{interval})", "ours", m))
  return out


def search_table(study: Study, rows: list[dict]) -> list[str]:
  """report.md's learning-rate search: per searched group, the search seeds' mean METRIC at the last step at each
  rate of the grid ("—" where that rate has not finished), the chosen rate in bold; [] where nothing was searched.
  These seeds choose the rate and judge nothing."""
  searched = [r for r in rows if r.get("search")]
  if not searched:
    return []
  rates = sorted({p.learning_rate for p in study.points if p.learning_rate is not None})
  seeds = sorted({s for r in searched for s in r["search"]["seeds"]})
  lines = [
    f"**Learning-rate search** ({study.metric} at the last step on search seed{'s' if len(seeds) > 1 else ''} "
    f"{', '.join(map(str, seeds))}{', their mean' if len(seeds) > 1 else ''}; the chosen rate in bold; these seeds "
    "choose the rate and judge nothing):",
    "",
    "| setting | " + " | ".join(f"{lr:g}" for lr in rates) + " |",
    "|---|" + "---:|" * len(rates),
  ]
  for r in searched:
    cells = []
    for lr in rates:
      mean = r["by_learning_rate"].get(str(lr))
      value = "—" if mean is None else f"{mean:#.4g}"
      cells.append(f"**{value}**" if lr == r["learning_rate"] and value != "—" else value)
    lines.append(f"| {r['group']} | " + " | ".join(cells) + " |")
  return [*lines, ""]


def _with_curves(
  study: Study, rows: list[dict], points: list[dict], found: dict[str, list], rates: dict[str, list]
) -> dict[str, list]:
  """Adds to each row "curves" ({seed: [(step, METRIC)]} at its best learning rate, the seeds that judge it: a
  search's seeds and unfinished runs left out, as from its values), "last_fifth_from" (the step from which those
  runs applied the last fifth of their summed learning rate, from the rates they logged: `rates`, {point name:
  [(step, rate)]}; None where none was logged) and "last_fifth_change": the mean over those seeds of METRIC's change
  from that step to the end (None without curves), what a claim's regime check reads. Returns {group: [the curves of
  every seed at that rate]}, what the learning-curve plot draws."""
  by_group = {}
  for r in rows:
    chosen = [
      p for p in points if p["group"] == r["group"] and p["learning_rate"] == r["learning_rate"] and p["point"] in found
    ]
    by_group[r["group"]] = [found[p["point"]] for p in chosen]
    searched = set((r.get("search") or {}).get("seeds", ()))
    judged = [p for p in chosen if p["seed"] not in searched and p.get("state") == "done"]
    r["curves"] = {p["seed"]: found[p["point"]] for p in judged}
    starts = [stats.learning_fraction_step(rates[p["point"]]) for p in judged if rates.get(p["point"])]
    r["last_fifth_from"] = min((s for s in starts if s is not None), default=None)
    changes = [stats.last_fifth_change(c, r["last_fifth_from"]) for c in r["curves"].values()]
    changes = [c for c in changes if c is not None]
    r["last_fifth_change"] = sum(changes) / len(changes) if changes else None
  return by_group


def _claims(study: Study, rows: list[dict], scale: str) -> list:
  """The sweep file's claim(rows, scale) (or claim(rows)) as a list: stats.Claim entries held to the scale's
  DESIGN (stats.fixed_design) and Holm-corrected together (stats.holm), or one line of text."""
  takes_scale = len(inspect.signature(study.claim).parameters) > 1
  found = study.claim(rows, scale) if takes_scale else study.claim(rows)
  if isinstance(found, str):
    return [found]
  found = [found] if isinstance(found, stats.Claim) else list(found)
  return stats.holm(stats.fixed_design(found, study.design[scale]) if scale in study.design else found)


def report(study: Study, workdir: str, scale: str, command: str) -> dict[str, str]:
  """Writes DIR/report.md, report.csv, report.png (the metrics), report_curves.png (the learning curves),
  report_claims.png (each measured claim against its threshold) and results.json; returns their paths."""
  points = collect(study, workdir)
  rows = _with_ratios(
    study, aggregate(points, study.goal, list(dict.fromkeys(p.group for p in study.points)), study.metrics)
  )
  logged = curves(study, workdir, ("learning_rate",))
  group_curves = _with_curves(study, rows, points, logged[study.metric], logged["learning_rate"])
  rows = split_counts(study, rows)
  several_lrs = len({p.learning_rate for p in study.points}) > 1
  seconds = sum(p["seconds"] or 0 for p in points)
  lines = [f"# {study.name}: {study.metric} ({'lower' if study.goal == 'min' else 'higher'} is better)", ""]
  first_paragraph = study.doc.strip().split("\n\n")[0]
  if first_paragraph:
    lines += [" ".join(first_paragraph.split()), ""]
  example = next(((g, b) for g, b in study.baseline.items() if g != b and g in {r["group"] for r in rows}), None)
  if example:
    lines += [f"\"÷ baseline\": each setting divided by its baseline's value (e.g. {example[0]} ÷ {example[1]}).", ""]
  if study.setting:
    lines += [
      "| | setting |",
      "|---|---|",
      f"| paper | {' '.join(study.paper_setting.split())} |",
      f"| ours (scale `{scale}`) | {' '.join(study.setting[scale].split())} |",
      "",
    ]
  if study.protocol.get(scale):
    lines += [f"**Protocol.** {' '.join(study.protocol[scale].split())}", ""]
  columns = _columns(study, scale)
  regime = any(r.get("last_fifth_change") is not None for r in rows)
  header = (
    ["setting", *(c[0] for c in columns), "repeats" if study.measured else "seeds"]
    + (["best learning rate"] if several_lrs else [])
    + ([f"{study.metric} change over the last fifth"] if regime else [])
  )
  lines += ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
  for r in rows:
    cells = [r["group"]]
    for _, kind, m in columns:
      if kind == "paper":
        cells.append(_fmt(study.paper_value(r["group"], m)))
      elif kind == "ratio":
        spread = r.get("ratio_range", {}).get(m)
        cells.append(
          "—"
          if r["ratio"][m] is None
          else f"{r['ratio'][m]:.3g}" + (f" [{spread[0]:.3g}–{spread[1]:.3g}]" if spread else "")
        )
      elif kind == "delta":
        d = r["delta"][m]
        if r["solved"].get(m) or _baseline_split(study, rows, r, m):
          cells.append("— (outcomes split)")
        else:
          cells.append("—" if d is None else stats.Interval(d["mean"], *(d["ci95"] or (None, None)), d["n"]).text(3))
      elif r["solved"].get(m):
        c = r["solved"][m]
        cells.append(
          f"{c['k']} of {c['n']} seeds ≥ {study.solved[m]:g}, rate [{c['ci95'][0]:.2g}, {c['ci95'][1]:.2g}] "
          f"(mean {r['metrics'][m]['mean'] if m != study.metric else r['mean']:.4g})"
        )
      else:
        mean, ci = r["metrics"][m]["mean"], r["metrics"][m]["ci95"]
        cells.append("—" if mean is None else stats.Interval(mean, *(ci or (None, None)), r["n"]).text())
    cells.append(f"{r['n']}/{r['of']}")
    if several_lrs:
      edge = f" ({r['rate_at_edge']} of the grid)" if r.get("rate_at_edge") else ""
      cells.append("—" if r["learning_rate"] is None else f"{r['learning_rate']:g}{edge}")
    if regime:
      cells.append("—" if r.get("last_fifth_change") is None else f"{r['last_fifth_change']:+.3g}")
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  if any(r["solved"] for r in rows):
    lines += [
      "Where a setting's seeds split into solved and not ("
      + ", ".join(f"{m} ≥ {v:g}" for m, v in study.solved.items())
      + "), its cell gives the count with the exact (Clopper–Pearson) 95 % interval of the rate, not a t-interval "
      "on a mean no seed is near" + ("; its paired difference is left out." if study.baseline else "."),
      "",
    ]
  if several_lrs and any(r.get("rate_at_edge") for r in rows):
    lines += [
      "A learning rate marked lowest or highest of the grid is the grid's edge: the best rate may lie beyond it.",
      "",
    ]
  if regime:
    lines += [
      f"The last column is the mean over seeds of {study.metric}'s change over the last fifth of training, counted "
      "in learning rate: from the evaluation at or before the step by which the runs had applied four fifths of "
      f"their summed learning rate ({'falling' if study.goal == 'min' else 'rising'}: still improving).",
      "",
    ]
  lines += search_table(study, rows)
  for metric, marks in study.plot.chance.items():
    lines += [
      f"Reference lines for {metric}: " + ", ".join(f"{label} {value:.4g}" for label, value in marks.items()) + ".",
      "",
    ]
  if study.paper and not study.paper_in_table(scale):
    shown = ", ".join(
      f"{g} {v:.4g}" if not isinstance(v, dict) else f"{g} " + ", ".join(f"{m} {x:.4g}" for m, x in v.items())
      for g, v in study.paper.items()
      if study.paper_value(g, study.metric) is not None or isinstance(v, dict)
    )
    lines += [f"The paper's numbers, in the paper's setting (not this table's, so not beside it): {shown}.", ""]
  if study.source:
    lines += [f"Paper: {study.source}", ""]
  claims = _claims(study, rows, scale) if study.claim and all(r["mean"] is not None for r in rows) else []
  if claims and isinstance(claims[0], stats.Claim):
    lines += [
      "**Verdicts** (held / did not hold only where the 95 % interval clears the paper's effect, the run is in "
      "the claim's regime, and Holm's correction over the study's tested claims keeps the p-value below 0.05; "
      "efftx.sweep.stats.verdict and holm):",
      "",
      "| claim | paper (its setting) | ours | verdict |",
      "|---|---|---|---|",
    ]
    lines += [f"| {c.claim} | {c.paper} | {c.ours} | **{c.verdict}**: {c.why} |" for c in claims]
    lines.append("")
  elif claims:
    lines += [f"**Claim at our scale:** {claims[0]}", ""]
  missing = [p["point"] for p in points if p["state"] == "done" and p["value"] is None]
  if missing:
    lines += [f"Done but without {study.metric} in their output (left out): " + ", ".join(missing), ""]
  failed = [p for p in points if p["state"] != "done"]
  if failed:
    lines += [
      "Not finished: "
      + "; ".join(f"{p['point']} ({p['state']}" + (f": {p['error']}" if p["error"] else "") + ")" for p in failed),
      "",
    ]
  lines += [
    f"Scale: `{scale}` ({len(study.points)} runs). Command: `{command}`",
    f"Machine: {_machines(points)}. Time of all runs together: {datetime.timedelta(seconds=round(seconds))}. "
    f"Written {datetime.datetime.now():%Y-%m-%d %H:%M}.",
    "",
  ]
  folder = epath.Path(workdir)
  folder.mkdir(parents=True, exist_ok=True)
  paths = {
    "md": folder / "report.md",
    "csv": folder / "report.csv",
    "png": folder / "report.png",
    "json": folder / "results.json",
  }
  if any(group_curves.values()):
    paths["curves"] = folder / "report_curves.png"
  drawn = [c for c in claims if isinstance(c, stats.Claim) and c.measured and c.threshold is not None]
  if drawn:
    paths["claims"] = folder / "report_claims.png"
    _plot_claims(study, drawn, paths["claims"])
  paths["md"].write_text("\n".join(lines))
  out = io.StringIO()
  writer = csv.writer(out)
  extra_header = [f"{m}_{k}" for m in study.metrics for k in ("mean", "std")]
  ratio_header = [f"{m}_ratio" for m in (study.metric, *study.metrics)] if study.baseline else []
  writer.writerow(
    ["setting", "paper", "mean", "std", "seeds", "runs", "best_learning_rate", *extra_header, *ratio_header]
    + (["solved"] if study.solved else [])
  )
  for r in rows:
    paper = study.paper_value(r["group"], study.metric)
    writer.writerow(
      [
        r["group"],
        "" if paper is None else paper,
        r["mean"],
        r["std"],
        r["n"],
        r["of"],
        r["learning_rate"],
        *(r["metrics"][m][k] for m in study.metrics for k in ("mean", "std")),
        *(r["ratio"][m] for m in (study.metric, *study.metrics) if study.baseline),
      ]
      + (
        [f"{r['solved'][study.metric]['k']}/{r['solved'][study.metric]['n']}" if r["solved"] else ""]
        if study.solved
        else []
      )
    )
  paths["csv"].write_text(out.getvalue())
  paths["json"].write_text(
    json.dumps(
      {
        "study": study.name,
        "metric": study.metric,
        "metrics": study.metrics,
        "goal": study.goal,
        "scale": scale,
        "command": command,
        "machine": _machines(points),
        "seconds": seconds,
        "setting": {
          "paper": " ".join(study.paper_setting.split()),
          "ours": " ".join(study.setting.get(scale, "").split()),
        },
        "protocol": " ".join(study.protocol.get(scale, "").split()),
        "verdicts": [dataclasses.asdict(c) if isinstance(c, stats.Claim) else {"claim": c} for c in claims],
        "rows": rows,
        "points": points,
      },
      indent=2,
    )
  )
  _plot(study, rows, paths["png"], scale)
  if "curves" in paths:
    _plot_curves(study, group_curves, paths["curves"])
  return {k: os.fspath(v) for k, v in paths.items()}


def curve_panels(study: Study, group_curves: dict[str, list]) -> dict[str, dict[str, list]]:
  """{panel title: {line label: seeds' curves}}: one panel per plot.panel(group) (one untitled panel without it),
  in the groups' order; a label drops its panel's title where the group's name starts with it."""
  panels = {}
  for group, seeds in group_curves.items():
    if not seeds:
      continue
    title = study.plot.panel(group) if study.plot.panel else ""
    label = group[len(title) :].strip() if title and group.startswith(title) else group
    panels.setdefault(title, {})[f"{label} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"] = seeds
  return panels


def _plot_curves(study: Study, group_curves: dict[str, list], path: epath.Path) -> None:
  """METRIC against step, one line per group (the mean over its seeds at the steps they all logged) with the band
  from the lowest to the highest seed; one panel per plot.panel value, the legend beside it (efftx.plot draws it)."""
  name = lambda title: f"{study.name}{': ' + title if title else ''}: learning curves (band: lowest to highest seed)"
  panels = [(name(title), study.metric, lines) for title, lines in curve_panels(study, group_curves).items()]
  plot.write_png(plot.curves_figure(panels), path)


def _spread(value: dict) -> tuple[float, float]:
  """(below, above) the mean of {"mean": ..., "ci95": [low, high] or None}: its error bar."""
  return (value["mean"] - value["ci95"][0], value["ci95"][1] - value["mean"]) if value["ci95"] else (0.0, 0.0)


def _errors(r: dict, metric: str, ratio: bool) -> tuple[float, float]:
  """(below, above) the point drawn for row r: the range of paired repeats for a ratio, else the 95 % interval."""
  if ratio:
    return _spread({"mean": r["ratio"][metric], "ci95": r.get("ratio_range", {}).get(metric)})
  if (r.get("solved") or {}).get(metric):  # split outcomes: a count, no t-interval (the seeds' dots show them)
    return 0.0, 0.0
  return _spread(r["metrics"][metric])


def _count_label(r: dict, metric: str, study: Study) -> str | None:
  """ "k of n ≥ threshold" for a row whose seeds split into solved and not (study.solved), else None."""
  c = (r.get("solved") or {}).get(metric)
  return None if not c else f"{c['k']} of {c['n']} ≥ {study.solved[metric]:g}"


def _scale_x(ax, study: Study) -> None:
  """plot.xscale, or log base 2 where plot.x's positive values span 16× or more."""
  xs = study.plot.x[1]
  if study.plot.xscale == "log" or (
    not study.plot.xscale and all(v > 0 for v in xs.values()) and max(xs.values()) / min(xs.values()) >= 16
  ):
    ax.set_xscale("log", base=2)


VERDICT_COLOURS = {stats.HELD: "C2", stats.DID_NOT_HOLD: "C3", stats.INCONCLUSIVE: "C1", stats.UNTESTED: "gray"}


def _plot_claims(study: Study, claims: list, path: epath.Path) -> None:
  """One row per claim, each on its own scale: the quantity the claim is about (a difference, a ratio, an exponent,
  a share) with its 95 % interval, shifted so that the claim's threshold lies on the red line at 0 and scaled so
  that the row's farthest point lies at ±1; the numbers themselves are written above the row, which is coloured by
  the verdict."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  row_inches, margin_inches = 0.5, 0.9
  height = margin_inches + row_inches * len(claims)
  fig, ax = plt.subplots(figsize=(10, height))
  fig.subplots_adjust(left=0.03, right=0.97, top=1 - 0.55 / height, bottom=0.35 / height)
  for i, c in enumerate(claims):
    mean, low, high = c.measured
    colour = VERDICT_COLOURS.get(c.verdict, "black")
    ends = [v for v in (low, high, mean) if v is not None]
    scale = max(abs(v - c.threshold) for v in ends) or abs(c.threshold) or 1.0
    at = lambda v, s=scale, t=c.threshold: (v - t) / s  # noqa: E731
    below, above = (at(mean) - at(low), at(high) - at(mean)) if low is not None else (0.0, 0.0)
    ax.errorbar([at(mean)], [i], xerr=[[below], [above]], fmt="o", capsize=4, color=colour)
    interval = f" [{low:.4g}, {high:.4g}]" if low is not None else ""
    ax.text(
      -1.15,
      i - 0.22,
      f"{c.claim}: {c.verdict}. {mean:.4g}{interval} against {c.threshold:.4g}",
      fontsize=7,
      color=colour,
      va="bottom",
      bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.8},
    )
  ax.axvline(0.0, color="red", linewidth=1)
  ax.set_xlim(-1.2, 1.2)
  ax.set_ylim(len(claims) - 0.5, -0.7)
  ax.set_yticks([])
  ax.set_xticks([-1, 0, 1], ["farthest below", "threshold", "farthest above"], fontsize=7)
  ax.set_title(
    f"{study.name}: each claim's measurement (95 % interval) against its threshold (red), each row on its own scale",
    fontsize=9,
  )
  plot.write_png(fig, path)


def _seed_values(r: dict, metric: str, study: Study) -> list[float]:
  """The values of a row's seeds (fresh seeds at the chosen rate) for metric; [] for a single seed."""
  key = "value" if metric == study.metric else metric  # report.aggregate's keys
  values = [v.get(key) for v in r.get("seeds", {}).values()]
  values = [v for v in values if v is not None and math.isfinite(v)]
  return values if len(values) > 1 else []


def _seed_deltas(r: dict, rows: list[dict], metric: str, study: Study) -> list[float]:
  """Each seed's paired difference of a row from its baseline row (the seeds both ran); [] for a single seed."""
  base = next((b for b in rows if b["group"] == study.baseline.get(r["group"])), None)
  if base is None:
    return []
  key = "value" if metric == study.metric else metric
  ours, theirs = r.get("seeds", {}), base.get("seeds", {})
  pairs = [(ours[s].get(key), theirs[s].get(key)) for s in ours if s in theirs]
  values = [a - b for a, b in pairs if a is not None and b is not None and math.isfinite(a - b)]
  return values if len(values) > 1 else []


def _seed_dots(ax, where: list[tuple[float, list[float]]], colour, label: str, horizontal: bool = False):
  """Each seed's (or repeat's) value as a small hollow dot at its group's place, beside the mean and interval (small
  n, or outcomes that split into solved and not: the mean may lie where no seed is); the legend names them once a
  panel."""
  for position, values in where:
    if not values:
      continue
    at = [position] * len(values)
    xy = (values, at) if horizontal else (at, values)
    first = label not in ax.get_legend_handles_labels()[1]
    ax.plot(*xy, "o", markersize=4, markerfacecolor="none", color=colour, alpha=0.7, label=label if first else None)


def _drawn(rows: list[dict], metric: str, ratio: bool, study: Study, value) -> list[float]:
  """Every value a metric panel draws for rows: the means, their error bars' ends and each seed's value."""
  out = []
  for r in rows:
    below, above = _errors(r, metric, ratio)
    out += [value(r), value(r) - below, value(r) + above]
    if not ratio:
      out += _seed_values(r, metric, study)
  return out


def _near(shown: list[float], level: float) -> bool:
  """Whether a reference line at level lies near the values a panel draws: within their span again (at least 5 % of
  their size) on either side. A line farther out would squash them; the caller writes its value instead."""
  shown = [v for v in shown if v is not None and math.isfinite(v)]
  if not shown:
    return True
  low, high = min(shown), max(shown)
  span = max(high - low, 1e-9 + 0.05 * abs(high))
  return low - span <= level <= high + span


def _chance_lines(study: Study, metric: str, title: str | None, shown: list[float], ax) -> list[tuple[str, float]]:
  """plot.chance's lines for metric on the panel `title` (plot.chance_panel restricts a line to its task's panel)
  that lie near what the panel draws (`shown`: means, interval ends, seeds; within its span again on either side);
  a line farther out would squash the data, so its value is written in the panel's lower right corner instead."""
  lines = [
    (name, level)
    for name, level in study.plot.chance.get(metric, {}).items()
    if title is None or study.plot.chance_panel.get(name, title) == title
  ]
  near = [(n, v) for n, v in lines if _near(shown, v)]
  far = [f"{n} = {v:g}" for n, v in lines if (n, v) not in near]
  if far:
    ax.text(0.99, 0.01, "off the axis: " + "; ".join(far), transform=ax.transAxes, fontsize=7, ha="right", va="bottom")
  return near


def along_x(study: Study, rows: list[dict]) -> bool:
  """Whether the plot draws rows against plot.x: only where they take more than one value of it. With one (one width
  of several run) an x axis shows nothing along it and stacks the groups on one point, so each group gets its own
  labelled dot instead."""
  return bool(study.plot.x) and len({study.plot.x[1][r["group"]] for r in rows if r["group"] in study.plot.x[1]}) > 1


def _plot(study: Study, rows: list[dict], path: epath.Path, scale: str = "") -> None:
  """One panel per question: each metric (ours as ratios where BASELINE is set, with the range of paired repeats;
  else the mean with its 95 % interval), against plot.x (one line per plot.series; where the rows take more than one
  value of it) or as one labelled dot per group on an axis that starts where the values do; and, where groups have
  several seeds and a baseline, a panel of the paired differences from it with their intervals and the zero line.
  The paper's numbers only where the scale's setting is the paper's; plot.chance's reference lines on their metric's
  panel; plot.metrics limits the metric panels, and plot.quantities adds the claims' own quantities as panels."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  metrics = list(study.plot.metrics or (study.metric, *study.metrics))
  # The claims' own quantities (plot.quantities), once every group has its value: what the verdicts read.
  quantities = study.plot.quantities(rows) if study.plot.quantities and all(r["mean"] is not None for r in rows) else []
  with_paper = study.paper_in_table(scale) if scale else True
  # Measurements get ratios to the baseline; training runs their paired differences from it.
  # Rows whose seeds (or their baseline's) split into solved and not have a count, not a paired t: left out.
  deltas = (
    [
      r
      for r in rows
      if (r.get("delta") or {}).get(study.metric)
      and not (r.get("solved") or {}).get(study.metric)
      and not _baseline_split(study, rows, r, study.metric)
    ]
    if not study.measured
    else []
  )
  # Against plot.x with plot.panel: the metric once per panel (Figure 2's one panel per sequence length).
  # With plot.panel, one panel per task also without plot.x: one task per axis.
  titles = list(dict.fromkeys(study.plot.panel(r["group"]) for r in rows)) if study.plot.panel else []
  in_panel = lambda r, t: t is None or study.plot.panel(r["group"]) == t  # noqa: E731
  panels = (
    [("metric", m, t) for m in metrics for t in titles or [None]]
    + [("delta", study.metric, t) for t in titles or [None] if any(in_panel(r, t) for r in deltas)]
    + [("quantity", q, None) for q in quantities]
  )
  against_x = along_x(study, rows)
  per_panel = max(sum(1 for r in rows if in_panel(r, t)) for t in titles or [None])
  tall = max(4.5, 0.35 * per_panel + 1.5) if not against_x else 4.5
  columns = min(3, len(panels))  # at most three panels a row
  grid_rows = -(-len(panels) // columns)
  fig, axes = plt.subplots(grid_rows, columns, figsize=(7 * columns, tall * grid_rows), squeeze=False)
  for ax in axes.flat[len(panels) :]:
    fig.delaxes(ax)
  each = "each repeat" if study.measured else "each seed"
  all_rows = rows
  for ax, (kind, metric, title) in zip(axes.flat, panels):
    if kind == "quantity":
      _draw_panel(ax, metric)
      continue
    rows = [r for r in all_rows if in_panel(r, title)]
    if kind == "delta" and against_x:  # the paired difference against plot.x, with its 95 % interval
      label, xs = study.plot.x
      shown = [r for r in rows if r in deltas and r["group"] in xs]
      for series in dict.fromkeys(study.plot.series.get(r["group"], "ours") for r in shown):
        line = [r for r in shown if study.plot.series.get(r["group"], "ours") == series]
        ds = [r["delta"][metric] for r in line]
        errors = list(zip(*map(_spread, ds)))
        ax.errorbar(
          [xs[r["group"]] for r in line], [d["mean"] for d in ds], yerr=errors, marker="o", capsize=3, label=series
        )
        seeds = [(xs[r["group"]], _seed_deltas(r, all_rows, metric, study)) for r in line]
        _seed_dots(ax, seeds, ax.lines[-1].get_color(), each)
      _scale_x(ax, study)
      ax.axhline(0.0, color="black", linewidth=0.8)
      baselines = sorted({study.baseline[r["group"]] for r in shown})
      ax.set(
        xlabel=label,
        ylabel=f"{metric} − {', '.join(baselines)} (paired, 95 % CI)",
        title=f"{study.name}: difference from {', '.join(baselines)}" + (f", {title}" if title else ""),
      )
      ax.grid(alpha=0.3)
      if len(ax.lines) > 1:
        ax.legend(fontsize=7)
      continue
    if kind == "delta":
      shown = [r for r in rows if r in deltas]
      for i, r in enumerate(shown):
        below, above = _spread(r["delta"][metric])
        ax.errorbar([r["delta"][metric]["mean"]], [i], xerr=[[below], [above]], fmt="o", capsize=3, color="C0")
        _seed_dots(ax, [(i, _seed_deltas(r, all_rows, metric, study))], "C0", each, horizontal=True)
      ax.axvline(0.0, color="black", linewidth=0.8)
      ax.set_yticks(range(len(shown)), [f"{r['group']} − {study.baseline[r['group']]}" for r in shown], fontsize=8)
      ax.invert_yaxis()
      ax.set_xlabel(f"{metric}: paired difference from the baseline (95 % CI)")
      ax.set_title(f"{study.name}: difference from the baseline" + (f", {title}" if title else ""))
      ax.grid(alpha=0.3)
      continue
    ratio = bool(study.baseline) and study.measured  # training: the delta panel
    value = lambda r, m=metric: r["ratio"][m] if ratio else r["metrics"][m]["mean"]
    done = [r for r in rows if value(r) is not None]
    if against_x:
      label, xs = study.plot.x
      on_axis = [r for r in done if r["group"] in xs]
      for series in dict.fromkeys(study.plot.series.get(r["group"], "ours") for r in on_axis):
        line = [r for r in on_axis if study.plot.series.get(r["group"], "ours") == series]
        errors = list(zip(*(_errors(r, metric, ratio) for r in line)))
        ax.errorbar(
          [xs[r["group"]] for r in line], [value(r) for r in line], yerr=errors, marker="o", capsize=3, label=series
        )
        if not ratio:
          seeds = [(xs[r["group"]], _seed_values(r, metric, study)) for r in line]
          _seed_dots(ax, seeds, ax.lines[-1].get_color(), each)
          for r in line:
            if _count_label(r, metric, study):
              ax.annotate(
                _count_label(r, metric, study),
                (xs[r["group"]], value(r)),
                fontsize=7,
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
              )
        paper = (
          sorted(
            (xs[g], study.paper_value(g, metric))
            for g in study.paper
            if g in xs
            and study.plot.series.get(g, "ours") == series
            and study.paper_value(g, metric) is not None
            and (title is None or study.plot.panel(g) == title)
          )
          if with_paper
          else []
        )
        if paper:
          ax.plot(
            *zip(*paper),
            "s--",
            color=ax.lines[-1].get_color(),
            label=f"{series} (paper)" if study.plot.series else "paper",
          )
      _scale_x(ax, study)
      # Groups off the axis (baselines) as horizontal lines where they lie near the groups drawn along x (within
      # their span again on either side); a line farther out would squash them, so its value is written instead.
      shown = _drawn([r for r in done if r["group"] in xs], metric, ratio, study, value)
      far = []
      for r in done:
        if r["group"] not in xs:
          if not _near(shown, value(r)):
            far.append(f"{r['group']} = {value(r):.4g}")
            continue
          ax.axhline(value(r), linestyle=":", color="gray")
          ax.annotate(r["group"], (ax.get_xlim()[0], value(r)), fontsize=8, va="bottom")
      if far:
        ax.text(0.01, 0.99, "off the axis: " + "; ".join(far), transform=ax.transAxes, fontsize=7, va="top")
      for name, level in _chance_lines(study, metric, title, _drawn(done, metric, ratio, study, value), ax):
        ax.axhline(level, linestyle="--", color="red", linewidth=0.8)
        ax.annotate(name, (ax.get_xlim()[0], level), fontsize=8, va="bottom", color="red")
      ax.set_xlabel(label)
      ax.set_ylabel(f"{metric} ÷ baseline" if ratio else metric)
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=2 if len(ax.get_legend_handles_labels()[0]) > 8 else 1)
    else:
      for i, r in enumerate(done):
        below, above = _errors(r, metric, ratio)
        counted = None if ratio else _count_label(r, metric, study)
        if counted:  # split outcomes: the seeds' dots and their count, no mean with a t-interval
          ax.annotate(
            counted,
            (max(_seed_values(r, metric, study) or [value(r)]), i),
            fontsize=7,
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
          )
        else:
          ax.errorbar(
            [value(r)],
            [i],
            xerr=[[below], [above]],
            fmt="o",
            capsize=3,
            color="C0",
            label="ours (95 % CI)"
            if not any("ours (95 % CI)" == h for h in ax.get_legend_handles_labels()[1])
            else None,
          )
        if not ratio:
          _seed_dots(ax, [(i, _seed_values(r, metric, study))], "C0", each, horizontal=True)
      paper = (
        [
          (study.paper_value(r["group"], metric), i)
          for i, r in enumerate(done)
          if study.paper_value(r["group"], metric) is not None
        ]
        if with_paper
        else []
      )
      if paper:
        ax.plot(*zip(*paper), "k|", markersize=14, label="paper")
      for name, level in _chance_lines(study, metric, title, _drawn(done, metric, ratio, study, value), ax):
        ax.axvline(level, linestyle="--", color="red", linewidth=0.8, label=name)
      ax.set_yticks(range(len(done)), [r["group"] for r in done], fontsize=8)
      ax.invert_yaxis()
      ax.set_xlabel(f"{metric} ÷ baseline" if ratio else metric)
      ax.legend(fontsize=8)
    if ratio:
      (ax.axhline if against_x else ax.axvline)(1.0, color="black", linewidth=0.8)
      shown = [value(r) for r in done]
      if shown and min(shown) > 0 and max(shown) / min(shown) >= 10:
        (ax.set_yscale if against_x else ax.set_xscale)("log")
    ax.set_title(
      (study.name if len(metrics) == 1 and not quantities else f"{study.name}: {metric}")
      + (f", {title}" if title else "")
    )
    ax.grid(alpha=0.3)
  fig.tight_layout()
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=120)
  plt.close(fig)
  path.write_bytes(buffer.getvalue())


def _draw_panel(ax, panel: Panel) -> None:
  """A claim's quantity as its sweep file computed it (study.Panel): lines with their intervals, each repeat's dots,
  the claim's threshold. A log axis only where every value drawn is positive."""
  drawn = list(panel.levels.values())
  for label, line in panel.lines.items():
    if not line:
      continue
    xs, ys, lows, highs = zip(*line)
    errors = [[max(0.0, y - lo) for y, lo in zip(ys, lows)], [max(0.0, hi - y) for y, hi in zip(ys, highs)]]
    bars = ax.errorbar(xs, ys, yerr=errors, marker="o", linestyle="-" if panel.join else "none", capsize=3, label=label)
    _seed_dots(ax, panel.dots.get(label, []), bars.lines[0].get_color(), panel.each)
    drawn += [*ys, *lows, *(v for _, values in panel.dots.get(label, []) for v in values)]
  for label, level in panel.levels.items():
    ax.axhline(level, linestyle="--", color="red", linewidth=0.8)
    ax.annotate(label, (ax.get_xlim()[0], level), fontsize=8, va="bottom", color="red")
  if panel.xticks:  # many or long labels (mixers' names) slanted
    slanted = len(panel.xticks) > 4
    ax.set_xticks(
      list(panel.xticks),
      list(panel.xticks.values()),
      rotation=30 if slanted else 0,
      ha="right" if slanted else "center",
    )
  ax.set_yscale("log" if panel.yscale == "log" and all(v > 0 for v in drawn) else "linear")
  ax.set(title=panel.title, xlabel=panel.xlabel, ylabel=panel.ylabel)
  ax.grid(alpha=0.3)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=7)


def _machines(points: list[dict]) -> str:
  """Where the finished points ran, from their outcomes ("A", or "A (n runs); B (1 run)"); this machine for runs
  whose outcome names none (runs from before outcomes did)."""
  counts = {}
  for p in points:
    if p["state"] == "done":
      where = p["machine"] or machine()
      counts[where] = counts.get(where, 0) + 1
  if len(counts) <= 1:
    return next(iter(counts), machine())
  return "; ".join(f"{m} ({n} run{'s' if n > 1 else ''})" for m, n in counts.items())


def publish(study: Study, paths: dict[str, str]) -> list[str]:
  """Copies the report into the sweep file's folder (experiments/<study>/) as table.md, table.csv, plot.png,
  results.json, claims.png where a claim was measured and, for training studies, curves.png."""
  folder = os.path.dirname(os.path.abspath(study.path))
  names = {
    "md": "table.md",
    "csv": "table.csv",
    "png": "plot.png",
    "json": "results.json",
    "curves": "curves.png",
    "claims": "claims.png",
  }
  out = []
  for kind, name in names.items():
    if kind not in paths:
      continue
    target = os.path.join(folder, name)
    with open(target, "wb") as f:
      f.write(epath.Path(paths[kind]).read_bytes())
    out.append(target)
  return out
