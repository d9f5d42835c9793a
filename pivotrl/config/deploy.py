"""Schemas of the `deploy` group: one dataclass per deployment mode, each with its own checks.

`conf/deploy/<mode>.yaml` selects its mode's schema, so `deploy=pivot` composes a
`PivotDeployConfig` and `deploy=disaggregated` a `DisaggregatedDeployConfig`; `mode` is set by the
schema and checked against it. Pivot's planner is a nested group of its own, one schema per shift
strategy (`deploy/planner=<strategy>`, pivotrl/config/planner.py). Checks that need
another group (the device count, replica sizes) are the mode's `check_allocation`, called by the
cross-field validation; no check changes a value (derived values come from
`pivotrl.config.resolve`).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pivotrl.config.base import ConfigError, check
from pivotrl.config.planner import PivotPlannerConfig, PlannerConfig
from pivotrl.registry import Registry


class DeployMode(str, enum.Enum):
    colocated = "colocated"
    disaggregated = "disaggregated"
    rr_colocated = "rr_colocated"
    pivot = "pivot"


@dataclass
class Allocation:
    """Devices per role. What each mode reads is stated in its schema; `null` everywhere means:
    pick the best by sweep (sim) or a default split (local/ray)."""

    rollout: int | None = None
    """Devices for rollout (rr_colocated: the shared rollout+reward pool)."""
    reward: int | None = None
    """Devices for reward (disaggregated only)."""
    train: int | None = None
    """Devices for training (its home set)."""

    def given(self) -> bool:
        return any(v is not None for v in (self.rollout, self.reward, self.train))

    def parts(self) -> dict[str, int]:
        return {k: int(getattr(self, k) or 0) for k in ("rollout", "reward", "train")}

    def __post_init__(self) -> None:
        for k in ("rollout", "reward", "train"):
            v = getattr(self, k)
            check(v is None or (isinstance(v, int) and v >= 0), k, "null or an int >= 0", v)


@dataclass
class DeployConfig:
    """What every mode has: its name, the staleness bound and an allocation."""

    mode: DeployMode = DeployMode.pivot
    """colocated | disaggregated | rr_colocated | pivot (set by the group option)."""
    staleness: int = 2
    """Max policy-version lag between generation and training (async modes; colocated is
    synchronous and runs at 0 whatever this says)."""
    allocation: Allocation = field(default_factory=Allocation)
    """Static allocation (baselines) or the training home set (pivot)."""

    def __post_init__(self) -> None:
        check(isinstance(self.staleness, int) and self.staleness >= 0, "staleness", "an int >= 0", self.staleness)
        if type(self) is not DeployConfig:  # a mode's schema: its mode is its registry key
            own = next((k for k, v in DEPLOY_SCHEMAS.items() if v is type(self)), None)
            mode = getattr(self.mode, "value", self.mode)
            check(mode == own, "mode", f"{own!r}, the mode of {type(self).__name__}: another mode is another "
                  "schema, chosen with deploy=<mode>", mode)

    def check_allocation(self, n: int, tp_of: dict[str, int]) -> None:
        """Raise `ConfigError` (relative to `deploy`) if the allocation cannot run on `n` devices
        with replica sizes `tp_of` (rollout, reward, train)."""
        parts = self.allocation.parts()
        for k, v in parts.items():
            if v and v % tp_of[k]:
                raise ConfigError(f"allocation.{k}", f"a multiple of its replica size tp={tp_of[k]}", v)


@dataclass
class ColocatedDeployConfig(DeployConfig):
    """`deploy=colocated`: every device serves every role, stages in sequence."""

    mode: DeployMode = DeployMode.colocated

    def __post_init__(self) -> None:
        super().__post_init__()
        check(not self.allocation.given(), "allocation", "empty (every device serves every role)",
              self.allocation.parts())


@dataclass
class DisaggregatedDeployConfig(DeployConfig):
    """`deploy=disaggregated`: disjoint pools for rollout, reward and training."""

    mode: DeployMode = DeployMode.disaggregated

    def check_allocation(self, n: int, tp_of: dict[str, int]) -> None:
        if not self.allocation.given():
            return
        p = self.allocation.parts()
        if sum(p.values()) != n:
            raise ConfigError("allocation", f"rollout+reward+train = cluster.num_devices = {n}",
                              f"{p['rollout']}+{p['reward']}+{p['train']}")
        for k, v in p.items():
            check(v >= 1, f"allocation.{k}", ">= 1 (every role needs a pool)", v)
        super().check_allocation(n, tp_of)


@dataclass
class RRColocatedDeployConfig(DeployConfig):
    """`deploy=rr_colocated`: rollout and reward share one pool (`allocation.rollout`), training
    has its own (`allocation.train`)."""

    mode: DeployMode = DeployMode.rr_colocated

    def __post_init__(self) -> None:
        super().__post_init__()
        check(not self.allocation.reward, "allocation.reward",
              "0 or null (rollout holds the shared rollout+reward pool)", self.allocation.reward)

    def check_allocation(self, n: int, tp_of: dict[str, int]) -> None:
        if not self.allocation.given():
            return
        p = self.allocation.parts()
        if p["rollout"] + p["train"] != n or min(p["rollout"], p["train"]) < 1:
            raise ConfigError("allocation", f"rollout+train = cluster.num_devices = {n}, each >= 1",
                              f"{p['rollout']}+{p['train']}")
        super().check_allocation(n, {**tp_of, "rollout": max(tp_of["rollout"], tp_of["reward"])})


@dataclass
class PivotDeployConfig(DeployConfig):
    """`deploy=pivot`: any device can hold any role; the planner shifts them at run time.
    `allocation.train` is the training home set (null: the model group's or a default)."""

    mode: DeployMode = DeployMode.pivot
    planner: PlannerConfig = field(default_factory=PivotPlannerConfig)
    """Shift strategy and its settings: one schema per strategy (`pivotrl.config.planner`),
    chosen with `deploy/planner=<strategy>` (`conf/deploy/planner/`; default `pivot`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        a = self.allocation
        check(not (a.rollout or a.reward), "allocation", "only `train` (the home set); rollout and "
              "reward are shifted at run time", a.parts())

    def check_allocation(self, n: int, tp_of: dict[str, int]) -> None:
        tr = self.allocation.train
        if tr is None:
            return
        # training home == every device stalls: nothing is left to generate the batch it waits for
        if not 1 <= tr <= max(n - 1, 1):
            raise ConfigError("allocation.train", f"in [1, {max(n - 1, 1)}] for cluster.num_devices={n} "
                              "(the home set must leave a device for rollout and reward)", tr)
        super().check_allocation(n, tp_of)


#: mode -> schema (the config string is the key; `conf/deploy/<mode>.yaml` selects it).
DEPLOY_SCHEMAS: Registry[type[DeployConfig]] = Registry("deploy.mode", {
    DeployMode.colocated.value: ColocatedDeployConfig,
    DeployMode.disaggregated.value: DisaggregatedDeployConfig,
    DeployMode.rr_colocated.value: RRColocatedDeployConfig,
    DeployMode.pivot.value: PivotDeployConfig,
})
