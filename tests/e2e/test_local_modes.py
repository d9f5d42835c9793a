"""End to end on `cluster=local`: every deployment mode trains 2 steps on tiny models, a resume
reaches the uninterrupted run's version, and the executor re-shifts a device killed before its
shift up. (Device kills at each phase of a run: `test_device_faults.py`.)

Two modes' runs judge with another family than the dense Qwen2 (a run's start-up is most of its
time, so each judge family rides on a mode's run instead of a run of its own): colocated with a
Qwen3-MoE judge on the CPU engine (issue 22 item 3: it died at its first load, GPS holding one
tensor per expert where the CPU engine's transformers module fused them), pivot with a Qwen3.5-MoE
judge, the architecture GPS has no partition rules for (the paper's 122B-A10B GenRM's family). A
frozen judge never enters GPS: the run keeps a host-memory copy of its folder on the node and the
reward engine loads it from there (vLLM's CPU build cannot import Qwen3.5 here).

Each run starts 4 device actors that import torch and transformers (20-60 s per run on 2 cores),
so all but the default mode (`pivot`, the embedded default of `python train.py`) are `slow`.
One Ray session (`ray_session`, shared with the files of `tests/shared_ray.py`); every run attaches to it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import make_local_cfg

MODES = [pytest.param("colocated", marks=pytest.mark.slow), pytest.param("disaggregated", marks=pytest.mark.slow),
         pytest.param("rr_colocated", marks=pytest.mark.slow), "pivot"]


#: each mode run's folder and checkpoints, by mode (the resume test continues pivot's)
RUNS: dict[str, tuple[Path, dict]] = {}

#: the judge family of a mode's run (module docstring); the others judge with the dense tiny Qwen2
JUDGES = {"colocated": ("qwen3_moe", "bfloat16"), "pivot": ("qwen3_5_moe", "float32")}


def _judge(assets, mode, root):
    """The tiny checkpoints of `mode`'s run: `assets`, its judge replaced by a random one of the
    mode's family in `JUDGES`."""
    if mode not in JUDGES:
        return assets
    from pivotrl.models.tiny_families import make_tiny_checkpoint

    family, dtype = JUDGES[mode]
    return {**assets, "genrm": make_tiny_checkpoint(family, root / f"{family}_genrm", dtype=dtype, seed=1)}


