"""The chaos hook (`runtime.faults.Chaos`) on a fake clock: a kill every N seconds (or every N fault
points), in turn at each phase of the cycle, at a seeded-random one of the devices reaching it; a
phase that does not come is passed over. (Real kills at each phase: tests/e2e/test_device_faults.py; the soak:
tests/bench/test_chaos.py.)"""
from __future__ import annotations

import pytest

from pivotrl.runtime import faults


@pytest.fixture()
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(faults.time, "monotonic", lambda: now[0])
    killed: list = []
    monkeypatch.setattr(faults, "kill_device", lambda actor: killed.append(actor))
    return now, killed


def test_a_kill_every_n_seconds_cycling_through_the_phases(clock):
    now, killed = clock
    chaos = faults.Chaos(10.0, ("submit", "poll", "train"), seed=3)
    for step in range(400):  # 0.25 s apart: every phase comes round for 4 devices
        now[0] = 1000.0 + step * 0.25
        ph = ("submit", "poll", "train")[step % 3]
        chaos(ph, step % 4, f"actor{step % 4}")
    phases = [k["phase"] for k in chaos.fired]
    assert phases[:6] == ["submit", "poll", "train", "submit", "poll", "train"]
    assert len(chaos.fired) == len(killed) == 9 and not chaos.missed
    gaps = [b["t"] - a["t"] for a, b in zip(chaos.fired, chaos.fired[1:])]
    assert all(10.0 <= g <= 10.0 + 3 * 0.75 for g in gaps), gaps  # up to 2 skips of a phase that comes every 0.75 s
    assert len({k["device"] for k in chaos.fired}) > 1, "the seeded skips vary the device"
    assert killed == [f"actor{k['device']}" for k in chaos.fired]


def test_a_phase_that_does_not_come_is_passed_over(clock):
    now, killed = clock
    chaos = faults.Chaos(5.0, ("shift_down", "poll"), seed=0)
    for step in range(200):
        now[0] = 1000.0 + step * 0.25
        chaos("poll", 0, "a")
    assert chaos.missed["shift_down"] >= 1 and all(k["phase"] == "poll" for k in chaos.fired) and chaos.fired


def test_a_kill_every_n_points_whatever_the_clock(clock):
    """Counted in fault points, the kills land at the same points of the same sequence whether the
    run is slow or fast: a short run on warm devices gets its kills too."""
    now, killed = clock
    runs = []
    for dt in (0.001, 5.0):  # the same 120 points, 0.12 s or 600 s in all
        chaos = faults.Chaos(10, ("submit", "poll", "train"), seed=3, unit="points")
        for step in range(120):
            now[0] = 1000.0 + step * dt
            chaos(("submit", "poll", "train")[step % 3], step % 4, f"actor{step % 4}")
        runs.append(chaos.fired)
    assert runs[0] == runs[1] and [k["phase"] for k in runs[0][:3]] == ["submit", "poll", "train"]
    gaps = [b["t"] - a["t"] for a, b in zip(runs[0], runs[0][1:])]
    assert len(runs[0]) >= 8 and all(10 <= g <= 10 + 3 * 3 for g in gaps), gaps  # up to 2 skips, 3 points apart
    assert len(killed) == 2 * len(runs[0])


def test_bad_settings_name_themselves():
    with pytest.raises(ValueError, match="every=0 s: must be > 0"):
        faults.Chaos(0)
    with pytest.raises(ValueError, match="unit='min': allowed s, points"):
        faults.Chaos(1, unit="min")
    with pytest.raises(ValueError, match="fault phase 'nope': allowed submit"):
        faults.Chaos(1, ("nope",))
