"""Fig. 11: shift strategies (static, rule, vanilla, pivot) and pivot without migration, on
qwen1.5b_glm9b and qwen7b_qwen30b. `python -m artifact.fig11.run [--quick]`."""
from __future__ import annotations

import sys

from artifact.common import item_main, plt, read_csv, run_one, save_figure

VARIANTS = [  # (label, overrides)
    ("static", ["deploy.planner.strategy=static"]),
    ("rule", ["deploy.planner.strategy=rule"]),
    ("vanilla", ["deploy.planner.strategy=vanilla"]),
    ("pivot w/o migration", ["deploy.planner.strategy=pivot", "deploy.planner.migration=false"]),
    ("pivot", ["deploy.planner.strategy=pivot"]),
]


def collect(out, quick: bool) -> list[dict]:
    groups = ["qwen1.5b_glm9b"] if quick else ["qwen1.5b_glm9b", "qwen7b_qwen30b"]
    exp = "experiment=quick" if quick else "experiment=fig11"
    rows = []
    for g in groups:
        for label, ov in VARIANTS:
            s = run_one([exp, f"models={g}", "deploy=pivot", *ov], out / "runs" / f"{g}_{label.replace(' ', '_')}")
            rows.append({"models": g, "variant": label, "throughput_tokens_per_s": s["throughput_tokens_per_s"],
                         "ideal_efficiency": s["ideal_efficiency"], "num_shifts": s["num_shifts"]})
    return rows


def plot(csv_path, png_path) -> None:
    rows = read_csv(csv_path)
    groups = list(dict.fromkeys(r["models"] for r in rows))
    p = plt()
    fig, axes = p.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), squeeze=False)
    for ax, g in zip(axes[0], groups):
        sub = [r for r in rows if r["models"] == g]
        base = float(sub[0]["throughput_tokens_per_s"]) or 1.0
        ys = [float(r["throughput_tokens_per_s"]) for r in sub]
        bars = ax.bar(range(len(sub)), ys, color=["#999", "#bbb", "#88a", "#6a6", "#2a7"][: len(sub)])
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y, f"x{y / base:.2f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(sub)), [r["variant"] for r in sub], rotation=25, fontsize=7)
        ax.set_title(g, fontsize=9)
        ax.set_ylabel("tokens / s")
    fig.suptitle("Shift strategies and components (x = over static)", fontsize=10)
    save_figure(fig, png_path)


def main(argv=None) -> int:
    return item_main("fig11", __doc__, collect, plot, argv)


if __name__ == "__main__":
    sys.exit(main())
