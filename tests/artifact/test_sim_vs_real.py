"""Sim against real: the replay workload (recorded lengths, exact totals, the sim's id scheme), the
replay runtime's use of fitted constants, and the artifact's CSV + PNG path on a small hand-made run
folder (no real run: the full real path is `python -m artifact.sim_vs_real.run --quick`)."""
from __future__ import annotations

import csv
import json

import pytest
import yaml

from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import Role
from pivotrl.report.records import RunRecords
from pivotrl.sim.replay import ReplayWorkload, constants_from_run, recorded_workload, slowed
from pivotrl.sim.workload import SampleLengths

FIT = {"A": 4e-7, "B": 0.0, "C": 1e-4, "D": 1.5e-3, "P0": 1.6e-3, "P1": 3e-5, "P2": 5e-9}


# ------------------------------------------------------------------------------ replay workload
def test_from_step_totals_keeps_each_batch_totals_exactly():
    steps = [{"prompt_tokens": 103.0, "response_tokens": 53.0, "genrm_tokens": 111.0},
             {"prompt_tokens": 96.0, "response_tokens": 40.0, "genrm_tokens": 97.0}]
    wl = ReplayWorkload.from_step_totals(steps, P=3, G=4)
    assert (wl.P, wl.G, wl.batch_samples) == (3, 4, 12)
    for b, st in enumerate(steps):
        rows = wl.batch_lengths(b)
        flat = [x for r in rows for x in r]
        assert sum(x.response for x in flat) == st["response_tokens"]
        assert sum(x.genrm for x in flat) == st["genrm_tokens"]
        # prompt totals are per prompt (a prompt's G samples share it): G * sum over prompts
        assert abs(sum(x.prompt for x in flat) - st["prompt_tokens"]) <= wl.G
        assert all(len({x.prompt for x in r}) == 1 for r in rows)
        assert max(x.response for x in flat) - min(x.response for x in flat) <= 1
        assert [p.prompt_len for p in wl.prompts(b)] == [r[0].prompt for r in rows]


def test_ids_match_the_pipeline_scheme_and_bad_input_is_named():
    wl = ReplayWorkload([[[SampleLengths(5, i + 1, 2 * i + 1) for i in range(3)] for _ in range(2)]])
    for p in range(2):
        for i in range(3):
            sid = wl.sample_id(0, p, i)
            assert sid == p * 3 + i  # pipeline.release: b * P*G + prompt * G + i
            assert wl.locate(sid) == (0, p, i)
            assert wl.lengths(sid).response == i + 1
    with pytest.raises(IndexError, match="batches 0..0"):
        wl.batch_lengths(1)
    with pytest.raises(ValueError, match="batch 1 is not 2 prompts x 3 samples"):
        ReplayWorkload([[[SampleLengths(1, 1, 1)] * 3] * 2, [[SampleLengths(1, 1, 1)] * 2] * 2])
    with pytest.raises(ValueError, match="differ in prompt length"):
        ReplayWorkload([[[SampleLengths(1, 1, 1), SampleLengths(2, 1, 1)]]])


def test_slowed_scales_every_time():
    m = ThroughputModel(**FIT)
    s = slowed(m, 3.0)
    assert s.iter_time(8, 400) == pytest.approx(3.0 * m.iter_time(8, 400))
    assert s.prefill_time(50) == pytest.approx(3.0 * m.prefill_time(50))
    with pytest.raises(ValueError, match="slowdown"):
        slowed(m, 0.0)


# ------------------------------------------------------------------------------ a small run folder
def _fake_run(d, mode="disaggregated", steps=3, P=2, G=2, response=10.0):
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({
        "deploy": {"mode": mode, "staleness": 1, "allocation": {"rollout": None, "reward": None, "train": None},
                   "planner": {}},
        "cluster": {"runtime": {"engine": {"kv_capacity_tokens": 4096}}}, "seed": 0}))
    n = P * G
    rows, t = [], 0.0
    for s in range(steps):
        rel, t = t, t + 2.0
        rows.append({"step": s + 1, "batch": s, "step_time_s": 2.0, "samples": n, "policy_tokens": int(20 + response) * n,
                     "response_tokens_mean": response, "genrm_tokens_mean": 20.0, "released_at": rel,
                     "rollout_done_at": rel + 0.5, "reward_done_at": rel + 1.0, "train_start": rel + 1.0,
                     "train_end": t, "train_s": 0.9})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tl = [{"kind": "throughput_fit", "role": r, **FIT} for r in ("rollout", "reward")]
    tl.append({"kind": "shift_timing", "devices": [
        {"device": 0, "role": "rollout", "direction": "up", "seconds": 3.0, "cold": True},
        {"device": 0, "role": "rollout", "direction": "up", "seconds": 0.2, "cold": False},
        {"device": 0, "role": "rollout", "direction": "down", "seconds": 0.4, "cold": False}]})
    (d / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tl))
    (d / "summary.json").write_text(json.dumps({"prompts_per_step": P, "group_size": G, "devices": 4,
                                                "warmup_steps": 1, "num_shifts": 0}))
    return d


