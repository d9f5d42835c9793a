"""Cross-field checks of a whole run config. Each raises `ConfigError` with the field's full path
and what is allowed. Nothing here changes a value (derived values: `pivotrl.config.resolve`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pivotrl.config.base import ConfigError

if TYPE_CHECKING:
    from pivotrl.config import PivotConfig


def validate_cross_fields(cfg: "PivotConfig") -> None:
    """Raise `ConfigError` if devices do not add up or a replica does not fit the cluster."""
    cl, dep, models = cfg.cluster, cfg.deploy, cfg.models
    if not all(hasattr(x, "__dataclass_fields__") for x in (cl, dep, models)):
        return  # still a schema with MISSING groups (ConfigStore registration)
    n = cl.num_devices if cl.num_devices is not None else models.devices
    node = cl.node_size
    if getattr(cl.kind, "value", cl.kind) == "sim":  # before anything allocates per device
        models.sim.check_devices(n, min(models.policy.tp, models.genrm.tp))
    if n % node and n > node:
        raise ConfigError("num_devices", f"a multiple of cluster.node_size={node}", n, "cluster")
    for role in ("policy", "genrm"):
        tp = getattr(models, role).tp
        if tp > min(n, node) or min(n, node) % tp:
            raise ConfigError("tp", f"a divisor of the devices per node, min(cluster.num_devices={n}, "
                              f"cluster.node_size={node})", tp, f"models.{role}")
    tp_of = {"rollout": models.policy.tp, "reward": models.genrm.tp, "train": 1}
    try:
        dep.check_allocation(n, tp_of)
    except ConfigError as e:
        raise e.at("deploy") from None
