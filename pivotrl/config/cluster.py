"""Schema of the `cluster` group: which runtime runs the control plane, on how many devices, and
how the real runtimes launch and watch those devices.

`kind` picks the runtime (`local` Ray actors on this machine, `ray` GPUs of a Ray cluster, `sim`
the discrete-event simulator). The hardware profile
is what the simulator's time model reads (`hardware.hbm_bytes` included: a real device's memory
is `device_memory_bytes` or the GPU's own); the launch settings (`poll_s` ... `gps`) are read by
the real runtimes only, and so are the time limits of every call into a device (`limits`). What runs on the devices is configured elsewhere: `engine`, `algo`, `reward`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pivotrl.config.base import check, finite
from pivotrl.config.gps import GPSConfig


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
    bw_weights: float = 1.42e12
    """Effective streaming rate of dense (non-expert) weights at decode, bytes/s (BW_w)."""
    bw_experts: float = 3.0e12
    """Streaming rate of a MoE model's routed-expert weights at decode (grouped GEMM), in bf16-equivalent
    bytes/s: the kernels move parameters at one rate whatever their storage type, so fp8 experts
    stream at half this byte rate (`pivotrl/sim/timemodel.py`)."""
    bw_kv: float = 3.0e12
    """Effective KV-cache read bandwidth of decode attention, bytes/s (BW_kv)."""
    flops_dense: float = 40e12
    """Achieved FLOP/s of a dense model's per-sequence decode work (F dense: the `C*N` term)."""
    flops_moe: float = 40e12
    """Achieved FLOP/s of a MoE model's per-sequence decode work (F MoE: the `C*N` term)."""
    flops_prefill: float = 120e12
    """Achieved FLOP/s of prefill (large, compute-bound GEMMs; bf16; fp8 models twice this)."""
    d0: float = 1.4e-3
    """Fixed per-iteration overhead of a CUDA-graph iteration, seconds (D0)."""
    eager_layer_s: float = 0.2e-3
    """Per layer of a decode iteration run without CUDA graphs (`models.sim.cudagraph=off`): the
    kernel launches from Python that a graph replays in one go, seconds; `layers * eager_layer_s`
    replaces D0 for such an iteration."""
    t_moe_layer: float = 50e-6
    """Per MoE layer and iteration: the routing kernels' floor (gating, top-k, token permutation and
    its reverse), seconds; independent of the batch."""
    linear_decode_s: float = 0.296e-6
    """Linear-attention (Gated DeltaNet) decode: state update per sequence, per value head on the
    device, per linear layer, seconds (a fixed-size recurrent state, read and written each step)."""
    linear_prefill_s: float = 0.0334e-6
    """Linear-attention (Gated DeltaNet) chunked prefill per token, per value head on the device, per
    linear layer, seconds."""
    t_allreduce: float = 20e-6
    """One all-reduce at tp > 1, seconds."""
    hbm_bytes: float = 96e9
    """Device memory of the simulated accelerator, bytes (the simulator's KV and weight model only;
    the real runtimes' device memory is `cluster.device_memory_bytes` or the GPU's own)."""
    host_to_device_bw: float = 55e9
    """Pinned host-to-device bandwidth per device, bytes/s (PCIe Gen5)."""
    inter_node_bw: float = 46e9
    """Inter-node bandwidth per NIC, bytes/s (InfiniBand NDR practical)."""
    mfu: float = 0.35
    """Training model-FLOPs utilisation."""

    def __post_init__(self) -> None:
        for name in ("peak_flops", "bw_weights", "bw_experts", "bw_kv", "flops_dense", "flops_moe", "flops_prefill",
                     "d0", "eager_layer_s", "t_allreduce", "hbm_bytes", "host_to_device_bw", "inter_node_bw", "mfu"):
            v = getattr(self, name)
            check(finite(v) and v > 0, name, "a finite number > 0", v)
        for name in ("t_moe_layer", "linear_decode_s", "linear_prefill_s"):
            v = getattr(self, name)
            check(finite(v) and v >= 0, name, "a finite number >= 0", v)
        check(self.mfu <= 1, "mfu", "in (0, 1]", self.mfu)


