"""Controllers as pure state machines: driven by hand-made events, no simulator."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import Role
from pivotrl.deploy import CONTROLLERS, ControlEnv, make_controller
from pivotrl.deploy.events import (
    Dispatch, Finish, PublishWeights, SequenceFinished, ShiftDone, Start, StartShift, StartTraining,
    StepDone, Tick, TrainingDone,
)

MODEL = ThroughputModel(A=3.2e-8, B=1e-2, C=1e-4, D=1e-3)


@dataclass(frozen=True)
class P:
    prompt_id: int
    batch: int
    prompt_len: int


class Prompts:
    def prompts(self, b):
        return [P(i, b, 20) for i in range(2)]


def env(alloc, staleness=2, steps=2, n=4):
    return ControlEnv(num_devices=n, node_size=n, tp={Role.ROLLOUT: 1, Role.REWARD: 2},
                      models={Role.ROLLOUT: MODEL, Role.REWARD: MODEL},
                      tau_shift={Role.ROLLOUT: 2.0, Role.REWARD: 3.0, Role.TRAIN: 5.0},
                      prompts=Prompts(), prompts_per_step=2, group_size=2, steps=steps,
                      staleness=staleness, allocation=alloc)


class Driver:
    """A minimal instant runtime: shifts and training complete at the next call."""

    def __init__(self, ctrl):
        self.c, self.now, self.running = ctrl, 0.0, {Role.ROLLOUT: {}, Role.REWARD: {}}
        self.log = []

    def feed(self, ev):
        acts = self.c.handle(ev)
        self.log += acts
        for a in acts:
            if isinstance(a, Dispatch):
                for m in a.moves:
                    if m.kind == "assign":
                        self.running[a.role][m.seq_id] = m.replica_id
                    else:
                        del self.running[a.role][m.seq_id]
            elif isinstance(a, StartShift):
                self.feed(ShiftDone(self.now, plan=a.plan, kv_capacity={s.slot_id: 10**6 for s in a.plan.up}))
            elif isinstance(a, StartTraining):
                self.now += 1
                self.feed(TrainingDone(self.now, batch=a.batch, version=a.version + 1, seconds=1.0))

    def drain(self, limit=1000):
        while not any(isinstance(a, Finish) for a in self.log) and limit:
            limit -= 1
            for role in (Role.ROLLOUT, Role.REWARD):
                if self.running[role]:
                    sid, rid = next(iter(self.running[role].items()))
                    del self.running[role][sid]
                    self.now += 0.1
                    self.feed(SequenceFinished(self.now, role=role, seq_id=sid, generated=3, replica_id=rid))
                    break
            else:
                if not self.c.tick_s:
                    raise AssertionError(f"stuck: {self.c.state()}")
                self.now += self.c.tick_s  # nothing running: a monitor tick lets the planner act
                self.feed(Tick(self.now))


def test_registry_has_the_four_modes():
    assert sorted(CONTROLLERS) == ["colocated", "disaggregated", "pivot", "rr_colocated"]
    with pytest.raises(ValueError, match="allowed"):
        make_controller("bogus", env({}))


@pytest.mark.parametrize("mode,alloc,staleness", [
    ("colocated", {}, 0),
    ("disaggregated", {Role.ROLLOUT: 1, Role.REWARD: 2, Role.TRAIN: 1}, 2),
    ("rr_colocated", {Role.ROLLOUT: 2, Role.TRAIN: 2}, 2),
    ("pivot", {Role.TRAIN: 2}, 2),
])
def test_each_mode_completes_its_steps(mode, alloc, staleness):
    d = Driver(make_controller(mode, env(alloc, staleness)))
    d.feed(Start(0.0))
    d.drain()
    steps = [a for a in d.log if isinstance(a, StepDone)]
    assert [s.batch for s in steps] == [0, 1]
    assert [a.version for a in d.log if isinstance(a, PublishWeights)] == [1, 2]
    assert d.c.pipe.trained_samples == 8


def test_colocated_swaps_every_stage():
    d = Driver(make_controller("colocated", env({}, 0)))
    d.feed(Start(0.0))
    d.drain()
    ups = [a.plan.role_up for a in d.log if isinstance(a, StartShift)]
    assert ups == [Role.ROLLOUT, Role.REWARD, Role.TRAIN, Role.ROLLOUT, Role.REWARD, Role.TRAIN]


def test_colocated_refuses_staleness():
    with pytest.raises(ValueError, match="staleness must be 0"):
        make_controller("colocated", env({}, 2))


def test_disaggregated_rejects_bad_allocation():
    with pytest.raises(ValueError, match="adding up"):
        make_controller("disaggregated", env({Role.ROLLOUT: 1, Role.REWARD: 2, Role.TRAIN: 2})).handle(Start(0.0))


class SharingDriver(Driver):
    """Odd samples repeat the response of the sample before them: when that one has finished, they
    share its judgement (`SequenceFinished.shares_judgement_of`). `order`: which role finishes first."""

    def __init__(self, ctrl, order):
        super().__init__(ctrl)
        self.order, self.finished, self.sharing = order, set(), set()

    def drain(self, limit=1000):
        while not any(isinstance(a, Finish) for a in self.log) and limit:
            limit -= 1
            role = next((r for r in self.order if self.running[r]), None)
            if role is None:
                self.now += self.c.tick_s
                self.feed(Tick(self.now))
                continue
            sid, rid = next(iter(self.running[role].items()))
            del self.running[role][sid]
            self.now += 0.1
            lead = -1
            if role == Role.ROLLOUT:
                self.finished.add(sid)
                if sid % 2 and sid - 1 in self.finished:
                    lead = sid - 1
                    self.sharing.add(sid)
            self.feed(SequenceFinished(self.now, role=role, seq_id=sid, generated=3, replica_id=rid,
                                       shares_judgement_of=lead))


@pytest.mark.parametrize("order", [(Role.ROLLOUT, Role.REWARD), (Role.REWARD, Role.ROLLOUT)])
@pytest.mark.parametrize("mode,alloc,staleness", [
    ("colocated", {}, 0),
    ("disaggregated", {Role.ROLLOUT: 1, Role.REWARD: 2, Role.TRAIN: 1}, 2),
    ("rr_colocated", {Role.ROLLOUT: 2, Role.TRAIN: 2}, 2),
    ("pivot", {Role.TRAIN: 2}, 2),
])
def test_shared_judgements_complete_every_mode(mode, alloc, staleness, order):
    """Samples sharing a judgement get no GenRM sequence, and their batches still complete (also
    when the shared judgement is done before the sharing response finishes, which then completes
    the batch)."""
    d = SharingDriver(make_controller(mode, env(alloc, staleness)), order)
    d.feed(Start(0.0))
    d.drain()
    assert [s.batch for s in d.log if isinstance(s, StepDone)] == [0, 1]
    assert d.c.pipe.trained_samples == 8 and d.sharing
    judged = {m.seq_id for a in d.log if isinstance(a, Dispatch) and a.role == Role.REWARD for m in a.moves}
    assert judged == set(range(8)) - d.sharing
    shared = sum(s.fields["judgements_shared"] for s in d.log if isinstance(s, StepDone))
    assert shared == len(d.sharing)
