"""Table 2: planner time by step (shift-up role, shift pairs, DP, evaluation, select) at
16/32/64/128 devices, extended to 256/512/1024. `python -m artifact.table2.run [--quick]`."""
from __future__ import annotations

import sys

from artifact.common import item_main, plt, read_csv, save_figure

STEPS = ("role", "pairs", "dp", "evaluate", "select")
DEVICES = [16, 32, 64, 128, 256, 512, 1024]


def collect(out, quick: bool) -> list[dict]:
    from pivotrl.bench.planner import planner_breakdown

    devices = [16, 32, 64] if quick else DEVICES
    rows = []
    for scenario in ("reward_up", "rollout_up"):
        for n in devices:
            r = planner_breakdown(n, scenario, repeats=3 if quick else 5)
            rows.append({"scenario": scenario, "devices": n, "live_seqs": r["live_seqs"],
                         "candidates": r["candidates"], "total_ms_median": r["total_ms_median"],
                         "total_ms_p90": r["total_ms_p90"],
                         **{f"{s}_ms": r[f"{s}_ms_median"] for s in STEPS}})
            print(f"  {scenario} {n:5d} devices: {r['total_ms_median']:.1f} ms", flush=True)
    return rows


def plot(csv_path, png_path) -> None:
    rows = read_csv(csv_path)
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    p = plt()
    fig, axes = p.subplots(1, len(scenarios), figsize=(5 * len(scenarios), 3.4), squeeze=False)
    for ax, sc in zip(axes[0], scenarios):
        sub = [r for r in rows if r["scenario"] == sc]
        xs = [int(r["devices"]) for r in sub]
        for s in STEPS:
            ax.plot(xs, [max(float(r[f"{s}_ms"]), 1e-4) for r in sub], "o-", ms=3, label=s)
        ax.plot(xs, [float(r["total_ms_median"]) for r in sub], "k*-", label="total")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("devices")
        ax.set_ylabel("ms per decision (median)")
        ax.set_title(sc, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Planner time by step (paper: 0.31-2.95 s at 16-128 GPUs)", fontsize=10)
    save_figure(fig, png_path)


def main(argv=None) -> int:
    return item_main("table2", __doc__, collect, plot, argv)


if __name__ == "__main__":
    sys.exit(main())
