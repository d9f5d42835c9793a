"""Time models of the simulated cluster, derived from model shapes and the hardware profile.

Owns the formulas of calibration.md §3, §5 and §7, and nothing else:
- decode constants per replica (`tau = A*K + max(B(N), C*N) + D`), with the MoE weight floor, the
  KV heads replicated beyond `kv_heads` devices, the MoE routing floor per layer, hybrid models'
  linear-attention state updates, and the engine's CUDA-graph mode;
- prefill `P0 + P1*L + P2*L^2`;
- KV capacity of a replica (HBM share minus weights) and a hybrid model's per-sequence state in KV tokens;
- training step time from the MFU model, on any number of devices (FSDP collectives across nodes),
  and the reshard of the trainer's state through host memory (elastic training);
- shift-up/down times (weight read from host over PCIe + the paper's measured engine overheads),
  the phased modes' sleep/wake swap (weights only), training shift times, and weight publish time.

This model is held to published H20 serving measurements (calibration §7, rows V1-V7) by
`python -m artifact.calibrate.engines`, which runs these very functions on each row's workload.

The decode clock itself is core's `ThroughputModel` (`decode_time`, `iter_time`): the simulator and
the control plane share one formula, and this module only fills in its constants. Every constant
comes from the config (`conf/models/*.yaml`, `conf/cluster/sim.yaml`), each naming its source.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pivotrl.config.cluster import HardwareProfile
from pivotrl.config.models import ModelSpec, ModelsConfig
from pivotrl.config.sim import SimConfig
from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.training_time import TrainTimeModel
from pivotrl.core.types import Role


FP8_SPEEDUP = 2.0  # Hopper's fp8 dense peak is twice its bf16 one (H20: 296 vs 148 TFLOPS, spec sheet)


def kv_replication(spec: ModelSpec, tp: int) -> float:
    """How many times a replica of `tp` devices stores each KV head: tensor parallelism splits heads,
    so beyond `kv_heads` devices every device keeps one whole head (vLLM, SGLang)."""
    kv_heads = spec.arch.kv_heads
    return max(1.0, tp / kv_heads) if kv_heads else 1.0


def decode_model(spec: ModelSpec, hw: HardwareProfile, tp: int | None = None,
                 attn_flops: float | None = None, cudagraph: str = "full",
                 attention_dp: bool = False) -> ThroughputModel:
    """Decode + prefill model of one replica of `spec` on `tp` devices (calibration §3, §7).

    A = KV_bytes_per_token * rep / tp / BW_kv      (rep: KV heads replicated at tp > kv_heads)
    B = W_dense / tp / BW_w + W_experts_bf16 / tp / BW_experts, the experts' share scaled by the
        touched fraction `1 - (1 - k/E)^N` (core's MoE floor form, `moe_floor` = the dense share
        of B); experts stream at one parameter rate whatever their storage type
    C = 2 * P_active / tp / F_decode + linear_layers * value_heads / tp * t_linear_decode
    D = D0 (cudagraph=off: layers * t_eager_layer) + moe_layers * t_moe_layer + (tp > 1) * 2 * layers * t_allreduce
    P1 = 2 * P_active / tp / F_prefill + linear_layers * value_heads / tp * t_linear_prefill
         (prefill chunks are GPU-bound: an eager chunk's launches hide behind its work)
    P2 = 2 * attention_layers * attention_dim / tp / F_attn,  P0 = 0 (prefills batch)

    fp8 weights (`dtype_bytes` 1) compute at twice the bf16 FLOP/s. `attention_dp`: data-parallel
    attention with expert parallelism across the `tp` devices (SGLang's DP-attention): the dense
    weights are replicated on every device instead of split, everything else is as with TP.
    """
    tp = spec.tp if tp is None else tp
    arch = spec.arch
    moe = spec.moe_experts > 0 and spec.moe_topk > 0
    speed = FP8_SPEEDUP if spec.dtype_bytes == 1 else 1.0
    f_decode = (hw.flops_moe if moe else hw.flops_dense) * speed
    f_prefill = hw.flops_prefill * speed
    f_attn = (attn_flops if attn_flops else hw.flops_prefill) * speed
    expert_share = spec.moe_expert_fraction if moe else 0.0
    dense_bytes = spec.weight_bytes * (1.0 - expert_share) / (1 if attention_dp else tp)
    b_dense = dense_bytes / hw.bw_weights
    b_experts = float(spec.params_total) * expert_share * 2.0 / tp / hw.bw_experts
    linear_heads = arch.linear_layers * arch.linear_value_heads / tp
    # an eager decode iteration pays its launches from Python (`layers * eager_layer_s`) instead of
    # a graph replay's D0: the GPU work of a decode step is too small to hide them
    d0 = spec.layers * hw.eager_layer_s if cudagraph == "off" else hw.d0
    b = b_dense + b_experts
    return ThroughputModel(
        A=spec.kv_bytes_per_token * kv_replication(spec, tp) / tp / hw.bw_kv,
        B=b,
        C=2.0 * spec.params_active / tp / f_decode + linear_heads * hw.linear_decode_s,
        D=d0 + (spec.layers * hw.t_moe_layer if moe else 0.0)
        + (2.0 * spec.layers * hw.t_allreduce if tp > 1 else 0.0),
        P0=0.0,
        P1=2.0 * spec.params_active / tp / f_prefill + linear_heads * hw.linear_prefill_s,
        P2=2.0 * (arch.attention_layers or spec.layers) * (arch.attention_dim or spec.hidden) / tp / f_attn,
        moe_floor=(b_dense / b) if moe else None,
        moe_k_over_e=(spec.moe_topk / spec.moe_experts) if moe else 0.0,
    )


def kv_capacity(spec: ModelSpec, hw: HardwareProfile, mem_util: float, tp: int | None = None) -> int:
    """KV-cache tokens one replica holds: `(tp*HBM*mem_util - weights) / (KV_bytes_per_token * rep)`:
    replicated KV heads (`kv_replication`) take their space."""
    tp = spec.tp if tp is None else tp
    free = tp * hw.hbm_bytes * mem_util - spec.weight_bytes
    if free <= 0:
        raise ValueError(
            f"model {spec.name} ({spec.weight_bytes / 1e9:.1f} GB) does not fit on tp={tp} x "
            f"{hw.hbm_bytes / 1e9:.0f} GB at mem_util={mem_util}: raise models.*.tp")
    return int(free // (spec.kv_bytes_per_token * kv_replication(spec, tp)))


def state_tokens(spec: ModelSpec, tp: int | None = None) -> int:
    """A hybrid model's per-sequence recurrent state in KV tokens of the same replica (vLLM pages the
    state from the KV pool): `linear_state_bytes / (KV_bytes_per_token * rep)`, 0 for other models."""
    tp = spec.tp if tp is None else tp
    if spec.arch.linear_state_bytes <= 0:
        return 0
    return math.ceil(spec.arch.linear_state_bytes / (spec.kv_bytes_per_token * kv_replication(spec, tp)))


def training_model(policy: ModelSpec, hw: HardwareProfile, sim: SimConfig, node_size: int,
                   updates: int = 1) -> TrainTimeModel:
    """Seconds of a training step on W devices (calibration §5's MFU model plus FSDP collectives),
    as core's `TrainTimeModel`, the form the planner prices elastic training with:

        t(W, tokens) = T_fixed + k * 6 * P * tokens / (W * peak * MFU)
                       + (W > node_size) * (W - 1) / W * bytes_per_step / inter_node_bw

    `T_fixed` does not shrink with W (the scaling loss within a node; calibration §5 brackets it).
    Collectives within a node are taken as hidden behind the compute (FSDP2 prefetches the next
    layer's all-gather while this one computes; the MFU fitted at one node's training already
    holds what is not): none declared, none charged. Across nodes a ring all-gather or
    reduce-scatter moves `(W-1)/W` of its bytes over each device's inter-node link (calibration §2,
    IB NDR practical), charged in full (no overlap, a conservative choice): per optimizer update
    one bf16 all-gather of the parameters (`2P` bytes, held through the update's micro-batches)
    and one fp32 reduce-scatter of the gradients (`4P`), plus one bf16 all-gather for the step's
    log-prob pass: `bytes_per_step = (6 * updates + 2) * P` (E: the schedule, not measured)."""
    return TrainTimeModel(
        fixed_s=sim.train_fixed_s,
        token_s=sim.train_recompute_factor * 6.0 * policy.params_total / (hw.peak_flops * hw.mfu),
        comm_s=0.0,
        cross_node_s=(6.0 * updates + 2.0) * policy.params_total / hw.inter_node_bw,
        node_size=int(node_size))


def training_time(policy: ModelSpec, hw: HardwareProfile, sim: SimConfig, tokens: int, gpus: int,
                  node_size: int = 0, updates: int = 1) -> float:
    """Seconds of a training step over `tokens` on `gpus` devices (`training_model`)."""
    if gpus < 1:
        raise ValueError(f"training needs >= 1 device, got {gpus}")
    return training_model(policy, hw, sim, node_size, updates).seconds(gpus, tokens)


def training_work(policy: ModelSpec, hw: HardwareProfile, sim: SimConfig, tokens: int) -> float:
    """Device-seconds of training compute for `tokens` (no fixed overhead): the ideal bound's W_train."""
    return sim.train_recompute_factor * 6.0 * policy.params_total * tokens / (hw.peak_flops * hw.mfu)


#: Bytes of trainer state per parameter kept in host memory between steps (elastic training): fp32
#: master weights and AdamW's two fp32 moments (pivotrl/trainer/state_store.py stores the same).
TRAIN_STATE_BYTES_PER_PARAM = 12


def reshard_time(policy: ModelSpec, hw: HardwareProfile, world: int, node_size: int) -> float:
    """Seconds to move the trainer's state from its home layout to `world` devices and back through
    host memory (elastic training): every rank reads its `1/world` share of the state and writes
    it back after the step, all ranks at once, each over its own link: PCIe host-to-device within
    the home node, the inter-node link once the trainer spans nodes (calibration §2)."""
    state = TRAIN_STATE_BYTES_PER_PARAM * policy.params_total
    bw = hw.inter_node_bw if 0 < node_size < world else hw.host_to_device_bw
    return 2.0 * state / world / bw


def shift_up_time(spec: ModelSpec, hw: HardwareProfile, tp: int | None = None) -> float:
    """Inference shift up: read this replica's weight shard from host memory over PCIe, plus the
    paper-measured engine overhead (`shift_up_base_s`, calibration §1)."""
    tp = spec.tp if tp is None else tp
    return spec.shift_up_base_s + spec.weight_bytes / tp / hw.host_to_device_bw


def swap_time(spec: ModelSpec, hw: HardwareProfile, tp: int | None = None) -> float:
    """One direction of a vLLM sleep/wake swap (verl's colocated engines, `models.sim.phase_switch:
    sleep`): `sleep(level=1)` copies this replica's weight shard to host memory and `wake_up`
    copies it back, each `weight_bytes / tp / host_to_device_bw`; the engine, its CUDA graphs and
    communicators stay alive, so no engine overhead is paid (the KV cache is only re-mapped)."""
    tp = spec.tp if tp is None else tp
    return spec.weight_bytes / tp / hw.host_to_device_bw


def shift_down_time(spec: ModelSpec) -> float:
    """Inference shift down: discard weights and KV (paper Fig. 12: under 2 s)."""
    return spec.shift_down_s


def publish_time(policy: ModelSpec, sim: SimConfig) -> float:
    """Publishing new policy weights to inference engines: `base + bytes / bw` (calibration §5)."""
    return sim.publish_base_s + policy.weight_bytes / sim.publish_bw


@dataclass(frozen=True)
class RoleCosts:
    """Everything a runtime needs to time one inference role."""

    model: ThroughputModel
    tp: int
    kv_capacity: int
    shift_up_s: float
    shift_down_s: float
    swap_s: float = 0.0
    """One direction of a sleep/wake swap (`swap_time`), for the phased modes' `phase_switch: sleep`."""
    max_num_seqs: int | None = None
    """Sequences one replica runs at once (its engine's `max_num_seqs`); None = no cap."""
    seq_tokens: int = 0
    """A running sequence's fixed linear-attention state, in KV tokens (`state_tokens`)."""

    def peak_per_device(self, context: float) -> float:
        """Best tokens/s per device: the max over N (within KV capacity) of T(N, N*context)/tp,
        where `context` is the mean KV length of a running sequence."""
        context = max(context, 1.0)
        n_max = max(1, int(self.kv_capacity // context))
        # T(N) = N/(A*N*ctx + max(B(N), C*N) + D) rises with N: its max is at n_max, except where
        # the MoE floor grows faster; scan a geometric grid to be safe.
        best, n = 0.0, 1
        while True:
            best = max(best, self.model.throughput(n, int(n * context)))
            if n >= n_max:
                break
            n = min(n_max, max(n + 1, int(n * 1.25)))
        return best / self.tp


def role_costs(models: ModelsConfig, hw: HardwareProfile, role: Role) -> RoleCosts:
    """Costs of the rollout (policy) or reward (GenRM) role."""
    if role == Role.ROLLOUT:
        spec = models.policy
    elif role == Role.REWARD:
        spec = models.genrm
    else:
        raise ValueError(f"role_costs is for inference roles (rollout, reward), got {role}")
    sim = models.sim
    cudagraph, max_num_seqs = sim.engine(reward=role == Role.REWARD)
    return RoleCosts(
        model=decode_model(spec, hw, attn_flops=sim.attn_flops, cudagraph=cudagraph),
        tp=spec.tp,
        kv_capacity=kv_capacity(spec, hw, sim.mem_util),
        max_num_seqs=max_num_seqs,
        seq_tokens=state_tokens(spec),
        shift_up_s=shift_up_time(spec, hw),
        shift_down_s=shift_down_time(spec),
        swap_s=swap_time(spec, hw),
    )


def lognormal_mean(median: float, sigma: float) -> float:
    return median * math.exp(sigma * sigma / 2.0)
