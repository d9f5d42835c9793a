"""PivotPlanner's five steps on hand-built cluster views; robustness on degenerate states."""
import json
import math

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pivotrl.bench.planner import synthetic_view
from pivotrl.config.planner import PivotPlannerConfig
from pivotrl.core.planner import (ClusterView, PivotPlanner, TrainView, eq1_throughput, role_demand,
                                  role_slots, shift_pairs)
from pivotrl.core.scheduler import ShiftAwareScheduler
from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import Role, Sequence, Slot

MODEL = ThroughputModel(A=3.2e-8, B=10.9e-3, C=0.139e-3, D=1.4e-3)
CAP = 200_000


def view(num=8, ro=(), rm=(), ro_tp=1, rm_tp=4, n_ro=0, n_rm=0, home=(), train="none", tau=2.0, pending=()):
    """`ro`/`rm`: first devices of active replicas; `n_*`: sequences per role (dispatched, rest queued);
    `train`: none | idle | running | ready (ready = batch ready, not holding devices)."""
    owner = [None] * num
    active = {Role.ROLLOUT: [Slot(Role.ROLLOUT, d, ro_tp) for d in ro],
              Role.REWARD: [Slot(Role.REWARD, d, rm_tp) for d in rm]}
    scheds, sid = {}, 0
    for role, n in ((Role.ROLLOUT, n_ro), (Role.REWARD, n_rm)):
        s = ShiftAwareScheduler(role, MODEL)
        s.add_replicas([(x.slot_id, CAP) for x in active[role]])
        s.submit([Sequence(sid + i, role, 500, generated=500) for i in range(n)])
        sid += n
        s.dispatch()
        scheds[role] = s
        for x in active[role]:
            for d in x.devices:
                owner[d] = role
    holds = train in ("idle", "running")
    if holds:
        for d in home:
            owner[d] = Role.TRAIN
    tv = TrainView(home=tuple(home), holds_devices=holds, running=train == "running", batch_ready=train == "ready")
    return ClusterView(now=1.0, num_devices=num, node_size=8, tp={Role.ROLLOUT: ro_tp, Role.REWARD: rm_tp},
                       owner=owner, active=active, schedulers=scheds, train=tv,
                       tau_shift={Role.ROLLOUT: tau, Role.REWARD: tau}, pending=set(pending))


def planner(**kw):
    return PivotPlanner(PivotPlannerConfig(**kw))


def test_eq1_and_demand_never_nan():
    assert eq1_throughput(10, 100, 10, 100) == pytest.approx(100)
    assert eq1_throughput(30, 300, 10, 10) == pytest.approx(40 / (0.1 + 1.0))
    assert eq1_throughput(0, 0, 0, 0) == 0.0
    assert eq1_throughput(5, 0, 5, 100) == 0.0  # a stalled role stalls the pipeline
    assert eq1_throughput(0, 0, 5, 50) == pytest.approx(50)
    assert role_demand(0, 0) == 0.0 and role_demand(3, 0) == math.inf and role_demand(4, 2) == 2.0


def test_role_slots_nest():
    assert [s.first_device for s in role_slots(Role.REWARD, 4, 16)] == [0, 4, 8, 12]
    assert len(role_slots(Role.ROLLOUT, 1, 16)) == 16


def test_training_shift_up_takes_home_devices():
    v = view(num=8, ro=range(8), n_ro=16, home=range(4, 8), train="ready")
    d = planner().decide(v)
    assert d.role_up == Role.TRAIN and d.chosen is not None
    assert d.chosen.up == [Slot(Role.TRAIN, 4, 4)]
    assert [s.first_device for s in d.chosen.down] == [4, 5, 6, 7]
    assert d.chosen.penalty > 0
    # training running (or holding its devices) is never disturbed
    v2 = view(num=8, ro=range(4), n_ro=16, home=range(4, 8), train="running")
    d2 = planner().decide(v2)
    assert d2.role_up != Role.TRAIN
    if d2.chosen:
        assert all(s.role != Role.TRAIN for s in d2.chosen.down)


def test_shift_up_role_by_demand():
    # reward has work and no replica: infinite demand, so it goes up first
    v = view(num=8, ro=range(4), n_ro=8, n_rm=20)
    d = planner().decide(v)
    assert d.role_up == Role.REWARD
    assert d.chosen is not None and d.chosen.role_up == Role.REWARD
    assert d.chosen.up == [Slot(Role.REWARD, 4, 4)] and d.chosen.down == []  # free devices, phi 0


