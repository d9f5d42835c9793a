"""A device killed at each phase of the real device loop (issue 12 item 1, issue 14 item 8).

Deterministic: `pivotrl.runtime.faults` calls a hook at each named phase (submit, poll, shift
down, shift up, train, publish, a training-home device lent to inference), and the hook kills the
device's actor right there, inside the loop, and waits until Ray reports it dead. No kill depends
on timing. `PIVOTRL_STRESS=N` runs the module beside N busy-loop processes it starts (bounded: each
stops itself after `STRESS_S` seconds and is killed by its pid at the end), the timing-independence
check recorded in BENCHMARKS.md; the default suite runs them without (0), beside the other tests.

Each run starts 4 device actors that import torch and transformers (30-90 s on 2 loaded cores),
so every test here is `slow`. Run them with `python -m pytest tests/e2e/test_device_faults.py -m slow`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pivotrl.runtime import faults
from tests.e2e.conftest import make_local_cfg

pytestmark = pytest.mark.slow

STRESS_S = 900
BUSY = f"import time\nend = time.monotonic() + {STRESS_S}\nwhile time.monotonic() < end:\n    pass\n"


@pytest.fixture(scope="module", autouse=True)
def stress():
    """`PIVOTRL_STRESS` busy-looping processes for the module's runs (each a core of load)."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(int(os.environ.get("PIVOTRL_STRESS", "0")))]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


@pytest.fixture
def hook():
    def install(h):
        faults.set_hook(h)
        return h

    yield install
    faults.set_hook(None)


def _each(*hooks):
    """One fault hook that runs each of `hooks` in turn (several kills in one run: a run's start-up
    is most of a kill test's time)."""
    def hook(phase, device, actor):
        for h in hooks:
            h(phase, device, actor)

    return hook


def _timeline(run_dir):
    return [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]


def _deaths(run_dir):
    return [r for r in _timeline(run_dir) if r["kind"] == "device_death"]


def _finished(summary, deaths=1):
    P, G = 2, 4
    assert summary["policy_version"] == 2
    assert summary["samples_trained"] == summary["samples_trained_unique"] == 2 * P * G, "no sample lost or twice"
    assert summary["device_deaths"] == deaths == summary["respawns"], "each death counted once"


def test_kills_at_submit_and_at_publish_rehost_the_device_and_lose_nothing(ray_session, tiny_assets, tmp_path, hook):
    """disaggregated (rollout on devices 0 and 1): device 0 dies as a submit reaches it, before any
    dispatch; device 1 as a weight publish reaches it. Each is found once, respawned and re-hosted,
    and the run finishes with nothing lost or trained twice."""
    from pivotrl.run import run

    at_submit, at_publish = faults.kill_at("submit", device=0), faults.kill_at("publish", device=1)
    hook(_each(at_submit, at_publish))
    summary = run(make_local_cfg(tiny_assets, "disaggregated"), tmp_path)
    assert at_submit.fired == [("submit", 0)] and at_publish.fired == [("publish", 1)]
    _finished(summary, deaths=2)
    deaths = {d["device"]: d for d in _deaths(tmp_path)}
    assert sorted(deaths) == [0, 1] and {d["role"] for d in deaths.values()} == {"rollout"}
    # each found by the call it was killed before, or by a poll already in flight to it: once either way
    assert deaths[0]["why"].split(":")[0] in ("submit", "poll")
    assert deaths[1]["why"].split(":")[0] in ("publish", "poll")


