"""Fig. 14: sensitivity to the horizon H: throughput and shifts per step, qwen7b_qwen30b (a
prediction: nothing is fitted to it). The paper's axes and shape are in
`artifact/expected/fig14.json`: throughput 21-23K tokens/s, rising from H=0.01 and falling at
H=600; shifts per step 4-6, growing with H. A shift is the paper's unit, one executed shift plan
(a shift-down set and a shift-up set, §3 C3 and §7); the replica moves it makes are reported beside
it. `python -m artifact.fig14.run [--quick]`."""
from __future__ import annotations

import sys

from artifact.common import item_main, plt, read_csv, run_one, save_figure

HORIZONS = [0.01, 5, 30, 60, 90, 120, 600]


def collect(out, quick: bool) -> list[dict]:
    hs = [0.01, 60, 600] if quick else HORIZONS
    base = ["experiment=quick", "models=qwen1.5b_glm9b"] if quick else ["experiment=fig14"]
    rows = []
    for h in hs:
        s = run_one([*base, "deploy=pivot", f"deploy.planner.horizon_s={h}"], out / "runs" / f"H{h}")
        rows.append({"horizon_s": h, "throughput_tokens_per_s": s["throughput_tokens_per_s"],
                     "shifts_per_step": s["shift_plans_per_step"],
                     "replica_moves_per_step": s["replica_shifts_per_step"]})
    return rows


def plot(csv_path, png_path) -> None:
    rows = read_csv(csv_path)
    xs = [str(r["horizon_s"]) for r in rows]
    p = plt()
    fig, ax = p.subplots(figsize=(5.5, 3.4))
    ax.bar(xs, [float(r["throughput_tokens_per_s"]) for r in rows], color="#2a7")
    ax.set_xlabel("H (s)")
    ax.set_ylabel("tokens / s")
    ax2 = ax.twinx()
    ax2.plot(xs, [float(r["shifts_per_step"]) for r in rows], "o-", color="#c33")
    ax2.set_ylabel("shifts (plans) per step", color="#c33")
    ax2.set_ylim(bottom=0)
    ax.set_title("Sensitivity to H")
    save_figure(fig, png_path)


def main(argv=None) -> int:
    return item_main("fig14", __doc__, collect, plot, argv)


if __name__ == "__main__":
    sys.exit(main())
