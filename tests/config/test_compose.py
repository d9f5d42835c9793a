"""Every deploy x models x cluster combination composes into a typed PivotConfig; bad values fail
at start with an error naming the field."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from pivotrl.config import ClusterKind, DeployMode, PivotConfig, register_configs

CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def make(overrides: list[str]) -> PivotConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return OmegaConf.to_object(compose("config", overrides=overrides))  # type: ignore[return-value]


def test_groups_are_the_documented_ones():
    assert group_options("deploy") == sorted(m.value for m in DeployMode)
    assert group_options("cluster") == sorted(k.value for k in ClusterKind)
    assert set(group_options("models")) >= {
        "tiny", "qwen1.5b_glm9b", "qwen7b_qwen30b", "qwen32b_qwen30b", "qwen72b_qwen122b"}


@pytest.mark.parametrize("deploy,models,cluster", list(itertools.product(
    group_options("deploy"), group_options("models"), group_options("cluster"))))
def test_every_combination_composes(deploy, models, cluster):
    cfg = make([f"deploy={deploy}", f"models={models}", f"cluster={cluster}"])
    assert isinstance(cfg, PivotConfig)
    assert cfg.deploy.mode.value == deploy
    assert cfg.models.name == models
    assert cfg.cluster.kind.value == cluster
    assert cfg.cluster.num_devices >= 1


def test_default_is_the_embedded_real_run():
    cfg = make([])
    assert (cfg.deploy.mode, cfg.models.name, cfg.cluster.kind) == (DeployMode.pivot, "tiny", ClusterKind.local)


@pytest.mark.parametrize("overrides,needle", [
    (["deploy=nosuchmode"], "deploy"),
    (["models=nosuchgroup"], "models"),
    (["deploy.mode=foo"], "mode"),
    (["cluster=sim", "models=qwen7b_qwen30b", "deploy=disaggregated", "deploy.allocation.rollout=12",
      "deploy.allocation.reward=12", "deploy.allocation.train=9"], "num_devices"),
    (["cluster=sim", "models=qwen7b_qwen30b", "deploy=disaggregated", "deploy.allocation.rollout=14",
      "deploy.allocation.reward=10", "deploy.allocation.train=8"], "tp=4"),
    (["cluster=sim", "models=qwen7b_qwen30b", "models.genrm.tp=3"], "power of two"),
    (["cluster=sim", "models=qwen7b_qwen30b", "models.genrm.tp=16"], "models.genrm.tp"),
    (["deploy.planner.horizon_s=0"], "horizon_s"),
    (["deploy.planner.horizon_s=-5"], "horizon_s"),
    (["deploy.staleness=-1"], "staleness"),
    (["cluster.num_devices=0"], "empty cluster"),
    (["cluster=sim", "models=qwen7b_qwen30b", "cluster.num_devices=36"], "node_size"),
    (["logging.wandb_mode=sometimes"], "wandb_mode"),
])
def test_bad_input_names_the_field(overrides, needle):
    with pytest.raises((ValueError, ConfigCompositionException)) as exc:
        make(overrides)
    text = str(exc.value) + " " + str(exc.value.__cause__ or "")
    assert needle in text, text