def test_shift_pairs_group_blockers_and_penalties():
    # reward tp4; rollout tp1 on 0..5, idle training on 6..7 (home), nothing free
    v = view(num=16, ro=range(6), rm=[12], n_ro=12, n_rm=50, home=(6, 7), train="idle")
    # devices 8..11 free
    rT = {s.slot_id: v.schedulers[Role.ROLLOUT].replica_throughput(s.slot_id) for s in v.active[Role.ROLLOUT]}
    pairs = shift_pairs(v, Role.REWARD, rT)
    by_first = {p.up[0].first_device: p for p in pairs}
    assert set(by_first) == {0, 4, 8}
    assert by_first[8].penalty == 0 and by_first[8].down == []
    assert [s.first_device for s in by_first[0].down] == [0, 1, 2, 3]
    assert by_first[0].penalty == pytest.approx(2.0 * sum(rT[f"rollout@{i}x1"] for i in range(4)))
    # slot 4..7 is blocked by rollout 4,5 and the idle training unit (phi 0 for training)
    assert {s.role for s in by_first[4].down} == {Role.ROLLOUT, Role.TRAIN}
    assert by_first[4].penalty == pytest.approx(2.0 * (rT["rollout@4x1"] + rT["rollout@5x1"]))
    assert [p.penalty for p in pairs] == sorted(p.penalty for p in pairs)
    # pending devices are never eligible
    v = dataclasses.replace(v, pending={9})  # a view is a value: a new one, not an edit
    assert 8 not in {p.up[0].first_device for p in shift_pairs(v, Role.REWARD, rT)}


def test_benefit_and_selection():
    v = view(num=16, ro=range(8), rm=[8], n_ro=8, n_rm=400, home=(), train="none")
    d = planner(horizon_s=60.0).decide(v)
    assert d.role_up == Role.REWARD
    assert d.candidates and d.chosen is not None
    for c in d.candidates:
        assert c.benefit == pytest.approx(60.0 * (c.throughput - d.t_now) - c.plan.penalty)
    best = max(d.candidates, key=lambda c: c.benefit)
    assert d.chosen is best.plan and best.benefit > 0
    rec = json.loads(json.dumps(d.to_record()))
    assert rec["chosen"]["up"] and len(rec["candidates"]) == len(d.candidates)
    assert set(d.timings) == {"role", "pairs", "dp", "evaluate", "select"}


def test_tiny_horizon_keeps_allocation_when_shifts_cost():
    # every candidate must shift rollout replicas down: with H tiny the penalty wins
    v = view(num=8, ro=range(4), rm=[4], n_ro=32, n_rm=300)
    d = planner(horizon_s=1e-6).decide(v)
    assert d.chosen is None and "no candidate" in d.reason and d.candidates


def test_no_demand_no_shift():
    d = planner().decide(view(num=8, ro=range(4)))
    assert d.chosen is None and d.role_up is None


def test_migrate_and_summary_agree_on_synthetic_cluster():
    v = synthetic_view(32, "reward_up", seqs_per_replica=16)
    ds = {ev: planner(evaluation=ev).decide(v) for ev in ("summary", "migrate")}
    s, m = ds["summary"], ds["migrate"]
    assert s.role_up == m.role_up == Role.REWARD
    assert [c.k for c in s.candidates] == [c.k for c in m.candidates]
    for a, b in zip(s.candidates, m.candidates):
        assert a.plan.penalty == b.plan.penalty
        assert a.throughput == pytest.approx(b.throughput, rel=0.05)
    assert s.chosen is not None and s.chosen.up == m.chosen.up and s.chosen.down == m.chosen.down
    # shifting every rollout replica down stalls the pipeline (Eq. 1 = 0): never chosen
    assert s.candidates[-1].throughput == 0.0 and s.candidates[-1].benefit < 0


def test_bad_view_errors():
    v = view(num=8, ro=range(4), n_ro=4)
    with pytest.raises(TypeError):
        v.tp[Role.REWARD] = 3  # a view is a value: nothing in it can be changed
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.owner = v.owner[:5]
    with pytest.raises(ValueError, match="tp"):
        planner().decide(dataclasses.replace(v, tp={**v.tp, Role.REWARD: 3}))
    with pytest.raises(ValueError, match="owner"):
        planner().decide(dataclasses.replace(v, owner=v.owner[:5]))
    with pytest.raises(ValueError, match="evaluation"):
        PivotPlannerConfig(evaluation="guess")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_ro=st.integers(0, 300), n_rm=st.integers(0, 300), ro=st.integers(0, 8), rm=st.integers(0, 2),
       train=st.sampled_from(["none", "idle", "running", "ready"]), zero_tau=st.booleans(),
       evaluation=st.sampled_from(["summary", "migrate"]), migration=st.booleans(), h=st.sampled_from([0.01, 60.0]))
def test_planner_never_crashes_or_nans(n_ro, n_rm, ro, rm, train, zero_tau, evaluation, migration, h):
    """Empty roles, zero throughput, queues far beyond all KV capacity (CAP holds ~200 sequences)."""
    home = (12, 13, 14, 15) if train != "none" else ()
    rm_first = [8 + 4 * i for i in range(rm) if 8 + 4 * i not in home]
    v = view(num=16, ro=range(ro), rm=rm_first, n_ro=n_ro * 3, n_rm=n_rm * 3, home=home, train=train,
             tau=0.0 if zero_tau else 3.0)
    d = planner(evaluation=evaluation, migration=migration, horizon_s=h).decide(v)
    assert math.isfinite(d.t_now)
    for c in d.candidates:
        assert math.isfinite(c.throughput) and not math.isnan(c.benefit)
    json.dumps(d.to_record())
    if d.chosen is not None:
        busy = set()
        for s in d.chosen.up:
            assert not set(s.devices) & busy
            busy |= set(s.devices)
        if train == "running":
            assert all(s.role != Role.TRAIN for s in d.chosen.down)
    for s in v.schedulers.values():
        s.check_invariants()
