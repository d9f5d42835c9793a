"""Fig. 10: throughput and allocation over time, pivot vs disaggregated (qwen7b_qwen30b).
`python -m artifact.fig10.run [--quick]`.

Runs `experiment=fig10` for deploy=disaggregated (best swept static allocation) and deploy=pivot,
reads the `throughput` records of each run's timeline.jsonl (one every
`models.sim.throughput_sample_s` simulated seconds, `pivotrl/sim/runtime.py`) and writes one CSV
row per record and mode, and a PNG: rollout, reward and overall throughput against time for both
modes, and pivot's allocation, with pivot's training intervals shaded.

Two views per role, both in the CSV: `actual_*` = tokens the simulated engines emitted in the
interval / interval (ground truth, plotted solid), and `model_*` = the schedulers' modelled
throughput, what the planner sees (plotted dotted). `overall` is paper Eq. 1 over the modelled
role throughputs weighted by running + queued sequences.
"""
from __future__ import annotations

import sys
from pathlib import Path

from artifact.common import item_main, plt, read_csv, read_jsonl, run_one, save_figure

MODES = ["disaggregated", "pivot"]
QUICK = ["experiment=quick", "train.prompts_per_step=16", "train.group_size=4",
         "models.sim.sweep_units=4", "models.sim.throughput_sample_s=1"]
COLORS = {"disaggregated": "#37c", "pivot": "#d52"}
ALLOC_COLORS = {"rollout": "#e9a", "reward": "#9c6", "train": "#fc6", "free": "#ddd"}


def rows_of(run_dir: Path, mode: str) -> list[dict]:
    rows = []
    for r in read_jsonl(run_dir / "timeline.jsonl"):
        if r.get("kind") != "throughput":
            continue
        a, al = r["actual"], r["allocation"]
        rows.append({"deploy": mode, "time_s": r["now"], "step": r["step"],
                     "model_rollout": r["rollout"], "model_reward": r["reward"], "model_overall": r["overall"],
                     "n_rollout": r["n_rollout"], "n_reward": r["n_reward"],
                     "actual_rollout": a["rollout"], "actual_reward": a["reward"],
                     "actual_total": r["actual_total"],
                     "alloc_rollout": al["rollout"], "alloc_reward": al["reward"], "alloc_train": al["train"],
                     "alloc_free": al["free"], "training": int(bool(r["training"]))})
    if not rows:
        raise RuntimeError(f"{run_dir}/timeline.jsonl has no throughput records "
                           f"(models.sim.throughput_sample_s=0?)")
    return rows


def collect(out: Path, quick: bool) -> list[dict]:
    base = QUICK if quick else ["experiment=fig10"]
    rows = []
    for m in MODES:
        run_dir = out / "runs" / m
        s = run_one([*base, f"deploy={m}"], run_dir)
        print(f"  {m:14s} {s['throughput_tokens_per_s']:9.0f} tok/s  allocation {s.get('allocation')}  "
              f"shift plans/step {s['shift_plans_per_step']:.1f} ({s['replica_shifts_per_step']:.1f} replica moves)")
        rows += rows_of(run_dir, m)
    return rows


def _intervals(ts: list[float], flags: list[bool]) -> list[tuple[float, float]]:
    """[start, end) spans where flags is true (a sample's flag holds until the next sample)."""
    out, start = [], None
    for i, (t, f) in enumerate(zip(ts, flags)):
        if f and start is None:
            start = t
        if not f and start is not None:
            out.append((start, t))
            start = None
    if start is not None:
        out.append((start, ts[-1]))
    return out


def plot(csv_path: Path, png_path: Path) -> None:
    rows = read_csv(csv_path)
    by = {m: [r for r in rows if r["deploy"] == m] for m in MODES}
    p = plt()
    fig, axes = p.subplots(4, 1, figsize=(10, 9.5), sharex=True,
                           gridspec_kw={"height_ratios": [1, 1, 1, 0.8]})
    panels = [("rollout", "actual_rollout", "model_rollout"), ("reward", "actual_reward", "model_reward"),
              ("overall (Eq. 1)", None, "model_overall")]
    for ax, (title, actual, model) in zip(axes, panels):
        for m, rs in by.items():
            if not rs:
                continue
            t = [float(r["time_s"]) for r in rs]
            if actual:
                ax.plot(t, [float(r[actual]) / 1e3 for r in rs], color=COLORS[m], lw=1.0, label=f"{m} (emitted)")
                ax.plot(t, [float(r[model]) / 1e3 for r in rs], color=COLORS[m], lw=0.8, ls=":",
                        label=f"{m} (planner's model)")
            else:
                ax.plot(t, [float(r[model]) / 1e3 for r in rs], color=COLORS[m], lw=1.0, label=m)
        ax.set_ylabel(f"{title}\nK tokens/s", fontsize=9)
        ax.grid(alpha=0.3)
    piv = by.get("pivot", [])
    if piv:
        t = [float(r["time_s"]) for r in piv]
        for ax in axes[:3]:
            for a, b in _intervals(t, [r["training"] == "1" for r in piv]):
                ax.axvspan(a, b, color=ALLOC_COLORS["train"], alpha=0.25, lw=0)
        keys = ["rollout", "reward", "train", "free"]
        axes[3].stackplot(t, *[[float(r[f"alloc_{k}"]) for r in piv] for k in keys], labels=keys,
                          colors=[ALLOC_COLORS[k] for k in keys], step="post")
        for a, b in zip(piv, piv[1:]):  # pivot's RL step boundaries (training steps may touch)
            if a["step"] != b["step"]:
                for ax in axes:
                    ax.axvline(float(b["time_s"]), color="#a60", lw=0.7, ls="--")
        changes = sum(1 for a, b in zip(piv, piv[1:])
                      if any(a[f"alloc_{k}"] != b[f"alloc_{k}"] for k in keys))
        axes[3].set_title(f"pivot allocation ({changes} changes between samples)", fontsize=9)
        axes[3].legend(fontsize=7, loc="upper right", ncol=4)
    dis = by.get("disaggregated", [])
    if dis:
        r0 = dis[0]
        axes[3].text(0.01, 0.04, f"disaggregated (static): {r0['alloc_rollout']} rollout / {r0['alloc_reward']} reward"
                     f" / {r0['alloc_train']} train", transform=axes[3].transAxes, fontsize=8)
    axes[3].set_ylabel("devices", fontsize=9)
    axes[3].set_xlabel("simulated time (s)")
    axes[0].legend(fontsize=7, ncol=2, loc="upper right")
    axes[2].legend(fontsize=7, loc="upper right")
    axes[0].set_title("Throughput over time, pivot vs disaggregated (shaded: pivot training; dashed: pivot step ends)", fontsize=10)
    save_figure(fig, png_path, dpi=110)


def main(argv=None) -> int:
    return item_main("fig10", __doc__, collect, plot, argv)


if __name__ == "__main__":
    sys.exit(main())
