"""Elastic training candidates (pivotrl/core/elastic.py) on hand-built cluster views."""
import dataclasses
import json
import math

import pytest

from pivotrl.config.planner import PivotPlannerConfig
from pivotrl.core.elastic import training_slot
from pivotrl.core.planner import ElasticView, PivotPlanner
from pivotrl.core.training_time import TrainTimeModel
from pivotrl.core.types import Role, Slot
from tests.core.test_planner import view

#: 100 s of work on the 4-device home set, no fixed part: a bigger trainer is proportionally faster
MODEL = TrainTimeModel(token_s=0.4)
TOKENS = 1000


def elastic_view(v, model=MODEL, backlog=None, tail=None, sizes=(4, 8, 12, 16), reshard=1.0, held=None):
    el = ElasticView(sizes=sizes, tokens=TOKENS, model=model, reshard_s=reshard, backlog=backlog or {},
                     tail_s=tail or {}, replica_throughput={Role.ROLLOUT: 100.0, Role.REWARD: 100.0}, rate=50.0)
    tr = dataclasses.replace(v.train, elastic=el)
    if held is not None:
        owner = list(v.owner)
        for d in held.devices:
            owner[d] = Role.TRAIN
        tr = dataclasses.replace(tr, holds_devices=True, devices=held.devices if held.tp != len(tr.home) else ())
        v = dataclasses.replace(v, owner=owner)
    return dataclasses.replace(v, train=tr)


def decide(v):
    return PivotPlanner(PivotPlannerConfig()).decide(v)


def test_training_slot_grows_downwards_from_the_home_set():
    assert training_slot((12, 13, 14, 15), 4) == Slot(Role.TRAIN, 12, 4)
    assert training_slot((12, 13, 14, 15), 12) == Slot(Role.TRAIN, 4, 12)


def test_training_bound_the_trainer_takes_every_idle_device():
    """No released work left: nothing is lost by borrowing, the biggest trainer ends soonest."""
    v = elastic_view(view(num=16, ro=range(12), home=range(12, 16), train="ready"))
    d = decide(v)
    assert d.role_up == Role.TRAIN and d.chosen.up == [Slot(Role.TRAIN, 0, 16)]
    assert [s.first_device for s in d.chosen.down] == list(range(12))
    by_w = {c.k: c.detail for c in d.candidates}
    assert sorted(by_w) == [4, 8, 12, 16]
    assert by_w[4]["step_s"] == pytest.approx(100.0) and by_w[4]["reshard_s"] == 0.0
    assert by_w[16]["step_s"] == pytest.approx(25.0) and by_w[16]["reshard_s"] == 2.0  # there and back
    assert by_w[16]["benefit_s"] == pytest.approx(by_w[4]["finish_s"] - by_w[16]["finish_s"])
    assert by_w[16]["saved_s"] == pytest.approx(75.0) and by_w[16]["lost_tokens"] == 0.0  # idle replicas
    assert "grows to 16" in d.reason
    best = next(c for c in d.candidates if c.k == 16)
    assert best.benefit == pytest.approx(best.detail["benefit_s"] * 50.0)  # tokens at the run's rate
    rec = json.loads(json.dumps(d.to_record()))
    assert {c["k"] for c in rec["candidates"]} == {4, 8, 12, 16} and "training" in rec["candidates"][0]


def test_inference_bound_the_trainer_stays_home():
    """A backlog the rollout replicas need all their devices for: borrowing them delays it more
    than the step gains."""
    v = view(num=16, ro=range(12), n_ro=48, home=range(12, 16), train="ready")
    T = v.schedulers[Role.ROLLOUT].throughput()
    v = elastic_view(v, backlog={Role.ROLLOUT: 300 * T})  # 300 s of work on 12 replicas
    d = decide(v)
    assert d.chosen.up == [Slot(Role.TRAIN, 12, 4)] and "home devices" in d.reason
    for c in d.candidates:
        if c.k > 4:
            assert c.detail["drain_s"] > 300.0 and c.detail["benefit_s"] < 0 and c.detail["lost_tokens"] > 0


def test_a_long_tail_bounds_the_gain_and_a_role_left_without_devices_waits():
    v = view(num=16, ro=range(8), rm=[8], n_ro=4, n_rm=4, ro_tp=1, rm_tp=4, home=range(12, 16), train="ready")
    v = elastic_view(v, backlog={Role.ROLLOUT: 10.0, Role.REWARD: 10.0}, tail={Role.ROLLOUT: 60.0, Role.REWARD: 70.0})
    d = decide(v)
    by_w = {c.k: c.detail for c in d.candidates}
    assert by_w[4]["drain_s"] == pytest.approx(70.0)  # the tail, not the throughput, ends the work
    # W=8 takes the reward replica: reward gets devices back only after rollout's work (sequential)
    assert by_w[8]["drain_s"] > by_w[4]["drain_s"] + 60.0 - 1e-6
    assert d.chosen.up[0].tp in by_w


def test_no_model_yet_trains_on_the_home_set():
    v = elastic_view(view(num=16, ro=range(12), home=range(12, 16), train="ready"), model=None)
    d = decide(v)
    assert [c.k for c in d.candidates] == [4] and d.chosen.up == [Slot(Role.TRAIN, 12, 4)]
    assert "no training-time model yet" in d.reason


def test_a_held_trainer_keeps_its_size_or_is_re_formed():
    grown = Slot(Role.TRAIN, 8, 8)
    v = view(num=16, ro=range(8), n_ro=32, home=range(12, 16), train="ready")
    T = v.schedulers[Role.ROLLOUT].throughput()
    busy = elastic_view(v, backlog={Role.ROLLOUT: 200 * T}, held=grown)  # the released work outlasts any step
    d = decide(busy)
    assert d.chosen is None and "keeps its 8 devices" in d.reason and {c.k for c in d.candidates} >= {8, 16}
    idle = elastic_view(view(num=16, ro=range(8), home=range(12, 16), train="ready"), held=grown)
    d = decide(idle)
    assert d.chosen.up == [Slot(Role.TRAIN, 0, 16)] and grown in d.chosen.down
    by_w = {c.k: c.detail for c in d.candidates}
    assert by_w[8]["train_s"] == pytest.approx(by_w[8]["step_s"])  # keeping costs nothing more
    assert by_w[16]["train_s"] > by_w[16]["step_s"] + 2.0  # a training shift and a reshard there and back
    shrink = elastic_view(view(num=16, ro=range(8), home=range(12, 16), train="ready"), held=grown,
                          model=TrainTimeModel(fixed_s=10.0, comm_s=400.0))  # more devices only cost
    d = decide(shrink)
    assert d.chosen.up == [Slot(Role.TRAIN, 12, 4)] and "shrinks to 4" in d.reason


def test_pending_devices_and_mid_shift_home_leave_candidates_out():
    v = elastic_view(view(num=16, ro=range(12), home=range(12, 16), train="ready", pending=(2,)))
    assert {c.k for c in decide(v).candidates} == {4, 8, 12}
    v = elastic_view(view(num=16, ro=range(12), home=range(12, 16), train="ready", pending=(13,)))
    d = decide(v)
    assert d.chosen is None and "mid-shift" in d.reason
    inf = elastic_view(view(num=16, ro=range(12), n_ro=4, home=range(12, 16), train="ready"),
                       backlog={Role.ROLLOUT: 100.0}, sizes=(4, 16))
    d = decide(inf)  # all 16 devices train: rollout's work has no device left, it never ends
    assert {c.k: c.detail["drain_s"] for c in d.candidates}[16] == math.inf and d.chosen.up[0].tp == 4