@dataclass
class LimitsConfig:
    """Time limits of the real runtimes' calls into their devices (`runtime/limits.py` applies
    them), so that no call waits forever: a stuck engine RPC (sleep, wake, `collective_rpc`, a
    load) or collective holds up the device call around it, and that call's limit ends it. An
    inference device past its limit is a device failure (replaced; its sequences go back to the
    queue with their reported tokens); a training call past its limit stops the run naming the
    phase, the devices, the elapsed time and the key to raise. A call that moves weights scales
    with its model: `<phase>_floor_s + <phase>_s_per_gb x GB of the model's weights` (the policy
    for rollout and training, the GenRM for reward)."""

    call_s: float = 120.0
    """A call that moves no weights: submit, abort, a poll's reply, a device's info, the node check
    at start and a validation's calls."""
    shift_floor_s: float = 600.0
    """One device's half of a shift (down or up), the cold first start included (an engine process
    starting, CUDA graphs captured, a trainer rank built): at least this many seconds ..."""
    shift_s_per_gb: float = 30.0
    """... plus this many per GB of the role's model."""
    load_floor_s: float = 120.0
    """A weight load into a serving engine (a publish), and the trainer's ranks writing a new
    version into GPS: at least this many seconds ..."""
    load_s_per_gb: float = 10.0
    """... plus this many per GB of the model."""
    train_floor_s: float = 900.0
    """A training step (and a checkpoint's staging or wait): at least this many seconds ..."""
    train_s_per_gb: float = 60.0
    """... plus this many per GB of the policy."""

    def __post_init__(self) -> None:
        for name in ("call_s", "shift_floor_s", "load_floor_s", "train_floor_s"):
            v = getattr(self, name)
            check(finite(v) and v > 0, name, "a finite number of seconds > 0", v)
        for name in ("shift_s_per_gb", "load_s_per_gb", "train_s_per_gb"):
            v = getattr(self, name)
            check(finite(v) and v >= 0, name, "a finite number of seconds per GB >= 0", v)


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
    """Ray to run on: `host:port` of a running head (joined within `connect_timeout_s`), or `local`
    (a private head of this run: its own temp dir and port, stopped at the end). null: `local` on
    `cluster=local`; `cluster=ray` then asks for an address. `auto` is refused: it can attach to
    another user's Ray on the same machine."""
    connect_timeout_s: float = 30.0
    """Real runtimes: seconds to wait for the Ray head at `address` before failing with how to
    start one."""
    max_respawns: int = 3
    """Real runtimes: a device whose actor dies more than this many times within
    `respawn_window_s` leaves the pool for good (a crash loop); its sequences go back to the queue
    and the run goes on with fewer devices, or stops naming the role that can no longer run."""
    respawn_window_s: float = 600.0
    """Real runtimes: the window (seconds) over which `max_respawns` counts a device's deaths."""
    keep_devices: bool = False
    """Real runtimes: after a run, keep its Ray session, placement groups and device actors for
    this process's next run with the same cluster settings (a Hydra multirun sweep, a test module),
    which then starts no device process (each one that imports torch and the model libraries cost
    about 8 CPU-seconds on the 2-core CPU machine). Between runs each actor closes its roles; one
    that died is replaced as in a run. A run with other cluster settings releases them first, and
    `pivotrl.runtime.cluster.release_kept_clusters()` (or the process's end) releases them."""
    accelerator: str | None = None
    """What a device is on the real runtimes: `cpu` (gloo, CPU engines) or `cuda` (NCCL, GPUs);
    null = cpu on `local`, cuda on `ray`."""
    threads_per_device: int = 1
    """CPU threads per virtual device actor (`local`)."""
    devices_per_gpu: int = 1
    """`ray`: devices that share one GPU, each actor taking that fraction of it (1: a GPU per
    device). > 1 lets one GPU hold a run that needs a device per role (the device check's pivot
    run on one H200); their shifts then run one device at a time, so that no two vLLM engines start
    on the GPU at once, and each engine's `engine.vllm_gpu_memory_utilization` must leave room for
    the others."""
    device_memory_bytes: float | None = None
    """Real runtimes on GPUs (`accelerator=cuda`): memory of one device in bytes, for the check at
    start that a training rank fits its home devices (`pivotrl.runtime.assets.check_trainer_fits`).
    null: the GPU's own (`torch.cuda.get_device_properties(0).total_memory`) when the driver sees
    one, else that check is skipped with a warning naming this key. Never `hardware.hbm_bytes`,
    which is the simulated accelerator's. CPU devices share host memory: not checked."""
    poll_s: float = 0.05
    """Real runtimes: longest a device poll waits for a completion before returning its progress."""
    fit_every_s: float = 5.0
    """Real runtimes: refit each role's throughput model from engine samples this often (seconds)."""
    tau_shift_prior_s: float = 1.0
    """Real runtimes: `tau_shift` (seconds, up + down) before any shift was measured."""
    max_wall_s: float | None = None
    """Real runtimes: stop with an error after this many seconds; null = no wall limit (a run with
    no work in flight stops with a stall error anyway)."""
    gps: GPSConfig = field(default_factory=GPSConfig)
    """Global Parameter Storage: memory budget, links, transport (real runtimes)."""
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    """Time limits of every call into a device (real runtimes)."""

    def __post_init__(self) -> None:
        check(self.num_devices is None or (isinstance(self.num_devices, int) and self.num_devices >= 1),
              "num_devices", "null or an int >= 1 (an empty cluster cannot run)", self.num_devices)
        check(isinstance(self.node_size, int) and self.node_size >= 1, "node_size", "an int >= 1", self.node_size)
        check(self.accelerator in (None, "cpu", "cuda"), "accelerator", "null, cpu or cuda", self.accelerator)
        check(isinstance(self.threads_per_device, int) and self.threads_per_device >= 1, "threads_per_device",
              "an int >= 1", self.threads_per_device)
        check(isinstance(self.devices_per_gpu, int) and not isinstance(self.devices_per_gpu, bool)
              and (self.devices_per_gpu == 1 or (self.devices_per_gpu > 1 and self.kind == ClusterKind.ray)),
              "devices_per_gpu", "1, or an int > 1 with cluster=ray (devices sharing one GPU)", self.devices_per_gpu)
        check(self.device_memory_bytes is None or (finite(self.device_memory_bytes) and self.device_memory_bytes > 0),
              "device_memory_bytes", "null (the GPU's own) or a finite number of bytes > 0", self.device_memory_bytes)
        for name in ("poll_s", "fit_every_s"):
            check(finite(getattr(self, name)) and getattr(self, name) > 0, name, "a finite number > 0",
                  getattr(self, name))
        check(finite(self.tau_shift_prior_s) and self.tau_shift_prior_s >= 0, "tau_shift_prior_s",
              "a finite number >= 0", self.tau_shift_prior_s)
        check(self.address is None or (isinstance(self.address, str) and self.address.strip() != ""
                                        and self.address != "auto"), "address",
              "null, `local` (a private Ray head for this run) or `host:port` of a running head "
              "(`auto` could attach to another user's Ray on this machine)", self.address)
        check(finite(self.connect_timeout_s) and self.connect_timeout_s > 0, "connect_timeout_s",
              "a finite number > 0", self.connect_timeout_s)
        check(isinstance(self.max_respawns, int) and not isinstance(self.max_respawns, bool)
              and self.max_respawns >= 0, "max_respawns", "an int >= 0", self.max_respawns)
        check(finite(self.respawn_window_s) and self.respawn_window_s > 0, "respawn_window_s",
              "a finite number > 0", self.respawn_window_s)
        check(self.max_wall_s is None or (finite(self.max_wall_s) and self.max_wall_s > 0), "max_wall_s",
              "null or a finite number > 0", self.max_wall_s)