def _timeline(run_dir):
    return [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", MODES)
def test_mode_trains_two_steps(ray_session, tiny_assets, tmp_path_factory, mode):
    from pivotrl.run import run

    assets = _judge(tiny_assets, mode, tmp_path_factory.mktemp("judge"))
    tmp_path = tmp_path_factory.mktemp("run")
    summary = run(make_local_cfg(assets, mode), tmp_path)
    P, G = 2, 4
    assert summary["deploy"] == mode and summary["cluster"] == "local"
    assert summary["policy_version"] == 2 and summary["steps"] == 2
    assert summary["samples_trained"] == summary["samples_trained_unique"] == 2 * P * G
    assert 0.0 <= summary["val_accuracy_before"] <= 1.0 and 0.0 <= summary["val_accuracy_after"] <= 1.0
    for f in ("config.yaml", "metrics.jsonl", "timeline.jsonl", "summary.json"):
        assert (tmp_path / f).is_file(), f
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["tokens"] > 0 and r["samples"] == P * G for r in rows)
    # the judge's parse-failure rate per step, against its threshold (random tiny judges mostly fail)
    parse = summary["genrm_parse"]
    assert parse["total"] == 2 * P * G and parse["failures"] == sum(r["genrm_parse_failures"] for r in rows)
    assert parse["steps_over"] == [r["step"] for r in rows if r["genrm_parse_failure_rate"] > 0.5]
    assert all(r["genrm_tokens"] > r["policy_tokens"] > 0 for r in rows), "every sample was judged"
    hf = json.loads((assets["genrm"] / "config.json").read_text())
    assert hf["model_type"] == {"colocated": "qwen3_moe", "pivot": "qwen3_5_moe_text"}.get(mode, "qwen2")
    # behaviour log-probs reached every batch: the first step is on-policy, so its ratio is 1
    assert summary["batches_without_behaviour_logprobs"] == 0
    assert rows[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    # decoupled PPO (the runtime's default): the on-policy batch's importance weight to the
    # behaviour policy is 1 (engine and trainer log-probs agree)
    assert rows[0]["behaviour_is_mean"] == pytest.approx(1.0, abs=1e-3)
    assert rows[0]["behaviour_logprob_diff"] < 1e-3, "the CPU engine samples from the trainer's weights"
    if mode == "pivot":  # the run's Perfetto trace: its schema, held-out validation, per-role load
        from tests.report.test_trace import check_trace

        by = check_trace(json.loads((tmp_path / "trace.json").read_text()))
        assert sorted(e["name"] for e in by["X"] if e["name"].startswith("validation")) == [
            "validation after", "validation before"]
        assert {e["name"] for e in by["C"]} >= {"rollout sequences", "reward KV tokens"}
        assert any(e["name"].startswith("publish v") for e in by["X"])
    timings = [r for r in _timeline(tmp_path) if r["kind"] == "shift_timing"]
    assert timings and all(t["up_s"] >= 0 and t["down_s"] >= 0 for t in timings)
    assert any(d["direction"] == "up" and d["role"] == "rollout" for t in timings for d in t["devices"])
    reward_ups = [d for t in timings for d in t["devices"] if d["role"] == "reward" and d["direction"] == "up"]
    assert reward_ups and not any("gps_bytes" in (d.get("detail") or {}) for d in reward_ups), \
        "the frozen judge read nothing from GPS (its engine loads the host copy)"
    # per-sample lengths of every trained batch (the simulator's replay reads them), consistent
    # with the step's token totals; and every weight publish is timed per rollout device
    from pivotrl.report.records import RunRecords

    tl = _timeline(tmp_path)
    lengths = {r["batch"]: r["samples"] for r in tl if r["kind"] == "sample_lengths"}
    shared = {r["batch"]: dict(r["shared"]) for r in tl if r["kind"] == "sample_lengths"}
    assert sorted(lengths) == sorted(r["batch"] for r in rows)
    for r in rows:
        samples, b = lengths[r["batch"]], r["batch"]
        assert [x[0] for x in samples] == list(range(b * P * G, (b + 1) * P * G))
        assert all(p > 0 and resp > 0 and g > 0 for _, p, resp, g in samples)
        assert sum(p + resp for _, p, resp, _ in samples) == r["policy_tokens"]
        # a sample that shared another's judgement (identical judge prompt) ran no GenRM tokens
        assert r["judgements_shared"] == len(shared[b])
        assert sum(p + resp + g for sid, p, resp, g in samples if sid not in shared[b]) == r["genrm_tokens"]
    assert RunRecords.load(tmp_path).per_sample
    refresh = [r for r in tl if r["kind"] == "weight_refresh"]
    assert refresh and all(d["seconds"] > 0 for r in refresh for d in r["devices"])
    # checkpoint of the last step (train.checkpoint_every=1)
    assert (tmp_path / "checkpoints" / "step_00000002" / "trainer_state.json").is_file()
    assert ray_session.is_initialized(), "a run attached to a session must not shut it down"
    RUNS[mode] = (tmp_path, assets)


@pytest.mark.slow
def test_resume_reaches_the_uninterrupted_step_and_version(ray_session, tiny_assets, tmp_path):
    """The pivot run above (2 steps, a checkpoint each), restarted in a copy of its folder with
    train.resume=true train.steps=3: it trains only step 3 and ends at the step count and policy
    version of an uninterrupted 3-step run. (Run on its own, the test makes that 2-step run first.)"""
    from pivotrl.run import run

    run_dir = tmp_path / "run"
    if "pivot" in RUNS:
        src, assets = RUNS["pivot"]
        shutil.copytree(src, run_dir)
    else:
        assets = _judge(tiny_assets, "pivot", tmp_path)
        assert run(make_local_cfg(assets, "pivot"), run_dir)["policy_version"] == 2
    assert (run_dir / "checkpoints" / "step_00000002" / "trainer_state.json").is_file()
    resumed = run(make_local_cfg(assets, "pivot", ["train.resume=true", "train.steps=3"]), run_dir)
    assert resumed["policy_version"] == 3
    assert resumed["samples_trained"] == resumed["samples_trained_unique"] == 2 * 4, "only step 3 is trained"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["batch"] for r in rows] == [0, 1, 2]
    assert any(r["kind"] == "resume" and r["version"] == 2 for r in _timeline(run_dir))


@pytest.mark.slow
def test_device_killed_before_shift_up_is_respawned_and_shifted(ray_session, tiny_assets):
    """Mid-shift fault at the executor: a device whose actor died is respawned on its bundle and the
    shift still brings every slot up; the measured halves feed tau_shift."""
    from pivotrl.core.types import Role, ShiftPlan, Slot
    from tests.e2e.conftest import policy_executor

    ray = ray_session
    with policy_executor(tiny_assets["policy"]) as ex:
        ray.kill(ex.actors[1], no_restart=True)
        up = ShiftPlan(Role.ROLLOUT, up=[Slot(Role.ROLLOUT, 0, 1), Slot(Role.ROLLOUT, 1, 1)])
        res = ex.run_shift(up)
        assert res.error is None and res.dead == {1} and ex.generation[1] == 1
        assert [i["role"] for i in ray.get([a.info.remote() for a in ex.actors.values()])] == ["rollout"] * 2
        assert set(res.kv_capacity) == {"rollout@0x1", "rollout@1x1"}
        down = ex.run_shift(ShiftPlan(Role.REWARD, down=up.up))
        assert down.error is None and down.seconds[0] > 0
        assert down.measured[Role.ROLLOUT] > 0, "a measured shift down reaches the controller's tau_shift"
        ups = [t for t in res.timings if t["direction"] == "up"]
        assert ups and all(t["gps_file"] == 1.0 and t["gps_bytes"] > 0 for t in ups), \
            "each device read its node's GPS file itself"
