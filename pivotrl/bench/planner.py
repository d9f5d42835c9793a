"""Planner decision time by step (paper Table 2), 16..1024 devices, >= 64 live sequences per replica.

`python -m pivotrl.bench planner [--json PATH] [--devices 16,32,...] [--repeats R] [--evaluation E]`

Owns `synthetic_view` (a reproducible mid-step cluster snapshot: real schedulers filled with real
sequences, the shape of the paper's Fig. 8 example) and `planner_breakdown(num_devices, ...)`, the
function the Table 2 artifact calls. Scenarios:
  * `reward_up`: rollout (tp 1) on the first half, reward (tp `reward_tp`) on the third quarter with a
    deep queue, idle training holding the last quarter: reward shifts up, with the idle-training pair
    (phi 0) and pairs that shift rollout replicas down;
  * `rollout_up`: rollout on the first quarter with a deep queue, reward on the middle half, idle
    training on the last quarter: rollout (tp 1) shifts up, so candidates are many (K = 3/4 of the
    devices).
Every active replica runs `seqs_per_replica` sequences (default 64) with lognormal lengths; the
queued role has as many again waiting. Times are wall-clock medians / p90 over `repeats` decisions;
`total_cpu_ms_*` is this process's CPU time, the figure to trust on a shared, overloaded machine.
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Any

from pivotrl.bench.common import parser, print_table, write_json
from pivotrl.config.planner import PivotPlannerConfig
from pivotrl.core.planner import ClusterView, PivotPlanner, TrainView
from pivotrl.core.scheduler import ShiftAwareScheduler
from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import Role, Sequence, Slot

# calibration.md §3, H20: Qwen2.5-7B (tp1) rollout and Qwen3-30B-A3B (tp4, MoE floor) reward
ROLLOUT_MODEL = ThroughputModel(A=3.2e-8, B=10.9e-3, C=0.139e-3, D=1.4e-3)
REWARD_MODEL = ThroughputModel(A=1.4e-8, B=43.6e-3 / 4, C=0.094e-3 / 4, D=1.4e-3 + 2 * 48 * 20e-6,
                               moe_floor=0.0483, moe_k_over_e=8 / 128)
KV_CAPACITY = {Role.ROLLOUT: 1_300_000, Role.REWARD: 2_400_000}
STEPS = ("role", "pairs", "dp", "evaluate", "select")


def synthetic_view(num_devices: int, scenario: str = "reward_up", seqs_per_replica: int = 64,
                   rollout_tp: int = 1, reward_tp: int = 4, node_size: int = 8, seed: int = 0) -> ClusterView:
    """A reproducible cluster snapshot for planner benchmarks and tests (see the module docstring)."""
    if scenario not in ("reward_up", "rollout_up"):
        raise ValueError(f"scenario={scenario!r}: allowed values are 'reward_up', 'rollout_up'")
    if num_devices % (4 * max(rollout_tp, reward_tp)):
        raise ValueError(f"num_devices={num_devices} must be a multiple of 4*max(tp)")
    rng = random.Random(seed)
    q = num_devices // 4
    if scenario == "reward_up":
        ranges = {Role.ROLLOUT: (0, 2 * q), Role.REWARD: (2 * q, 3 * q)}
        deep = Role.REWARD
    else:
        ranges = {Role.ROLLOUT: (0, q), Role.REWARD: (q, 3 * q)}
        deep = Role.ROLLOUT
    tp = {Role.ROLLOUT: rollout_tp, Role.REWARD: reward_tp}
    models = {Role.ROLLOUT: ROLLOUT_MODEL, Role.REWARD: REWARD_MODEL}
    owner: list[Role | None] = [None] * num_devices
    active: dict[Role, list[Slot]] = {}
    scheds: dict[Role, ShiftAwareScheduler] = {}
    sid = 0
    for role, (lo, hi) in ranges.items():
        slots = [Slot(role, d, tp[role]) for d in range(lo, hi, tp[role])]
        active[role] = slots
        for s in slots:
            for d in s.devices:
                owner[d] = role
        sch = ShiftAwareScheduler(role, models[role])
        sch.add_replicas([(s.slot_id, KV_CAPACITY[role]) for s in slots])
        n_seqs = len(slots) * seqs_per_replica * (2 if role == deep else 1)
        batch = []
        for _ in range(n_seqs):
            prompt = min(2048, int(rng.lognormvariate(5.0, 0.5))) + (1500 if role == Role.REWARD else 0)
            gen = min(15000, int(rng.lognormvariate(6.5, 1.0)))
            batch.append(Sequence(sid, role, prompt, generated=gen))
            sid += 1
        sch.submit(batch[: len(slots) * seqs_per_replica])
        sch.dispatch()
        # the deep role's extra sequences wait in the queue (more than the free KV holds)
        sch.submit(batch[len(slots) * seqs_per_replica:])
        scheds[role] = sch
    home = tuple(range(3 * q, num_devices))
    for d in home:
        owner[d] = Role.TRAIN
    return ClusterView(now=0.0, num_devices=num_devices, node_size=node_size, tp=tp, owner=owner,
                       active=active, schedulers=scheds,
                       train=TrainView(home=home, holds_devices=True, running=False, batch_ready=False),
                       tau_shift={Role.ROLLOUT: 2.0, Role.REWARD: 9.0}, kv_capacity=dict(KV_CAPACITY))


def planner_breakdown(num_devices: int, scenario: str = "reward_up", repeats: int = 5,
                      evaluation: str = "summary", migration: bool = True, seqs_per_replica: int = 64,
                      seed: int = 0) -> dict[str, Any]:
    """Time `repeats` full decisions on `synthetic_view(num_devices, scenario)`; per step and in
    total, median and p90 in milliseconds. The Table 2 artifact calls this."""
    view = synthetic_view(num_devices, scenario, seqs_per_replica=seqs_per_replica, seed=seed)
    planner = PivotPlanner(PivotPlannerConfig(evaluation=evaluation, migration=migration))
    per_step: dict[str, list[float]] = {s: [] for s in STEPS}
    totals: list[float] = []
    cpu: list[float] = []
    decision = None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        decision = planner.decide(view)
        totals.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)  # this process's CPU: robust to a shared machine
        for s in STEPS:
            per_step[s].append(decision.timings.get(s, 0.0))
    assert decision is not None

    def q(xs: list[float], p: float) -> float:
        xs = sorted(xs)
        return 1e3 * xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]

    out: dict[str, Any] = {
        "devices": num_devices, "scenario": scenario, "evaluation": evaluation,
        "live_seqs": sum(s.num_sequences() - s.queued() for s in view.schedulers.values()),
        "queued": sum(s.queued() for s in view.schedulers.values()),
        "candidates": len(decision.candidates),
        "chosen_k": next((c.k for c in decision.candidates if c.plan is decision.chosen), 0),
        "total_ms_median": 1e3 * statistics.median(totals), "total_ms_p90": q(totals, 0.9),
        "total_cpu_ms_median": 1e3 * statistics.median(cpu), "total_cpu_ms_p90": q(cpu, 0.9),
    }
    for s in STEPS:
        out[f"{s}_ms_median"] = 1e3 * statistics.median(per_step[s])
        out[f"{s}_ms_p90"] = q(per_step[s], 0.9)
    return out


def main(argv: list[str]) -> int:
    p = parser("planner decision time by step (Table 2)")
    p.add_argument("--devices", default="16,32,64,128,256,512,1024")
    p.add_argument("--scenarios", default="reward_up,rollout_up")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--evaluation", default="summary", help="summary | migrate | both")
    p.add_argument("--migrate-max-devices", type=int, default=128,
                   help="skip evaluation=migrate above this many devices (it is slow)")
    a = p.parse_args(argv)
    evals = ["summary", "migrate"] if a.evaluation == "both" else [a.evaluation]
    rows = []
    for ev in evals:
        for sc in a.scenarios.split(","):
            for n in (int(x) for x in a.devices.split(",")):
                if ev == "migrate" and n > a.migrate_max_devices:
                    continue
                r = planner_breakdown(n, sc, repeats=a.repeats if ev == "summary" else max(1, min(a.repeats, 3)),
                                      evaluation=ev)
                rows.append({k: r[k] for k in ("evaluation", "scenario", "devices", "live_seqs", "queued",
                                               "candidates", "chosen_k", "total_ms_median", "total_ms_p90", "total_cpu_ms_median",
                                               *(f"{s}_ms_median" for s in STEPS))})
                print(f"  {ev} {sc} {n}: {r['total_ms_median']:.1f} ms", flush=True)
    print_table(rows, "planner decision time (ms)")
    write_json(a.json, "planner", rows)
    return 0
