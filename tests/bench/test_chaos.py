"""The chaos soak's short form (`python -m pivotrl.bench chaos`, issue 22 item 8), through the
bench's own command: a 3-step pivot run on tiny random models with a device killed every 5 fault
points, cycling through every fault phase, resumed after any stop, ends with every step trained
once: no sample lost, none trained twice. Counted in points, not seconds, the kills come whether
the devices start cold (such a run has ~35 points in ~23 s) or were kept warm by an earlier run (the
same points in ~7 s: a kill every 2 s once fired none).
(The long form, the default run beside an unkilled one: BENCHMARKS.md, "Reliability".)"""
from __future__ import annotations

import json

from tests.e2e.conftest import local_overrides, ray_session, tiny_assets  # noqa: F401  (fixtures)


def test_short_soak_loses_nothing_and_trains_nothing_twice(ray_session, tiny_assets, tmp_path):  # noqa: F811
    from pivotrl.bench.chaos import main

    steps = 3
    overrides = [a for o in local_overrides(tiny_assets, "pivot", [f"train.steps={steps}"]) for a in ("-o", o)]
    assert main(["--every-points", "5", "--no-baseline", "--max-restarts", "6", "--out", str(tmp_path),
                 "--json", str(tmp_path / "chaos.json"), *overrides]) == 0
    got = json.loads((tmp_path / "chaos.json").read_text())
    (row,) = got["rows"]
    assert got["unit"] == "points" and len(got["kills"]) >= 2 and row["kills"] == len(got["kills"]), got["kills"]
    assert row["steps_completed"] == steps and row["policy_version"] == steps
    assert row["samples_lost"] == 0 and row["samples_trained_twice"] == 0, row
    assert row["lost_devices"] == 0 and row["device_deaths"] + row["restarts"] >= 1, (row, got["stops"])
    assert 0.0 <= row["val_accuracy_after"] <= 1.0
