"""Single-point checks of the fitted model: every mode at the paper's Table 4 allocation, beside the
paper's Fig. 9 figure, with the stage seconds of a mean measured step (a diagnosis, never a fit).

`python -m artifact.calibrate.points [--groups G ...] [--modes M ...] [--json out.json] [--override O ...]`

`--override` takes Hydra overrides for every run (e.g. `cluster.hardware.mfu=0.41` or
`models.sim.phase_switch=shift`: what docs/benchmarks-history.md's "Refit with verl's baseline costs" tables
used). "paper step" is the run's tokens per step over the paper's tokens/s: the step time the
paper's figure implies for the simulated workload. Pivot's row is a prediction, as everywhere.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from artifact.calibrate.run import EXPECTED, GROUPS, overrides

MODES = ["colocated", "disaggregated", "rr_colocated", "pivot"]


def point(group: str, mode: str, extra: list[str]) -> dict[str, Any]:
    """One simulated run of `mode` at Table 4 (colocated: every device) with its stage seconds."""
    from pivotrl.config import compose_config
    from pivotrl.sim.runtime import SimDriver, SimSetup
    from pivotrl.sim.sweep import paper_allocation

    cfg = compose_config([*overrides(group, mode, {}), *extra])
    rt = SimDriver(SimSetup.from_config(cfg, paper_allocation(cfg) if mode != "colocated" else {}))
    s = rt.run()
    rows = rt.rec.rows[rt.s.warmup:] or rt.rec.rows
    mean = {k: statistics.mean(float(r[k]) for r in rows)
            for k in ("step_time_s", "rollout_s", "reward_s", "train_s", "tokens")}
    paper = json.loads(EXPECTED.read_text())["tokens_per_s"][group][mode]
    papers = paper if isinstance(paper, list) else [paper]  # 1.5b's unordered pair: both
    tps = float(s["throughput_tokens_per_s"])
    return {"models": group, "deploy": mode, "sim_tokens_per_s": round(tps),
            "paper_tokens_per_s": paper, "ratio": [round(tps / p, 3) for p in papers],
            "step_s": round(mean["step_time_s"], 1), "rollout_s": round(mean["rollout_s"], 1),
            "reward_s": round(mean["reward_s"], 1), "train_s": round(mean["train_s"], 1),
            "tokens_per_step": round(mean["tokens"]),
            "paper_step_s": [round(mean["tokens"] / p, 1) for p in papers],
            "kv_preemptions": int(s["kv_preemptions"])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", nargs="*", default=GROUPS)
    p.add_argument("--modes", nargs="*", default=MODES, choices=MODES)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--override", nargs="*", default=[], help="Hydra overrides for every run")
    args = p.parse_args(argv)
    rows = []
    for g in args.groups:
        for m in args.modes:
            r = point(g, m, args.override)
            rows.append(r)
            print(f"{g:18s} {m:14s} {r['sim_tokens_per_s']:>8,} tok/s x{'/'.join(map(str, r['ratio']))}  "
                  f"step {r['step_s']:.0f} s (paper {'/'.join(f'{x:.0f}' for x in r['paper_step_s'])})  "
                  f"rollout {r['rollout_s']:.0f} reward {r['reward_s']:.0f} train {r['train_s']:.0f}  "
                  f"preemptions {r['kv_preemptions']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"overrides": args.override, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
