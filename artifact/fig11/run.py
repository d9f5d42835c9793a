"""Fig. 11: shift strategies (static, rule, vanilla, pivot) and pivot without migration, on
qwen1.5b_glm9b and qwen7b_qwen30b, each over disaggregated at the paper's Table 4 allocation, beside
the paper's ratios (`artifact/expected/fig11.json`). These are predictions: nothing here is fitted.
`python -m artifact.fig11.run [--quick]`."""
from __future__ import annotations

import json
import sys

from artifact.common import ROOT, item_main, plt, read_csv, run_one, save_figure
from pivotrl.config import compose_config

EXPECTED = ROOT / "artifact" / "expected" / "fig11.json"

VARIANTS = [  # (label, overrides)
    ("static", ["deploy/planner=static"]),
    ("rule", ["deploy/planner=rule"]),
    ("vanilla", ["deploy/planner=vanilla"]),
    ("pivot w/o migration", ["deploy/planner=pivot", "deploy.planner.migration=false"]),
    ("pivot", ["deploy/planner=pivot"]),
]


def table4_disaggregated(cfg) -> tuple[int, int, int]:
    """Table 4's disaggregated split, scaled to the cluster when it is not the paper's size (the
    --quick cluster), in whole replicas of each role."""
    ro, rm, tr = (int(x) for x in cfg.models.sim.paper_allocation.disaggregated)
    n = int(cfg.cluster.num_devices or cfg.models.devices)
    if ro + rm + tr == n:
        return ro, rm, tr
    tp_ro, tp_rm, total = cfg.models.policy.tp, cfg.models.genrm.tp, ro + rm + tr
    ro = max(tp_ro, round(ro * n / total / tp_ro) * tp_ro)
    rm = max(tp_rm, round(rm * n / total / tp_rm) * tp_rm)
    return ro, rm, n - ro - rm


def collect(out, quick: bool) -> list[dict]:
    groups = ["qwen1.5b_glm9b"] if quick else ["qwen1.5b_glm9b", "qwen7b_qwen30b"]
    exp = "experiment=quick" if quick else "experiment=fig11"
    paper = json.loads(EXPECTED.read_text())["over_disaggregated"]
    rows = []
    for g in groups:
        cfg = compose_config([exp, f"models={g}"])
        ro, rm, tr = table4_disaggregated(cfg)
        base = run_one([exp, f"models={g}", "deploy=disaggregated", f"deploy.allocation.rollout={ro}",
                        f"deploy.allocation.reward={rm}", f"deploy.allocation.train={tr}"],
                       out / "runs" / f"{g}_disaggregated_table4")["throughput_tokens_per_s"]
        rows.append({"models": g, "variant": f"disaggregated {ro}/{rm}/{tr}", "throughput_tokens_per_s": base,
                     "sim_over_disaggregated": 1.0, "paper_over_disaggregated": 1.0, "ratio_sim_over_paper": 1.0})
        for label, ov in VARIANTS:
            s = run_one([exp, f"models={g}", "deploy=pivot", *ov], out / "runs" / f"{g}_{label.replace(' ', '_')}")
            sim_r = s["throughput_tokens_per_s"] / base if base else 0.0
            p = paper.get(g, {}).get(label)
            rows.append({"models": g, "variant": label, "throughput_tokens_per_s": s["throughput_tokens_per_s"],
                         "sim_over_disaggregated": round(sim_r, 3), "paper_over_disaggregated": p or "",
                         "ratio_sim_over_paper": round(sim_r / p, 3) if p else "",
                         "ideal_efficiency": s["ideal_efficiency"], "num_shifts": s["num_shifts"],
                         "shift_plans_per_step": round(s["shift_plans_per_step"], 2)})
    return rows


def plot(csv_path, png_path) -> None:
    rows = read_csv(csv_path)
    groups = list(dict.fromkeys(r["models"] for r in rows))
    p = plt()
    fig, axes = p.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), squeeze=False)
    for ax, g in zip(axes[0], groups):
        sub = [r for r in rows if r["models"] == g]
        ys = [float(r["throughput_tokens_per_s"]) for r in sub]
        bars = ax.bar(range(len(sub)), ys, color=["#555", "#999", "#bbb", "#88a", "#6a6", "#2a7"][: len(sub)])
        for b, r in zip(bars, sub):
            pr = f"/{float(r['paper_over_disaggregated']):.2f}" if r["paper_over_disaggregated"] else ""
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"x{float(r['sim_over_disaggregated']):.2f}{pr}",
                    ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(sub)), [r["variant"] for r in sub], rotation=25, fontsize=7)
        ax.set_title(g, fontsize=9)
        ax.set_ylabel("tokens / s")
    fig.suptitle("Shift strategies and components: x sim / paper, over disaggregated at Table 4", fontsize=9)
    save_figure(fig, png_path)


def main(argv=None) -> int:
    return item_main("fig11", __doc__, collect, plot, argv)


if __name__ == "__main__":
    sys.exit(main())
