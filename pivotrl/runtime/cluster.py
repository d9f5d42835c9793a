"""Start or attach Ray, and reserve one placement-group bundle per device.

Owns: the Ray session of a real runtime and where each device lives. `cluster=local` declares one
custom resource `pivot_device` per virtual device (`start_cluster` starts Ray with exactly
`num_devices` of them, or attaches to a running Ray that has them); `cluster=ray` uses the `GPU`
resource of a running cluster. Both reserve devices the same way: one placement group per node of
`node_size` devices (`STRICT_PACK`, so a TP replica's devices share a Ray node), one bundle per
device. Device `d` is bundle `d % node_size` of group `d // node_size`. The device actors
(`device.py`) are scheduled onto these bundles and never onto anything else.

Knows nothing about roles, engines or the control plane.

Errors: asking for more devices than the cluster's resources is a `ClusterResourceError` at start
that names both numbers (and the resource). Teardown (`Cluster.shutdown`, or the
`cluster_session` context manager) removes the placement groups and shuts Ray down if this module
started it; it runs in `finally`, so a failed run never leaves Ray behind for the next one.
"""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

log = logging.getLogger(__name__)

#: The custom Ray resource of one virtual device on `cluster=local`.
DEVICE_RESOURCE = "pivot_device"
#: Which Ray resource one device is, per `cluster.kind`.
RESOURCE_OF_KIND = {"local": DEVICE_RESOURCE, "ray": "GPU"}


class ClusterResourceError(RuntimeError):
    """The cluster cannot hold the devices the config asks for."""


