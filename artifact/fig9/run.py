"""Fig. 9: end-to-end throughput of 4 model groups x 4 deployment modes (simulated H20 cluster),
beside the paper's values (`artifact/expected/fig9.json`). `python -m artifact.fig9.run [--quick]`.

Each baseline is reported at the paper's Table 4 allocation and at its best swept allocation (the
sweep measures both; the run itself uses the best). Pivot runs with Table 4's training home set.
Columns: `sim` and `paper` tokens/s at Table 4 with `ratio` = sim/paper, the best swept allocation
and its tokens/s, and pivot's speed-up over this mode at Table 4 (sim and paper) and over its best
swept allocation. The baselines' E constants are fitted to these Table 4 numbers
(`artifact.calibrate`); pivot's column is a held-out prediction.
"""
from __future__ import annotations

import json
import sys

from artifact.common import MODEL_GROUPS, MODES, ROOT, item_main, plt, read_csv, run_one, save_figure

EXPECTED = ROOT / "artifact" / "expected" / "fig9.json"


def paper_values() -> dict[str, dict[str, float]]:
    """The paper's value per (group, mode). 1.5b's colocated/rr_colocated pair is unordered in the
    extraction: the larger goes to colocated, as §8.2's ratio range allows either (documented in
    the expected file); `paper_alt` in the CSV keeps the other."""
    raw = json.loads(EXPECTED.read_text())["tokens_per_s"]
    out = {}
    for g, d in raw.items():
        out[g] = {m: (max(v) if m == "colocated" else min(v)) if isinstance(v, list) else float(v)
                  for m, v in d.items()}
    return out


def collect(out, quick: bool) -> list[dict]:
    groups = ["qwen1.5b_glm9b"] if quick else MODEL_GROUPS
    exp = "experiment=quick" if quick else "experiment=fig9"
    paper = paper_values()
    rows = []
    for g in groups:
        per_mode = {}
        for m in MODES:
            per_mode[m] = run_one([exp, f"models={g}", f"deploy={m}"], out / "runs" / f"{g}_{m}")
        piv = per_mode["pivot"]["throughput_tokens_per_s"]
        for m in MODES:
            s = per_mode[m]
            info = s.get("allocation_choice", {})
            best = s["throughput_tokens_per_s"]
            # colocated and pivot have one allocation; baselines: Table 4 from the sweep's results
            table4 = info.get("paper_allocation_throughput") if m in ("disaggregated", "rr_colocated") else best
            p = paper.get(g, {}).get(m)
            row = {"models": g, "deploy": m,
                   "sim_table4_tokens_per_s": round(table4) if table4 else "",
                   "paper_tokens_per_s": p or "",
                   "ratio_sim_over_paper": round(table4 / p, 3) if table4 and p else "",
                   "table4_allocation": info.get("paper_allocation") or info.get("train_home") or "all",
                   "best_swept_allocation": info.get("allocation") or info.get("train_home") or "all",
                   "sim_best_swept_tokens_per_s": round(best),
                   "pivot_over_this_table4": round(piv / table4, 3) if table4 else "",
                   "paper_pivot_over_this": round(paper[g]["pivot"] / p, 3) if p and g in paper else "",
                   "pivot_over_this_best_swept": round(piv / best, 3) if best else "",
                   "ideal_efficiency": s["ideal_efficiency"], "num_shifts": s["num_shifts"],
                   "kv_preemptions": s.get("kv_preemptions", "")}
            rows.append(row)
    return rows


def plot(csv_path, png_path) -> None:
    rows = read_csv(csv_path)
    groups = list(dict.fromkeys(r["models"] for r in rows))
    p = plt()
    fig, ax = p.subplots(figsize=(max(6.0, 2.8 * len(groups) + 2), 4.2))
    width = 0.8 / len(MODES)
    for i, m in enumerate(MODES):
        sub = [next(r for r in rows if r["models"] == g and r["deploy"] == m) for g in groups]
        ys = [float(r["sim_table4_tokens_per_s"] or 0) for r in sub]
        xs = [j + i * width for j in range(len(groups))]
        bars = ax.bar(xs, ys, width, label=f"{m} (sim)")
        paper = [float(r["paper_tokens_per_s"] or "nan") for r in sub]
        ax.plot(xs, paper, "k_", markersize=14, mew=2, label="paper" if i == 0 else None)
        if m != "pivot":
            for b, r in zip(bars, sub):
                if r["pivot_over_this_table4"]:
                    ax.text(b.get_x() + width / 2, b.get_height(), f"x{float(r['pivot_over_this_table4']):.2f}",
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], groups, fontsize=8)
    ax.set_ylabel("tokens / s")
    ax.set_title("Throughput at Table 4 allocations (bars: sim, black: paper); xN = sim pivot / that mode",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=len(MODES) + 1, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    save_figure(fig, png_path)


def main(argv=None) -> int:
    return item_main("fig9", __doc__, collect, plot, argv)


if __name__ == "__main__":
    sys.exit(main())
