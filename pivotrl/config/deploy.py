"""Schema of the `deploy` group: the deployment mode, its static allocation and the planner."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pivotrl.config.planner import PlannerConfig


class DeployMode(str, enum.Enum):
    colocated = "colocated"
    disaggregated = "disaggregated"
    rr_colocated = "rr_colocated"
    pivot = "pivot"


@dataclass
class Allocation:
    """Devices per role for static modes (`disaggregated`: all three; `rr_colocated`: rollout holds
    the shared rollout+reward pool and reward is 0). `null` everywhere means: pick the best by sweep
    (sim) or a default split (local/ray)."""

    rollout: int | None = None
    """Devices for rollout (rr_colocated: the shared rollout+reward pool)."""
    reward: int | None = None
    """Devices for reward (0 for rr_colocated)."""
    train: int | None = None
    """Devices for training (its home set; pivot and rr_colocated use this too)."""

    def given(self) -> bool:
        return any(v is not None for v in (self.rollout, self.reward, self.train))


@dataclass
class DeployConfig:
    """The `deploy` group."""

    mode: DeployMode = DeployMode.pivot
    """colocated | disaggregated | rr_colocated | pivot."""
    staleness: int = 2
    """Max policy-version lag between generation and training (async modes; colocated is 0)."""
    allocation: Allocation = field(default_factory=Allocation)
    """Static allocation for baselines; training home set for pivot."""
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    """Shift strategy and planner settings (pivot only)."""

    def __post_init__(self) -> None:
        if isinstance(self.staleness, int) and self.staleness < 0:
            raise ValueError(f"deploy.staleness must be >= 0, got {self.staleness}")
