"""The simulator's `throughput` timeline records (Fig. 10): present in every mode, spaced by
`models.sim.throughput_sample_s`, Eq. 1 consistent with the recorded role throughputs, allocations
that add up, emitted-token rates that integrate to what the engines produced, and no effect on the
simulation itself."""
from __future__ import annotations

import pytest

from pivotrl.core.types import Role
from pivotrl.sim.runtime import SimDriver
from pivotrl.sim.setup import SimSetup
from pivotrl.sim.sweep import config_hash

SMALL = ["cluster.num_devices=8", "train.prompts_per_step=8", "train.group_size=4", "train.steps=3",
         "models=qwen1.5b_glm9b"]
ALLOC = {"colocated": None, "disaggregated": {Role.ROLLOUT: 2, Role.REWARD: 4, Role.TRAIN: 2},
         "rr_colocated": {Role.ROLLOUT: 4, Role.REWARD: 0, Role.TRAIN: 4}, "pivot": {Role.TRAIN: 4}}


def harmonic(n_ro: float, t_ro: float, n_rm: float, t_rm: float) -> float:
    """Paper Eq. 1 written out independently of core's helper."""
    terms = [(n, t) for n, t in ((n_ro, t_ro), (n_rm, t_rm)) if n > 0]
    if not terms:
        return 0.0
    if any(t <= 0 for _, t in terms):
        return 0.0
    return sum(n for n, _ in terms) / sum(n / t for n, t in terms)


@pytest.mark.parametrize("mode", sorted(ALLOC))
def test_records_exist_and_are_consistent(make_cfg, mode):
    cfg = make_cfg(f"deploy={mode}", "models.sim.throughput_sample_s=2", *SMALL)
    rt = SimDriver(SimSetup.from_config(cfg, ALLOC[mode]))
    cum: list[float] = []
    inner = rt.sampler.role_tokens

    def role_tokens(*args):
        out = inner(*args)
        cum.append(sum(out.values()))
        return out

    rt.sampler.role_tokens = role_tokens
    summary = rt.run()
    recs = rt.stats.samples
    assert len(recs) >= summary["sim_time_s"] / 2 - 1
    times = [r["now"] for r in recs]
    assert times[0] == 0.0
    assert all(b - a == pytest.approx(2.0) for a, b in zip(times, times[1:]))
    busy = 0
    for r in recs:
        assert r["overall"] == pytest.approx(harmonic(r["n_rollout"], r["rollout"], r["n_reward"], r["reward"]),
                                             rel=1e-12, abs=1e-12)
        if r["n_rollout"] > 0 and r["n_reward"] > 0 and r["rollout"] > 0 and r["reward"] > 0:
            lo, hi = sorted((r["rollout"], r["reward"]))
            assert lo * (1 - 1e-12) <= r["overall"] <= hi * (1 + 1e-12)  # a weighted harmonic mean
            busy += 1
        assert sum(r["allocation"].values()) == 8
        assert r["actual_total"] == pytest.approx(sum(r["actual"].values()))
        assert all(v >= 0 for v in r["actual"].values())
    assert busy > 0 or mode in ("colocated", "rr_colocated")  # these may never run both at once here
    # each record's emitted-token rate covers the interval before it: the rates integrate to the
    # engines' cumulative token counters at the last sample
    assert cum[0] == 0.0 and len(cum) == len(recs)
    emitted = sum(b["actual_total"] * (b["now"] - a["now"]) for a, b in zip(recs, recs[1:]))
    assert emitted == pytest.approx(cum[-1], rel=1e-9) and emitted > 0
    if mode == "pivot":
        allocs = {tuple(sorted(r["allocation"].items())) for r in recs}
        assert len(allocs) > 1  # pivot's allocation changes over time
        assert any(r["training"] for r in recs) and not all(r["training"] for r in recs)
    elif mode == "disaggregated":
        assert {r["allocation"]["train"] for r in recs[1:]} == {2}


def test_sampling_does_not_change_the_simulation(make_cfg):
    out = []
    for s in ("0", "3"):
        cfg = make_cfg("deploy=pivot", f"models.sim.throughput_sample_s={s}", *SMALL)
        rt = SimDriver(SimSetup.from_config(cfg, ALLOC["pivot"]))
        out.append((rt.run(), len(rt.stats.samples)))
    (a, na), (b, nb) = out
    assert na == 0 and nb > 0
    assert b["throughput_tokens_per_s"] == pytest.approx(a["throughput_tokens_per_s"], rel=1e-9)
    assert b["num_shifts"] == a["num_shifts"]


def test_records_reach_the_timeline_file(make_cfg, tmp_path):
    from artifact.common import read_jsonl, run_one

    run_one(["experiment=quick", "train.prompts_per_step=8", "train.group_size=2",
             "deploy=pivot", "models.sim.throughput_sample_s=5"], tmp_path / "run")
    recs = [r for r in read_jsonl(tmp_path / "run" / "timeline.jsonl") if r["kind"] == "throughput"]
    assert recs and set(recs[0]["allocation"]) == {"rollout", "reward", "train", "free"}
    assert {"now", "rollout", "reward", "overall", "actual", "allocation"} <= set(recs[0])


def test_sweep_cache_key_covers_run_length_not_sampling(make_cfg):
    a = make_cfg("deploy=disaggregated", *SMALL)
    assert config_hash(a) != config_hash(make_cfg("deploy=disaggregated", *SMALL, "train.steps=5"))
    assert config_hash(a) == config_hash(make_cfg("deploy=disaggregated", *SMALL, "models.sim.throughput_sample_s=1"))


def test_negative_sample_interval_is_rejected(make_cfg):
    with pytest.raises(ValueError, match="throughput_sample_s"):
        make_cfg("models.sim.throughput_sample_s=-1")
