"""Fig. 9: end-to-end throughput of 4 model groups x 4 deployment modes (simulated H20 cluster),
with pivot's speed-up over each baseline. `python -m artifact.fig9.run [--quick]`."""
from __future__ import annotations

import sys

from artifact.common import MODEL_GROUPS, MODES, item_main, plt, read_csv, run_one, save_figure


def collect(out, quick: bool) -> list[dict]:
    groups = ["qwen1.5b_glm9b"] if quick else MODEL_GROUPS
    exp = "experiment=quick" if quick else "experiment=fig9"
    rows = []
    for g in groups:
        per_mode = {}
        for m in MODES:
            s = run_one([exp, f"models={g}", f"deploy={m}"], out / "runs" / f"{g}_{m}")
            per_mode[m] = s
            rows.append({"models": g, "deploy": m, "throughput_tokens_per_s": s["throughput_tokens_per_s"],
                         "ideal_efficiency": s["ideal_efficiency"], "num_shifts": s["num_shifts"],
                         "allocation": s.get("allocation", ""),
                         "paper_allocation_throughput": s.get("paper_allocation_throughput", "")})
        piv = per_mode["pivot"]["throughput_tokens_per_s"]
        for r in rows:
            if r["models"] == g:
                r["pivot_speedup"] = piv / r["throughput_tokens_per_s"] if r["throughput_tokens_per_s"] else ""
    return rows


def plot(csv_path, png_path) -> None:
    rows = read_csv(csv_path)
    groups = list(dict.fromkeys(r["models"] for r in rows))
    p = plt()
    fig, ax = p.subplots(figsize=(max(6.0, 2.6 * len(groups) + 2), 4.0))
    width = 0.8 / len(MODES)
    for i, m in enumerate(MODES):
        ys = [float(next(r for r in rows if r["models"] == g and r["deploy"] == m)["throughput_tokens_per_s"])
              for g in groups]
        xs = [j + i * width for j in range(len(groups))]
        bars = ax.bar(xs, ys, width, label=m)
        if m != "pivot":
            for b, g in zip(bars, groups):
                sp = next(r for r in rows if r["models"] == g and r["deploy"] == m)["pivot_speedup"]
                if sp:
                    ax.text(b.get_x() + width / 2, b.get_height(), f"x{float(sp):.2f}", ha="center",
                            va="bottom", fontsize=7)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], groups, fontsize=8)
    ax.set_ylabel("tokens / s")
    ax.set_title("End-to-end throughput; xN = pivot / that mode", fontsize=10)
    ax.legend(fontsize=8, ncol=len(MODES), loc="upper center", bbox_to_anchor=(0.5, -0.12))
    save_figure(fig, png_path)


def main(argv=None) -> int:
    return item_main("fig9", __doc__, collect, plot, argv)


if __name__ == "__main__":
    sys.exit(main())
