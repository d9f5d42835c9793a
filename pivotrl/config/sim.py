"""`SimConfig`: simulator-only settings of one model group (nested as `models.sim`).

Owns the constants the discrete-event simulator (`pivotrl/sim`) needs beyond the model shapes and the
hardware profile: the simulated batch, engine memory use, training and weight-publish cost models,
the workload window, the allocation sweep, and the paper's Table 4 allocations (reported beside the
swept best). Every value in `conf/models/*.yaml` names its source (calibration.md or an estimate E).
Knows nothing about Hydra or the simulator itself.

The batch is `train.prompts_per_step` x `train.group_size` in every runtime (the paper model
groups select `conf/train/paper.yaml`, whose docstring says where its 256 x 8 comes from).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PaperAllocation:
    """Paper Table 4 (App. E): the authors' tuned baseline allocations, in devices."""

    disaggregated: list[int] = field(default_factory=list)
    """[rollout, reward, train] devices for deploy=disaggregated; empty = unknown."""
    rr_colocated: list[int] = field(default_factory=list)
    """[shared rollout+reward pool, train] devices for deploy=rr_colocated; empty = unknown."""
    pivot_train: int = 0
    """Training home set size for deploy=pivot (training is 0 or this many devices)."""


@dataclass
class SimConfig:
    """Simulator settings of a model group."""

    mem_util: float = 0.9
    """Share of device memory an inference engine may use (weights + KV cache); vLLM's default
    `gpu_memory_utilization` (E)."""
    kv_reserve_tokens: int = 0
    """KV tokens a scheduler keeps free on a replica when admitting a sequence (growth headroom)."""
    train_recompute_factor: float = 1.33
    """k in `k*6*P*tokens/(gpus*peak*MFU) + T_fixed` (calibration §5, D/E)."""
    train_fixed_s: float = 7.5
    """T_fixed seconds per training step (calibration §5: 5-10 s, E)."""
    publish_base_s: float = 1.0
    """Weight publish `base + bytes/bw` (calibration §5, checkpoint-engine, D)."""
    publish_bw: float = 60e9
    """Weight publish bandwidth, bytes/s (calibration §5, D)."""
    attn_flops: float | None = None
    """FLOP/s of prefill attention (the L^2 term); null = the hardware's dense FLOP/s (E)."""
    step_offset: int = 0
    """RL step at which the simulated window starts: response lengths grow with the step (E)."""
    sweep_units: int = 8
    """Baseline sweep granularity: the cluster is cut into this many equal units (each a multiple of
    the largest replica size), and every split into whole units is tried."""
    sweep_steps: int | None = None
    """RL steps per sweep run (warm-up included); null = `train.steps`. Keep it >= staleness + 3:
    shorter runs measure only batches generated during the warm-up and favour tiny inference pools."""
    pivot_home: str = "paper"
    """Training home set of deploy=pivot when `deploy.allocation.train` is null: `paper` (Table 4's
    training allocation) or `sweep` (the best on the sweep grid, as the baselines get)."""
    throughput_sample_s: float = 5.0
    """Simulated seconds between `throughput` timeline records (every mode, for Fig. 10): the
    planner-visible modelled throughput per role, Eq. 1, tokens actually produced in the interval
    and the allocation. 0 turns them off."""
    max_sim_time_s: float = 1e6
    """Simulated-seconds safety cap: a run that would exceed it fails with an error (a stuck mode)."""
    paper_allocation: PaperAllocation = field(default_factory=PaperAllocation)
    """Paper Table 4 allocations (reported beside the swept best)."""

    def __post_init__(self) -> None:
        if isinstance(self.mem_util, float) and not 0.0 < self.mem_util <= 1.0:
            raise ValueError(f"models.sim.mem_util must be in (0, 1], got {self.mem_util}")
        if self.pivot_home not in ("paper", "sweep"):
            raise ValueError(f"models.sim.pivot_home must be 'paper' or 'sweep', got {self.pivot_home!r}")
        if isinstance(self.sweep_units, int) and self.sweep_units < 2:
            raise ValueError(f"models.sim.sweep_units must be >= 2, got {self.sweep_units}")
        if isinstance(self.throughput_sample_s, (int, float)) and self.throughput_sample_s < 0:
            raise ValueError(f"models.sim.throughput_sample_s must be >= 0 (0 = off), got {self.throughput_sample_s}")
        if self.sweep_steps is not None and isinstance(self.sweep_steps, int) and self.sweep_steps < 2:
            raise ValueError(f"models.sim.sweep_steps must be >= 2 (one warm-up + one measured), got {self.sweep_steps}")
