"""`Controller.device_lost`: a device that left the pool (a crash loop) gives its sequences back to
the queue and is in no later plan; the run goes on with fewer devices, or stops with
`DeviceLostError` once a role can no longer run (issue 14 item 8)."""
from __future__ import annotations

import pytest

from pivotrl.core.types import Role
from pivotrl.deploy import make_controller
from pivotrl.deploy.base import DeviceLostError
from pivotrl.deploy.events import DeviceLost, Dispatch, Finish, Record, Start, StartShift
from tests.deploy.test_controllers import Driver, env


def _env(alloc, n=4):
    e = env(alloc, n=n)
    e.tp = {Role.ROLLOUT: 1, Role.REWARD: 1}
    return e


def test_disaggregated_loses_a_rollout_device_and_finishes_on_the_other():
    c = make_controller("disaggregated", _env({Role.ROLLOUT: 2, Role.REWARD: 1, Role.TRAIN: 1}))
    drv = Driver(c)
    drv.feed(Start(0.0))
    victim = next(iter(c.active[Role.ROLLOUT].values()))
    on_victim = [sid for sid, rid in drv.running[Role.ROLLOUT].items() if rid == victim.slot_id]
    assert on_victim, "the lost replica held sequences"
    n_log = len(drv.log)
    drv.feed(DeviceLost(1.0, device=victim.first_device))
    acts = drv.log[n_log:]
    assert isinstance(acts[0], Record) and acts[0].kind == "device_lost"
    moved = {m.seq_id: m for a in acts if isinstance(a, Dispatch) for m in a.moves if m.kind == "assign"}
    assert set(on_victim) <= set(moved), "its sequences were dispatched again"
    assert all(m.replica_id != victim.slot_id for m in moved.values())
    assert victim.first_device in c.pending_devices() and victim.slot_id not in c.active[Role.ROLLOUT]
    drv.drain()
    assert any(isinstance(a, Finish) for a in drv.log) and c.pipe.version == 2
    assert all(rid != victim.slot_id for rid in drv.running[Role.ROLLOUT].values())


def test_the_last_replica_of_a_static_role_is_an_error_naming_the_role():
    c = make_controller("disaggregated", _env({Role.ROLLOUT: 2, Role.REWARD: 1, Role.TRAIN: 1}))
    Driver(c).feed(Start(0.0))
    reward = next(iter(c.active[Role.REWARD].values()))
    with pytest.raises(DeviceLostError, match="last reward replica.*deploy=disaggregated.*reward can no longer run"):
        c.handle(DeviceLost(1.0, device=reward.first_device))


def test_a_training_device_is_an_error():
    c = make_controller("disaggregated", _env({Role.ROLLOUT: 2, Role.REWARD: 1, Role.TRAIN: 1}))
    Driver(c).feed(Start(0.0))
    with pytest.raises(DeviceLostError, match="training device"):
        c.handle(DeviceLost(1.0, device=c.train_slot.first_device))


def test_pivot_never_plans_a_lost_device_and_finishes():
    c = make_controller("pivot", _env({Role.TRAIN: 1}))
    drv = Driver(c)
    drv.feed(Start(0.0))
    victim = next(iter(c.active[Role.ROLLOUT].values()))
    n_log = len(drv.log)
    drv.feed(DeviceLost(1.0, device=victim.first_device))
    drv.drain()
    assert any(isinstance(a, Finish) for a in drv.log) and c.pipe.version == 2
    later = [a.plan for a in drv.log[n_log:] if isinstance(a, StartShift)]
    assert later, "the run shifted devices after the loss"
    assert all(victim.first_device not in s.devices for p in later for s in p.up + p.down)
    assert victim.first_device in c.pending_devices()


def test_colocated_drops_the_lost_device_from_its_reward_phase_then_stops_at_training():
    c = make_controller("colocated", env({}, staleness=0))
    c.env.tp = {Role.ROLLOUT: 1, Role.REWARD: 1}
    drv = Driver(c)
    drv.feed(Start(0.0))
    drv.feed(DeviceLost(1.0, device=3))
    with pytest.raises(DeviceLostError, match=r"training slot train@0x4.*\[3\] left the pool"):
        drv.drain()
    ups = [s for a in drv.log if isinstance(a, StartShift) and a.plan.role_up == Role.REWARD for s in a.plan.up]
    assert ups and all(3 not in s.devices for s in ups), "the reward phase ran on the other devices"


def test_an_unknown_device_is_refused():
    c = make_controller("pivot", _env({Role.TRAIN: 1}))
    with pytest.raises(ValueError, match="device 9"):
        c.device_lost(9, 0.0)