def test_kills_at_shift_down_and_at_shift_up_in_one_shift(ray_session, tiny_assets, tmp_path, hook):
    """colocated turns its rollout pool to reward: device 1 dies as it is shifted down, device 2 as
    it is shifted up (its second shift up, to reward). The shift finds both, respawns them and
    brings them up as reward; the run finishes with nothing lost."""
    from pivotrl.run import run

    at_down, at_up = faults.kill_at("shift_down", device=1), faults.kill_at("shift_up", device=2, after=1)
    hook(_each(at_down, at_up))
    summary = run(make_local_cfg(tiny_assets, "colocated"), tmp_path)
    assert at_down.fired == [("shift_down", 1)] and at_up.fired == [("shift_up", 2)]
    _finished(summary, deaths=2)
    deaths = {d["device"]: d for d in _deaths(tmp_path)}
    assert sorted(deaths) == [1, 2]
    # each found by the shift's own call or by a poll already in flight: once either way
    assert deaths[1]["why"].split(":")[0] in ("shift_down", "poll")
    assert deaths[2]["why"].split(":")[0] in ("shift_up", "poll")
    shift = [r for r in _timeline(tmp_path) if r["kind"] == "shift_timing" and r["role_up"] == "reward"][0]
    # the shift saw device 1 dead unless the poll's respawn came before its call
    dead = set(shift["dead"]) - {2}
    assert dead == {1} if deaths[1]["why"].startswith("shift_down") else dead in (set(), {1})
    assert {t["device"] for t in shift["devices"] if t["role"] == "reward" and t["direction"] == "up"} >= {1, 2}, \
        "the reward shift brought both fresh actors up"


def test_a_weight_load_past_its_time_limit_replaces_the_device(ray_session, tiny_assets, tmp_path, hook):
    """A rollout device hangs (its step lock held, as a stuck engine call would) just as a publish
    reaches it: the load runs past `cluster.limits.load_floor_s`, the device is replaced like a
    dead one, its sequences go back to the queue, and the run finishes with nothing lost."""
    from pivotrl.run import run

    h = hook(faults.stall_at("publish", device=0, seconds=300))
    summary = run(make_local_cfg(tiny_assets, "disaggregated", ["cluster.limits.load_floor_s=5"]), tmp_path)
    assert h.fired == [("publish", 0)]
    _finished(summary)
    (d,) = _deaths(tmp_path)
    assert d["device"] == 0 and d["role"] == "rollout"
    assert "weight load (publish) on device(s) [0] ran" in d["why"] and "cluster.limits.load_floor_s=5" in d["why"]


def test_kill_a_training_rank_says_how_to_resume(ray_session, tiny_assets, tmp_path, hook):
    from pivotrl.run import run

    h = hook(faults.kill_at("train", after=1))  # the second step: step 1's checkpoint exists
    with pytest.raises(RuntimeError) as ei:
        run(make_local_cfg(tiny_assets, "disaggregated"), tmp_path)
    assert h.fired and h.fired[0][0] == "train"
    msg = str(ei.value)
    assert "training rank" in msg and "process group is lost" in msg
    assert f"train.resume=true hydra.run.dir={tmp_path}" in msg
    assert (tmp_path / "checkpoints" / "step_00000001" / "trainer_state.json").is_file()


