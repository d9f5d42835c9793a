"""`resolve(cfg)`: the values a run derives from its config, computed once, here and nowhere else.

A config says what the user asked for; a `Resolved` says what the run does with it: how many
devices, which staleness bound, the batch, the starting allocation, the accelerator, the
response cap, and the trainer's settings as the trainer receives them. Validation never changes a
config; anything "null means ..." is turned into a value by this module. Pure: standard library
and the config dataclasses only.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pivotrl.config.base import ConfigError
from pivotrl.config.deploy import PivotDeployConfig
from pivotrl.config.planner import PlannerConfig
from pivotrl.config.trainer import TrainerConfig

if TYPE_CHECKING:
    from pivotrl.config import PivotConfig

#: Trainer fields that the run derives from other settings; setting them under `algo` would be
#: silently overwritten, so `check_algo` refuses that and names where to set them instead.
DERIVED_TRAINER_FIELDS: dict[str, str] = {
    "staleness": "deploy.staleness",
    "world_size": "deploy.allocation.train (the training home set)",
    "seed": "seed",
    "backend": "cluster.accelerator",
    "device": "cluster.accelerator",
    "num_threads": "cluster.threads_per_device",
    "logprob_temperature": "algo.rollout_temperature",
}


def _mode(cfg: PivotConfig) -> str:
    return getattr(cfg.deploy.mode, "value", str(cfg.deploy.mode))


def _kind(cfg: PivotConfig) -> str:
    return getattr(cfg.cluster.kind, "value", str(cfg.cluster.kind))


def default_allocation(mode: str, n: int, tp: dict[str, int] | None = None) -> dict[str, int]:
    """Device split of a real run when `deploy.allocation` is empty (the simulator sweeps
    instead; a real run cannot): about a quarter of the devices train, the rest generate, each
    inference pool a whole number of its replicas (`tp`: rollout, reward replica sizes)."""
    tp = tp or {"rollout": 1, "reward": 1}
    tr = max(1, n // 4)

    def whole(devices: int, size: int) -> int:  # at least one replica, else whole replicas
        return max(size, devices // size * size)

    if mode == "disaggregated":
        if n < 3:
            raise ConfigError("num_devices", ">= 3 for deploy=disaggregated (one pool per role)", n, "cluster")
        rm = whole(n // 4, tp["reward"])
        ro = whole(n - rm - tr, tp["rollout"])
        if n - rm - ro < 1:
            raise ConfigError("num_devices", f">= {rm + ro + 1} for deploy=disaggregated with models.policy.tp="
                              f"{tp['rollout']} and models.genrm.tp={tp['reward']} (a replica of each role and a "
                              f"training device), or set deploy.allocation", n, "cluster")
        return {"rollout": ro, "reward": rm, "train": n - rm - ro}
    if mode == "rr_colocated":
        if n < 2:
            raise ConfigError("num_devices", ">= 2 for deploy=rr_colocated", n, "cluster")
        size = max(tp.values())  # the shared pool holds replicas of both roles (sizes nest)
        pool = whole(n - tr, size)
        if n - pool < 1:
            raise ConfigError("num_devices", f">= {pool + 1} for deploy=rr_colocated with replicas of {size} "
                              f"devices and a training device, or set deploy.allocation", n, "cluster")
        return {"rollout": pool, "reward": 0, "train": n - pool}
    if mode == "pivot":
        return {"train": tr}
    return {}


@dataclass(frozen=True)
class Resolved:
    """What a run derives from its config (see module docstring)."""

    runtime: str
    """cluster.kind: local | ray | sim | inproc."""
    mode: str
    """deploy mode."""
    num_devices: int
    """cluster.num_devices, or the model group's devices."""
    node_size: int
    tp: dict[str, int]
    """Replica size per inference role: rollout (policy), reward (GenRM)."""
    staleness: int
    """The staleness bound the controller enforces (colocated and the inproc loop: 0)."""
    prompts_per_step: int
    group_size: int
    steps: int
    warmup: int
    """Leading steps excluded from throughput (at most steps - 1)."""
    allocation: dict[str, int]
    """Devices per role the run starts from; empty: colocated, or the simulator's sweep."""
    allocation_given: bool
    """Whether `deploy.allocation` named it (else a default split or the sweep)."""
    planner: PlannerConfig
    """deploy.planner for pivot, the defaults for the static modes (which never plan)."""
    accelerator: str
    """cpu | cuda (real runtimes)."""
    max_response: int
    """The policy's response cap (data.max_response_length)."""
    lr_decay_steps: int
    """algo.lr_decay_steps, where null means over the run's train.steps."""

    def trainer(self, cfg: PivotConfig, world_size: int) -> TrainerConfig:
        """`cfg.algo` as one trainer of `world_size` ranks receives it."""
        on_cpu = self.accelerator == "cpu"
        return dataclasses.replace(
            cfg.algo, staleness=self.staleness, world_size=int(world_size), seed=int(cfg.seed),
            backend="gloo" if on_cpu else "nccl", device=self.accelerator,
            num_threads=int(cfg.cluster.threads_per_device), lr_decay_steps=self.lr_decay_steps,
            # the engines' log-prob convention (engines/protocol.py): at T, or at 1 for greedy
            logprob_temperature=float(cfg.algo.rollout_temperature) or 1.0)


def check_algo(algo: TrainerConfig) -> None:
    """Refuse derived trainer fields set under `algo` (they would be overwritten)."""
    default = TrainerConfig()
    for name, where in DERIVED_TRAINER_FIELDS.items():
        if getattr(algo, name) != getattr(default, name):
            raise ConfigError(name, f"left at its default {getattr(default, name)!r}: the run sets it from "
                              f"{where}", getattr(algo, name), "algo")


def resolve(cfg: PivotConfig) -> Resolved:
    """The derived values of a validated `PivotConfig`."""
    mode, kind = _mode(cfg), _kind(cfg)
    n = int(cfg.cluster.num_devices or cfg.models.devices)
    a = cfg.deploy.allocation
    if a.given():
        alloc = {k: v for k, v in a.parts().items()}
        if mode == "pivot":
            alloc = {"train": alloc["train"]}
    elif kind == "sim" or mode == "colocated":
        alloc = {}
    else:
        alloc = default_allocation(mode, n, {"rollout": int(cfg.models.policy.tp), "reward": int(cfg.models.genrm.tp)})
    accel = cfg.cluster.accelerator or ("cuda" if kind == "ray" else "cpu")
    decay = cfg.algo.lr_decay_steps
    steps = int(cfg.train.steps)
    return Resolved(
        runtime=kind, mode=mode, num_devices=n, node_size=int(cfg.cluster.node_size),
        tp={"rollout": int(cfg.models.policy.tp), "reward": int(cfg.models.genrm.tp)},
        staleness=0 if mode == "colocated" or kind == "inproc" else int(cfg.deploy.staleness),
        prompts_per_step=int(cfg.train.prompts_per_step), group_size=int(cfg.train.group_size),
        steps=steps, warmup=min(int(cfg.train.warmup_steps), steps - 1),
        allocation=alloc, allocation_given=a.given(),
        planner=cfg.deploy.planner if isinstance(cfg.deploy, PivotDeployConfig) else PlannerConfig(),
        accelerator=accel, max_response=int(cfg.data.max_response_length),
        lr_decay_steps=steps if decay is None else int(decay))
