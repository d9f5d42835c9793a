"""The simulated replica's analytic decode advance against token-by-token stepping."""
from __future__ import annotations

import random

import pytest

from pivotrl.core.throughput import ThroughputModel
from pivotrl.sim.engine import SimReplica

MODEL = ThroughputModel(A=3.2e-8, B=10.9e-3, C=1.39e-4, D=1.4e-3)
MOE = ThroughputModel(A=1.4e-8, B=1.09e-2, C=2.4e-5, D=3.3e-3, moe_floor=0.05, moe_k_over_e=8 / 128)


def stepped_finish_times(model, seqs):
    """Reference: step one decode iteration at a time. seqs: (prompt, target)."""
    live = {i: [p, 0, t] for i, (p, t) in enumerate(seqs)}
    now, out = 0.0, {}
    while live:
        n = len(live)
        k = sum(p + g for p, g, _ in live.values())
        now += model.iter_time(n, k)
        for i in list(live):
            live[i][1] += 1
            if live[i][1] >= live[i][2]:
                out[i] = now
                del live[i]
    return out


@pytest.mark.parametrize("model", [MODEL, MOE])
def test_closed_form_completions_match_token_stepping(model):
    rng = random.Random(0)
    seqs = [(rng.randint(50, 500), rng.randint(1, 400)) for _ in range(24)]
    ref = stepped_finish_times(model, seqs)
    rep = SimReplica("r", model, tp=1, now=0.0)
    for i, (p, t) in enumerate(seqs):
        rep.add(i, p, 0, t, prefill_s=0.0)
    got = {}
    while rep.runs:
        t = rep.next_finish()
        rep.advance(t)
        while (item := rep.pop_finished()) is not None:
            sid, gen = item
            got[sid] = t
            assert gen == seqs[sid][1]
    for i in ref:
        # fluid approximation: off by well under one iteration per completion
        assert got[i] == pytest.approx(ref[i], rel=2e-3, abs=model.iter_time(24, 20000))


def test_advancing_in_pieces_equals_one_advance():
    a = SimReplica("a", MODEL, 1, 0.0)
    b = SimReplica("b", MODEL, 1, 0.0)
    for r in (a, b):
        for i in range(10):
            r.add(i, 100 + i, 0, 10_000, 0.0)
    a.advance(5.0)
    for t in (0.5, 1.0, 2.5, 4.0, 5.0):
        b.advance(t)
    assert a.iters == pytest.approx(b.iters, rel=1e-12)
    assert a.k == pytest.approx(b.k, rel=1e-12)
    assert a.time_for(a.iters) >= 0


def test_abort_keeps_tokens_and_prefill_stalls():
    r = SimReplica("r", MODEL, 1, 0.0)
    r.add(1, 100, 0, 1000, prefill_s=0.5)
    r.advance(0.5)
    assert r.generated(1) == 0           # prefill: no tokens yet
    r.advance(0.5 + 10 * MODEL.iter_time(1, 105))
    gen = r.remove(1)
    assert 9 <= gen <= 10
    assert r.n == 0 and r.k == 0.0
    r.add(1, 100, gen, 1000, prefill_s=0.0)
    assert r.next_finish() == pytest.approx(r.t + r.time_for(1000 - gen))


def test_kv_overflow_pauses_newest_and_resumes_without_losing_tokens():
    rep = SimReplica("r", MODEL, 1, 0.0, kv_capacity=3000)
    for i in range(8):  # 8 x 100 prompt tokens fit now; they grow to 8 x 600 > 3000
        rep.add(i, 100, 0, 500, prefill_s=0.0)
    done = {}
    while not rep.empty:
        t = rep.next_finish()
        assert t is not None, "a paused sequence was left without a way to resume"
        rep.advance(t)
        rep.relieve()
        assert rep.k <= 3000 * (1 + 1e-6) or rep.n == 1
        while (item := rep.pop_finished()) is not None:
            done[item[0]] = item[1]
            rep.resume()
    assert done == {i: 500 for i in range(8)}
    assert rep.preemptions > 0


def test_removing_a_sequence_before_its_prefill_ran_takes_its_prefill_with_it():
    """A request aborted while still waiting for prefill leaves no phantom stall behind (the bug:
    1,100 sequences migrated off a replica left it stalled ~300 s for prefills that never ran)."""
    rep = SimReplica("r", MODEL, 1, 0.0)
    for i in range(10):
        rep.add(i, 1000, 0, 50, 2.0)  # ten prefills of 2 s each, serial: stall until t=20
    assert rep.stall_until == pytest.approx(20.0)
    rep.advance(3.0)  # seq 0 prefilled (0-2 s), seq 1 half way (2-4 s)
    rep.remove(5)  # not started: its whole 2 s goes
    assert rep.stall_until == pytest.approx(18.0)
    rep.remove(1)  # half done: the remaining 1 s goes, later prefills move up
    assert rep.stall_until == pytest.approx(17.0)
    rep.remove(0)  # already prefilled: nothing changes
    assert rep.stall_until == pytest.approx(17.0)
    for i in (2, 3, 4, 6, 7, 8, 9):
        rep.remove(i)
    assert rep.stall_until == pytest.approx(3.0)  # only the work actually done (seq 0, half of seq 1)
    # a weight-load stall queued after prefills moves up with them, and is never cancelled
    rep2 = SimReplica("r2", MODEL, 1, 0.0)
    rep2.add(0, 1000, 0, 50, 5.0)
    rep2.stall(1.5)
    rep2.remove(0)
    assert rep2.stall_until == pytest.approx(1.5)
    rep2.add(1, 1000, 0, 50, 1.0)
    t = rep2.next_finish()
    assert t == pytest.approx(2.5 + rep2.time_for(50))


def test_max_num_seqs_caps_running_sequences_and_the_rest_wait_inside():
    rep = SimReplica("r", MODEL, 1, 0.0, max_num_seqs=2)
    for i in range(5):
        rep.add(i, 100, 0, 50 + 10 * i, prefill_s=0.0)
    assert rep.n == 2 and len(rep.paused) == 3
    done = {}
    while not rep.empty:
        t = rep.next_finish()
        assert t is not None
        rep.advance(t)
        assert rep.n <= 2
        while (item := rep.pop_finished()) is not None:
            done[item[0]] = item[1]
            rep.resume()
    assert done == {i: 50 + 10 * i for i in range(5)}


def test_a_hybrid_sequence_holds_its_state_in_the_kv_pool():
    """`seq_tokens`: each running sequence of a linear-attention model counts its fixed state as KV
    tokens, so fewer fit before the replica preempts."""
    from pivotrl.core.throughput import ThroughputModel
    from pivotrl.sim.engine import SimReplica

    m = ThroughputModel(A=1e-7, B=1e-3, C=1e-5, D=1e-3)
    plain = SimReplica("a", m, 1, 0.0, kv_capacity=1000)
    hybrid = SimReplica("b", m, 1, 0.0, kv_capacity=1000, seq_tokens=300)
    for rep in (plain, hybrid):
        for i in range(3):
            rep.add(i, 100, 0, 50, 0.0)
    assert plain.n == 3 and plain.k == 300
    assert hybrid.n == 2 and hybrid.k == 800 and len(hybrid.paused) == 1  # 3 x 400 > 1000: one waits
