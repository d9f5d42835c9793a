"""The device driver's handling of a finished shift, with stand-ins for the devices: a rollout
replica that read GPS while a publish committed a newer policy is refreshed before it serves."""
from __future__ import annotations

from pivotrl.core.types import Role, ShiftPlan, Slot
from pivotrl.deploy.events import ShiftDone
from pivotrl.runtime.driver import DeviceDriver
from pivotrl.runtime.ledger import SequenceLedger
from pivotrl.runtime.monitor import Monitor
from pivotrl.runtime.outcomes import ShiftResult


class _Params:
    def __init__(self, version):
        self.v = version

    def version(self, model):
        return self.v


class _Executor:
    def __init__(self, version):
        self.params, self.recoveries, self.published = _Params(version), [], 0

    def publish_policy(self):
        self.published += 1
        return self.params.v, [{"device": 0, "seconds": 0.01, "version": self.params.v}]


class _Training:
    def shifted(self, res):
        self.res = res


def _driver(version):
    d = DeviceDriver.__new__(DeviceDriver)
    d.ex, d.training, d.monitor, d.ledger = _Executor(version), _Training(), Monitor(), SequenceLedger()
    d.recorded_recoveries, d.events, d.t0 = [], [], 0.0
    d.record_event = lambda kind, **f: d.events.append((kind, f))
    return d


def _shift(loaded):
    res = ShiftResult(ShiftPlan(Role.ROLLOUT, up=[Slot(Role.ROLLOUT, 0, 1)]))
    res.timings = [{"device": 0, "role": "rollout", "direction": "up", "seconds": 0.1, "cold": False, "version": loaded}]
    return res


def test_a_rollout_shift_that_raced_a_publish_takes_the_new_policy_first():
    d = _driver(version=3)
    evs = list(d._on_result(_shift(loaded=2)))
    assert d.ex.published == 1 and [k for k, _ in d.events] == ["shift_timing", "weight_refresh"]
    assert isinstance(evs[-1], ShiftDone)  # the controller hears of the replica after its refresh
    fresh = _driver(version=3)
    list(fresh._on_result(_shift(loaded=3)))
    assert fresh.ex.published == 0
