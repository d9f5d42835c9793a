"""The simulator's event queue: time order, stale completions dropped, ties in a fixed order."""
from __future__ import annotations

from pivotrl.core.throughput import ThroughputModel
from pivotrl.sim.clock import EventQueue
from pivotrl.sim.engine import SimReplica

MODEL = ThroughputModel(A=1e-8, B=0.01, C=1e-4, D=1e-3, P0=0.0, P1=0.0, P2=0.0)


def _replica(rid: str, target: int) -> SimReplica:
    rep = SimReplica(rid, MODEL, 1, 0.0)
    rep.add(1, 10, 0, target, 0.0)
    return rep


def test_events_and_completions_pop_in_time_order():
    q, reps = EventQueue(), {"a": _replica("a", 100)}  # 100 iterations of ~11 ms: ~1.1 s
    q.push(5.0, "tick")
    q.push(0.5, "sample")
    q.watch("a", reps["a"])
    kinds = []
    while (nxt := q.pop(reps)) is not None:
        kinds.append((round(nxt[0], 3), nxt[1]))
    assert [k for _, k in kinds] == ["sample", "finish", "tick"]
    assert kinds[1][0] == round(reps["a"].next_finish(), 3)
    assert q.empty()


def test_a_completion_made_stale_by_a_change_is_dropped():
    q, reps = EventQueue(), {"a": _replica("a", 100)}
    q.watch("a", reps["a"])
    reps["a"].stall(10.0)  # the replica changed: its queued completion no longer holds
    assert not q.work_pending(reps)
    assert q.pop(reps) is None
    q.watch("a", reps["a"])
    t, kind, rid = q.pop(reps)
    assert (kind, rid) == ("finish", "a") and t > 10.0


def test_work_pending_ignores_passive_events_and_ties_go_to_events_first():
    q, reps = EventQueue(), {}
    q.push(1.0, "tick")
    q.push(1.0, "sample")
    assert not q.work_pending(reps)
    q.push(1.0, "train_done", "payload")
    assert q.work_pending(reps)
    assert [q.pop(reps)[1] for _ in range(3)] == ["tick", "sample", "train_done"]  # push order at a tie