def test_constants_come_from_the_records(tmp_path):
    rec = RunRecords.load(_fake_run(tmp_path / "run"))
    c = constants_from_run(rec, 4096, {Role.TRAIN: 1}, "trace")
    assert c.models[Role.ROLLOUT].C == FIT["C"]
    assert c.shift_up_s[Role.ROLLOUT] == 0.2 and c.cold_up_s[Role.ROLLOUT] == 3.0
    assert c.shift_down_s[Role.ROLLOUT] == 0.4
    assert c.train_s == pytest.approx(1.0)  # train_start..train_end, not the trainer's 0.9
    assert c.train_time(1) == pytest.approx(1.0)
    assert any("per-sample lengths are not recorded" in n for n in c.notes)
    with pytest.raises(ValueError, match="train_time='x'"):
        constants_from_run(rec, 4096, {}, "x")


def test_a_folder_with_two_runs_is_refused(tmp_path):
    d = _fake_run(tmp_path / "run")
    with (d / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 1, "batch": 0}) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl line \d+: step 1 after step \d+.*two runs wrote into this folder"):
        RunRecords.load(d)


def test_replay_csv_and_png_on_a_small_run(tmp_path):
    from artifact.sim_vs_real import run as svr

    d = _fake_run(tmp_path / "run")
    out = tmp_path / "out"
    assert svr.main(["--run-dir", str(d), "--out", str(out)]) == 0
    with (out / "sim_vs_real.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["variant"] for r in rows} == {"fitted_model", "trace_train", "calibrated", "calibrated_cores"}
    assert len(rows) == 4 * 3  # 4 variants x 3 steps
    for r in rows:
        assert float(r["predicted_s"]) > 0 and float(r["measured_s"]) == 2.0
    with (out / "sim_vs_real_summary.csv").open() as f:
        sums = {r["variant"]: r for r in csv.DictReader(f)}
    # the calibrated slowdown makes the simulated engines at least as slow as the fitted model
    assert float(sums["calibrated"]["engine_slowdown"]) >= 1.0
    assert float(sums["fitted_model"]["mape_pct"]) >= 0.0
    from tests.artifact.plotted import shows

    assert shows(out / "sim_vs_real.png", [float(r["predicted_s"]) for r in rows[:3]], scales=(1.0,))
    consts = json.loads((out / "constants.json").read_text())
    assert consts[0]["models"]["rollout"]["C"] == FIT["C"]
    # re-plot alone from the CSV
    (out / "sim_vs_real.png").unlink()
    assert svr.main(["--plot-only", "--out", str(out)]) == 0
    assert shows(out / "sim_vs_real.png", [float(r["predicted_s"]) for r in rows[:3]], scales=(1.0,))


def test_replay_charges_cold_loads_trace_training_and_slowdown(tmp_path):
    import dataclasses

    from artifact.sim_vs_real.run import prepare
    from pivotrl.sim.replay import replay

    d = _fake_run(tmp_path / "run")
    rec, consts, cfg, _ = prepare(d, "trace")
    wl = recorded_workload(rec)

    def run(c):
        return replay(cfg, c, wl, 3, 1, 4)

    base = run(consts)
    assert len(base["step_time_s"]) == 3
    # trace training time: every training phase lasts the recorded 1.0 s
    for r in base["step_rows"]:
        assert r["train_end"] - r["train_start"] == pytest.approx(1.0)
    # the first load of rollout on a device costs the measured cold time (3.0 s, vs 0.2 warm)
    warm_only = run(dataclasses.replace(consts, cold_up_s={}))
    assert base["step_rows"][0]["train_end"] - warm_only["step_rows"][0]["train_end"] == pytest.approx(2.8, abs=1e-6)
    # slower engines: longer rollout + reward phases
    slow = run(dataclasses.replace(consts, engine_slowdown=5.0))

    def phase(s):
        return sum(r["reward_done_at"] - r["released_at"] for r in s["step_rows"])

    assert phase(slow) > phase(base)


def test_recorded_per_sample_lengths_are_replayed_when_every_batch_has_them(tmp_path):
    d = _fake_run(tmp_path / "run", steps=2, P=2, G=2)
    assert not RunRecords.load(d).per_sample
    with (d / "timeline.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "sample_lengths", "batch": 0,
                            "samples": [[s, 7 + s // 2, 3 + s, 11 + s] for s in range(4)]}) + "\n")
    rec = RunRecords.load(d)
    assert not rec.per_sample  # batch 1 has none: fall back to per-step totals
    assert recorded_workload(rec).lengths(0).response == 10
    with (d / "timeline.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "sample_lengths", "batch": 1,
                            "samples": [[s, 5, 1 + s, 2] for s in range(4, 8)]}) + "\n")
    rec = RunRecords.load(d)
    assert rec.per_sample
    wl = recorded_workload(rec)
    assert wl.lengths(3) == SampleLengths(8, 6, 14)
    assert wl.lengths(6) == SampleLengths(5, 7, 2)
    assert any("replayed from the run's sample_lengths" in n for n in constants_from_run(rec, 4096, {}).notes)


def test_shared_judgements_are_replayed_shared(tmp_path):
    """A run's `shared` pairs (samples whose judge prompt repeated another's) become one judge key
    per pair; the replay judges one of each pair and the other shares its judgement."""
    from artifact.sim_vs_real.run import prepare
    from pivotrl.sim.replay import replay

    d = _fake_run(tmp_path / "run", steps=3)
    with (d / "timeline.jsonl").open("a") as f:
        for b in range(3):
            f.write(json.dumps({"kind": "sample_lengths", "batch": b, "samples": [[s, 5, 4, 6] for s in range(4 * b, 4 * b + 4)],
                                "shared": [[4 * b + 1, 4 * b], [4 * b + 3, 4 * b + 2]]}) + "\n")
    rec, consts, cfg, _ = prepare(d, "trace")
    wl = recorded_workload(rec)
    assert [wl.lengths(s).judge_key for s in range(4)] == [0, 0, 2, 2]
    rows = replay(cfg, consts, wl, 3, 1, 4)["step_rows"]
    assert [r["judgements_shared"] for r in rows] == [2, 2, 2]
    assert all(r["genrm_tokens"] == 2 * (5 + 4 + 6) for r in rows)   # two judgements ran per batch


def test_engine_duty_compares_measured_with_modelled_throughput(tmp_path):
    from pivotrl.sim.replay import engine_duty

    d = _fake_run(tmp_path / "run")
    rec = RunRecords.load(d)
    m = ThroughputModel(**FIT)
    modelled = 2 * m.throughput(8, 200)
    rec.steps[1]["role_state"] = {"rollout": {"replicas": 2, "running": 16, "kv_tokens": 400,
                                              "throughput_tokens_per_s": modelled / 4}}
    duty = engine_duty(rec, {Role.ROLLOUT: m, Role.REWARD: m})
    assert duty[Role.ROLLOUT] == pytest.approx(0.25)
    assert duty[Role.REWARD] is None


def test_shared_cores_contention_slows_inference(tmp_path):
    import dataclasses

    from artifact.sim_vs_real.run import prepare
    from pivotrl.sim.replay import replay

    rec, consts, cfg, _ = prepare(_fake_run(tmp_path / "run", P=4, G=4, response=400.0))
    wl = recorded_workload(rec)

    def rollout(c):  # batch 0's rollout phase: 2 rollout replicas decoding 400 tokens each
        r = replay(cfg, c, wl, 3, 1, 4)["step_rows"][0]
        return r["rollout_done_at"] - r["released_at"]

    free = rollout(consts)
    assert rollout(dataclasses.replace(consts, cores=64)) == pytest.approx(free)  # never more busy than cores
    # 2 busy rollout replicas on 1 core: decode takes twice as long (the 3 s cold load does not)
    assert rollout(dataclasses.replace(consts, cores=1)) > free * 1.25


def test_weight_refresh_is_charged_at_the_measured_median(tmp_path):
    from artifact.sim_vs_real.run import prepare
    from pivotrl.sim.replay import replay

    d = _fake_run(tmp_path / "run")
    rec, consts, cfg, _ = prepare(d, "trace")
    assert consts.publish_s == 0.0 and any("charged 0 s" in n for n in consts.notes)
    with (d / "timeline.jsonl").open("a") as f:
        for v, secs in ((1, [0.3, 0.5]), (2, [0.4]), (3, [])):  # v3: no rollout replica was up
            f.write(json.dumps({"kind": "weight_refresh", "version": v, "wait_s": 1.0,
                                "devices": [{"device": i, "seconds": s} for i, s in enumerate(secs)]}) + "\n")
    rec, refreshed, cfg, _ = prepare(d, "trace")
    assert refreshed.publish_s == pytest.approx(0.4)
    assert any("median of 3 measured loads" in n for n in refreshed.notes)
    assert refreshed.as_dict()["publish_s"] == pytest.approx(0.4)
    # the replay stalls rollout replicas for it: no step gets faster, and the run as a whole is not faster
    wl = recorded_workload(rec)
    base, slow = replay(cfg, consts, wl, 3, 1, 4), replay(cfg, refreshed, wl, 3, 1, 4)
    assert sum(slow["step_time_s"]) >= sum(base["step_time_s"])
