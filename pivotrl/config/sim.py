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

import math
from dataclasses import dataclass, field

from pivotrl.config.base import check, finite

PLANNER_TABLE_BYTES = 4  # int32 entries of the planner's Alg. 1 choice table (pivotrl/core/planner.py)
# Host bytes one sample of an in-flight batch costs the simulator (its hidden lengths, sequence,
# events and ledger entries): measured 2.8 KB of peak RSS per sample of a step at staleness 2 (up
# to 4 batches alive), i.e. 0.7 KB per in-flight sample; 1 KiB leaves headroom
# (docs/benchmarks-history.md, issue 22, "Simulator memory per sample").
BATCH_SAMPLE_BYTES = 1024


#: `models.sim.phase_switch`, `models.sim.pivot_home` and `models.sim.cudagraph` values.
PHASE_SWITCHES = ("shift", "sleep")
PIVOT_HOMES = ("paper", "sweep")
CUDAGRAPH_MODES = ("full", "decode_only", "off")


@dataclass
class ModelArch:
    """Shape details of a model that its engine's costs depend on beyond `ModelSpec`'s totals (sim
    only; `models.<role>.arch`). Zeros mean "as a plain decoder": every layer has full attention
    with `hidden`-wide queries and no head is replicated."""

    kv_heads: int = 0
    """KV heads of a full-attention layer. Tensor parallelism splits heads, so at `tp > kv_heads`
    each device keeps a whole head and the KV cache is replicated `tp / kv_heads` times (vLLM and
    SGLang both do this); 0 = never replicated."""
    attention_layers: int = 0
    """Layers with full (quadratic) attention and a KV cache; 0 = all `layers`. `kv_bytes_per_token`
    counts these layers only."""
    attention_dim: int = 0
    """Query heads x head_dim of those layers (prefill's L^2 attention FLOPs); 0 = `hidden`."""
    linear_layers: int = 0
    """Linear-attention (Gated DeltaNet) layers: a fixed recurrent state per sequence instead of a KV
    cache."""
    linear_value_heads: int = 0
    """Value heads of a linear-attention layer (its kernels' unit of work; split by tensor parallelism)."""
    linear_state_bytes: float = 0.0
    """Recurrent state of one sequence over all linear layers, bytes (SSM state + convolution state,
    at the engine's state dtype): held for every running sequence."""

    def __post_init__(self) -> None:
        for name in ("kv_heads", "attention_layers", "attention_dim", "linear_layers", "linear_value_heads"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 0, name, "an int >= 0", v)
        check(finite(self.linear_state_bytes) and self.linear_state_bytes >= 0, "linear_state_bytes",
              "a finite number >= 0", self.linear_state_bytes)


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
    """Share of device memory an inference engine may use (weights + KV cache): vLLM's
    `gpu_memory_utilization` (its own default 0.9; verl's rollout config sets 0.5, which the paper
    groups use: docs/calibration_sources.md §4)."""
    cudagraph: str = "full"
    """Which engine iterations run as CUDA graphs: `full` (every iteration; its fixed cost is
    `cluster.hardware.d0`), `decode_only` (vLLM's `FULL_DECODE_ONLY`, what verl's rollout sets: an
    iteration that carries a prefill chunk runs eagerly, but its launches hide behind the chunk's
    GPU work, so it costs as `full`), or `off` (vLLM's `enforce_eager`, verl's GenRM engine: every
    decode iteration pays `layers * cluster.hardware.eager_layer_s` instead of `d0`)."""
    reward_cudagraph: str | None = None
    """`cudagraph` of the GenRM's engine; null = the rollout engine's. verl's reward model config sets
    `enforce_eager: true` (`off`): docs/calibration_sources.md §6."""
    reward_max_num_seqs: int | None = None
    """`max_num_seqs` of the GenRM's engine; null = `max_num_seqs` (verl's reward model config: 1024)."""
    kv_reserve_tokens: int = 0
    """KV tokens a scheduler keeps free on a replica when admitting a sequence (growth headroom)."""
    max_num_seqs: int = 256
    """Sequences one simulated inference replica runs at once: vLLM's `max_num_seqs` (its default,
    256; the paper does not state its setting). The scheduler admits up to this many per replica,
    so a real waiting queue forms (E)."""
    rollout_batch_barrier: bool = False
    """verl's batch-synchronous rollout (the paper's baselines and pivot run on verl): batch b+1
    is released only once every response of batch b is done, so each batch's long tail leaves
    rollout devices idle (paper Fig. 3's headroom). False = continuous streaming across batches
    within the staleness bound (docs/calibration_sources.md)."""
    reward_batch_barrier: bool = False
    """deploy=disaggregated only: the GenRM scores a batch after the batch's rollout is complete
    (verl's older `reward.compute_reward(batch)`), instead of streaming judgements as responses
    finish. Off in the paper groups: the paper's disaggregated baseline consumes each response
    "immediately" (§2), as verl's Reward Loop does on a separate pool (docs/calibration_sources.md
    §4). Pivot streams (paper Fig. 10); the phased modes already run reward after rollout."""
    phase_switch: str = "shift"
    """How the phased modes (colocated, rr_colocated) swap an inference model at a phase boundary:
    `shift` = a full shift, as our own runtime does it (engine overheads `shift_up_base_s` /
    `shift_down_s` + the weight read); `sleep` = verl's colocated engines, vLLM `sleep(level=1)`
    then `wake_up`: the engine process, its CUDA graphs and communicators stay alive, and only the
    weights move, to host memory and back over PCIe (`weight_bytes / tp / host_to_device_bw`
    each way; docs/calibration_sources.md §4). Training's shifts are unchanged."""
    memory_budget_gib: float = 2.0
    """Host memory the simulator may use for its largest table (the planner's Alg. 1 choice table,
    replicas x devices int32 entries) and for the batches alive at once (`check_batch`). A cluster
    or batch beyond it is refused at start with the most devices or samples per step it can hold
    (100,000 devices needed 2.18 GiB and failed after 51 s)."""
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

    def engine(self, reward: bool) -> tuple[str, int]:
        """(cudagraph, max_num_seqs) of the rollout engine, or with `reward` of the GenRM's."""
        if not reward:
            return self.cudagraph, self.max_num_seqs
        return (self.reward_cudagraph or self.cudagraph,
                self.reward_max_num_seqs if self.reward_max_num_seqs is not None else self.max_num_seqs)

    def max_devices(self, min_tp: int = 1) -> int:
        """Most simulated devices `memory_budget_gib` holds: the planner's table has up to
        (devices / min_tp) rows of (devices + 1) int32 entries."""
        budget = self.memory_budget_gib * 2**30 / PLANNER_TABLE_BYTES
        return int(math.isqrt(int(budget * max(min_tp, 1))))

    def check_devices(self, num_devices: int, min_tp: int = 1) -> None:
        """Refuse a simulated cluster beyond the memory budget (called by the cross-field checks)."""
        cap = self.max_devices(min_tp)
        if num_devices > cap:
            raise ValueError(
                f"cluster.num_devices={num_devices} is beyond the simulator's memory budget "
                f"(models.sim.memory_budget_gib={self.memory_budget_gib}): it can hold at most {cap} devices "
                f"with replicas of {min_tp} device(s); lower cluster.num_devices or raise the budget")

    def check_batch(self, prompts_per_step: int, group_size: int, staleness: int) -> None:
        """Refuse a simulated batch beyond the memory budget (called by the cross-field checks,
        before anything is allocated): `prompts_per_step x group_size` samples in each of the
        `staleness + 2` batches alive at once (generating ahead, plus the one training), at
        `BATCH_SAMPLE_BYTES` each (issue 22: `train.prompts_per_step=1e9` ran silent until killed,
        `train.group_size=1e8` raised MemoryError)."""
        samples = int(prompts_per_step) * int(group_size)
        need = samples * (int(staleness) + 2) * BATCH_SAMPLE_BYTES
        budget = self.memory_budget_gib * 2**30
        if need > budget:
            cap = int(budget // ((int(staleness) + 2) * BATCH_SAMPLE_BYTES))
            raise ValueError(
                f"train.prompts_per_step={prompts_per_step} x train.group_size={group_size} = {samples} samples per "
                f"step is beyond the simulator's memory budget (models.sim.memory_budget_gib={self.memory_budget_gib}): "
                f"with deploy.staleness={staleness} ({int(staleness) + 2} batches alive, about {BATCH_SAMPLE_BYTES} "
                f"bytes per sample) it needs {need / 2**30:.3g} GiB and holds at most {cap} samples per step; "
                f"lower train.prompts_per_step or train.group_size, or raise models.sim.memory_budget_gib")

    def __post_init__(self) -> None:
        # non-finite numbers are refused by the loader for every field (`pivotrl.config.loader`);
        # these are the range checks, through the one `finite` predicate (`pivotrl.config.base`)
        check(isinstance(self.max_num_seqs, int) and self.max_num_seqs >= 1, "max_num_seqs", "an int >= 1",
              self.max_num_seqs)
        check(finite(self.memory_budget_gib) and self.memory_budget_gib > 0, "memory_budget_gib",
              "a finite number > 0", self.memory_budget_gib)
        check(finite(self.mem_util) and 0.0 < self.mem_util <= 1.0, "mem_util", "in (0, 1]", self.mem_util)
        check(self.phase_switch in PHASE_SWITCHES, "phase_switch", " | ".join(PHASE_SWITCHES), self.phase_switch)
        check(self.cudagraph in CUDAGRAPH_MODES, "cudagraph", " | ".join(CUDAGRAPH_MODES), self.cudagraph)
        check(self.reward_cudagraph is None or self.reward_cudagraph in CUDAGRAPH_MODES, "reward_cudagraph",
              "null | " + " | ".join(CUDAGRAPH_MODES), self.reward_cudagraph)
        check(self.reward_max_num_seqs is None or (isinstance(self.reward_max_num_seqs, int)
                                                   and self.reward_max_num_seqs >= 1),
              "reward_max_num_seqs", "null or an int >= 1", self.reward_max_num_seqs)
        check(self.pivot_home in PIVOT_HOMES, "pivot_home", " | ".join(PIVOT_HOMES), self.pivot_home)
        check(isinstance(self.sweep_units, int) and self.sweep_units >= 2, "sweep_units", "an int >= 2",
              self.sweep_units)
        check(finite(self.throughput_sample_s) and self.throughput_sample_s >= 0, "throughput_sample_s",
              "a finite number >= 0 (0 = off)", self.throughput_sample_s)
        check(self.sweep_steps is None or (isinstance(self.sweep_steps, int) and self.sweep_steps >= 2),
              "sweep_steps", "null or an int >= 2 (one warm-up + one measured)", self.sweep_steps)