def test_a_lent_home_killed_again_as_it_returns_to_training_is_rebuilt_once(ray_session, tiny_assets, tmp_path,
                                                                                hook):
    """pivot lends its training home (device 3, holding the trainer's offloaded state) to inference
    after step 1; it dies there (its trainer state with it), is respawned and re-hosted, then dies
    again as it is shifted down to return to training. The shift rebuilds the trainer once, from the
    step-1 checkpoint, before its shift up: the run ends at version 3, never back at 0. The second
    death (found by the chaos soak, issue 22): the device came up fresh, so it no longer triggers a
    second rebuild, which called `shift_up(train)` on ranks already training and stopped the run.
    Two sequences per engine: a queue forms, so the freed home device always has work (with all 8
    sequences already running, the fitted throughput model can see no gain in a fourth replica,
    and the home is not lent)."""
    from pivotrl.run import run

    ck1 = tmp_path / "checkpoints" / "step_00000001" / "trainer_state.json"
    # in this order: lent (after step 1's checkpoint), then the next shift down of the fresh device
    # (one hook for both phases also fired at a shift down of the home before it was lent, on a
    # loaded machine: PIVOTRL_STRESS=1)
    lent = faults.kill_at("lent_home", device=3, when=ck1.is_file)
    back = faults.kill_at("shift_down", device=3, when=lambda: bool(lent.fired))
    hook(_each(lent, back))
    summary = run(make_local_cfg(tiny_assets, "pivot", ["deploy.staleness=0", "train.steps=3",
                                                        "engine.max_num_seqs=2"]), tmp_path)
    assert lent.fired == [("lent_home", 3)] and back.fired == [("shift_down", 3)]
    deaths = [r for r in _timeline(tmp_path) if r["kind"] == "device_death" and r["device"] == 3]
    assert len(deaths) == 2, "killed as lent, then again as it was shifted down to return to training"
    assert deaths[0]["held_train_state"], "the first death took the trainer's offloaded state"
    # the shift that took the second death (in its own calls, or through a submit settled before it)
    # brought device 3 back to training: the trainer was rebuilt once, before that shift up
    assert summary["policy_version"] == 3
    assert summary["samples_trained"] == summary["samples_trained_unique"] == 3 * 2 * 4
    assert len(summary["training_recoveries"]) == 1
    rec = [r for r in _timeline(tmp_path) if r["kind"] == "training_recovered"]
    assert len(rec) == 1 and rec[0]["version"] >= 1, "rebuilt at its checkpoint's version, not 0"
    assert summary["training_recoveries"][0]["version"] == rec[0]["version"]


def test_a_crash_looping_device_leaves_the_pool_and_a_polled_one_keeps_its_tokens(ray_session, tiny_assets, tmp_path,
                                                                                     hook):
    """disaggregated, rollout on devices 0 and 1, one run for two faults. Device 0 dies when it
    first reports tokens, then at every re-host (an engine that crashes as it starts): with
    cluster.max_respawns=2 the re-host death keeps the role, so the device is re-hosted once more,
    and the third death takes it out of the pool. Device 1 dies just after a poll reported its
    tokens (64-token answers, so it holds sequences part-way): the tokens reported are kept and
    resubmitted with their log-probs, and the run finishes on device 1 with nothing lost."""
    from pivotrl.run import run

    looping, polled = faults.kill_at(("poll", "rehost"), device=0, times=3), faults.kill_at("poll", device=1)
    hook(_each(looping, polled))
    summary = run(make_local_cfg(tiny_assets, "disaggregated", ["cluster.max_respawns=2", "data.max_response_length=64"]),
                  tmp_path)
    assert looping.fired == [("poll", 0), ("rehost", 0), ("rehost", 0)] and polled.fired == [("poll", 1)]
    _finished(summary, deaths=4)
    assert summary["lost_devices"] == [0]
    lost = [r for r in _timeline(tmp_path) if r["kind"] == "device_lost"]
    assert [r["device"] for r in lost] == [0], "one device_lost record (the controller's)"
    deaths = [r for r in _deaths(tmp_path) if r["device"] == 0]
    assert [r["crash_loop"] for r in deaths] == [False, False, True]
    assert [r["role"] for r in deaths] == ["rollout"] * 3, "a death at re-host keeps the role it was given"
    assert [r["why"].split(":")[0] for r in deaths] == ["poll", "re-host", "re-host"]
    (d,) = [r for r in _deaths(tmp_path) if r["device"] == 1]
    assert d["role"] == "rollout" and not d["crash_loop"] and d["sequences"], "the killed device held sequences"
    assert any(n > 0 for n in d["tokens_kept"].values()), "their reported tokens were kept"
    assert summary["resumes"] >= 1, "kept tokens were resubmitted (resume by re-prefill)"
    assert summary["batches_without_behaviour_logprobs"] == 0, "the kept tokens kept their log-probs"
