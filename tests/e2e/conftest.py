"""Shared fixtures of the end-to-end runs: one Ray session per module, tiny random models + data."""
from __future__ import annotations

from pathlib import Path

import pytest

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, resources={"pivot_device": 4}, include_dashboard=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    """Random-init tiny policy/GenRM and a small synthetic dataset (no bootstrap: tests need the
    pipeline, not a trained model)."""
    from pivotrl.models.tiny import create_tiny_model
    from pivotrl.rl.data import write_synthetic_dataset

    root = tmp_path_factory.mktemp("assets")
    create_tiny_model(root / "policy", seed=0)
    create_tiny_model(root / "genrm", seed=1)
    train, val = write_synthetic_dataset(root / "data", 64, 16, 0)
    return {"policy": root / "policy", "genrm": root / "genrm", "train": train, "val": val}


def make_local_cfg(assets, mode: str, overrides: list[str] = (), **runtime):
    """A composed `cluster=local` PivotConfig for 2 tiny steps, with a RuntimeConfig attached."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from pivotrl.config import register_configs
    from pivotrl.config.engine import EngineConfig
    from pivotrl.config.rl import BootstrapConfig, DataConfig
    from pivotrl.config.runtime import RuntimeConfig

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = OmegaConf.to_object(compose("config", overrides=[
            f"deploy={mode}", "cluster=local", f"models.policy.hf_path={assets['policy']}",
            f"models.genrm.hf_path={assets['genrm']}", "train.steps=2", "train.prompts_per_step=2",
            "train.group_size=4", "logging.wandb_mode=disabled", "logging.progress=false", *overrides]))
    kw = dict(val_size=4, max_response_tokens=12, max_wall_s=600,
              engine=EngineConfig(name="cpu", num_threads=1, max_num_seqs=32, kv_capacity_tokens=8192),
              bootstrap=BootstrapConfig(data=DataConfig(train_path=str(assets["train"]), val_path=str(assets["val"]))))
    kw.update(runtime)
    cfg.cluster.runtime = RuntimeConfig(**kw)
    return cfg
