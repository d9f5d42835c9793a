"""`python -m pivotrl.bench main_job [--seeds 0 1] [--runs N] [--json PATH] [OVERRIDES...]`: the main
job (`python train.py`, the embedded default) `--runs` times per seed, one run after the other, and
its two figures of issue 20: the run loop's seconds (target <= 150 on 2 cores, bootstrap cached) and
the held-out sampled accuracy gain in points (target >= +25 on each seed).

Each run is `train.py seed=S engine.seed=S` in its own process (`local_modes.run_mode`), its folder
under `--out`. Prints one row per run, then the mean, lowest and spread of each seed's gains and of
all runs together, beside the host's speed (`host.sft_step_cpu_s`, measured first), which sets a
run loop's seconds of one host against another's. A run's gain spreads by ±4-5 points around its
seed's mean (the asynchronous run's timing, and 2.5-3.5 points of sampling error in each held-out
accuracy), so one run per seed says little: BENCHMARKS.md gives the means.
"""
from __future__ import annotations

import datetime as _dt
import statistics
from pathlib import Path
from typing import Any

from pivotrl.bench.common import parser, print_table, write_json
from pivotrl.bench.local_modes import REPO, run_mode

TARGET_GAIN = 25.0
TARGET_RUN_LOOP_S = 150.0


def run_row(seed: int, run: int, row: dict[str, Any]) -> dict[str, Any]:
    """One run's printed row from `run_mode`'s: gain in points, None where the run failed."""
    before, after = row.get("val_acc_before"), row.get("val_acc_after")
    gain = None if before is None or after is None else round(100.0 * (after - before), 2)
    return {"seed": seed, "run": run, "run_loop_s": row.get("run_loop_s"), "acc_before": before,
            "acc_after": after, "gain_points": gain, "ok": "error" not in row and gain is not None}


def summary_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per seed (in order of first appearance) and over all runs: how many ran, the mean, lowest and
    standard deviation of the gains, the mean run loop, and whether the mean meets each target."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(f"seed {r['seed']}", []).append(r)
    if len(groups) > 1:
        groups["all"] = list(rows)
    out = []
    for name, rs in groups.items():
        ok = [r for r in rs if r["ok"]]
        gains = [r["gain_points"] for r in ok]
        loops = [r["run_loop_s"] for r in ok if r["run_loop_s"] is not None]
        mean = statistics.fmean(gains) if gains else None
        loop = statistics.fmean(loops) if loops else None
        out.append({"runs": name, "ok": f"{len(ok)}/{len(rs)}", "gain_mean": mean,
                    "gain_min": min(gains) if gains else None,
                    "gain_sd": statistics.stdev(gains) if len(gains) > 1 else None,
                    "run_loop_s_mean": loop,
                    "gain_target_met": mean is not None and mean >= TARGET_GAIN,
                    "run_loop_target_met": loop is not None and loop <= TARGET_RUN_LOOP_S})
    return out


def main(argv: list[str] | None = None) -> int:
    from pivotrl.bench.host import sft_step_cpu_s

    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds run (seed=S engine.seed=S)")
    p.add_argument("--runs", type=int, default=1, help="runs per seed")
    p.add_argument("--out", type=Path, default=None, help="parent folder of the run folders")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed per run")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    a = p.parse_args(argv)
    if a.runs < 1:
        p.error(f"--runs must be >= 1, got {a.runs}")
    if len(set(a.seeds)) != len(a.seeds):
        p.error(f"--seeds must not repeat a seed, got {a.seeds}")
    out = a.out or REPO / "outputs" / "main_job" / _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    host = sft_step_cpu_s(10)
    print(f"[main_job] host speed: {host:.3f} CPU-s per GenRM SFT step (python -m pivotrl.bench host)", flush=True)
    rows = []
    for seed in a.seeds:
        for i in range(a.runs):
            print(f"[main_job] seed {seed}, run {i + 1}/{a.runs} ...", flush=True)
            raw = run_mode("pivot", out / f"seed{seed}_run{i + 1}", None,
                           [f"seed={seed}", f"engine.seed={seed}", *a.overrides], a.timeout)
            if "error" in raw:
                print(f"[main_job] seed {seed} run {i + 1} FAILED (rc={raw['rc']}):\n{raw['error']}", flush=True)
            rows.append(run_row(seed, i + 1, raw))
    print_table(rows, title="main job runs (python train.py)")
    summary = summary_rows(rows)
    print_table(summary, title=f"by seed (targets: gain >= +{TARGET_GAIN:g} points, run loop <= "
                               f"{TARGET_RUN_LOOP_S:g} s; host {host:.3f} CPU-s per SFT step)")
    write_json(a.json, "main_job", rows, summary=summary, host_sft_step_cpu_s=host, out=str(out))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
