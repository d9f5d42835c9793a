"""`cluster=inproc` (the synchronous proof loop) end to end on CPU with a tiny budget: bootstrap ->
rollout -> GenRM judge -> GRPO step, through the same config tree and run entry as every runtime.

Asserts the pieces connect (steps run, the policy version increments and reaches the engine,
files are written); whether accuracy rises is the default run's measurement, not this test's."""
from __future__ import annotations

import json

import torch

from pivotrl.config import compose_config

TINY_BOOT = ["models.bootstrap.policy.hidden_size=32", "models.bootstrap.policy.num_layers=1",
             "models.bootstrap.policy.num_heads=2", "models.bootstrap.policy.num_kv_heads=1",
             "models.bootstrap.policy.intermediate_size=64", "models.bootstrap.genrm.hidden_size=32",
             "models.bootstrap.genrm.num_layers=1", "models.bootstrap.genrm.num_heads=2",
             "models.bootstrap.genrm.num_kv_heads=1", "models.bootstrap.genrm.intermediate_size=64",
             "models.bootstrap.policy_steps=2", "models.bootstrap.genrm_steps=2", "models.bootstrap.batch_size=4",
             "models.bootstrap.warmup_steps=1", "data.num_train=16", "data.val_size=4", "data.val_samples=1",
             "data.max_response_length=8", "models.genrm.judge.max_tokens=8"]


def _cfg(tmp_path, *extra):
    return compose_config(["cluster=inproc", f"models.bootstrap.cache_dir={tmp_path / 'cache'}",
                           "train.steps=2", "train.prompts_per_step=2", "train.group_size=2",
                           "logging.wandb_mode=disabled", "logging.progress=false", *TINY_BOOT, *extra])


def test_two_steps_increment_policy_version(tmp_path) -> None:
    from pivotrl.run import run

    torch.set_num_threads(1)
    s = run(_cfg(tmp_path), tmp_path / "run")
    assert s["cluster"] == "inproc" and s["policy_version"] == 2 and s["steps"] == 2
    assert s["genrm_parse"]["total"] == 2 * 2 * 2  # every response was judged
    assert 0.0 <= s["val_accuracy_before"] <= 1.0 and 0.0 <= s["val_accuracy_after"] <= 1.0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == [1, 2]
    for r in rows:
        assert 0.0 <= r["train_accuracy"] <= 1.0 and 0.0 <= r["reward_mean"] <= 2.0 and r["train_s"] > 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["policy_version"] == 2


def test_verifiable_only(tmp_path) -> None:
    from pivotrl.run import run

    s = run(_cfg(tmp_path, "train.steps=1", "train.warmup_steps=0", "reward.genrm_weight=0"), tmp_path / "run")
    assert s["policy_version"] == 1 and s["genrm_parse"]["total"] == 0
