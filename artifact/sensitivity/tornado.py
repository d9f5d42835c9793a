"""Tornado chart: how each held-out error (pivot's throughput over the paper's, per group) moves when
one estimated (E) constant goes to either end of its declared range, the others as committed.

`python -m artifact.sensitivity.tornado [--groups ...] [--jobs 2] [--quick] [--plot-only]`

Pivot is never fitted (calibration.md's rule), so its error against the paper is a prediction's
error. When one misses, this shows which E constant could move it and how far, inside its range:
the constant with the widest bar is the one a measurement should settle first. Every run is pivot
at Table 4's training home set with the Fig. 9 settings (`artifact.calibrate.points.point`); the
ranges are calibration.md's (§4, §5, §7) as the fit declares them (`artifact.calibrate.run`).
Writes `tornado.csv` (one row per group x constant x end) and `tornado.png`.
"""
from __future__ import annotations

import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from artifact.common import item_parser, plt, read_csv, save_figure, write_csv

GROUPS = ["qwen1.5b_glm9b", "qwen7b_qwen30b", "qwen32b_qwen30b", "qwen72b_qwen122b"]
# (label, override key, low end, high end): E rows of calibration.md, at the ends of their ranges
CONSTANTS: list[tuple[str, str, float, float]] = [
    ("training MFU", "cluster.hardware.mfu", 0.20, 0.50),
    ("eager launch cost per layer (s)", "cluster.hardware.eager_layer_s", 0.05e-3, 0.6e-3),
    ("GenRM output median", "models.workload.genrm.median", 800, 8000),
    ("GenRM output sigma", "models.workload.genrm.sigma", 0.8, 1.2),
    ("step offset (response length)", "models.sim.step_offset", 0, 300),
    ("policy response sigma", "models.workload.response.sigma", 0.8, 1.2),
    ("GenRM/response length correlation", "models.workload.genrm_response_corr", 0.0, 0.6),
    ("training fixed seconds per step", "models.sim.train_fixed_s", 5.0, 10.0),
]
QUICK = {"groups": ["qwen1.5b_glm9b"], "constants": CONSTANTS[:2], "extra": ["train.steps=3"]}


def _fmt(v: float) -> str:
    return f"{v:g}"


def _run(args: tuple[str, list[str]]) -> float:
    from artifact.calibrate.points import point

    group, overrides = args
    return float(point(group, "pivot", overrides)["sim_tokens_per_s"])


def collect(groups: list[str], constants, extra: list[str], jobs: int) -> list[dict]:
    import json

    from artifact.calibrate.run import EXPECTED

    paper = json.loads(EXPECTED.read_text())["tokens_per_s"]
    cells = [(g, None, None, list(extra)) for g in groups]
    for g in groups:
        for label, key, lo, hi in constants:
            cells += [(g, label, v, [*extra, f"{key}={_fmt(v)}"]) for v in (lo, hi)]
    args = [(g, ov) for g, _, _, ov in cells]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            tps = list(pool.map(_run, args))
    else:
        tps = [_run(a) for a in args]
    base = {g: t for (g, label, _, _), t in zip(cells, tps) if label is None}
    rows = []
    for (g, label, v, _), t in zip(cells, tps):
        if label is None:
            continue
        p = float(paper[g]["pivot"])
        rows.append({"models": g, "constant": label, "value": v, "pivot_tokens_per_s": round(t),
                     "pivot_over_paper": round(t / p, 3), "committed_over_paper": round(base[g] / p, 3),
                     "log_error_change": round(math.log(t / base[g]), 4)})
    return rows


def plot(csv_path: Path, png_path: Path) -> None:
    rows = read_csv(csv_path)
    groups = list(dict.fromkeys(r["models"] for r in rows))
    p = plt()
    fig, axes = p.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.2), sharey=True, squeeze=False)
    labels = list(dict.fromkeys(r["constant"] for r in rows))
    for ax, g in zip(axes[0], groups):
        mine = [r for r in rows if r["models"] == g]
        base = float(mine[0]["committed_over_paper"])
        for i, lab in enumerate(labels):
            vals = sorted(float(r["pivot_over_paper"]) for r in mine if r["constant"] == lab)
            ax.barh(i, vals[-1] - vals[0], left=vals[0], color="tab:blue", alpha=0.7)
        ax.axvline(base, color="k", lw=1, label=f"committed x{base:.2f}")
        ax.axvspan(0.8, 1.25, color="tab:green", alpha=0.1, label="target 0.8-1.25")
        ax.set_title(g, fontsize=9)
        ax.set_xlabel("pivot sim / paper (held out)")
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_yticks(range(len(labels)))
    axes[0][0].set_yticklabels(labels, fontsize=7)
    fig.suptitle("Held-out pivot error vs each E constant over its declared range")
    save_figure(fig, png_path)


def main(argv=None) -> int:
    p = item_parser("tornado", __doc__.splitlines()[0])
    p.add_argument("--groups", nargs="*", default=GROUPS)
    p.add_argument("--jobs", type=int, default=1)
    args = p.parse_args(argv)
    csv_path, png_path = args.out / "tornado.csv", args.out / "tornado.png"
    if not args.plot_only:
        if args.quick:
            rows = collect(QUICK["groups"], QUICK["constants"], QUICK["extra"], args.jobs)
        else:
            rows = collect(args.groups, CONSTANTS, [], args.jobs)
        write_csv(rows, csv_path)
        for r in rows:
            print(f"{r['models']:18s} {r['constant']:36s} {r['value']:>8g}: pivot x{r['pivot_over_paper']:.2f} "
                  f"(committed x{r['committed_over_paper']:.2f})")
    plot(csv_path, png_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
