"""`GPSConfig`: the settings of the Global Parameter Storage (DESIGN.md §4.4).

Owns only the dataclass and its own cross-field checks. Knows nothing about Hydra (the config
package registers it) and nothing about torch or Ray, so the pure GPS planner can take it.
"""
from __future__ import annotations

from dataclasses import dataclass

from pivotrl.registry import Registry

#: `gps.transport` -> the transport's factory `(config, num_nodes, **kw)` (imported on first use).
TRANSPORTS: Registry = Registry("cluster.gps.transport", {
    "shm": "pivotrl.gps.transports:ShmTransport",
    "ray": "pivotrl.gps.ray_transport:RayTransport.create",
    "nixl": "pivotrl.gps.nixl_transport:NixlTransport",
})


@dataclass
class GPSConfig:
    """Global Parameter Storage settings. Defaults model a Hopper node (paper §5.1: PCIe 63 GB/s,
    RDMA 50 GB/s); the memory budget follows from the node's memory unless set."""

    node_memory_budget_bytes: int = 0
    """Host memory each node may spend on GPS, over all registered models. Placement picks full
    replication when every model fits, else the smallest shard group `k` that fits. 0 (default):
    `node_memory_fraction` of this node's memory (the least of MemTotal, the cgroup limit and the size
    of `shm_dir`; `pivotrl.gps.placement.node_memory_bytes`), derived where GPS is built
    (`placement.budget_bytes`; the config itself is never changed). The real runtimes check the
    models against it at start (`pivotrl.gps.placement.check_budget`)."""

    node_memory_fraction: float = 0.8
    """Share of the node's memory a derived budget takes (the rest is left to the engines' host-side
    buffers, Ray's object store and the OS). Ignored when `node_memory_budget_bytes` is set."""

    write_headroom_versions: int = 1
    """Extra versions a writable (non-frozen) model may hold during a write (the version being
    written while readers still hold the old one). Placement reserves this room, so a write never
    runs out of budget; frozen models (GenRM) reserve none."""

    local_bandwidth_bytes_per_s: float = 63e9
    """Estimated bandwidth of a node-local link (host memory of the device's own node, PCIe)."""

    remote_bandwidth_bytes_per_s: float = 50e9
    """Estimated bandwidth of a remote link (another node's host memory, RDMA fabric)."""

    transfer_overhead_s: float = 20e-6
    """Fixed estimated cost of issuing one point-to-point transfer, added to bytes/bandwidth."""

    prefer_local: bool = True
    """When a slice has a holder on the receiving device's own node, use only node-local holders
    (paper App. B.1: full replication makes every Read node-local). False gives the pure
    latency-balanced greedy of App. B.2 over all holders."""

    transport: str = "shm"
    """How bytes move: `shm` (one process, `/dev/shm`-backed tensors), `ray` (one store actor per
    node, shared memory on the node, Ray object transfer across nodes), `nixl` (needs `nixl`)."""

    ray_node_resource: str = ""
    """`ray` transport only: format string of the Ray custom resource that marks GPS node `i`
    (e.g. `"gps_node_{}"`); its NodeStore actor is pinned there. Empty: GPS node `i` is the `i`-th
    alive Ray node, pinned by node affinity."""

    shm_dir: str = "/dev/shm"
    """Directory of the shared-memory files that back stored tensors (tmpfs, so pages are RAM)."""

    pool_freed_buffers: int = 1
    """`shm`/`nixl` transports: freed version buffers kept per buffer size to back the next write
    (0: give memory back at once). Reuse spares a write the page faults of fresh shared memory;
    the pooled buffer is the write headroom the budget already reserves. A buffer some zero-copy
    view still references is never pooled."""

    remote_write_bucket_bytes: int = 256 << 20
    """A trainer rank's publish sends the rows it holds for another node's buffer in calls of
    about this many bytes (one call per node when its rows fit): bounds the host copy a rank
    stages for a remote node, and the number of blocking calls. >= 1."""

    alignment_bytes: int = 64
    """Each stored tensor chunk starts at a multiple of this many bytes inside its node buffer."""

    plan_cache_size: int = 4096
    """Most read/write plans kept in the plan cache (least recently used ones are dropped)."""

    def __post_init__(self) -> None:
        if not 0 < self.node_memory_fraction <= 1:
            raise ValueError(f"gps.node_memory_fraction must be in (0, 1], got {self.node_memory_fraction}")
        if self.node_memory_budget_bytes < 0:
            raise ValueError(f"gps.node_memory_budget_bytes must be >= 0 (0: derive from the node's memory), "
                             f"got {self.node_memory_budget_bytes}")
        if self.write_headroom_versions < 0:
            raise ValueError(f"gps.write_headroom_versions must be >= 0, got {self.write_headroom_versions}")
        for name in ("local_bandwidth_bytes_per_s", "remote_bandwidth_bytes_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"gps.{name} must be > 0, got {getattr(self, name)}")
        if self.transfer_overhead_s < 0:
            raise ValueError(f"gps.transfer_overhead_s must be >= 0, got {self.transfer_overhead_s}")
        TRANSPORTS.check(self.transport)
        if self.alignment_bytes <= 0 or self.alignment_bytes & (self.alignment_bytes - 1):
            raise ValueError(f"gps.alignment_bytes must be a power of two, got {self.alignment_bytes}")
        if self.pool_freed_buffers < 0:
            raise ValueError(f"gps.pool_freed_buffers must be >= 0, got {self.pool_freed_buffers}")
        if self.remote_write_bucket_bytes < 1:
            raise ValueError(f"gps.remote_write_bucket_bytes must be >= 1, got {self.remote_write_bucket_bytes}")
        if self.plan_cache_size < 1:
            raise ValueError(f"gps.plan_cache_size must be >= 1, got {self.plan_cache_size}")
