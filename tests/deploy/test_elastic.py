"""The pivot controller with elastic training (DESIGN §4.6), as a pure state machine."""
from __future__ import annotations

import dataclasses

import pytest

from pivotrl.config.planner import PivotPlannerConfig
from pivotrl.core.training_time import TrainTimeModel
from pivotrl.core.types import Role, Sequence
from pivotrl.deploy import make_controller
from pivotrl.deploy.events import Record, Start, StartShift, StartTraining, StepDone, TrainingDone
from pivotrl.deploy.pivot import elastic_sizes
from tests.deploy.test_controllers import Driver, env


def elastic_env(model=TrainTimeModel(token_s=0.05), max_devices=None, **kw):
    e = env({Role.TRAIN: 1}, **kw)
    return dataclasses.replace(e, planner=PivotPlannerConfig(elastic_training=True, elastic_max_devices=max_devices),
                               train_model=model, reshard_s=0.25)


class ElasticDriver(Driver):
    """The instant runtime, reporting each step's world size and (off the home set) a reshard."""

    def feed(self, ev):
        if isinstance(ev, TrainingDone):
            start = [a for a in self.log if isinstance(a, StartTraining)][-1]
            ev = dataclasses.replace(ev, seconds=0.05 * start.tokens / len(start.devices) + 0.5,
                                     reshard_s=0.3 if start.home else None)
        return super().feed(ev)


def test_sizes_grow_the_home_set_by_whole_replica_blocks():
    assert elastic_sizes(32, 8, 4, None) == (8, 12, 16, 20, 24, 28, 32)
    assert elastic_sizes(32, 8, 4, 17) == (8, 12, 16)
    assert elastic_sizes(4, 1, 2, None) == (1, 3)
    assert elastic_sizes(8, 4, 4, 2) == (4,)
    assert make_controller("pivot", env({Role.TRAIN: 1})).elastic.sizes == (1,)  # off: the home set alone
    assert make_controller("pivot", elastic_env(max_devices=3)).elastic.sizes == (1, 3)


def test_the_trainer_grows_learns_and_comes_back():
    d = ElasticDriver(make_controller("pivot", elastic_env(steps=3)))
    d.feed(Start(0.0))
    d.drain()
    starts = [a for a in d.log if isinstance(a, StartTraining)]
    worlds = [len(a.devices) for a in starts]
    assert max(worlds) > 1, "no released work left at a batch: the trainer borrows devices"
    for a in starts:  # a grown step names its home set, where the state goes back to
        assert (a.home == (3,)) == (len(a.devices) > 1) and a.devices[-1] == 3
    rows = [a.fields for a in d.log if isinstance(a, StepDone)]
    assert [r["train_world"] for r in rows] == worlds
    assert all((r["reshard_s"] > 0) == (w > 1) for r, w in zip(rows, worlds))
    assert len(d.c.train_fit.samples) == 3 and d.c.train_fit.model() != d.c.train_fit.prior  # refitted
    assert d.c.reshard_s != 0.25  # the measured reshard replaced the prior
    decisions = [a.fields for a in d.log if isinstance(a, Record) and a.kind == "decision"
                 and a.fields["role_up"] == "train"]
    assert decisions and all(c.get("training") for dec in decisions for c in dec["candidates"])
    # growing takes whole replicas: the reward replica straddling the grown slot's edge goes too
    grow = next(a.plan for a in d.log if isinstance(a, StartShift) and a.plan.up and a.plan.up[0].role == Role.TRAIN
                and a.plan.up[0].tp > 1)
    assert all(set(s.devices) & set(grow.up[0].devices) for s in grow.down)
    assert any("keeps its" in dec["reason"] for dec in decisions)  # a batch waiting: priced, then kept
    assert d.c.pipe.trained_samples == 12


def test_disable_elastic_keeps_the_home_set():
    c = make_controller("pivot", elastic_env())
    c.disable_elastic()
    d = ElasticDriver(c)
    d.feed(Start(0.0))
    d.drain()
    assert {len(a.devices) for a in d.log if isinstance(a, StartTraining)} == {1}


def test_backlog_counts_released_work_and_its_tail():
    c = make_controller("pivot", elastic_env())
    assert c.elastic.backlog(c) == ({Role.ROLLOUT: 0.0, Role.REWARD: 0.0}, {Role.ROLLOUT: 0.0, Role.REWARD: 0.0})
    # finished responses of 10..100 tokens; two in flight at 5 and at 200 (longer than any seen)
    for i, n in enumerate(range(10, 101, 10)):
        c.pipe._done["response"].append(n)
    c.sched[Role.ROLLOUT].submit([Sequence(100, Role.ROLLOUT, 20, generated=5),
                                  Sequence(101, Role.ROLLOUT, 20, generated=200)])
    tokens, tail = c.elastic.backlog(c)
    # 5 tokens in: the mean of the longer ones (55) minus 5; 200 in: 1.5 x 200 + 1 - 200
    assert tokens[Role.ROLLOUT] == pytest.approx(50.0 + 101.0)
    assert tail[Role.ROLLOUT] > 0 and c.elastic.backlog(c) == (tokens, tail)  # the same state, the same estimate
    assert tokens[Role.REWARD] == 0.0  # no judgement finished yet: no length to expect


def test_the_drain_prediction_is_checked_against_the_batches():
    """A training decision predicts when the released work is done; the batch's readiness then
    measures it, and the ratio scales later predictions (clipped, averaged)."""
    from pivotrl.core.planner_types import Candidate, Decision
    from pivotrl.core.types import ShiftPlan, Slot
    from pivotrl.deploy.elastic import DRAIN_CLIP

    c = make_controller("pivot", elastic_env())
    el = c.elastic
    c.pipe.version, c.pipe.next_release = 1, 3  # batch 1 about to train, batch 2 released
    plan = ShiftPlan(Role.TRAIN, up=[Slot(Role.TRAIN, 2, 2)])
    el.decided(Decision(10.0, Role.TRAIN, 0.0, [Candidate(plan, 0.0, 0.0, k=2, detail={"drain_s": 20.0})], plan, ""), c)
    el.batch_ready(1, 15.0)  # not the batch the prediction waits for
    assert el.drain_scale == 1.0
    el.batch_ready(2, 70.0)  # 60 s measured for 20 s predicted
    assert el.drain_ratios == [3.0] and el.drain_scale == pytest.approx(2.0)
    el.decided(Decision(100.0, Role.TRAIN, 0.0, [Candidate(plan, 0.0, 0.0, k=2, detail={"drain_s": 2.0})], plan, ""), c)
    el.batch_ready(2, 1e6)  # absurdly late: clipped
    assert el.drain_ratios[-1] == DRAIN_CLIP and el.drain_scale <= DRAIN_CLIP
    assert el.record()["drain_ratios"] == el.drain_ratios
