"""Time models of the simulated cluster, derived from model shapes and the hardware profile.

Owns the formulas of calibration.md §3 and §5, and nothing else:
- decode constants per replica (`tau = A*K + max(B(N), C*N) + D`), with the MoE weight floor;
- prefill `P0 + P1*L + P2*L^2`;
- KV capacity of a replica (HBM share minus weights);
- training step time from the MFU model, on any number of devices (FSDP collectives across nodes),
  and the reshard of the trainer's state through host memory (elastic training);
- shift-up/down times (weight read from host over PCIe + the paper's measured engine overheads),
  the phased modes' sleep/wake swap (weights only), training shift times, and weight publish time.

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


def decode_model(spec: ModelSpec, hw: HardwareProfile, tp: int | None = None,
                 attn_flops: float | None = None) -> ThroughputModel:
    """Decode + prefill model of one replica of `spec` on `tp` devices (calibration §3).

    A = KV_bytes_per_token / tp / BW_kv
    B = weight_bytes / tp / BW_w            (all weights; MoE: scaled by the touched share, below)
    C = 2 * P_active / tp / F               (F = MoE grouped GEMM FLOP/s for MoE models)
    D = D0 + (tp > 1) * 2 * layers * t_allreduce
    P1 = 2 * P_active / tp / F,  P2 = 2 * layers * d_model / tp / F_attn,  P0 = 0 (prefills batch)
    MoE: B(N) = B * (f + (1-f)*(1-(1-k/E)^N)) with f = 1 - moe_expert_fraction (core's form, equal
    to calibration's `(W_dense + W_experts*(1-(1-k/E)^N)) / tp / BW_w`).
    """
    tp = spec.tp if tp is None else tp
    moe = spec.moe_experts > 0 and spec.moe_topk > 0
    flops = hw.flops_moe if moe else hw.flops_dense
    f_attn = attn_flops if attn_flops else hw.flops_dense
    return ThroughputModel(
        A=spec.kv_bytes_per_token / tp / hw.bw_kv,
        B=spec.weight_bytes / tp / hw.bw_weights,
        C=2.0 * spec.params_active / tp / flops,
        D=hw.d0 + (2.0 * spec.layers * hw.t_allreduce if tp > 1 else 0.0),
        P0=0.0,
        P1=2.0 * spec.params_active / tp / flops,
        P2=2.0 * spec.layers * spec.hidden / tp / f_attn,
        moe_floor=(1.0 - spec.moe_expert_fraction) if moe else None,
        moe_k_over_e=(spec.moe_topk / spec.moe_experts) if moe else 0.0,
    )


def kv_capacity(spec: ModelSpec, hw: HardwareProfile, mem_util: float, tp: int | None = None) -> int:
    """KV-cache tokens one replica holds: `(tp*HBM*mem_util - weights) / KV_bytes_per_token`."""
    tp = spec.tp if tp is None else tp
    free = tp * hw.hbm_bytes * mem_util - spec.weight_bytes
    if free <= 0:
        raise ValueError(
            f"model {spec.name} ({spec.weight_bytes / 1e9:.1f} GB) does not fit on tp={tp} x "
            f"{hw.hbm_bytes / 1e9:.0f} GB at mem_util={mem_util}: raise models.*.tp")
    return int(free // spec.kv_bytes_per_token)


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
    return RoleCosts(
        model=decode_model(spec, hw, attn_flops=models.sim.attn_flops),
        tp=spec.tp,
        kv_capacity=kv_capacity(spec, hw, models.sim.mem_util),
        shift_up_s=shift_up_time(spec, hw),
        shift_down_s=shift_down_time(spec),
        swap_s=swap_time(spec, hw),
    )


def lognormal_mean(median: float, sigma: float) -> float:
    return median * math.exp(sigma * sigma / 2.0)
