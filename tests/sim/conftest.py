"""Shared fixtures of the simulator tests: compose a typed config for `cluster=sim`."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pivotrl.config import PivotConfig, register_configs

CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()


def sim_config(*overrides: str) -> PivotConfig:
    """A `cluster=sim` config with wandb off and the given overrides."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        c = compose("config", overrides=["cluster=sim", "logging.wandb_mode=disabled",
                                          "logging.progress=false", *overrides])
        return OmegaConf.to_object(c)  # type: ignore[return-value]


@pytest.fixture
def make_cfg():
    return sim_config
