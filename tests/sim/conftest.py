"""Shared fixtures of the simulator tests: compose a typed config for `cluster=sim`."""
from __future__ import annotations

import pytest

from pivotrl.config import PivotConfig, compose_config


def sim_config(*overrides: str) -> PivotConfig:
    """A `cluster=sim` config with wandb off and the given overrides."""
    return compose_config(["cluster=sim", "logging.wandb_mode=disabled", "logging.progress=false", *overrides])


@pytest.fixture
def make_cfg():
    return sim_config
