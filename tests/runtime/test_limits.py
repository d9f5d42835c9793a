"""Time limits of the calls into device actors (`runtime/limits.py`, `cluster.limits.*`): limits
scale with the model, and on real Ray actors whose methods hang past a small limit, an inference
device is replaced (a death naming the limit) while a training call stops with an error naming the
phase, the devices, the elapsed time and the key to raise. On the same actors: devices sharing a
GPU (`cluster.devices_per_gpu`) shift one at a time."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from pivotrl.config.cluster import LimitsConfig
from pivotrl.config.engine import EngineConfig
from pivotrl.core.dispatch import Move
from pivotrl.core.types import Role, ShiftPlan, Slot
from pivotrl.runtime.cluster import ClusterSpec
from pivotrl.runtime.limits import Limits
from pivotrl.runtime.outcomes import TimeLimitExceeded
from pivotrl.runtime.roles import RoleSpec, ShiftTiming

HANG_S = 60.0  # far past every limit below


def test_limits_scale_with_the_model_and_name_their_keys():
    lim = Limits(LimitsConfig(call_s=7, shift_floor_s=100, shift_s_per_gb=10, train_floor_s=50, train_s_per_gb=2),
                 {"policy": 15.0, "genrm": 60.0})
    assert lim.of("call").seconds == 7 and lim.of("call").key == "cluster.limits.call_s"
    assert lim.of("shift", "policy").seconds == pytest.approx(250)
    assert lim.of("shift", "genrm").seconds == pytest.approx(700)
    assert lim.of("train", "policy").seconds == pytest.approx(80)
    assert "cluster.limits.shift_s_per_gb=10" in lim.of("shift", "genrm").key and "60 GB of genrm" in lim.of("shift", "genrm").key
    assert Limits().of("load", "unknown").seconds == LimitsConfig().load_floor_s, "an unknown size: the floor"
    with pytest.raises(ValueError, match="allowed call, shift, load, train"):
        lim.of("sleep")


def test_the_time_limit_error_names_phase_devices_elapsed_and_key():
    e = TimeLimitExceeded("training train_step", [2, 3], 12.34, 10.0, "cluster.limits.train_floor_s=10")
    assert str(e) == ("training train_step on device(s) [2, 3] ran 12.3s, past its time limit of 10.0s "
                      "(cluster.limits.train_floor_s=10); if it is only slow, raise that limit")


@pytest.mark.parametrize("bad", ["call_s=0", "shift_floor_s=-1", "load_s_per_gb=-0.5", "train_floor_s=inf"])
def test_bad_limits_are_refused_naming_the_key(bad):
    from pivotrl.config import compose_config
    from pivotrl.config.base import ConfigError

    with pytest.raises((ConfigError, ValueError), match="cluster.limits." + bad.split("=")[0]):
        compose_config(["cluster=local", f"cluster.limits.{bad}"])


class Hanging:
    """A device actor whose calls hang (generation 0 only: a respawned actor answers at once)."""

    def __init__(self, device, generation, hang):
        self.device, self.generation, self.hang = device, generation, hang

    def _maybe_hang(self, method):
        if self.generation == 0 and method in self.hang:
            time.sleep(HANG_S)

    def info(self):
        return {"device": self.device, "cores": None, "accelerators": []}

    def ping(self):
        return self.device

    def shift_up(self, spec, weights=None, version=0):
        self._maybe_hang(f"shift_up:{spec.role.value}")
        t0 = time.time()
        if "slow_up" in self.hang:
            time.sleep(0.5)
        return ShiftTiming(spec.role.value, "up", 0.0, version=version,
                           detail={"kv_capacity_tokens": 64.0, "t0": t0, "t1": time.time()})

    def shift_down(self):
        self._maybe_hang("shift_down")
        return ShiftTiming("none", "down", 0.0)

    def load_weights(self, weights, version, role=None):
        self._maybe_hang("load_weights")
        return {"seconds": 0.0, "version": version}

    def abort(self, ids):
        self._maybe_hang("abort")
        return SimpleNamespace(aborted={}, finished=[])

    def train_step(self, batch):
        self._maybe_hang("train_step")
        return {"version": 1}

    def close(self):
        return None


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _executor(ray, monkeypatch, hang, devices=2, shift_s=1.5, devices_per_gpu=1):
    import pivotrl.runtime.executor as executor

    cls = ray.remote(num_cpus=0, max_concurrency=4)(Hanging)
    monkeypatch.setattr(executor, "spawn_device", lambda cluster, d, g=0: cls.remote(d, g, set(hang)))
    params = SimpleNamespace(weights=lambda model: (None, 1), version=lambda model: 1)

    def specs(slot, i):
        if slot.role == Role.TRAIN:
            return RoleSpec(Role.TRAIN, "policy", "/p", trainer=object(), rank=i, world_size=slot.tp, init_method="tcp://x:1")
        return RoleSpec(slot.role, "policy", "/p", engine=EngineConfig(name="cpu"))

    lim = Limits(LimitsConfig(call_s=1.0, shift_floor_s=shift_s, shift_s_per_gb=0.0, load_floor_s=1.0,
                              load_s_per_gb=0.0, train_floor_s=1.0, train_s_per_gb=0.0))
    ex = executor.Executor(SimpleNamespace(spec=ClusterSpec(kind="ray", num_devices=devices, devices_per_gpu=devices_per_gpu), devices={}),
                           specs, params,
                           {Role.ROLLOUT: "policy", Role.REWARD: "genrm"})
    ex.wait_ready()  # actors start within the default limits; the tight ones apply from here
    ex.limits = lim
    return ex


def test_an_inference_shift_up_past_its_limit_replaces_the_device(ray_session, monkeypatch):
    # room for the retry: it waits for the fresh actor's start too
    ex = _executor(ray_session, monkeypatch, ["shift_up:rollout"], shift_s=10.0)
    t0 = time.monotonic()
    res = ex.run_shift(ShiftPlan(Role.ROLLOUT, up=[Slot(Role.ROLLOUT, 0, 1)]))
    assert res.error is None and res.dead == {0}, "shifted up again on the fresh actor"
    assert time.monotonic() - t0 < 2 * HANG_S / 3, "the limit, not the hang, ended the wait"
    (death,) = ex.take_deaths()
    assert death.device == 0 and "shift_up on device(s) [0] ran" in death.why and "cluster.limits.shift_floor_s" in death.why
    assert ex.serving() == {0: Role.ROLLOUT} and ex.generation[0] == 1


def test_a_weight_load_past_its_limit_replaces_the_device(ray_session, monkeypatch):
    ex = _executor(ray_session, monkeypatch, ["load_weights"])
    assert ex.run_shift(ShiftPlan(Role.ROLLOUT, up=[Slot(Role.ROLLOUT, 0, 1), Slot(Role.ROLLOUT, 1, 1)])).error is None
    version, per = ex.publish_policy()
    assert per == [], "both devices hung in the load; each is replaced, not waited for"
    deaths = ex.take_deaths()
    assert sorted(d.device for d in deaths) == [0, 1]
    assert all("weight load (publish)" in d.why and "cluster.limits.load_floor_s" in d.why for d in deaths)
    assert all(d.slot is not None and d.role == Role.ROLLOUT for d in deaths), "their sequences go back to the queue"


def test_an_abort_past_its_limit_replaces_the_device(ray_session, monkeypatch):
    ex = _executor(ray_session, monkeypatch, ["abort"])
    ex.run_shift(ShiftPlan(Role.ROLLOUT, up=[Slot(Role.ROLLOUT, 0, 1)]))
    res = ex.execute_moves(Role.ROLLOUT, [Move("abort", 7, "rollout@0x1")], lambda role, sid: None)
    assert res.dead == {0}
    (death,) = ex.take_deaths()
    assert "abort on device(s) [0]" in death.why and "cluster.limits.call_s" in death.why


def test_a_training_step_past_its_limit_stops_naming_the_phase_and_key(ray_session, monkeypatch):
    ex = _executor(ray_session, monkeypatch, ["train_step"])
    ex.train_ranks.update({0, 1})  # as after training's shift up (a call to no rank is a rank death)
    with pytest.raises(TimeLimitExceeded) as e:
        ex.train_call((0, 1), "train_step", None)
    assert e.value.devices == [0, 1] and e.value.phase == "training train_step" and 0.9 <= e.value.elapsed_s < HANG_S
    assert "cluster.limits.train_floor_s=1" in str(e.value)
    assert ex.take_deaths() == [], "a training rank is never silently replaced"


def test_a_training_shift_up_past_its_limit_stops_the_shift(ray_session, monkeypatch):
    ex = _executor(ray_session, monkeypatch, ["shift_up:train"])
    res = ex.run_shift(ShiftPlan(Role.TRAIN, up=[Slot(Role.TRAIN, 0, 2)]))
    assert isinstance(res.error, TimeLimitExceeded) and res.error.phase == "shift_up"
    assert "cluster.limits.shift_floor_s" in str(res.error)


@pytest.mark.parametrize("per_gpu", [1, 3])
def test_devices_sharing_a_gpu_shift_one_at_a_time(ray_session, monkeypatch, per_gpu):
    ex = _executor(ray_session, monkeypatch, ["slow_up"], devices=3, shift_s=30.0, devices_per_gpu=per_gpu)
    res = ex.run_shift(ShiftPlan(Role.ROLLOUT, up=[Slot(Role.ROLLOUT, d, 1) for d in range(3)]))
    assert res.error is None
    spans = sorted((t["t0"], t["t1"]) for t in res.timings if t["direction"] == "up")
    overlap = any(b0 < a1 for (_, a1), (b0, _) in zip(spans, spans[1:]))
    assert overlap == (per_gpu == 1), spans
