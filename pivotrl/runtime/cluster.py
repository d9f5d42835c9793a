"""Start or attach Ray, and reserve one placement-group bundle per device.

Owns: the Ray session of a real runtime and where each device lives. `cluster=local` declares one
custom resource `pivot_device` per virtual device (`start_cluster` starts Ray with exactly
`num_devices` of them, or attaches to a running Ray that has them); `cluster=ray` uses the `GPU`
resource of a running cluster. Both reserve devices the same way: one placement group per node of
`node_size` devices (`STRICT_PACK`, so a TP replica's devices share a Ray node), one bundle per
device. Device `d` is bundle `d % node_size` of group `d // node_size`. The device actors
(`device.py`) are scheduled onto these bundles and never onto anything else. On `cluster=ray`,
`devices_per_gpu` > 1 makes several devices share one GPU (each bundle and actor takes that
fraction of it; Ray gives every one of them that GPU): one GPU can then hold a run that needs a
device per role, as the device check's pivot run does; the executor serialises the devices'
shifts so that no two engines start on the GPU at once (vLLM sizes its KV cache from the memory it
finds free while it starts).

Knows nothing about roles, engines or the control plane.

Joining Ray: `cluster.address=host:port` is probed and joined within `connect_timeout_s`, else a
`ClusterConnectError` that says how to start a head; `local` (the default of `cluster=local`)
starts a private head with its own temp dir and port, stopped through this driver's own
`ray.shutdown()` (never the CLI's stop command, which would stop other users' Ray too); `auto` is refused. The
address in use is logged. A private head gets a reaper (`reaper.py`): Ray ties its gcs and raylet
to the driver, not the agents the raylet starts, which outlived a SIGKILLed driver by minutes.

Kept clusters: with `cluster.keep_devices` (`ClusterSpec.keep_devices`) a run's `shutdown` keeps
the cluster (its Ray session, placement groups and the device actors the executor hands back in
`Cluster.devices`), and the process's next `start_cluster` of the same spec in the same Ray session
returns it, so that run starts no device process. One cluster is kept at a time: a start of another
spec releases it first (it holds the devices), and `release_kept_clusters` ends it (also at the
process's exit, so a private head's temp dir goes as after any run).

Errors: asking for more devices than the cluster's resources is a `ClusterResourceError` at start
that names both numbers (and the resource). Teardown (`Cluster.shutdown`, or the
`cluster_session` context manager) removes the placement groups and shuts Ray down if this module
started it; it runs in `finally`, so a failed run never leaves Ray behind for the next one.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from pivotrl.config.cluster import ClusterConfig
    from pivotrl.runtime.reaper import Reaper

log = logging.getLogger(__name__)

#: The custom Ray resource of one virtual device on `cluster=local`.
DEVICE_RESOURCE = "pivot_device"
#: The file in a private head's temp dir where its reaper records the head's processes.
REAPER_RECORD = "pivotrl-reaper.pids"
#: Which Ray resource one device is, per `cluster.kind`.
RESOURCE_OF_KIND = {"local": DEVICE_RESOURCE, "ray": "GPU"}


class ClusterResourceError(RuntimeError):
    """The cluster cannot hold the devices the config asks for."""


class ClusterConnectError(RuntimeError):
    """No Ray head to join (nothing listens at `cluster.address`, or it did not answer in time)."""


AUTO_REFUSED = ("cluster.address=auto is refused: it attaches to whatever Ray runs on this machine, "
                "maybe another user's; use cluster.address=local (a private head for this run) or "
                "cluster.address=host:port of your head")


def how_to_start(spec: "ClusterSpec") -> str:
    """What to tell a user who has no Ray cluster to join."""
    res = "--num-gpus=8" if spec.kind == "ray" else f"--resources='{{\"{DEVICE_RESOURCE}\": {spec.num_devices}}}'"
    return (f"start a head with `ray start --head --port=6379 {res}` (and `ray start --address=HEAD:6379` "
            f"on each worker node), then pass cluster.address=HEAD:6379; or cluster.address=local "
            f"for a private head on this machine")


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
    """`host:port` of a running Ray head to join, or `local` (a private head: own temp dir and
    port); None: `local` for `kind=local`, an error naming both choices for `kind=ray`."""
    start_timeout_s: float = 60.0
    """Seconds to wait for the placement groups before declaring the cluster too small."""
    connect_timeout_s: float = 30.0
    """Seconds to wait for the head at `address` before failing with how to start one."""
    declare_gpus: bool = False
    """`kind=ray`, `address=local`: declare `num_devices` GPUs on the private head (a CPU machine
    running the ray path with vLLM's CPU build and gloo, `cluster.accelerator=cpu`)."""
    devices_per_gpu: int = 1
    """`kind=ray`: devices sharing one GPU (each takes 1/devices_per_gpu of it)."""
    keep_devices: bool = False
    """Keep the cluster and its device actors for the process's next run of this spec
    (`cluster.keep_devices`; module docstring, Kept clusters)."""

    def __post_init__(self) -> None:
        if self.kind not in RESOURCE_OF_KIND:
            raise ValueError(f"cluster.kind={self.kind!r} has no device actors; allowed: {sorted(RESOURCE_OF_KIND)}")
        if self.num_devices < 1:
            raise ValueError(f"cluster.num_devices must be >= 1, got {self.num_devices}")
        if self.node_size < 1:
            raise ValueError(f"cluster.node_size must be >= 1, got {self.node_size}")
        if self.threads_per_device < 1:
            raise ValueError(f"cluster.threads_per_device must be >= 1, got {self.threads_per_device}")
        if self.address == "auto":
            raise ValueError(AUTO_REFUSED)
        if self.devices_per_gpu < 1 or (self.devices_per_gpu > 1 and self.kind != "ray"):
            raise ValueError(f"cluster.devices_per_gpu={self.devices_per_gpu}: allowed 1, or > 1 with cluster=ray "
                             f"(devices sharing a GPU); cluster={self.kind}")

    @property
    def per_device(self) -> float:
        """How much of its resource one device takes (a fraction of a GPU when devices share one)."""
        return 1.0 / self.devices_per_gpu

    @property
    def resources_needed(self) -> float:
        """Units of `resource` the devices take in all (GPUs when they share them)."""
        return float(-(-self.num_devices // self.devices_per_gpu))

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
    def from_config(cls, cluster_cfg: ClusterConfig, num_devices: int | None = None) -> ClusterSpec:
        kind = getattr(cluster_cfg.kind, "value", cluster_cfg.kind)
        n = num_devices if num_devices is not None else cluster_cfg.num_devices
        if n is None:
            raise ValueError("cluster.num_devices is null: resolve it (PivotConfig does) before starting Ray")
        accel = getattr(cluster_cfg, "accelerator", None) or ("cuda" if kind == "ray" else "cpu")
        return cls(kind=str(kind), num_devices=int(n), node_size=int(cluster_cfg.node_size),
                   threads_per_device=int(getattr(cluster_cfg, "threads_per_device", 1)),
                   address=getattr(cluster_cfg, "address", None),
                   connect_timeout_s=float(getattr(cluster_cfg, "connect_timeout_s", 30.0)),
                   declare_gpus=str(kind) == "ray" and accel == "cpu",
                   devices_per_gpu=int(getattr(cluster_cfg, "devices_per_gpu", 1)),
                   keep_devices=bool(getattr(cluster_cfg, "keep_devices", False)))


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
    address: str | None = None
    """The GCS address of the Ray in use (logged at start)."""
    temp_dir: str | None = None
    """The private head's own temp dir (`address=local`), removed at shutdown."""
    reaper: Reaper | None = None
    """The private head's `runtime.reaper.Reaper`: ends the head's processes by their recorded
    pids when this driver dies (even by SIGKILL), and what is left of them at shutdown."""
    devices: dict[int, tuple[Any, int]] = field(default_factory=dict)
    """`spec.keep_devices`: each device's actor (None once it was stopped) and its generation, as
    the last run left them; the executor takes them at start and hands them back at close."""
    session: str | None = None
    """The Ray session the cluster lives in (the driver's node id: a new session has a new one)."""

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
            opts["num_gpus"] = self.spec.per_device
        else:
            opts["resources"] = {self.resource: 1}
        return opts

    def ray_node_ids(self) -> list[str]:
        """The Ray node each node group (placement group) was placed on, in group order: where
        that group's GPS copy lives (several groups may share one Ray node)."""
        from ray.util.placement_group import placement_group_table

        out = []
        for pg in self.placement_groups:
            nodes = placement_group_table(pg)["bundles_to_node_id"]
            out.append(str(nodes[0]))
        return out

    def _check(self, device: int) -> None:
        if not 0 <= device < self.spec.num_devices:
            raise ValueError(f"device {device} is outside the cluster's devices [0, {self.spec.num_devices})")

    def shutdown(self) -> None:
        """Remove the placement groups; shut Ray down if we started it. Idempotent. A kept cluster
        (`spec.keep_devices`) stays as it is, for the next run: `release_kept_clusters` ends it."""
        if _KEPT.get("cluster") is self:
            return
        self._end()

    def _end(self) -> None:
        import ray

        for actor, _ in self.devices.values():
            if actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
        self.devices.clear()
        if not ray.is_initialized():
            self.placement_groups.clear()
            return
        from ray.util.placement_group import remove_placement_group

        for pg in self.placement_groups:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        self.placement_groups.clear()
        if self.started_ray:
            ray.shutdown()  # our own driver's session: a private head stops with it
            self.started_ray = False
        if self.reaper is not None:
            self.reaper.close()
            self.reaper = None
        if self.temp_dir is not None:
            import shutil

            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


def _probe(address: str, timeout_s: float) -> None:
    """Raise `ClusterConnectError` unless something accepts TCP connections at `host:port`."""
    import socket

    host, _, port = address.rpartition(":")
    if address.startswith("ray://"):
        host, _, port = address[len("ray://"):].rpartition(":")
    if not host or not port.isdigit():
        raise ClusterConnectError(f"cluster.address={address!r} is not host:port (or `local`)")
    try:
        with socket.create_connection((host, int(port)), timeout=min(timeout_s, 10.0)):
            pass
    except OSError as e:
        raise ClusterConnectError(f"no Ray head answers at cluster.address={address} ({type(e).__name__}: "
                                  f"{e})") from None


def _join(address: str, timeout_s: float, kwargs: dict[str, Any]) -> None:
    """`ray.init(address)` bounded by `timeout_s` (Ray itself retries for minutes)."""
    import threading

    import ray

    out: dict[str, BaseException] = {}

    def body() -> None:
        try:
            ray.init(address=address, **kwargs)
        except BaseException as e:  # re-raised in the caller
            out["error"] = e

    t = threading.Thread(target=body, name="pivotrl-ray-join", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise ClusterConnectError(f"the Ray head at cluster.address={address} did not answer within "
                                  f"cluster.connect_timeout_s={timeout_s:g}s")
    if "error" in out:
        e = out["error"]
        raise ClusterConnectError(f"joining the Ray head at cluster.address={address} failed: "
                                  f"{type(e).__name__}: {e}") from e


def _init_ray(spec: ClusterSpec) -> tuple[bool, str | None, Any]:
    """Start or join Ray; return (whether this call started it, the private head's temp dir, its
    reaper)."""
    import ray

    if ray.is_initialized():
        return False, None, None
    from pivotrl.logging.console import prepare_ray_init  # logging.verbose: Ray's console output

    kwargs: dict[str, Any] = dict(include_dashboard=False, configure_logging=False, **prepare_ray_init())
    address = spec.address
    if address is None and spec.kind == "ray":
        raise ClusterConnectError(f"cluster=ray needs a Ray cluster to join and cluster.address is null: "
                                  f"{how_to_start(spec)}")
    if address not in (None, "local"):
        try:
            _probe(address, spec.connect_timeout_s)
            _join(address, spec.connect_timeout_s, kwargs)
        except ClusterConnectError as e:
            raise ClusterConnectError(f"{e}; {how_to_start(spec)}") from None
        return True, None, None  # our connection: disconnect at the end (the cluster itself stays up)
    # A private head ("local": always a fresh instance, never someone else's running cluster),
    # with its own temp dir; it stops with this driver's `ray.shutdown()`. Virtual devices declare
    # exactly num_devices of them; num_cpus is the real core count (the device actors claim no
    # CPU, see Cluster.actor_options).
    import tempfile

    temp_dir = tempfile.mkdtemp(prefix="pivotrl-ray-")
    res: dict[str, Any] = {}
    if spec.kind == "local":
        res["resources"] = {DEVICE_RESOURCE: float(spec.num_devices)}
    elif spec.declare_gpus:
        res["num_gpus"] = int(spec.resources_needed)
    from pivotrl.runtime.reaper import Reaper, children

    before = children(os.getpid()) if os.path.exists("/proc/self/stat") else set()
    try:
        ray.init(address="local", num_cpus=max(1, len(os.sched_getaffinity(0))), _temp_dir=temp_dir, **res,
                 **kwargs)
    except BaseException:
        import shutil

        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    # the head's processes are the children ray.init just started: a watcher ends them (and the
    # agents the raylet starts) by pid if this driver dies (runtime/reaper.py)
    return True, temp_dir, Reaper.start(before, record=Path(temp_dir) / REAPER_RECORD, remove=Path(temp_dir))


#: The kept cluster of this process, if any (`spec.keep_devices`): {"cluster": Cluster}.
_KEPT: dict[str, Cluster] = {}


def _session() -> str | None:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def release_kept_clusters() -> None:
    """End the kept cluster, if any: its device actors, placement groups and (if it started it)
    Ray. Before a caller shuts down the Ray session a kept cluster lives in."""
    cluster = _KEPT.pop("cluster", None)
    if cluster is not None:
        cluster._end()


def _kept(spec: ClusterSpec) -> Cluster | None:
    """The kept cluster if it is `spec`'s and its Ray session is the one in use; any other is
    released (it would hold the devices a new cluster asks for)."""
    cluster = _KEPT.get("cluster")
    if cluster is None:
        return None
    if cluster.spec == spec and cluster.session is not None and cluster.session == _session():
        log.info("cluster: the kept cluster of the last run (%d devices, Ray at %s)", spec.num_devices,
                 cluster.address)
        return cluster
    if cluster.session != _session():  # its Ray session is gone (and is not ours to stop now)
        cluster.started_ray = False
    release_kept_clusters()
    return None


def start_cluster(spec: ClusterSpec) -> Cluster:
    """Start/attach Ray and reserve every device, or raise `ClusterResourceError` naming both numbers
    (`ClusterConnectError` when there is no head to join, saying how to start one). With
    `spec.keep_devices`, the kept cluster of the process's last run of `spec`, if there is one."""
    import ray
    from ray.util.placement_group import placement_group

    kept = _kept(spec)
    if kept is not None:
        return kept
    started, temp_dir, reaper = _init_ray(spec)
    cluster = Cluster(spec=spec, started_ray=started, temp_dir=temp_dir, reaper=reaper)
    try:
        cluster.address = ray.get_runtime_context().gcs_address
        cluster.session = _session()
        log.info("cluster: Ray at %s (%s)", cluster.address,
                 "a private head of this run" if temp_dir else "joined" if started else "already connected")
        have = ray.cluster_resources().get(spec.resource, 0.0)
        if have < spec.resources_needed:
            shared = f" ({spec.devices_per_gpu} per GPU)" if spec.devices_per_gpu > 1 else ""
            raise ClusterResourceError(
                f"cluster.num_devices={spec.num_devices} devices{shared} requested, but the Ray cluster has only "
                f"{have:g} '{spec.resource}' resources")
        for node in range(spec.num_nodes):
            devs = spec.node_devices(node)
            bundle: dict[str, float] = {spec.resource: spec.per_device}
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
        if spec.keep_devices:
            _KEPT["cluster"] = cluster
            atexit.unregister(release_kept_clusters)  # once, and after Ray's own exit hook: runs first
            atexit.register(release_kept_clusters)
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
