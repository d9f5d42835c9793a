"""The simulator's shift counts: a shift plan (the paper's unit of a "shift", Fig. 14) is counted
once however many replicas it moves; replica moves are counted per replica shifted up or down."""
from __future__ import annotations

from pivotrl.deploy.events import StartShift, StepDone
from tests.sim.test_runtime import ALLOC, SMALL, run_recorded


def test_plans_and_replica_moves_per_measured_step(make_cfg):
    cfg = make_cfg("models=qwen7b_qwen30b", "deploy=pivot", *SMALL)
    rt, summary, acts = run_recorded(cfg, ALLOC["pivot"])
    steps = [a for a in acts if isinstance(a, StepDone)]
    warm_end = next(i for i, a in enumerate(acts) if isinstance(a, StepDone) and a.step == rt.s.warmup)
    measured = [a for a in acts[warm_end + 1:] if isinstance(a, StartShift)]
    n_meas = len(steps) - rt.s.warmup
    plans = len(measured)
    moves = sum(len(a.plan.up) + len(a.plan.down) for a in measured)
    assert plans > 0
    assert summary["shift_plans_per_step"] == plans / n_meas
    assert summary["replica_shifts_per_step"] == moves / n_meas
    # whole run: every StartShift counted, each replica of it once
    every = [a for a in acts if isinstance(a, StartShift)]
    assert summary["num_shifts"] == sum(len(a.plan.up) + len(a.plan.down) for a in every)
    assert any(len(a.plan.up) + len(a.plan.down) > 1 for a in every)  # so the two counts differ here
    assert summary["shift_plans_per_step"] < summary["replica_shifts_per_step"]
