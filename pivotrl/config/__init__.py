"""Typed configuration: one dataclass per Hydra group, registered in Hydra's ConfigStore.

Groups say what they configure: `deploy` (mode, allocation, planner), `models` (policy, GenRM,
tiny bootstrap, simulator constants), `cluster` (runtime, devices, launch, GPS), `train` (the RL
loop: steps, batch, resume), `algo` (the GRPO trainer: the one place its settings live), `data`
(prompts, held-out set, lengths), `reward`, `engine` (inference engines), `logging`.

`train.py` composes `conf/` and calls `load(dcfg)` once: it refuses keys no dataclass declares
(also `+key` additions) and non-finite numbers, converts into `PivotConfig`, and names the full
path of the first bad value. Library code only ever sees these dataclasses; derived values come
from `resolve(cfg)` (`pivotrl.config.resolve`). This package imports no omegaconf or Hydra at
import time, so the pure control plane may import its dataclasses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pivotrl.config.base import MISSING, ConfigError
from pivotrl.config.cluster import ClusterConfig, ClusterKind, HardwareProfile
from pivotrl.config.deploy import DEPLOY_SCHEMAS, Allocation, DeployConfig, DeployMode
from pivotrl.config.engine import EngineConfig
from pivotrl.config.models import LengthDist, ModelsConfig, ModelSpec, WorkloadConfig
from pivotrl.config.planner import PLANNER_SCHEMAS, PlannerConfig
from pivotrl.config.rl import DataConfig, RewardConfig
from pivotrl.config.run import LoggingConfig, TrainConfig
from pivotrl.config.trainer import AlgoConfig, TrainerSpec
from pivotrl.config.validate import validate_cross_fields


@dataclass
class PivotConfig:
    """The whole run."""

    defaults: list[Any] = field(default_factory=lambda: ["_self_"])
    deploy: DeployConfig = MISSING
    """Deployment mode, allocation and (pivot) planner with its shift strategy."""
    models: ModelsConfig = MISSING
    """Policy and GenRM."""
    cluster: ClusterConfig = MISSING
    """Runtime, devices, launch settings, GPS."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """RL loop: steps, batch, group size, resume, checkpoints."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """The GRPO trainer: optimizer, loss, PPO mini-batches, off-policy correction."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts, held-out set, prompt and response length caps."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """R = w_v * R_verifiable + w_g * R_genrm, and the GenRM's parsing and sampling."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Every inference replica's engine (rollout and reward), real runtimes."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Run outputs: wandb mode/project, progress bars."""
    seed: int = 0
    """Seed of the run: sampling, trainer, simulated workload. Every mode sees the same samples."""

    def __post_init__(self) -> None:
        validate_cross_fields(self)


def register_configs() -> None:
    """Register every group's schema in Hydra's ConfigStore, once per process (the store is a
    process-wide singleton; registering again would only rebuild the same nodes, 0.05 s each time)."""
    from hydra.core.config_store import ConfigStore

    from omegaconf import MISSING as OC_MISSING, OmegaConf

    cs = ConfigStore.instance()
    if "pivot_schema.yaml" in cs.repo:
        return
    cs.store(name="pivot_schema", node=PivotConfig)
    for mode, schema in DEPLOY_SCHEMAS.items():
        node = OmegaConf.structured(schema)
        if "planner" in node:  # the nested group `deploy/planner` fills it with its strategy's schema
            node.planner = OC_MISSING
        cs.store(group="deploy", name=f"{mode}_schema", node=node)
    for strategy, schema in PLANNER_SCHEMAS.items():
        cs.store(group="deploy/planner", name=f"{strategy}_planner_schema", node=schema)
    cs.store(group="models", name="models_schema", node=ModelsConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig)
    # multirun folder names: an override of a nested group (`deploy/planner=rule`) would nest folders
    if not OmegaConf.has_resolver("path_safe"):
        OmegaConf.register_new_resolver("path_safe", lambda s: str(s).replace("/", "."))


def load(dcfg: Any) -> PivotConfig:
    """Convert a composed config into `PivotConfig`; the first bad value raises `ConfigError`
    with its full path (see `pivotrl.config.loader`)."""
    from pivotrl.config.loader import to_config

    return to_config(dcfg)


def compose_config(overrides: list[str] = (), config_dir: str | None = None) -> PivotConfig:
    """Compose `conf/` with Hydra's overrides and `load` it (tests and library use)."""
    from pivotrl.config.loader import compose

    return compose(list(overrides), config_dir)


__all__ = [
    "AlgoConfig", "Allocation", "ClusterConfig", "ClusterKind", "ConfigError", "DataConfig", "DeployConfig", "DeployMode",
    "EngineConfig", "HardwareProfile", "LengthDist", "LoggingConfig", "ModelSpec", "ModelsConfig", "PivotConfig",
    "PlannerConfig", "RewardConfig", "TrainConfig", "TrainerSpec", "WorkloadConfig", "compose_config", "load",
    "register_configs",
]
