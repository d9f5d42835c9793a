"""Chaos soak: the default `cluster=local` pivot run with a device killed every N seconds, in every
phase of the device loop, beside an unkilled run of the same seed.

`python -m pivotrl.bench chaos [--json PATH] [--every-s N | --every-points N] [--phases submit,poll,...]
[--seed S] [--max-restarts R] [--no-baseline] [--out DIR] [-o key=value ...]`

Owns `soak(overrides, run_dir, chaos)` (one soaked run, resumed after every stop) and `account`
(what the run folder says happened). The kills come from `runtime.faults.Chaos`: every `--every-s`
seconds (or every `--every-points` fault points, whatever the run's speed) it kills the device that
reaches the next phase of the cycle (`--phases`, default all of `faults.PHASES`: submit, poll, shift
down and up, training, checkpoint, weight load, a lent training home, re-host) right there in the
loop. A device that dies in a training step (or while its checkpoint is written) stops the run with
how to resume (the documented behaviour), so the soak resumes it (`train.resume=true`, same folder;
`train.allow_fresh_start=true`: a stop before the first checkpoint completed starts over), at most
`--max-restarts` times. The crash-loop rule is set out of the way (`cluster.max_respawns`,
`cluster.respawn_window_s`: `NO_RETIRE`), so no device leaves the pool by design; any that does is
reported (`lost_devices`).

Reported (table and JSON): kills fired (by phase) and passed over, device deaths the runtime
recorded and respawns, restarts (resumes), steps completed out of `train.steps`, samples lost (a
step's batch trained short, or a step never trained) and samples trained twice (target 0 and 0),
the steps a resume trained again (their first training was discarded with the policy it made:
`metrics.superseded.jsonl`), held-out accuracy before and after against the unkilled run, and
wall time.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from pivotrl.bench.common import parser, print_table, write_json

log = logging.getLogger(__name__)

#: the crash-loop rule, set so a soak never retires a device by design
NO_RETIRE = ["cluster.max_respawns=1000000", "cluster.respawn_window_s=1"]
#: the default run (`python train.py`): cluster=local, the tiny models, pivot
DEFAULT = ["cluster=local", "models=tiny", "deploy=pivot", "logging.wandb_mode=disabled", "logging.progress=false"]


def _compose(overrides: list[str]) -> Any:
    from pivotrl.config import compose_config

    return compose_config(overrides)


def soak(overrides: list[str], run_dir: Path, chaos: Any | None, max_restarts: int = 10) -> dict[str, Any]:
    """Run `overrides` into `run_dir` with `chaos` (a `faults.Chaos`, or None for the unkilled run)
    as the fault hook; resume after a stop that says how (`train.resume=true`). Returns
    `{"summary", "stops": [error text], "wall_s"}`."""
    from pivotrl.run import run
    from pivotrl.runtime import faults

    stops: list[str] = []
    t0 = time.perf_counter()
    faults.set_hook(chaos)
    try:
        while True:
            # a stop before the first checkpoint is complete leaves nothing to resume: start over there
            cfg = _compose([*overrides, *(["train.resume=true", "train.allow_fresh_start=true"] if stops else [])])
            try:
                summary = run(cfg, run_dir)
                break
            except RuntimeError as e:
                if "train.resume=true" not in str(e) or len(stops) >= max_restarts:
                    raise
                stops.append(str(e).split("\n")[0][:300])
                log.warning("chaos soak: the run stopped (%s); resuming (%d/%d)", stops[-1], len(stops), max_restarts)
    finally:
        faults.set_hook(None)
    return {"summary": summary, "stops": stops, "wall_s": time.perf_counter() - t0}


def _rows(path: Path) -> list[dict[str, Any]]:
    from pivotrl.report.records import read_jsonl

    return read_jsonl(path)[0]


def account(run_dir: Path, summary: dict[str, Any], steps: int, batch: int) -> dict[str, Any]:
    """What the folder's records say of a (soaked) run of `steps` steps of `batch` samples each."""
    rows = _rows(run_dir / "metrics.jsonl")
    timeline = _rows(run_dir / "timeline.superseded.jsonl") + _rows(run_dir / "timeline.jsonl")
    done = {int(r["step"]): r for r in rows}
    batches = [int(r["batch"]) for r in rows]
    short = sum(max(0, batch - int(r.get("samples", batch))) for r in rows)
    missing = [s for s in range(1, steps + 1) if s not in done]
    deaths = [r for r in timeline if r.get("kind") == "device_death"]
    return {
        "steps_completed": len(done),
        "policy_version": summary.get("policy_version"),
        "samples_lost": short + batch * len(missing),
        # a batch trained twice in the policy's history, or a repeat within a run's own step
        "samples_trained_twice": batch * (len(batches) - len(set(batches)))
        + int(summary.get("samples_trained", 0)) - int(summary.get("samples_trained_unique", 0)),
        "steps_redone_after_resume": len(_rows(run_dir / "metrics.superseded.jsonl")),
        "device_deaths": len(deaths),
        "respawns": len(deaths),  # every recorded death is respawned once (runtime/stats.py)
        "lost_devices": summary.get("lost_devices", []),
        # a resumed run measures "before" at its resume: the run's own start is then unknown here
        "val_accuracy_before": None if any(r.get("kind") == "resume" for r in timeline)
        else summary.get("val_accuracy_before"),
        "val_accuracy_after": summary.get("val_accuracy_after"),
        "val_accuracy_greedy_after": summary.get("val_accuracy_greedy_after"),
    }


