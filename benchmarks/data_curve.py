"""Held-out accuracy and bench tau against the amount of verifier text (issue 17's curve).

Reads what `gpu_pipeline.sh curve` leaves behind for each dataset: the train split's answer tokens
(the tokens the draft's loss sees), the last held-out evaluation in each draft's metrics.jsonl, and
bench_accept.py's JSON (all datasets measured on one bench prompt set). Prints a markdown table,
writes the figure and the JSON:
    python benchmarks/data_curve.py --datasets smollm2-curve-1 smollm2-curve-2 --bench-dir /tmp --out outputs/curve
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from draftlab import config  # noqa: E402
from draftlab.layout import RunLayout, runs_on  # noqa: E402

KINDS = ("eagle3", "dflash")


def train_tokens(run_dir: Path) -> dict:
    import datasets

    rows = datasets.load_from_disk(str(run_dir / "train"))
    return {
        "train rows": len(rows),
        "train answer tokens": int(sum(int(sum(m)) for m in rows["loss_mask"])),
        "train tokens": int(sum(rows["seq_len"])),
    }


def last_eval(kind: str, metrics: Path) -> dict:
    from draftlab.training.train import first_accuracy

    evals = [json.loads(line) for line in metrics.read_text().splitlines() if '"split": "eval"' in line]
    return {"step": evals[-1]["step"], "acc_0": first_accuracy(kind, evals[-1])} if evals else {}


def point(name: str, bench_dir: Path) -> dict:
    runs = runs_on(name)  # each curve point is one run on its own dataset
    out = {"dataset": name, **train_tokens(RunLayout(name, "").data)}
    for kind in KINDS:
        metrics = runs[-1].draft(kind) / "metrics.jsonl" if runs else None
        if metrics is not None and metrics.exists():
            last = last_eval(kind, metrics)
            out[f"{kind} eval acc_0"], out["steps"] = last.get("acc_0"), last.get("step")
    bench = bench_dir / f"bench-{name}.json"
    if bench.exists():
        b = json.loads(bench.read_text())
        out["bench prompts"] = b["prompts"]
        for kind, r in b["results"].items():
            out[f"{kind} bench tau"] = r["all"]["tau"]
    return out


def figure(points: list[dict]):
    fig, (ax_acc, ax_tau) = plt.subplots(1, 2, figsize=(11, 4))
    x = [p["train answer tokens"] for p in points]
    for kind in KINDS:
        if any(f"{kind} eval acc_0" in p for p in points):
            ax_acc.plot(x, [p.get(f"{kind} eval acc_0") for p in points], "o-", label=kind)
        if any(f"{kind} bench tau" in p for p in points):
            ax_tau.plot(x, [p.get(f"{kind} bench tau") for p in points], "o-", label=kind)
    if any("ngram bench tau" in p for p in points):
        ax_tau.plot(x, [p.get("ngram bench tau") for p in points], "k--", label="n-gram")
    for ax, title in (
        (ax_acc, "held-out first-position accuracy (eval)"),
        (ax_tau, "tau on bench prompts (k 5, greedy)"),
    ):
        ax.set_xscale("log")
        ax.set_xlabel("verifier answer tokens in the train split")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", required=True)
    ap.add_argument("--bench-dir", default="/tmp")
    ap.add_argument("--out", default=str(config.outputs_dir() / "curve"))
    args = ap.parse_args()
    points = [point(name, Path(args.bench_dir)) for name in args.datasets]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.json").write_text(json.dumps(points, indent=1))
    figure(points).savefig(out / "curve.png", dpi=110)
    cols = sorted({k for p in points for k in p} - {"dataset"}, key=lambda k: (k.split()[0] in KINDS + ("ngram",), k))
    print("| dataset | " + " | ".join(cols) + " |\n|" + " --- |" * (len(cols) + 1))
    for p in points:
        cells = [f"{p[c]:.3f}" if isinstance(p.get(c), float) else str(p.get(c, "")) for c in cols]
        print(f"| {p['dataset']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
