"""A Qwen3.5-MoE judge on `cluster=local`: the architecture GPS has no partition rules for (the
paper's 122B-A10B GenRM's family), as a tiny random model beside a tiny policy, runs real steps.

The judge never enters GPS: the run keeps a host-memory copy of its folder on the node and the
reward engine (the project's CPU engine: vLLM's CPU build cannot import Qwen3.5 here) loads it
from there. One run of 2 steps (4 device actors: 20-60 s on 2 cores).
"""
from __future__ import annotations

import json

from tests.e2e.conftest import make_local_cfg


def test_a_qwen35_moe_judge_runs_real_steps_from_its_host_copy(ray_session, tiny_assets, tmp_path_factory):
    from pivotrl.models.tiny_families import make_tiny_checkpoint
    from pivotrl.run import run

    judge = make_tiny_checkpoint("qwen3_5_moe", tmp_path_factory.mktemp("q35") / "genrm", seed=1)
    assert json.loads((judge / "config.json").read_text())["architectures"] == ["Qwen3_5MoeForCausalLM"]
    run_dir = tmp_path_factory.mktemp("run")
    cfg = make_local_cfg({**tiny_assets, "genrm": judge}, "pivot", ["engine=cpu"])
    summary = run(cfg, run_dir)
    assert summary["policy_version"] == 2 and summary["samples_trained"] == 2 * 2 * 4
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["genrm_tokens"] > r["policy_tokens"] > 0 for r in rows)  # every sample was judged
    timings = [d for r in map(json.loads, (run_dir / "timeline.jsonl").read_text().splitlines())
               if r["kind"] == "shift_timing" for d in r["devices"]]
    reward_ups = [d for d in timings if d["role"] == "reward" and d["direction"] == "up"]
    assert reward_ups and not any("gps_bytes" in (d.get("detail") or {}) for d in reward_ups)  # read nothing from GPS
