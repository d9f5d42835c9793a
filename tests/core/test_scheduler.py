"""ShiftAwareScheduler: dispatch by gain under KV capacity, abort with tokens, Alg. 3/4 migration."""
import pytest

from pivotrl.core.dispatch import Move
from pivotrl.core.scheduler import ShiftAwareScheduler
from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import Role, Sequence

MODEL = ThroughputModel(A=3.2e-8, B=10.9e-3, C=0.139e-3, D=1.4e-3)


def seqs(n, start=0, prompt=100, gen=0, role=Role.ROLLOUT):
    return [Sequence(start + i, role, prompt, generated=gen) for i in range(n)]


def make(num_replicas=2, cap=10_000, reserve=0):
    s = ShiftAwareScheduler(Role.ROLLOUT, MODEL, kv_reserve=reserve)
    s.add_replicas([(f"r{i}", cap) for i in range(num_replicas)])
    return s


def test_dispatch_balances_by_gain_and_priority_order():
    s = make(2)
    s.submit(seqs(4)[::-1])  # submission order does not matter: seq_id is the priority
    moves = s.dispatch()
    assert [m.seq_id for m in moves] == [0, 1, 2, 3]
    assert all(m.kind == "assign" for m in moves)
    # concave throughput: gain is larger on the emptier replica, so they alternate
    assert [s.where(i) for i in range(4)] == ["r0", "r1", "r0", "r1"]
    assert s.queued() == 0 and s.num_sequences() == 4
    s.check_invariants()


def test_dispatch_respects_kv_capacity_and_reserve_and_skips_what_does_not_fit():
    s = make(1, cap=1000, reserve=100)
    s.submit([Sequence(0, Role.ROLLOUT, 500), Sequence(1, Role.ROLLOUT, 450), Sequence(2, Role.ROLLOUT, 10)])
    s.dispatch()
    # seq 0 fits (500+100 <= 1000); seq 1 needs 550 > 500 free: it waits, but seq 2 behind it runs
    assert s.where(0) == "r0" and s.where(1) == "queue" and s.where(2) == "r0"
    assert s.queued_sequences()[0].seq_id == 1  # it keeps its place at the head
    s.finish(0)
    s.dispatch()  # capacity freed: the skipped sequence is tried again, first
    assert s.where(1) == "r0"
    s.check_invariants()


def test_a_sequence_that_fits_nowhere_does_not_block_the_queue():
    # issue 14: a 17K-token resume left 64 short prompts queued with nothing dispatched
    s = make(2, cap=16_384)
    s.submit([Sequence(0, Role.ROLLOUT, 17_000)] + seqs(64, start=1, prompt=100))
    s.dispatch()
    assert s.where(0) == "queue" and s.queued() == 1
    assert all(s.where(i) in ("r0", "r1") for i in range(1, 65))
    s.shift_up([("big", 40_000)])  # room for it appears: the next dispatch takes it first
    assert s.where(0) == "big"
    s.check_invariants()


def test_max_num_seqs_caps_each_replica_and_a_queue_forms():
    s = ShiftAwareScheduler(Role.ROLLOUT, MODEL, max_num_seqs=3)
    s.add_replicas([("r0", 10**6), ("r1", 10**6, 1)])  # r1's engine reports its own cap
    s.submit(seqs(6))
    s.dispatch()
    assert s.replicas["r0"].n == 3 and s.replicas["r1"].n == 1 and s.queued() == 2
    s.finish(s.queued_sequences()[0].seq_id - 1)  # one running sequence finishes
    s.dispatch()
    assert s.queued() == 1 and s.replicas["r0"].n + s.replicas["r1"].n == 4
    s.check_invariants()
    with pytest.raises(ValueError, match="max_num_seqs"):
        s.add_replicas([("r2", 100, 0)])


def test_refused_calls_leave_the_scheduler_unchanged():
    # issue 12: a refused call used to leave a half-open journal (next submit: bare KeyError)
    # and shift_up([ok, cap 0]) a half-added replica
    s = make(2, cap=1000)
    s.submit(seqs(3))
    s.dispatch()
    s.submit(seqs(2, start=3, prompt=900))
    s.dispatch()

    def state():
        return (sorted((r, sorted(x.running), x.k, x.max_seqs) for r, x in s.replicas.items()),
                [q.seq_id for q in s.queued_sequences()], s.throughput())

    before = state()
    with pytest.raises(KeyError):
        s.abort("nope")
    with pytest.raises(ValueError):
        s.abort("r0", "longest")
    with pytest.raises(ValueError):
        s.shift_up([("r0", 100)])  # duplicate id
    with pytest.raises(ValueError):
        s.shift_up([("new", 100), ("new2", 0)])  # ok + cap 0: neither is added
    with pytest.raises(ValueError):
        s.shift_up([("x", 100), ("x", 100)])
    with pytest.raises(KeyError):
        s.shift_down(["r0", "nope"])
    with pytest.raises(ValueError):
        s.shift_down(["r0", "r0"])
    with pytest.raises(ValueError):
        s.submit([Sequence(10, Role.ROLLOUT, 5), Sequence(0, Role.ROLLOUT, 5)])  # second is a duplicate
    with pytest.raises(ValueError):
        s.progress(0, -1)
    with pytest.raises(ValueError):
        s.advance("r0", -1)
    with pytest.raises(KeyError):
        s.finish(999)
    assert state() == before
    s.check_invariants()
    s.submit(seqs(1, start=20))  # and it still works
    s.dispatch()
    s.check_invariants()


