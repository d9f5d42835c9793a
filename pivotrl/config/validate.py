"""Cross-field checks of a whole run config. Each error names the fields and what is allowed."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pivotrl.config import PivotConfig


def _is_pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


def validate_cross_fields(cfg: "PivotConfig") -> None:
    """Raise ValueError if devices do not add up or a replica does not fit the cluster."""
    from pivotrl.config.deploy import DeployMode

    cl, dep, models = cfg.cluster, cfg.deploy, cfg.models
    if not all(hasattr(x, "__dataclass_fields__") for x in (cl, dep, models)):
        return  # still a schema with MISSING groups (ConfigStore registration)
    if cl.num_devices is None:
        cl.num_devices = models.devices
    n, node = cl.num_devices, cl.node_size
    if n % node and n > node:
        raise ValueError(f"cluster.num_devices={n} must be a multiple of cluster.node_size={node}")
    for role in ("policy", "genrm"):
        tp = getattr(models, role).tp
        if not _is_pow2(tp):
            raise ValueError(f"models.{role}.tp must be a power of two, got {tp}")
        if tp > min(n, node) or min(n, node) % tp:
            raise ValueError(
                f"models.{role}.tp={tp} must divide the devices per node "
                f"(min(cluster.num_devices={n}, cluster.node_size={node}))")
    a = dep.allocation
    mode = dep.mode
    if mode == DeployMode.colocated and a.given():
        raise ValueError("deploy.allocation must be empty for deploy=colocated (every device serves every role)")
    if not a.given():
        return
    parts = {k: (getattr(a, k) or 0) for k in ("rollout", "reward", "train")}
    for k, v in parts.items():
        if v < 0:
            raise ValueError(f"deploy.allocation.{k} must be >= 0, got {v}")
    if mode == DeployMode.disaggregated:
        if sum(parts.values()) != n:
            raise ValueError(
                f"deploy.allocation rollout+reward+train = {parts['rollout']}+{parts['reward']}+{parts['train']}"
                f" = {sum(parts.values())} must equal cluster.num_devices={n}")
        for k, v in parts.items():
            if v < 1:
                raise ValueError(f"deploy.allocation.{k} must be >= 1 for deploy=disaggregated, got {v}")
    elif mode == DeployMode.rr_colocated:
        if parts["reward"]:
            raise ValueError("deploy.allocation.reward must be 0/null for rr_colocated: "
                             "rollout holds the shared rollout+reward pool")
        if parts["rollout"] + parts["train"] != n or min(parts["rollout"], parts["train"]) < 1:
            raise ValueError(
                f"deploy.allocation rollout+train = {parts['rollout']}+{parts['train']} must equal "
                f"cluster.num_devices={n}, each >= 1")
    elif mode == DeployMode.pivot:
        if parts["rollout"] or parts["reward"]:
            raise ValueError("deploy.allocation for pivot takes only `train` (its home set); "
                             "rollout and reward are shifted at run time")
        if not 1 <= parts["train"] <= n:
            raise ValueError(f"deploy.allocation.train must be in [1, cluster.num_devices={n}], got {parts['train']}")
    tp_of = {"rollout": models.policy.tp, "reward": models.genrm.tp, "train": 1}
    if mode == DeployMode.rr_colocated:
        tp_of["rollout"] = max(models.policy.tp, models.genrm.tp)
    for k, v in parts.items():
        if v and v % tp_of[k]:
            raise ValueError(f"deploy.allocation.{k}={v} must be a multiple of its replica size tp={tp_of[k]}")
