"""Validation through the cluster's rollout engines: a replica is shifted up for it when none
serves (and down again after; on the slot the run asks for, else the pool's first), one that
serves is used as it is, and its greedy answers equal an engine's in the driver holding the same
weights; a device that stops progressing is an error."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pivotrl.core.types import Role, ShiftPlan, Slot


@pytest.mark.slow
def test_validation_runs_on_a_rollout_replica_of_the_cluster(ray_session, tiny_assets):
    from pivotrl.config.engine import EngineConfig
    from pivotrl.engines.cpu_engine import CPUEngine
    from pivotrl.engines.protocol import GenerationRequest, SamplingParams
    from pivotrl.runtime.validation import RemoteEngine, rollout_replica
    from tests.e2e.conftest import policy_executor

    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    reqs = [GenerationRequest(seq_id=(1 << 40) + i, prompt_ids=[3 + i, 5, 7], params=greedy) for i in range(3)]
    local = CPUEngine(tiny_assets["policy"], EngineConfig(name="cpu", num_threads=1))
    try:
        want = [c.token_ids for c in local.generate(reqs)]
    finally:
        local.shutdown()
    with policy_executor(tiny_assets["policy"]) as ex:
        with rollout_replica(ex, 1) as (actor, device):  # nothing serves: one is shifted up for it
            assert device == 0 and ex.serving() == {0: Role.ROLLOUT}
            got = [c.token_ids for c in RemoteEngine(actor, device, poll_s=0.05).generate(reqs)]
        assert got == want, "the same weights give the same greedy answers on the device"
        assert ex.serving() == {} and ex.role_of[0] is None, "shifted down again: the devices as they were"
        with rollout_replica(ex, 1, Slot(Role.ROLLOUT, 1, 1)) as (actor, device):  # on the slot asked for
            assert device == 1 and ex.serving() == {1: Role.ROLLOUT}
        assert ex.serving() == {}
        res = ex.run_shift(ShiftPlan(Role.ROLLOUT, up=[Slot(Role.ROLLOUT, 1, 1)]))
        assert res.error is None
        assert not res.timings[-1]["cold"], "the validation's engine, dormant on device 1, is the shift's"
        shifts = len(ex.shift_log)
        with rollout_replica(ex, 1) as (actor, device):  # one serves: used as it is
            assert device == 1
            assert [c.token_ids for c in RemoteEngine(actor, device, poll_s=0.05).generate(reqs[:1])] == want[:1]
        assert len(ex.shift_log) == shifts and ex.serving() == {1: Role.ROLLOUT}


def test_a_device_that_stops_progressing_is_an_error_naming_it(monkeypatch):
    import ray

    from pivotrl.runtime.device import DevicePoll
    from pivotrl.runtime.validation import RemoteEngine

    class Silent:  # takes the requests, never reports a token
        submit = SimpleNamespace(remote=lambda reqs: len(reqs))
        poll = SimpleNamespace(remote=lambda timeout: DevicePoll(device=3))

    monkeypatch.setattr(ray, "get", lambda x, **k: x)
    req = SimpleNamespace(seq_id=1 << 40)
    with pytest.raises(RuntimeError, match=r"device 3: no token for 0\.2s with 1 of 1 requests unfinished"):
        RemoteEngine(Silent(), 3, poll_s=0.01, idle_limit_s=0.2).generate([req])


def test_a_validation_slot_of_another_role_or_size_is_refused():
    from pivotrl.runtime.validation import rollout_replica

    ex = SimpleNamespace(serving=lambda: {}, retired=set())
    for slot in (Slot(Role.REWARD, 0, 1), Slot(Role.ROLLOUT, 0, 2)):
        with pytest.raises(ValueError, match="validation needs a rollout slot of 1 device"):
            with rollout_replica(ex, 1, slot):
                pass
