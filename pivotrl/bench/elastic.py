"""`python -m pivotrl.bench elastic --json PATH`: elastic training in the simulator, the paper groups.

For each model group: disaggregated at its best swept allocation (the baseline the paper's Fig. 9
compares with, `pivotrl/sim/sweep.py`), pivot with Table 4's training home set, and the same pivot
with `deploy.planner.elastic_training=true` (DESIGN §4.6). Prints tokens/s, ideal efficiency, the
training world sizes the elastic run used per step, and the ratios elastic/disaggregated and
elastic/pivot; "training binds" marks the groups whose pivot trainer is busy >= 90 % of the time
on its home set, the ones elastic training is for (issue 23's target there: >= 1.2x the best swept
disaggregated).
`--fresh` sweeps into an empty cache (the sweep cache is keyed by the config, not the code: after a
change to the simulator's physics, sweep fresh).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from pivotrl.bench.common import parser, print_table, write_json
from pivotrl.bench.sim import GROUPS, peak_rss_mb, run_cell

ELASTIC = "deploy.planner.elastic_training=true"


class StepRows:
    """A tracker keeping the metrics rows (the training world of each step) and nothing else."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def log_step(self, metrics: dict[str, Any]) -> None:
        self.rows.append(metrics)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def training_binds(pivot_cell: dict[str, Any]) -> bool:
    """Whether pivot's trainer, on its home set, was busy for >= 90 % of the measured time (the
    runs elastic training is for: nothing the planner does with inference devices helps them)."""
    s = pivot_cell["_summary"]
    home = float(pivot_cell["allocation"]) if str(pivot_cell["allocation"]).isdigit() else 0.0
    return home > 0 and s["busy_fraction"]["train"] * s["devices"] / home >= 0.9


def elastic_cell(group: str, steps: int, cache: Path, extra: list[str], jobs: int) -> dict[str, Any]:
    """`run_cell`'s row of pivot with elastic training, and the training world of every step."""
    from pivotrl.config import compose_config
    from pivotrl.sim.runtime import simulate
    from pivotrl.sim.sweep import resolve_allocation

    cfg = compose_config(["cluster=sim", f"models={group}", "deploy=pivot", f"train.steps={steps}",
                          "logging.wandb_mode=disabled", "logging.progress=false", "models.sim.pivot_home=paper",
                          ELASTIC, *extra])
    alloc, info = resolve_allocation(cfg, cache_dir=cache, jobs=jobs)
    t = StepRows()
    s = simulate(cfg, alloc, tracker=t)
    return {"tokens_per_s": s["throughput_tokens_per_s"], "ideal_eff": s["ideal_efficiency"],
            "allocation": info.get("train_home", "?"), "worlds": [int(r["train_world"]) for r in t.rows],
            "_summary": s}


def main(argv: list[str]) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--groups", nargs="*", default=GROUPS)
    p.add_argument("--steps", type=int, default=7, help="RL steps per run, warm-up (1) included")
    p.add_argument("--fresh", action="store_true", help="sweep into an empty cache")
    p.add_argument("--cache-dir", type=Path, default=None)
    p.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides for every run")
    p.add_argument("--jobs", type=int, default=1, help="processes for the allocation sweeps")
    a = p.parse_args(argv)
    from pivotrl.sim.sweep import default_cache_dir

    cache = Path(tempfile.mkdtemp(prefix="pivotrl_sweep_")) if a.fresh else (a.cache_dir or default_cache_dir())
    wall0 = time.perf_counter()
    table: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    for g in a.groups:
        cells = {"disaggregated": run_cell(g, "disaggregated", a.steps, cache, list(a.override), a.jobs),
                 "pivot": run_cell(g, "pivot", a.steps, cache, ["models.sim.pivot_home=paper", *a.override], a.jobs),
                 "pivot+elastic": elastic_cell(g, a.steps, cache, list(a.override), a.jobs)}
        dis, piv, el = (cells[k]["tokens_per_s"] for k in ("disaggregated", "pivot", "pivot+elastic"))
        worlds = cells["pivot+elastic"]["worlds"]
        table.append({"group": g, "disagg alloc": cells["disaggregated"]["allocation"], "disagg tok/s": dis,
                      "pivot tok/s": piv, "elastic tok/s": el, "elastic/disagg": el / dis if dis else 0.0,
                      "elastic/pivot": el / piv if piv else 0.0, "pivot/disagg": piv / dis if dis else 0.0,
                      "training binds": training_binds(cells["pivot"]),
                      "eff disagg/pivot/elastic": "/".join(f"{cells[k]['ideal_eff']:.2f}" for k in cells),
                      "home": cells["pivot"]["allocation"], "elastic worlds": worlds})
        summaries += [{"group": g, "mode": k, **c["_summary"]} for k, c in cells.items()]
        print(f"  {g:17s} disagg {dis:9.0f}  pivot {piv:9.0f}  elastic {el:9.0f} tok/s  "
              f"({time.perf_counter() - wall0:.0f}s)", flush=True)
    wall = time.perf_counter() - wall0
    print_table([{k: v for k, v in r.items() if k != "elastic worlds"} for r in table],
                "elastic training in the simulator (disaggregated at its best swept allocation; pivot at Table 4's home set)")
    for r in table:
        print(f"  {r['group']}: training world per step {r['elastic worlds']}")
    mem = peak_rss_mb()
    print(f"\nwall {wall:.1f} s, peak RSS {mem:.0f} MB, cache {cache}")
    write_json(a.json, "elastic", table, wall_s=wall, peak_rss_mb=mem, steps=a.steps, fresh_cache=a.fresh,
               overrides=a.override, summaries=summaries)
    return 0