def test_rebalance_moves_work_onto_idle_replicas_only_when_it_pays():
    s = make(1, cap=10**6)
    s.submit(seqs(200))  # compute-bound on one replica (C*N > B): splitting pays
    s.dispatch()
    s.add_replicas([("r1", 10**6), ("r2", 10**6)])  # idle replicas, empty queue
    t0 = s.throughput()
    assert s.rebalance(min_gain=10.0) == []  # a 1000 % gain is not on offer: nothing moves
    moves = s.rebalance(min_gain=0.05)
    assert moves and {m.kind for m in moves} == {"abort", "assign"}
    assert s.throughput() > 1.05 * t0
    assert s.replicas["r1"].n > 0 and s.replicas["r2"].n > 0
    s.check_invariants()
    s.submit(seqs(1, start=1000, prompt=10**7))  # a queued sequence: dispatch's job, no rebalance
    assert s.rebalance() == []


def test_prefers_replica_with_larger_gain():
    s = make(2, cap=10**7)
    # load r0 with many long sequences: adding to r1 gains more
    s.submit(seqs(1, prompt=10))
    s.dispatch()
    first = s.where(0)
    s.submit([Sequence(1, Role.ROLLOUT, 10)])
    s.dispatch()
    assert s.where(1) != first


def test_abort_keeps_tokens_and_requeues():
    s = make(1)
    s.submit(seqs(3))
    s.dispatch()
    s.progress(1, 50)
    s.progress(0, 10)
    s.progress(2, 70)
    moves = s.abort("r0", "shortest")
    assert moves == [Move("abort", 0, "r0")]
    assert s.where(0) == "queue" and s.get(0).generated == 10
    s.abort("r0", "all")
    assert s.queued() == 3 and s.replicas["r0"].k == 0
    s.dispatch()
    assert s.replicas["r0"].k == 3 * 100 + 10 + 50 + 70
    s.check_invariants()


def test_progress_never_decreases_and_advance_updates_k():
    s = make(1)
    s.submit(seqs(2))
    s.dispatch()
    s.progress(0, 5)
    with pytest.raises(ValueError, match="may not decrease"):
        s.progress(0, 4)
    s.advance("r0", 10)
    assert s.get(0).generated == 15 and s.get(1).generated == 10
    assert s.replicas["r0"].k == 200 + 25
    s.check_invariants()


def test_progress_of_a_replica_at_once_equals_progress_one_by_one():
    a, b = make(2), make(2)
    for s in (a, b):
        s.submit(seqs(6))
        s.dispatch()
    on_r0 = [sid for sid in range(6) if a.where(sid) == "r0"]
    counts = {sid: 3 + sid for sid in on_r0}
    for sid, c in counts.items():
        a.progress(sid, c)
    b.progress_replica("r0", counts)
    assert [b.get(sid).generated for sid in range(6)] == [a.get(sid).generated for sid in range(6)]
    assert b.replicas["r0"].k == a.replicas["r0"].k == 100 * len(on_r0) + sum(counts.values())
    for s in (a, b):  # the replica's refreshed terms steer the next placements alike
        s.submit(seqs(4, start=6, prompt=400))
    assert b.dispatch() == a.dispatch() != []
    b.check_invariants()
    with pytest.raises(ValueError, match="may not decrease"):
        b.progress_replica("r0", {on_r0[0]: 0})
    elsewhere = next(sid for sid in range(6) if a.where(sid) != "r0")
    with pytest.raises(ValueError, match=f"seq {elsewhere} is not running there"):
        b.progress_replica("r0", {elsewhere: 50})


def test_shift_down_moves_everything_to_the_rest():
    s = make(3)
    s.submit(seqs(9))
    s.dispatch()
    on_r1 = sorted(sid for sid in range(9) if s.where(sid) == "r1")
    moves = s.shift_down(["r1"])
    assert "r1" not in s.replicas
    aborts = [m for m in moves if m.kind == "abort"]
    assigns = [m for m in moves if m.kind == "assign"]
    assert sorted(m.seq_id for m in aborts) == on_r1
    assert moves[: len(aborts)] == aborts  # aborts first
    assert sorted(m.seq_id for m in assigns) == on_r1
    assert all(s.where(sid) in ("r0", "r2") for sid in range(9))
    s.check_invariants()


def test_shift_down_overflow_stays_queued():
    s = make(2, cap=250)
    s.submit(seqs(4))
    s.dispatch()
    s.shift_down(["r0"])
    assert s.queued() == 2 and s.replicas["r1"].n == 2
    s.check_invariants()


