"""The chaos soak's short form (`python -m pivotrl.bench chaos`, issue 22 item 8): a 3-step pivot
run on tiny random models with a device killed every 2 s, cycling through every fault phase,
resumed after any stop, ends with every step trained once: no sample lost, none trained twice.
(The long form, the default run beside an unkilled one: BENCHMARKS.md, "Reliability".)"""
from __future__ import annotations

from tests.e2e.conftest import local_overrides, ray_session, tiny_assets  # noqa: F401  (fixtures)


def test_short_soak_loses_nothing_and_trains_nothing_twice(ray_session, tiny_assets, tmp_path):  # noqa: F811
    from pivotrl.bench.chaos import NO_RETIRE, account, soak
    from pivotrl.runtime.faults import PHASES, Chaos

    steps, batch = 3, 2 * 4
    chaos = Chaos(2.0, PHASES, seed=0)
    got = soak([*local_overrides(tiny_assets, "pivot", [f"train.steps={steps}"]), *NO_RETIRE], tmp_path, chaos,
               max_restarts=6)
    acc = account(tmp_path, got["summary"], steps, batch)
    assert chaos.fired, "at least one device was killed"
    assert acc["steps_completed"] == steps and acc["policy_version"] == steps
    assert acc["samples_lost"] == 0 and acc["samples_trained_twice"] == 0, acc
    assert acc["lost_devices"] == [] and acc["device_deaths"] + len(got["stops"]) >= 1, (acc, got["stops"])
    assert 0.0 <= acc["val_accuracy_after"] <= 1.0
