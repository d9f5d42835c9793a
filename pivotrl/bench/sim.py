"""`python -m pivotrl.bench sim --json PATH`: the paper's Fig. 9 grid in the simulator.

Runs 4 model groups x 4 deployment modes (pivot twice: with Table 4's training home set, and with
the best home set on the sweep grid) (>= 5 measured steps after a warm-up step, the groups'
simulated batch), each baseline at its best static allocation found by the sweep
(`pivotrl/sim/sweep.py`, cached by config hash), and also at the paper's Table 4 allocation. Prints
throughput per mode, the pivot/colocated and pivot/disaggregated ratios, ideal_efficiency per mode,
and the benchmark's own wall time and peak memory (targets: <= 10 min, <= 2 GB on 2 cores).
`--fresh` sweeps into an empty cache (cold timing); the default reuses the cache.
"""
from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from pivotrl.bench.common import parser, print_table, write_json

GROUPS = ["qwen1.5b_glm9b", "qwen7b_qwen30b", "qwen32b_qwen30b", "qwen72b_qwen122b"]
MODES = ["colocated", "disaggregated", "rr_colocated", "pivot"]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def run_cell(group: str, mode: str, steps: int, cache: Path, extra: list[str], jobs: int = 1,
             label: str | None = None) -> dict[str, Any]:
    from pivotrl.config import compose_config
    from pivotrl.core.types import Role
    from pivotrl.sim.runtime import simulate
    from pivotrl.sim.sweep import paper_allocation, resolve_allocation

    cfg = compose_config(["cluster=sim", f"models={group}", f"deploy={mode}", f"train.steps={steps}",
                          "logging.wandb_mode=disabled", "logging.progress=false", *extra])
    t0 = time.perf_counter()
    alloc, info = resolve_allocation(cfg, cache_dir=cache, jobs=jobs)
    t_sweep = time.perf_counter() - t0
    s = simulate(cfg, alloc)
    row = {"group": group, "mode": label or mode, "allocation": info.get("allocation") or info.get("train_home", "all"),
           "tokens_per_s": s["throughput_tokens_per_s"], "ideal_eff": s["ideal_efficiency"],
           "shift_plans_per_step": s["shift_plans_per_step"], "below20": s["below_20pct_fraction"],
           "step_s": s["measured_time_s"] / max(s["measured_steps"], 1),
           "sweep_s": t_sweep, "sweep_runs": info.get("sweep_runs", 0), "sim_wall_s": s["wall_s"]}
    paper = paper_allocation(cfg)
    if paper is not None and mode != "pivot":
        key = f"{paper[Role.ROLLOUT]}/{paper[Role.REWARD]}/{paper[Role.TRAIN]}"
        if key == row["allocation"]:
            row["paper_alloc_tokens_per_s"] = row["tokens_per_s"]
        else:
            row["paper_alloc_tokens_per_s"] = simulate(cfg, paper)["throughput_tokens_per_s"]
    row["_summary"] = s
    return row


def main(argv: list[str]) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--groups", nargs="*", default=GROUPS)
    p.add_argument("--modes", nargs="*", default=MODES)
    p.add_argument("--steps", type=int, default=7,
                   help="RL steps per run, warm-up (1) included; 7 = 6 measured = two whole staleness-2 cycles")
    p.add_argument("--fresh", action="store_true", help="sweep into an empty cache (cold timing)")
    p.add_argument("--cache-dir", type=Path, default=None)
    p.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides for every run")
    p.add_argument("--pivot-home", choices=["paper", "sweep", "both"], default="both",
                   help="pivot's training home set: Table 4's, the best on the sweep grid, or both rows")
    p.add_argument("--jobs", type=int, default=1, help="processes for allocation sweeps")
    a = p.parse_args(argv)
    from pivotrl.sim.sweep import default_cache_dir

    cache = Path(tempfile.mkdtemp(prefix="pivotrl_sweep_")) if a.fresh else (a.cache_dir or default_cache_dir())
    wall0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    cells: list[tuple[str, str, list[str], str]] = []
    for g in a.groups:
        for m in a.modes:
            if m != "pivot":
                cells.append((g, m, [], m))
                continue
            if a.pivot_home in ("paper", "both"):
                cells.append((g, m, ["models.sim.pivot_home=paper"], "pivot"))
            if a.pivot_home in ("sweep", "both"):
                cells.append((g, m, ["models.sim.pivot_home=sweep"], "pivot_swept_home"))
    for g, m, ov, label in cells:
        r = run_cell(g, m, a.steps, cache, [*ov, *a.override], a.jobs, label)
        rows.append(r)
        print(f"  {g:17s} {label:16s} {r['tokens_per_s']:10.0f} tok/s  eff {r['ideal_eff']:.3f}  "
              f"alloc {r['allocation']}  ({time.perf_counter() - wall0:.0f}s)", flush=True)
    wall = time.perf_counter() - wall0
    table, ratios = [], []
    for g in a.groups:
        by = {r["mode"]: r for r in rows if r["group"] == g}
        for r in by.values():
            table.append({k: v for k, v in r.items() if not k.startswith("_")})
        for pv in ("pivot", "pivot_swept_home"):
            if pv not in by:
                continue
            piv = by[pv]["tokens_per_s"]
            rr = {"group": g, "pivot": f"{pv} ({by[pv]['allocation']})"}
            for base in ("colocated", "disaggregated", "rr_colocated"):
                if base in by and by[base]["tokens_per_s"] > 0:
                    rr[f"/{base}"] = piv / by[base]["tokens_per_s"]
                    pa = by[base].get("paper_alloc_tokens_per_s")
                    if pa:
                        rr[f"/{base}@table4"] = piv / pa
            ratios.append(rr)
    print_table(table, "Fig. 9 grid (simulated H20 cluster)")
    print()
    print_table(ratios, "speed-up of pivot over each baseline (baselines at their best swept allocation; "
                        "@table4 = at the paper's Table 4 allocation)")
    mem = peak_rss_mb()
    print(f"\nwall {wall:.1f} s, peak RSS {mem:.0f} MB, cache {cache}")
    write_json(a.json, "sim", table, ratios=ratios, wall_s=wall, peak_rss_mb=mem, steps=a.steps,
               fresh_cache=a.fresh, overrides=a.override,
               summaries=[{"group": r["group"], "mode": r["mode"], **r["_summary"]} for r in rows])
    return 0
