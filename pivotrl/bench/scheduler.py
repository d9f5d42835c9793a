"""Shift-aware scheduler speed: dispatch microseconds per sequence at 8..128 replicas, and the
wall time of shift-down (Alg. 3) and shift-up (Alg. 4) migration.

`python -m pivotrl.bench scheduler [--json PATH] [--replicas 8,16,32,64,128] [--seqs-per-replica 64]`

Setup per replica count R: a rollout scheduler (Qwen2.5-7B on H20 constants, calibration.md §3)
with R replicas of 1.3M KV tokens; R*64 sequences with lognormal lengths are submitted and
dispatched in one call (dispatch us/seq = that call's time / sequences). Then R/4 new replicas
shift up with migration (moves and ms reported), and R/4 replicas shift down.

With `--max-num-seqs M` (default 32, below the 64 per replica, so half the sequences wait) each
replica is capped at M running sequences (vLLM's `max_num_seqs`): `queued` is what waits after the
first dispatch, and `full_dispatch_us` the cost of a dispatch call on that whole queue while every
replica is at its cap (the skip rule stops at once: no replica has a free slot). 0 = no cap.
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Any

from pivotrl.bench.common import parser, print_table, write_json
from pivotrl.bench.planner import KV_CAPACITY, ROLLOUT_MODEL
from pivotrl.core.scheduler import ShiftAwareScheduler
from pivotrl.core.types import Role, Sequence


def _filled(replicas: int, per: int, seed: int, cap: int | None = None) -> tuple[ShiftAwareScheduler, list[Sequence]]:
    rng = random.Random(seed)
    s = ShiftAwareScheduler(Role.ROLLOUT, ROLLOUT_MODEL, max_num_seqs=cap)
    s.add_replicas([(f"r{i}", KV_CAPACITY[Role.ROLLOUT]) for i in range(replicas)])
    seqs = [Sequence(i, Role.ROLLOUT, min(2048, int(rng.lognormvariate(5.0, 0.5))),
                     generated=min(15000, int(rng.lognormvariate(6.5, 1.0)))) for i in range(replicas * per)]
    return s, seqs


def measure(replicas: int, per: int = 64, repeats: int = 3, seed: int = 0, cap: int | None = None) -> dict[str, Any]:
    disp, disp_cpu, up_ms, down_ms, up_moves, down_moves, gain = [], [], [], [], [], [], []
    queued, full = [], []
    for r in range(repeats):
        s, seqs = _filled(replicas, per, seed + r, cap)
        s.submit(seqs)
        t0, c0 = time.perf_counter(), time.process_time()
        moves = s.dispatch()
        disp.append((time.perf_counter() - t0) / max(1, len(moves)) * 1e6)
        # CPU time of this process: what the algorithm costs on a core of its own (a shared,
        # overloaded machine inflates wall time; both are reported)
        disp_cpu.append((time.process_time() - c0) / max(1, len(moves)) * 1e6)
        queued.append(s.queued())
        t0 = time.perf_counter()
        s.dispatch()  # nothing freed: with a cap, every replica is full
        full.append((time.perf_counter() - t0) * 1e6)
        k = max(1, replicas // 4)
        before = s.throughput()
        t0 = time.perf_counter()
        mv = s.shift_up([(f"n{i}", KV_CAPACITY[Role.ROLLOUT]) for i in range(k)])
        up_ms.append((time.perf_counter() - t0) * 1e3)
        up_moves.append(sum(1 for m in mv if m.kind == "abort"))
        gain.append(s.throughput() / before - 1.0 if before > 0 else 0.0)
        t0 = time.perf_counter()
        mv = s.shift_down([f"r{i}" for i in range(k)])
        down_ms.append((time.perf_counter() - t0) * 1e3)
        down_moves.append(sum(1 for m in mv if m.kind == "assign"))
        s.check_invariants()
    med = statistics.median
    return {"replicas": replicas, "seqs": replicas * per, "dispatch_us_per_seq": med(disp),
            "dispatch_us_per_seq_min": min(disp), "dispatch_cpu_us_per_seq": med(disp_cpu),
            "shift_up_k": max(1, replicas // 4), "shift_up_ms": med(up_ms), "shift_up_migrated": int(med(up_moves)),
            "shift_up_gain_pct": 100 * med(gain), "shift_down_ms": med(down_ms),
            "shift_down_redispatched": int(med(down_moves)), "max_num_seqs": cap or "none",
            "queued": int(med(queued)), "full_dispatch_us": med(full)}


def main(argv: list[str]) -> int:
    p = parser("scheduler dispatch and migration speed")
    p.add_argument("--replicas", default="8,16,32,64,128")
    p.add_argument("--seqs-per-replica", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-num-seqs", type=int, default=32, help="per-replica cap (0 = none)")
    a = p.parse_args(argv)
    rows = [measure(int(r), a.seqs_per_replica, a.repeats, cap=a.max_num_seqs or None) for r in a.replicas.split(",")]
    print_table(rows, "shift-aware scheduler")
    write_json(a.json, "scheduler", rows)
    return 0
