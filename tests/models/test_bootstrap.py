"""Bootstrap plumbing with a tiny budget: the cache is written atomically, keyed by config, reused,
and its folders load. The default recipe's quality (accuracy bands) is `test_shipped.py`'s."""
from __future__ import annotations

import os

import pytest
import torch

from pivotrl.config.rl import SYNTHETIC_VAL_ROWS, BootstrapConfig, DataConfig, TinyModelConfig
from pivotrl.models.bootstrap import bootstrap, cache_key, genrm_example, policy_example
from pivotrl.models.tiny import load_tiny_model
from pivotrl.rl.data import load_examples
from pivotrl.rl.genrm import ParseStats, parse_score
from pivotrl.rl.rewards import verifiable_score

ARCH = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


DATA = DataConfig(num_train=16, val_size=4)


def tiny_cfg(**kw) -> BootstrapConfig:
    base = dict(policy=ARCH, genrm=ARCH, policy_steps=2, genrm_steps=2, batch_size=4, warmup_steps=1)
    return BootstrapConfig(**{**base, **kw})


def test_build_then_reuse(tmp_path, monkeypatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("PIVOTRL_CACHE", str(tmp_path))
    cfg = tiny_cfg()
    first = bootstrap(cfg, DATA, progress=False)
    assert not first.cached
    assert first.policy_path.parent == tmp_path / "bootstrap" / cache_key(cfg, DATA)
    for path in (first.policy_path, first.genrm_path):
        model, tok = load_tiny_model(path)
        assert model.config.hidden_size == 32 and tok.eos_token_id == model.config.eos_token_id
    assert len(load_examples(first.train_path)) == 16 and len(load_examples(first.val_path)) == SYNTHETIC_VAL_ROWS
    r = first.report
    assert 0.0 <= r["policy_val_accuracy_sampled_t1"] <= 1.0
    assert r["genrm_on_policy_samples"]["n"] == 4 and r["genrm_init"] == "policy"
    assert not [p for p in (tmp_path / "bootstrap").iterdir() if p.name.startswith(".") and p.suffix != ".lock"], \
        "no tmp or old folder left (the builders' lock file stays)"

    mtime = os.path.getmtime(first.policy_path / "model.safetensors")
    again = bootstrap(cfg, DATA, progress=False)
    assert again.cached and again.policy_path == first.policy_path and again.report == first.report
    assert os.path.getmtime(first.policy_path / "model.safetensors") == mtime

    other = bootstrap(tiny_cfg(seed=1), DATA, progress=False)
    assert not other.cached and other.policy_path != first.policy_path

    forced = bootstrap(cfg, DATA, progress=False, force=True)
    assert not forced.cached and forced.policy_path == first.policy_path


def test_stale_tmp_of_dead_process_is_removed(tmp_path) -> None:
    cfg = tiny_cfg()
    parent = tmp_path / "bootstrap"
    parent.mkdir()
    stale = parent / f".{cache_key(cfg, DATA)}.tmp-999999999-abc"  # no such pid
    stale.mkdir()
    bootstrap(tiny_cfg(cache_dir=str(tmp_path)), DATA, progress=False)
    assert not stale.exists()


def test_cache_key_depends_on_every_field() -> None:
    assert cache_key(tiny_cfg(), DATA) == cache_key(tiny_cfg(), DATA)
    assert cache_key(tiny_cfg(), DATA) != cache_key(tiny_cfg(policy_label_noise=0.1), DATA)
    assert cache_key(tiny_cfg(), DATA) != cache_key(tiny_cfg(lr=1e-3), DATA)
    assert cache_key(tiny_cfg(), DATA) != cache_key(tiny_cfg(), DataConfig(num_train=16, val_size=4, seed=1))
    # how many held-out prompts a run evaluates is not what the cache holds
    assert cache_key(tiny_cfg(), DATA) == cache_key(tiny_cfg(), DataConfig(num_train=16, val_size=50))
    # where the cache lives is not what it holds
    assert cache_key(tiny_cfg(), DATA) == cache_key(tiny_cfg(cache_dir="/elsewhere"), DATA)


def test_sft_examples_are_labelled_correctly() -> None:
    import random
    rng = random.Random(0)
    data = DataConfig()
    noisy = [policy_example(rng, data, 0.5) for _ in range(400)]
    right = 0
    for prompt, response in noisy:
        assert "####" in response and prompt[0]["role"] == "user"
        eq = response.split("\n")[0]
        lhs, rhs = eq.split("=")
        right += eval(lhs) == int(rhs)  # noqa: S307 - our own "a+b" / "a-b" strings
    assert 0.4 < right / 400 < 0.6  # label noise 0.5
    stats = ParseStats()
    for _ in range(200):
        judge, target = genrm_example(rng, data, 0.5)
        question_and_response = judge[0]["content"]
        response = question_and_response.split("\nA: ")[1].rsplit("\nCheck A.", 1)[0]
        equation = target.split("\n")[0].removeprefix("check: ")
        truth = str(eval(equation.split("=")[0]))  # noqa: S307
        assert parse_score(target, stats=stats).score == verifiable_score(response, truth)
    assert stats.failures == 0


def test_bad_bootstrap_config() -> None:
    with pytest.raises(ValueError, match="policy_label_noise"):
        tiny_cfg(policy_label_noise=1.5)
    with pytest.raises(ValueError, match="batch_size"):
        tiny_cfg(batch_size=0)
