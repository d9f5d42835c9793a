"""Dispatch with a long queue that mostly fits nowhere (a GenRM queue behind full KV caches): it
stops as soon as no queued sequence can fit, yet places every one that can, in priority order,
and a queued sequence that grew (`progress`) is judged by its new length."""
from pivotrl.core.scheduler import ShiftAwareScheduler
from pivotrl.core.types import Role, Sequence
from tests.core.test_scheduler import MODEL


def _sched(cap, reserve=0, replicas=2):
    s = ShiftAwareScheduler(Role.REWARD, MODEL, kv_reserve=reserve)
    s.add_replicas([(f"r{i}", cap) for i in range(replicas)])
    return s


def test_long_queue_places_only_what_fits_in_priority_order():
    s = _sched(cap=5_000, reserve=50)
    long = [Sequence(i, Role.REWARD, 3_000) for i in range(40)]
    short = [Sequence(100 + i, Role.REWARD, 200) for i in range(5)]
    s.submit(long + short)
    s.dispatch()
    # one 3,000-token sequence per replica; then only short ones fit in the 2,000 left on each
    assert [s.where(i) for i in range(40)].count("queue") == 38
    assert all(s.where(100 + i) in ("r0", "r1") for i in range(5))
    assert [q.seq_id for q in s.queued_sequences()] == list(range(2, 40))  # places kept, in order
    s.check_invariants()
    # nothing fits: dispatch is a no-op that loses nothing
    before = [q.seq_id for q in s.queued_sequences()]
    assert s.dispatch() == []
    assert [q.seq_id for q in s.queued_sequences()] == before
    # room for one long one: the head of the queue gets it
    s.finish(0)
    s.dispatch()
    assert s.where(2) != "queue" and s.where(3) == "queue"
    s.check_invariants()


def test_a_queued_sequence_that_grew_is_admitted_by_its_new_length():
    s = _sched(cap=1_000, replicas=1)
    s.submit([Sequence(0, Role.REWARD, 900)])
    s.dispatch()
    s.submit([Sequence(1, Role.REWARD, 50)])
    s.progress(1, 80)  # it grew while queued (tokens it had when aborted elsewhere): 130 > 100 free
    s.dispatch()
    assert s.where(1) == "queue"
    s.check_invariants()
    s.finish(0)
    s.dispatch()
    assert s.where(1) == "r0"
    s.check_invariants()


def test_the_same_placements_as_trying_every_queued_sequence():
    """Against a reference that tries every queued sequence, one by one, in priority order."""
    import random

    rng = random.Random(7)
    for trial in range(30):
        caps = [rng.choice([2_000, 4_000, 8_000]) for _ in range(rng.randint(1, 4))]
        seqs = [Sequence(i, Role.REWARD, rng.choice([100, 500, 1_500, 3_000, 7_000])) for i in range(60)]
        fast = ShiftAwareScheduler(Role.REWARD, MODEL, kv_reserve=100, max_num_seqs=8)
        fast.add_replicas([(f"r{i}", c) for i, c in enumerate(caps)])
        fast.submit([Sequence(x.seq_id, x.role, x.prompt_len) for x in seqs])
        fast.dispatch()
        # reference: every sequence is tried (a dispatch per sequence, placing one at most)
        ref = ShiftAwareScheduler(Role.REWARD, MODEL, kv_reserve=100, max_num_seqs=8)
        ref.add_replicas([(f"r{i}", c) for i, c in enumerate(caps)])
        for x in seqs:
            ref.submit([Sequence(x.seq_id, x.role, x.prompt_len)])
            ref.dispatch()
        # the reference dispatches as sequences arrive, the fast one all at once: both place greedily in
        # id order with the same gains, so each sequence ends in the same place
        assert {x.seq_id: fast.where(x.seq_id) for x in seqs} == {x.seq_id: ref.where(x.seq_id) for x in seqs}, trial
        fast.check_invariants()


def test_the_length_index_stays_bounded_over_a_long_run():
    s = _sched(cap=10**6, replicas=2)
    for step in range(200):  # 200 batches of 50 sequences, each dispatched and finished
        s.submit([Sequence(step * 50 + i, Role.REWARD, 100 + (step * 7 + i) % 900) for i in range(50)])
        s.dispatch()
        for i in range(50):
            s.finish(step * 50 + i)
    assert s.queued() == 0 and len(s._queue.lens) <= 2 * 50 + 64 + 1
    s.check_invariants()
