"""Property test of the scheduler invariant through random operation mixes (hypothesis).

Every submitted sequence is at all times in exactly one place (the queue, one replica, or finished),
and its generated-token count never decreases, through any mix of submit / dispatch / progress /
abort / finish / shift_up / shift_down / advance / rebalance, with per-replica `max_num_seqs` caps,
and with refused calls mixed in (issue 12: a call that raises leaves the scheduler exactly as it
was, and the next call works)."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pivotrl.core.scheduler import ShiftAwareScheduler
from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import Role, Sequence

MODELS = [ThroughputModel(A=3.2e-8, B=10.9e-3, C=0.139e-3, D=1.4e-3),
          ThroughputModel(A=5.5e-8, B=43.6e-3, C=0.094e-3, D=1.4e-3, moe_floor=0.05, moe_k_over_e=1 / 16),
          ThroughputModel(A=0.0, B=0.0, C=1e-3, D=0.0)]

op = st.one_of(
    st.tuples(st.just("submit"), st.integers(1, 6), st.integers(1, 400)),
    st.tuples(st.just("dispatch")),
    st.tuples(st.just("progress"), st.integers(0, 10**6), st.integers(0, 300)),
    st.tuples(st.just("advance"), st.integers(0, 10**6), st.integers(0, 50)),
    st.tuples(st.just("abort"), st.integers(0, 10**6), st.sampled_from(["all", "shortest"])),
    st.tuples(st.just("finish"), st.integers(0, 10**6)),
    st.tuples(st.just("up"), st.integers(1, 3), st.integers(200, 3000), st.booleans()),
    st.tuples(st.just("down"), st.integers(1, 2)),
    st.tuples(st.just("rebalance"), st.sampled_from([0.0, 0.05])),
    st.tuples(st.just("refused"), st.integers(0, 7)),
)


def _state(s, alive):
    return (sorted((r, sorted(x.running), x.k, x.kv_capacity, x.max_seqs) for r, x in s.replicas.items()),
            [q.seq_id for q in s.queued_sequences()], {sid: (s.where(sid), s.get(sid).generated) for sid in alive},
            s.num_sequences(), s.throughput())


def _refused(s, which, next_id):
    """One call the scheduler must refuse, chosen by `which`."""
    rid = sorted(s.replicas)[0] if s.replicas else "missing"
    calls = [
        lambda: s.abort("no-such-replica"),
        lambda: s.abort(rid, "longest"),
        lambda: s.shift_up([(rid, 100)]) if s.replicas else s.shift_up([("z", 0)]),
        lambda: s.shift_up([("ok-new", 500), ("cap0", 0)]),
        lambda: s.shift_down([rid, "no-such-replica"]),
        lambda: s.submit([Sequence(next_id, Role.ROLLOUT, 5), Sequence(next_id, Role.ROLLOUT, 5)]),
        lambda: s.finish(10**9),
        lambda: s.shift_up([("capneg", 100, 0)]),
    ]
    with pytest.raises((KeyError, ValueError)):
        calls[which]()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=40), model=st.sampled_from(MODELS), reserve=st.sampled_from([0, 16]),
       cap=st.sampled_from([None, 1, 4]))
def test_every_sequence_in_exactly_one_place(ops, model, reserve, cap):
    s = ShiftAwareScheduler(Role.ROLLOUT, model, kv_reserve=reserve, max_num_seqs=cap)
    s.add_replicas([("r0", 1500)])
    next_id, next_rep = 0, 0
    alive: set[int] = set()
    finished: set[int] = set()
    tokens: dict[int, int] = {}
    for o in ops:
        kind = o[0]
        if kind == "submit":
            s.submit([Sequence(next_id + i, Role.ROLLOUT, o[2]) for i in range(o[1])])
            alive |= set(range(next_id, next_id + o[1]))
            next_id += o[1]
        elif kind == "dispatch":
            s.dispatch()
        elif kind == "progress" and alive:
            sid = sorted(alive)[o[1] % len(alive)]
            s.progress(sid, s.get(sid).generated + o[2])
        elif kind == "advance" and s.replicas:
            s.advance(sorted(s.replicas)[o[1] % len(s.replicas)], o[2])
        elif kind == "abort" and s.replicas:
            s.abort(sorted(s.replicas)[o[1] % len(s.replicas)], o[2])
        elif kind == "finish" and alive:
            sid = sorted(alive)[o[1] % len(alive)]
            s.finish(sid)
            alive.discard(sid)
            finished.add(sid)
        elif kind == "up":
            reps = [(f"u{next_rep + i}", o[2]) for i in range(o[1])]
            next_rep += o[1]
            moves = s.shift_up(reps, migrate=o[3])
            for m in moves:
                if m.kind == "assign":
                    assert s.where(m.seq_id) == m.replica_id
        elif kind == "down" and s.replicas:
            victims = sorted(s.replicas)[: o[1]]
            s.shift_down(victims)
            assert not set(victims) & set(s.replicas)
        elif kind == "rebalance":
            t0 = s.throughput()
            if s.rebalance(o[1]):
                assert s.throughput() > t0 * (1 + o[1]) - 1e-9
        elif kind == "refused":
            before = _state(s, alive)
            _refused(s, o[1], next_id)
            assert _state(s, alive) == before
        s.check_invariants()
        # exactly one place: queue or one replica for live sequences, nowhere for finished ones
        places = {}
        for rid, rep in s.replicas.items():
            for sid in rep.running:
                assert sid not in places
                places[sid] = rid
        for sid in alive:
            where = s.where(sid)
            assert where == "queue" or places.get(sid) == where
            assert (where == "queue") == (sid not in places)
            g = s.get(sid).generated
            assert g >= tokens.get(sid, 0)
            tokens[sid] = g
        for sid in finished:
            assert s.where(sid) is None and sid not in places
        assert s.num_sequences() == len(alive)
        assert s.throughput() >= 0.0
        for rep in s.replicas.values():
            assert rep.max_seqs is None or rep.n <= rep.max_seqs
        # nothing that fits waits: a queued sequence has no replica with room for it (skip rule)
        for q in s.queued_sequences():
            assert not any(r.free_seqs >= 1 and r.free_kv >= q.length + reserve for r in s.replicas.values()) \
                or kind not in ("dispatch", "up", "down")