def main(argv: list[str]) -> int:
    from pivotrl.config.resolve import resolve
    from pivotrl.runtime.faults import PHASES, Chaos

    ap = parser(__doc__.splitlines()[0])
    every = ap.add_mutually_exclusive_group()
    every.add_argument("--every-s", type=float, default=20.0, help="seconds between kills")
    every.add_argument("--every-points", type=int, default=None,
                       help="fault points between kills instead (any phase, any device)")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"phases to cycle through (of {', '.join(PHASES)})")
    ap.add_argument("--seed", type=int, default=0, help="the run's seed (both runs) and the chaos draws")
    ap.add_argument("--max-restarts", type=int, default=10)
    ap.add_argument("--no-baseline", action="store_true", help="skip the unkilled run")
    ap.add_argument("--out", type=Path, default=None, help="folder for the two run folders (default: a temp dir)")
    ap.add_argument("-o", "--override", action="append", default=[], help="a config override (repeatable)")
    args = ap.parse_args(argv)
    import tempfile

    out = args.out or Path(tempfile.mkdtemp(prefix="pivotrl_chaos_"))
    overrides = [*DEFAULT, f"seed={args.seed}", *args.override]
    r = resolve(_compose(overrides))
    every, unit = (args.every_points, "points") if args.every_points is not None else (args.every_s, "s")
    chaos = Chaos(every, tuple(p for p in args.phases.split(",") if p), seed=args.seed, unit=unit)
    got = soak([*overrides, *NO_RETIRE], out / "chaos", chaos, args.max_restarts)
    soaked = account(out / "chaos", got["summary"], r.steps, r.prompts_per_step * r.group_size)
    kills: dict[str, int] = {}
    for k in chaos.fired:
        kills[k["phase"]] = kills.get(k["phase"], 0) + 1
    rows = [{"run": "chaos", **{k: v for k, v in soaked.items() if k != "lost_devices"},
             "kills": len(chaos.fired), "restarts": len(got["stops"]), "lost_devices": len(soaked["lost_devices"]),
             "wall_s": got["wall_s"]}]
    if not args.no_baseline:
        base = soak(overrides, out / "baseline", None)
        rows.append({"run": "unkilled", **{k: v for k, v in account(out / "baseline", base["summary"], r.steps,
                                                                     r.prompts_per_step * r.group_size).items()
                                           if k != "lost_devices"},
                     "kills": 0, "restarts": 0, "lost_devices": 0, "wall_s": base["wall_s"]})
    print_table(rows, f"chaos soak: a device killed every {every:g} {unit} ({out})")
    print(f"kills by phase: {json.dumps(kills)}; passed over: {json.dumps(chaos.missed)}")
    for s in got["stops"]:
        print(f"stopped and resumed: {s}")
    write_json(args.json, "chaos", rows, kills=chaos.fired, kills_by_phase=kills, passed_over=chaos.missed,
               stops=got["stops"], every=every, unit=unit, overrides=overrides, out=str(out))
    return 0
