"""Typed configuration: one dataclass per Hydra group, registered in Hydra's ConfigStore.

`train.py` composes `conf/`, converts once with `OmegaConf.to_object` into `PivotConfig`, and library
code only ever sees these dataclasses. Single-field checks live in each dataclass's `__post_init__`;
cross-field checks (devices add up, tp divides the device counts) live in `PivotConfig.__post_init__`.
Every error names the field and what is allowed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from pivotrl.config.cluster import ClusterConfig, ClusterKind, HardwareProfile
from pivotrl.config.deploy import Allocation, DeployConfig, DeployMode
from pivotrl.config.models import LengthDist, ModelsConfig, ModelSpec, WorkloadConfig
from pivotrl.config.planner import PlannerConfig
from pivotrl.config.run import LoggingConfig, TrainConfig
from pivotrl.config.validate import validate_cross_fields


@dataclass
class PivotConfig:
    """The whole run. Groups: deploy, models, cluster (+ experiment overlays)."""

    defaults: list[Any] = field(default_factory=lambda: ["_self_"])
    deploy: DeployConfig = MISSING
    """Deployment mode, allocation and planner."""
    models: ModelsConfig = MISSING
    """Policy and GenRM."""
    cluster: ClusterConfig = MISSING
    """Runtime and devices."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """RL loop: steps, batch, group size, resume."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Run outputs: wandb mode/project, progress bars."""
    seed: int = 0
    """Seed for data, workload and sampling. Every mode sees the same samples for a seed."""

    def __post_init__(self) -> None:
        validate_cross_fields(self)


def register_configs() -> None:
    """Register every group's schema in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="pivot_schema", node=PivotConfig)
    cs.store(group="deploy", name="deploy_schema", node=DeployConfig)
    cs.store(group="models", name="models_schema", node=ModelsConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig)


__all__ = [
    "Allocation", "ClusterConfig", "ClusterKind", "DeployConfig", "DeployMode", "HardwareProfile",
    "LengthDist", "LoggingConfig", "ModelSpec", "ModelsConfig", "PivotConfig", "PlannerConfig",
    "TrainConfig", "WorkloadConfig", "register_configs",
]