def test_shift_up_dispatches_queue_to_new_replicas_first():
    s = make(1, cap=250)
    s.submit(seqs(6))
    s.dispatch()
    assert s.queued() == 4
    moves = s.shift_up([("n0", 250), ("n1", 250)])
    assert {m.replica_id for m in moves} == {"n0", "n1"}
    assert s.queued() == 0
    s.check_invariants()


def test_shift_up_migration_raises_throughput_and_is_net():
    s = make(2, cap=10**7)
    s.submit([Sequence(i, Role.ROLLOUT, 100 + i, generated=1000) for i in range(64)])
    s.dispatch()
    before = s.throughput()
    moves = s.shift_up([("n0", 10**7), ("n1", 10**7)])
    after = s.throughput()
    assert after > before
    # balanced afterwards (concave model): counts differ by at most one, roughly
    counts = sorted(r.n for r in s.replicas.values())
    assert counts[-1] - counts[0] <= 2
    aborted = {m.seq_id for m in moves if m.kind == "abort"}
    assigned = {m.seq_id for m in moves if m.kind == "assign"}
    assert aborted == assigned  # every migrated sequence lands somewhere
    assert all(s.where(m.seq_id) == m.replica_id for m in moves if m.kind == "assign")
    # migration moves the shortest sequences first
    migrated_lengths = sorted(s.get(i).length for i in aborted)
    assert migrated_lengths[0] == min(seq.length for r in s.replicas.values() for seq in r.running.values())
    s.check_invariants()


def test_shift_up_without_migration_leaves_running_alone():
    s = make(2, cap=10**7)
    s.submit(seqs(20))
    s.dispatch()
    moves = s.shift_up([("n0", 10**7)], migrate=False)
    assert moves == [] and s.replicas["n0"].n == 0


def test_migration_stops_when_no_gain():
    # with a constant iteration time, throughput is linear in N: moving a sequence cannot help
    flat = ThroughputModel(A=0.0, B=1e-2, C=0.0, D=0.0)
    s = ShiftAwareScheduler(Role.ROLLOUT, flat)
    s.add_replicas([("r0", 10**6)])
    s.submit(seqs(10))
    s.dispatch()
    assert s.shift_up([("n0", 10**6)]) == []


def test_clone_is_independent_and_what_if_only():
    s = make(2)
    s.submit(seqs(6))
    s.dispatch()
    c = s.clone()
    c.shift_down(["r0"])
    assert "r0" in s.replicas and s.replicas["r0"].n == 3
    s.check_invariants()
    c.check_invariants()
    with pytest.raises(RuntimeError, match="clone"):
        c.progress(1, 3)


def test_bad_input_errors():
    s = make(1)
    s.submit(seqs(1))
    with pytest.raises(ValueError, match="already"):
        s.submit(seqs(1))
    with pytest.raises(ValueError, match="role"):
        s.submit([Sequence(5, Role.REWARD, 10)])
    with pytest.raises(KeyError, match="no active"):
        s.abort("nope")
    with pytest.raises(ValueError, match="which"):
        s.abort("r0", "longest")
    with pytest.raises(ValueError, match="kv_reserve"):
        ShiftAwareScheduler(Role.ROLLOUT, MODEL, kv_reserve=-1)


def test_empty_scheduler_is_safe():
    s = ShiftAwareScheduler(Role.REWARD, MODEL)
    assert s.throughput() == 0.0 and s.kv_utilisation() == 0.0 and s.dispatch() == []
    s.submit(seqs(3, role=Role.REWARD))
    assert s.dispatch() == [] and s.queued() == 3
    assert s.shift_up([("x", 1000)]) and s.queued() == 0
    s.check_invariants()


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_dispatch_matches_scalar_argmax(seed):
    import random

    rng = random.Random(seed)
    model = MODEL if seed % 2 else ThroughputModel(A=5.5e-8, B=43.6e-3, C=0.094e-3, D=1.4e-3,
                                                    moe_floor=0.05, moe_k_over_e=1 / 16)
    s = ShiftAwareScheduler(Role.ROLLOUT, model, kv_reserve=rng.choice([0, 50]))
    s.add_replicas([(f"r{i}", rng.choice([3_000, 20_000, 100_000])) for i in range(rng.randint(1, 12))])
    s.submit([Sequence(i, Role.ROLLOUT, rng.randint(10, 3000)) for i in range(rng.randint(0, 120))])
    for _ in range(40):
        length = rng.randint(1, 5000)
        best, best_gain = -1, None
        for pos, rid in enumerate(s.replicas):
            r = s.replicas[rid]
            if r.free_kv >= length + s.kv_reserve:
                g = model.gain(r.n, r.k, length)
                if best_gain is None or g > best_gain + 1e-12:
                    best, best_gain = pos, g
        got = s._best_replica(length)
        if best < 0:
            assert got == -1
        else:
            rid = list(s.replicas)[got]
            r = s.replicas[rid]
            assert r.free_kv >= length + s.kv_reserve
            assert model.gain(r.n, r.k, length) == pytest.approx(best_gain, rel=1e-9)
        s.dispatch()
        if rng.random() < 0.5 and s.num_sequences() > s.queued():
            running = [sid for rep in s.replicas.values() for sid in rep.running]
            s.finish(rng.choice(running))
