"""Schema of the `cluster` group: which runtime runs the control plane, on how many devices.

`kind` picks the runtime (`local` Ray actors on this machine, `ray` GPUs of a Ray cluster, `sim` the
discrete-event simulator). The hardware profile is what the simulator's time model reads.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pivotrl.config.runtime import RuntimeConfig


class ClusterKind(str, enum.Enum):
    local = "local"
    ray = "ray"
    sim = "sim"


@dataclass
class HardwareProfile:
    """Accelerator and link constants (calibration.md §2-3). Each yaml value names its source."""

    name: str = "H20"
    """Accelerator name."""
    peak_flops: float = 148e12
    """Dense BF16 peak FLOP/s (spec sheet)."""
    bw_weights: float = 1.4e12
    """Effective weight-streaming bandwidth at decode, bytes/s (BW_w)."""
    bw_kv: float = 1.8e12
    """Effective KV-cache read bandwidth at decode, bytes/s (BW_kv)."""
    flops_dense: float = 110e12
    """Achieved dense GEMM FLOP/s at decode (F dense)."""
    flops_moe: float = 70e12
    """Achieved MoE grouped-GEMM FLOP/s (F MoE)."""
    d0: float = 1.4e-3
    """Fixed per-iteration overhead, seconds (D0)."""
    t_allreduce: float = 20e-6
    """One all-reduce at tp > 1, seconds."""
    hbm_bytes: float = 96e9
    """Device memory, bytes."""
    host_to_device_bw: float = 55e9
    """Pinned host-to-device bandwidth per device, bytes/s (PCIe Gen5)."""
    inter_node_bw: float = 46e9
    """Inter-node bandwidth per NIC, bytes/s (InfiniBand NDR practical)."""
    mfu: float = 0.35
    """Training model-FLOPs utilisation."""


@dataclass
class ClusterConfig:
    """The `cluster` group."""

    kind: ClusterKind = ClusterKind.sim
    """Runtime: local | ray | sim."""
    num_devices: int | None = None
    """Total devices (GPUs on ray/sim, virtual devices on local); null = the model group's `devices`."""
    node_size: int = 8
    """Devices per node."""
    hardware: HardwareProfile = field(default_factory=HardwareProfile)
    """Accelerator profile (sim time model)."""
    address: str | None = None
    """Ray cluster address for `ray` (`auto` to join a running cluster); ignored elsewhere."""
    threads_per_device: int = 1
    """CPU threads per virtual device actor (`local`)."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Engines, trainer and bootstrap settings of the real runtimes (`local`, `ray`); unused by `sim`."""

    def __post_init__(self) -> None:
        if isinstance(self.num_devices, int) and self.num_devices < 1:
            raise ValueError(f"cluster.num_devices must be >= 1 (an empty cluster cannot run), got {self.num_devices}")
        if isinstance(self.node_size, int) and self.node_size < 1:
            raise ValueError(f"cluster.node_size must be >= 1, got {self.node_size}")
