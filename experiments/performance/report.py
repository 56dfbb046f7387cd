"""Table and plot of one peer-benchmark run: python experiments/peers/report.py RESULTS.json [--publish[=NAME]].

Reads the JSON that ../shared/bench/peers.py wrote and prints (and with --publish writes beside this file as
NAME.md, NAME.png, NAME.json; NAME defaults to "table") tokens/s, MFU and peak RSS per model and length, and each
efftx model's tokens/s as a ratio to its peer: a model named <anything>-fnet or -identity to hf-fnet,
-attention to hf-bert-sdpa, the others (the AFT variants, linear) to efftx-fnet, the issue's target for them.
"""
import json
import pathlib
import shutil
import sys

HERE = pathlib.Path(__file__).parent
PEER_OF = {"fnet": "hf-fnet", "identity": "hf-fnet", "attention": "hf-bert-sdpa"}
HARNESS_MODELS = ("hf-fnet", "hf-bert-sdpa", "hf-bert-eager", "flax-attn", "flax-fnet")  # peers.py's own


def table(run: dict) -> str:
  rows = run["results"]
  models = list(dict.fromkeys(r["peer"] for r in rows))
  seqs = sorted({r["seq"] for r in rows})
  by = {(r["peer"], r["seq"]): r for r in rows if "tokens_per_s" in r}
  cell = lambda m, s, f: f(by[(m, s)]) if (m, s) in by else "—"
  meta, peak = run.get("meta", {}), run.get("peak", {})
  lines = [f"Peer benchmark run of {meta.get('started', '?')} on {meta.get('cpu', '?')} ({meta.get('nproc', '?')} cores), "
           f"{meta.get('total_wall_s', 0) / 60:.0f} min: `peers.py {' '.join(meta.get('argv', []))}`", "",
           "tokens/s (median of the timed steps; MFU % in brackets, against the larger of torch's and JAX's float32 "
           "2048³ matmul rate; peak RSS MiB after the slash):", "",
           "| model | " + " | ".join(str(s) for s in seqs) + " |", "|---|" + "---:|" * len(seqs)]
  for m in models:
    lines.append(f"| {m} | " + " | ".join(cell(m, s, lambda r: f"{r['tokens_per_s']:,.0f} ({100 * r['mfu']:.0f}) / "
                                                                f"{r['peak_rss_mib']:,.0f}") for s in seqs) + " |")
  lines += ["", "efftx ÷ peer, tokens/s (fnet and identity ÷ hf-fnet; attention ÷ hf-bert-sdpa; the AFT variants and "
            "linear ÷ efftx-fnet, the issue's target for them):", "",
            "| model | peer | " + " | ".join(str(s) for s in seqs) + " |", "|---|---|" + "---:|" * len(seqs)]
  for m in models:
    if m in HARNESS_MODELS:
      continue
    peer = PEER_OF.get(m.split("-", 1)[-1], "efftx-fnet")
    ratio = lambda s: (f"{by[(m, s)]['tokens_per_s'] / by[(peer, s)]['tokens_per_s']:.2f}"
                       if (m, s) in by and (peer, s) in by else "—")
    lines.append(f"| {m} | {peer} | " + " | ".join(ratio(s) for s in seqs) + " |")
  lines += ["", "GFLOP per token (the harness's count: 6 × matmul weights + the factory's mixer_flops_per_token):", "",
            "| model | " + " | ".join(str(s) for s in seqs) + " |", "|---|" + "---:|" * len(seqs)]
  for m in models:
    lines.append(f"| {m} | " + " | ".join(cell(m, s, lambda r: f"{r['flops_per_token'] / 1e9:.4f}") for s in seqs)
                 + " |")
  lines += ["", f"float32 matmul 2048³: torch {peak.get('torch', {}).get('mm2048_gflops', float('nan')):.0f}, JAX "
            f"{peak.get('jax', {}).get('mm2048_gflops', float('nan')):.0f} GFLOP/s. Other-CPU share during the timed "
            f"steps: at most {100 * max(r.get('foreign_cpu_frac') or 0 for r in rows):.1f} %."]
  return "\n".join(lines) + "\n"


def plot(run: dict, path: pathlib.Path) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rows = [r for r in run["results"] if "tokens_per_s" in r]
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for m in dict.fromkeys(r["peer"] for r in rows):
    points = sorted((r["seq"], r["tokens_per_s"]) for r in rows if r["peer"] == m)
    ax.plot(*zip(*points), marker="o", label=m, linestyle="--" if m.startswith("hf-") else "-")
  ax.set(xscale="log", yscale="log", xlabel="sequence length (8192 tokens a step)", ylabel="train-step tokens/s",
         title="efftx and its PyTorch peers, same shape, same CPU")
  ax.set_xticks(sorted({r["seq"] for r in rows}), [str(s) for s in sorted({r["seq"] for r in rows})])
  ax.set_xticks([], minor=True)  # the log axis's own minor ticks would label 200, 300, ... over the lengths
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  if len(argv) < 2:
    sys.exit(__doc__)
  source = pathlib.Path(argv[1])
  run = json.loads(source.read_text())
  text = table(run)
  print(text)
  publish = [a for a in argv if a.startswith("--publish")]
  if publish:
    name = publish[0].partition("=")[2] or "table"
    (HERE / f"{name}.md").write_text(text)
    plot(run, HERE / f"{name}.png")
    shutil.copyfile(source, HERE / f"{name}.json")
    print(f"published: {', '.join(str(HERE / f'{name}.{ext}') for ext in ('md', 'png', 'json'))}")


if __name__ == "__main__":
  main(sys.argv)