@dataclass(frozen=True)
class ClusterSpec:
    """What a runtime asks of Ray (built from `cfg.cluster` by `ClusterSpec.from_config`)."""

    kind: str
    """`local` (virtual devices, custom resource) or `ray` (GPUs)."""
    num_devices: int
    """Devices to reserve, >= 1."""
    node_size: int = 8
    """Devices per node; the last node may be smaller when num_devices < node_size."""
    threads_per_device: int = 1
    """CPU threads each device actor may use (torch intra-op threads)."""
    address: str | None = None
    """Ray address to attach to (`auto` = a running local cluster); None starts Ray (local only)."""
    start_timeout_s: float = 60.0
    """Seconds to wait for the placement groups before declaring the cluster too small."""

    def __post_init__(self) -> None:
        if self.kind not in RESOURCE_OF_KIND:
            raise ValueError(f"cluster.kind={self.kind!r} has no device actors; allowed: {sorted(RESOURCE_OF_KIND)}")
        if self.num_devices < 1:
            raise ValueError(f"cluster.num_devices must be >= 1, got {self.num_devices}")
        if self.node_size < 1:
            raise ValueError(f"cluster.node_size must be >= 1, got {self.node_size}")
        if self.threads_per_device < 1:
            raise ValueError(f"cluster.threads_per_device must be >= 1, got {self.threads_per_device}")

    @property
    def resource(self) -> str:
        return RESOURCE_OF_KIND[self.kind]

    @property
    def num_nodes(self) -> int:
        return -(-self.num_devices // self.node_size)

    def node_devices(self, node: int) -> list[int]:
        lo = node * self.node_size
        return list(range(lo, min(lo + self.node_size, self.num_devices)))

    @classmethod
    def from_config(cls, cluster_cfg: Any, num_devices: int | None = None) -> "ClusterSpec":
        kind = getattr(cluster_cfg.kind, "value", cluster_cfg.kind)
        n = num_devices if num_devices is not None else cluster_cfg.num_devices
        if n is None:
            raise ValueError("cluster.num_devices is null: resolve it (PivotConfig does) before starting Ray")
        return cls(kind=str(kind), num_devices=int(n), node_size=int(cluster_cfg.node_size),
                   threads_per_device=int(getattr(cluster_cfg, "threads_per_device", 1)),
                   address=getattr(cluster_cfg, "address", None))


def cores_for_device(local_index: int, threads: int, available: list[int] | None = None) -> list[int] | None:
    """Cores to pin the `local_index`-th device of a node to, or None when the node has too few.

    Pinning only helps when every device gets its own cores; with fewer cores than
    devices x threads (2 cores, 4 virtual devices here) pinning would stack devices on the same
    cores while others idle, so we leave placement to the OS scheduler instead."""
    cores = sorted(available if available is not None else os.sched_getaffinity(0))
    lo = local_index * threads
    if lo + threads > len(cores):
        return None
    return cores[lo:lo + threads]


@dataclass
class Cluster:
    """A started (or attached) Ray session with one reserved bundle per device."""

    spec: ClusterSpec
    placement_groups: list[Any] = field(default_factory=list)
    started_ray: bool = False
    """True when `start_cluster` called `ray.init` (so `shutdown` calls `ray.shutdown`)."""

    @property
    def resource(self) -> str:
        return self.spec.resource

    def node_of(self, device: int) -> int:
        self._check(device)
        return device // self.spec.node_size

    def local_index(self, device: int) -> int:
        self._check(device)
        return device % self.spec.node_size

    def scheduling_strategy(self, device: int) -> Any:
        """The Ray scheduling strategy that puts an actor on `device`'s bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._check(device)
        return PlacementGroupSchedulingStrategy(
            placement_group=self.placement_groups[self.node_of(device)],
            placement_group_bundle_index=self.local_index(device),
            placement_group_capture_child_tasks=False)

    def actor_options(self, device: int) -> dict[str, Any]:
        """`Actor.options(**...)` for the actor of `device`: its resource, its bundle, no CPU claim.

        Actors claim no Ray CPU: on `local` the virtual devices share the machine's cores on
        purpose (their thread budget and pinning are set inside the actor, `device.py`)."""
        opts: dict[str, Any] = {"num_cpus": 0, "scheduling_strategy": self.scheduling_strategy(device)}
        if self.resource == "GPU":
            opts["num_gpus"] = 1
        else:
            opts["resources"] = {self.resource: 1}
        return opts

    def _check(self, device: int) -> None:
        if not 0 <= device < self.spec.num_devices:
            raise ValueError(f"device {device} is outside the cluster's devices [0, {self.spec.num_devices})")

    def shutdown(self) -> None:
        """Remove the placement groups; shut Ray down if we started it. Idempotent."""
        import ray

        if not ray.is_initialized():
            self.placement_groups.clear()
            return
        from ray.util.placement_group import remove_placement_group

        for pg in self.placement_groups:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        self.placement_groups.clear()
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


def _init_ray(spec: ClusterSpec) -> bool:
    """Start or attach Ray; return True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    from pivotrl.logging.console import prepare_ray_init  # logging.verbose: Ray's console output

    kwargs: dict[str, Any] = dict(include_dashboard=False, configure_logging=False, **prepare_ray_init())
    if spec.address is not None:
        ray.init(address=spec.address, **kwargs)
        return True  # our connection: disconnect at the end (the cluster itself stays up)
    if spec.kind == "ray":
        raise ClusterResourceError(
            "cluster=ray needs cluster.address (e.g. `auto`) of a running Ray cluster with GPUs; "
            "use cluster=local for virtual devices on this machine")
    # Virtual devices: declare exactly num_devices of them. num_cpus is the real core count; the
    # device actors claim no CPU (see Cluster.actor_options).
    # address="local": always a fresh private instance, never someone else's running cluster.
    ray.init(address="local", num_cpus=max(1, len(os.sched_getaffinity(0))),
             resources={DEVICE_RESOURCE: float(spec.num_devices)}, **kwargs)
    return True


def start_cluster(spec: ClusterSpec) -> Cluster:
    """Start/attach Ray and reserve every device, or raise `ClusterResourceError` naming both numbers."""
    import ray
    from ray.util.placement_group import placement_group

    cluster = Cluster(spec=spec, started_ray=_init_ray(spec))
    try:
        have = ray.cluster_resources().get(spec.resource, 0.0)
        if have < spec.num_devices:
            raise ClusterResourceError(
                f"cluster.num_devices={spec.num_devices} devices requested, but the Ray cluster has only "
                f"{have:g} '{spec.resource}' resources")
        for node in range(spec.num_nodes):
            devs = spec.node_devices(node)
            bundle: dict[str, float] = {spec.resource: 1.0}
            pg = placement_group([dict(bundle) for _ in devs], strategy="STRICT_PACK",
                                 name=f"pivotrl-node{node}")
            cluster.placement_groups.append(pg)
        for node, pg in enumerate(cluster.placement_groups):
            if not pg.wait(timeout_seconds=spec.start_timeout_s):
                per_node = _max_per_node(spec.resource)
                raise ClusterResourceError(
                    f"could not place node {node}: cluster.node_size={spec.node_size} devices must share one "
                    f"Ray node, but the largest node has {per_node:g} '{spec.resource}' resources "
                    f"(cluster.num_devices={spec.num_devices}, total {have:g})")
        log.info("cluster: %d %s devices on %d node(s), Ray %s", spec.num_devices, spec.resource,
                 spec.num_nodes, "started" if cluster.started_ray else "attached")
        return cluster
    except BaseException:
        cluster.shutdown()
        raise


def _max_per_node(resource: str) -> float:
    import ray

    return max((n.get("Resources", {}).get(resource, 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0)


@contextlib.contextmanager
def cluster_session(spec: ClusterSpec) -> Iterator[Cluster]:
    """`with cluster_session(spec) as cluster:` ... always torn down, also on error."""
    cluster = start_cluster(spec)
    try:
        yield cluster
    finally:
        cluster.shutdown()
