"""Elastic training on the real `cluster=local` runtime (issue 23): the trainer grows onto a
borrowed device, its state resharded through host memory (GPS), and a borrowed device that dies
mid-step restarts the step on the device still held, from that state: no sample lost or twice.

One run of 4 device actors (the real path exists only with them: the state store in Ray's GPS,
the trainer's process groups re-formed per size), so `slow`. With staleness 0 no released work is
left when a batch is ready, so once a step was measured the planner's optimistic fit grows the
trainer from its home set (device 3) to 2 devices (`elastic_max_devices=2`) at the next batch;
device 2 is a training rank only then, and the fault hook kills it there.

Whether it grows is the planner's own call: the step seconds a second device saves against what
growing costs. If the trainer still holds its home device when the batch is ready, growing costs a
training shift (`tau_shift`, ~0.26 s here) that keeping it does not. At one PPO epoch this tiny
step is ~0.23 s, so a second device saves ~0.12 s: it grew only when the trainer had already let
its home go (benefit 0.12-0.14 s), never when it still held it, which timing decides; on a loaded
host the planner once kept the home set and the kill never came. At 16 epochs the step is ~1.2 s
(1.5 s beside a spinning process) and it grows either way: the first growth came 0.35 s sooner
with the home still held (quiet host), 0.77 s with it let go (a spinning process beside the run),
2026-12-04.
"""
from __future__ import annotations

import json

import pytest

from pivotrl.runtime import faults
from tests.e2e.conftest import make_local_cfg

pytestmark = pytest.mark.slow


def _timeline(run_dir):
    return [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]


def test_the_trainer_grows_reshards_and_survives_a_borrowed_device(ray_session, tiny_assets, tmp_path):
    from pivotrl.run import run

    h = faults.kill_at("train", device=2)  # device 2 trains only in a grown step
    faults.set_hook(h)
    try:
        summary = run(make_local_cfg(tiny_assets, "pivot", [
            "deploy.planner.elastic_training=true", "deploy.planner.elastic_max_devices=2",
            "deploy.staleness=0", "train.steps=4", "algo.ppo_epochs=16"]), tmp_path)
    finally:
        faults.set_hook(None)
    assert h.fired == [("train", 2)]
    assert summary["policy_version"] == 4
    assert summary["samples_trained"] == summary["samples_trained_unique"] == 4 * 2 * 4, "no sample lost or twice"
    tl = _timeline(tmp_path)
    grew = [r for r in tl if r["kind"] == "shift" and r["up"] == ["train@2x2"]]
    assert grew, "the planner grew the trainer onto device 2"
    (restart,) = [r for r in tl if r["kind"] == "training_restarted"]
    assert restart["dead"] == [2] and restart["devices"] == [3] and restart["reshard_s"] > 0
    writes = [r for r in tl if r["kind"] == "state_write"]
    assert [r["version"] for r in writes] == [1, 2, 3, 4]  # the state in host memory after every step
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    restarted = next(r for r in rows if r["batch"] == restart["batch"])
    assert restarted["train_world"] == 1 and restarted["reshard_s"] > 0  # the step ran on device 3 alone
    (death,) = [r for r in tl if r["kind"] == "device_death"]
    assert death["device"] == 2 and death["role"] == "train"
