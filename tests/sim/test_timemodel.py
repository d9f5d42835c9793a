"""Time-model formulas against calibration.md §3/§5 table values."""
from __future__ import annotations

import dataclasses
import math

import pytest

from pivotrl.config.cluster import HardwareProfile
from pivotrl.core.types import Role
from pivotrl.sim import timemodel as tm

HW = HardwareProfile()  # the H20 profile's defaults (calibration §2, §3, §7)
# calibration.md §3's table was computed with its "measured-H20" column: one weight-streaming rate for
# dense and expert weights, BW_kv 1.8 TB/s, no routing floor
HW3 = HardwareProfile(bw_weights=1.4e12, bw_experts=1.4e12, bw_kv=1.8e12, flops_dense=110e12, flops_moe=70e12,
                      flops_prefill=110e12, t_moe_layer=0.0)


def _spec(cfg, role):
    return cfg.models.policy if role == "policy" else cfg.models.genrm


@pytest.mark.parametrize("group,role,A_us,B_ms,C_ms", [
    ("qwen7b_qwen30b", "policy", 0.032, 10.9, 0.139),    # Qwen2.5-7B tp1
    ("qwen1.5b_glm9b", "policy", 0.016, 2.2, 0.028),     # Qwen2.5-1.5B tp1
    ("qwen1.5b_glm9b", "genrm", 0.023, 13.4, 0.171),     # GLM-Z1-9B tp1
])
def test_dense_decode_constants_match_calibration(make_cfg, group, role, A_us, B_ms, C_ms):
    m = tm.decode_model(_spec(make_cfg(f"models={group}"), role), HW3)
    assert m.A * 1e6 == pytest.approx(A_us, rel=0.03)
    assert m.B * 1e3 == pytest.approx(B_ms, rel=0.03)
    assert m.C * 1e3 == pytest.approx(C_ms, rel=0.03)
    assert m.D == pytest.approx(HW3.d0)  # tp1: no all-reduce


def test_moe_floor_rises_with_batch_as_calibrated(make_cfg):
    spec = make_cfg("models=qwen7b_qwen30b").models.genrm  # Qwen3-30B-A3B
    m = tm.decode_model(spec, HW3, tp=1)
    assert m.A * 1e6 == pytest.approx(0.055, rel=0.03)
    assert m.C * 1e3 == pytest.approx(0.094, rel=0.03)
    assert m.floor(1) * 1e3 == pytest.approx(4.7, rel=0.05)
    assert m.floor(128) * 1e3 == pytest.approx(43.6, rel=0.03)
    assert m.floor(1) < m.floor(8) < m.floor(64)


def test_tensor_parallel_divides_and_adds_allreduce(make_cfg):
    spec = make_cfg("models=qwen7b_qwen30b").models.genrm
    m1, m4 = tm.decode_model(spec, HW, tp=1), tm.decode_model(spec, HW, tp=4)
    assert m4.A == pytest.approx(m1.A / 4) and m4.B == pytest.approx(m1.B / 4)
    routing = spec.layers * HW.t_moe_layer  # a MoE model pays its routing floor per layer at any tp
    assert m1.D == pytest.approx(HW.d0 + routing)
    assert m4.D == pytest.approx(HW.d0 + routing + 2 * spec.layers * HW.t_allreduce)


def test_prefill_of_17k_tokens_on_glm9b_is_seconds(make_cfg):
    # calibration §3: "about 2.9 s for 17K tokens on GLM-Z1-9B" (at 110 TFLOPS); P2 adds attention
    m = tm.decode_model(make_cfg("models=qwen1.5b_glm9b").models.genrm, HW3)
    assert 2.5 < m.prefill_time(17_000) < 4.5
    assert m.P1 * 17_000 == pytest.approx(2.9, rel=0.05)
    assert tm.decode_model(make_cfg("models=qwen1.5b_glm9b").models.genrm, HW).P1 == pytest.approx(
        2 * 9.4e9 / HW.flops_prefill)  # prefill runs at the compute-bound rate, not the decode one


def test_kv_capacity_is_hbm_minus_weights(make_cfg):
    spec = make_cfg("models=qwen7b_qwen30b").models.policy
    cap = tm.kv_capacity(spec, HW, 0.9)
    assert cap == int((96e9 * 0.9 - 7.6e9 * 2) // 57344)
    with pytest.raises(ValueError, match="does not fit"):
        tm.kv_capacity(make_cfg("models=qwen72b_qwen122b").models.policy, HW, 0.9, tp=1)


def test_training_time_mfu_model(make_cfg):
    cfg = make_cfg("models=qwen7b_qwen30b")
    t = tm.training_time(cfg.models.policy, HW, cfg.models.sim, tokens=1_000_000, gpus=8)
    expect = 1.33 * 6 * 7.6e9 * 1e6 / (8 * 148e12 * 0.35) + cfg.models.sim.train_fixed_s
    assert t == pytest.approx(expect)
    assert tm.training_time(cfg.models.policy, HW, cfg.models.sim, 1_000_000, 16) < t


def test_training_on_more_devices_pays_collectives_across_nodes_and_a_reshard(make_cfg):
    """Elastic training's physics: FSDP collectives only once the trainer spans nodes, at the
    inter-node bandwidth (charged in full), and the state's trip through host memory."""
    cfg = make_cfg("models=qwen7b_qwen30b")
    pol, sim = cfg.models.policy, cfg.models.sim
    m = tm.training_model(pol, HW, sim, node_size=8, updates=2)
    assert m.cross_node_s == pytest.approx((6 * 2 + 2) * pol.params_total / HW.inter_node_bw)
    one_node = tm.training_time(pol, HW, sim, 1_000_000, 8, node_size=8, updates=2)
    assert one_node == pytest.approx(tm.training_time(pol, HW, sim, 1_000_000, 8))  # as before within a node
    sixteen = tm.training_time(pol, HW, sim, 1_000_000, 16, node_size=8, updates=2)
    assert sixteen == pytest.approx((one_node - sim.train_fixed_s) / 2 + sim.train_fixed_s + m.cross_node_s * 15 / 16)
    state = tm.TRAIN_STATE_BYTES_PER_PARAM * pol.params_total
    assert tm.reshard_time(pol, HW, 8, 8) == pytest.approx(2 * state / 8 / HW.host_to_device_bw)
    assert tm.reshard_time(pol, HW, 16, 8) == pytest.approx(2 * state / 16 / HW.inter_node_bw)


def test_shift_times_within_paper_measurements(make_cfg):
    small = make_cfg("models=qwen1.5b_glm9b").models.policy
    big = make_cfg("models=qwen72b_qwen122b").models.genrm
    assert 0.5 < tm.shift_up_time(small, HW) < 1.5        # paper Fig. 12: ~1 s for 1.5B
    assert 8.0 < tm.shift_up_time(big, HW) < 10.0         # ~9 s for 122B-A10B
    assert tm.shift_down_time(big) <= 2.0                  # shift down under 2 s
    pol = make_cfg("models=qwen7b_qwen30b").models
    assert tm.publish_time(pol.policy, pol.sim) == pytest.approx(1.0 + 15.2e9 / 60e9)


def test_peak_per_device_is_the_best_batch(make_cfg):
    costs = tm.role_costs(make_cfg("models=qwen7b_qwen30b").models, HW, Role.ROLLOUT)
    peak = costs.peak_per_device(1000.0)
    assert peak >= costs.model.throughput(64, 64_000) / costs.tp
    assert peak >= costs.model.throughput(256, 256_000) / costs.tp


def test_kv_heads_are_replicated_beyond_their_count(make_cfg):
    """Qwen3.5-122B-A10B has 2 KV heads: at TP 8 every device keeps one, so the replica stores its
    KV 4 times (per-device KV of a token is half the model's, not an eighth)."""
    spec = make_cfg("models=qwen72b_qwen122b").models.genrm
    assert tm.kv_replication(spec, 8) == 4.0 and tm.kv_replication(spec, 2) == 1.0
    m8, m2 = tm.decode_model(spec, HW, tp=8), tm.decode_model(spec, HW, tp=2)
    assert m8.A == pytest.approx(24576 / 2 / HW.bw_kv) and m2.A == pytest.approx(24576 / 2 / HW.bw_kv)
    dense = make_cfg("models=qwen72b_qwen122b").models.policy  # 8 KV heads at TP 8: no replication
    assert tm.decode_model(dense, HW).A == pytest.approx(dense.kv_bytes_per_token / 8 / HW.bw_kv)


def test_hybrid_linear_attention_costs_per_sequence_and_holds_state(make_cfg):
    """Gated DeltaNet layers: a per-sequence state update at decode (in C), a per-token chunk cost at
    prefill (in P1), only the full-attention layers in P2, and a state set aside per sequence."""
    spec = make_cfg("models=qwen72b_qwen122b").models.genrm
    m = tm.decode_model(spec, HW)
    heads = 36 * 64 / 8
    assert m.C == pytest.approx(2 * 10e9 / 8 / HW.flops_moe + heads * HW.linear_decode_s)
    assert m.P1 == pytest.approx(2 * 10e9 / 8 / HW.flops_prefill + heads * HW.linear_prefill_s)
    assert m.P2 == pytest.approx(2 * 12 * 8192 / 8 / HW.flops_prefill)
    assert tm.state_tokens(spec) == math.ceil(78.2e6 / (24576 * 4))  # ~800 KV tokens of state per sequence
    assert tm.state_tokens(make_cfg("models=qwen72b_qwen122b").models.policy) == 0
    costs = tm.role_costs(make_cfg("models=qwen72b_qwen122b").models, HW, Role.REWARD)
    assert costs.seq_tokens == tm.state_tokens(spec) and costs.kv_capacity == tm.kv_capacity(spec, HW, 0.5)


def test_expert_weights_stream_at_the_grouped_gemm_rate_and_fp8_at_the_same_parameter_rate(make_cfg):
    spec = make_cfg("models=qwen7b_qwen30b").models.genrm  # Qwen3-30B-A3B, 95 % in experts
    m = tm.decode_model(spec, HW, tp=1)
    dense, experts = 30.5e9 * 2 * 0.05 / HW.bw_weights, 30.5e9 * 0.95 * 2 / HW.bw_experts
    assert m.B == pytest.approx(dense + experts) and m.moe_floor == pytest.approx(dense / (dense + experts))
    fp8 = dataclasses.replace(spec, dtype_bytes=1)
    m8 = tm.decode_model(fp8, HW, tp=1)
    assert m8.B == pytest.approx(dense / 2 + experts)  # fp8 experts: same parameters per second
    assert m8.C == pytest.approx(m.C / 2) and m8.P1 == pytest.approx(m.P1 / 2)  # fp8 FLOP/s: 2x bf16


def test_eager_iterations_pay_the_launch_overhead(make_cfg):
    spec = make_cfg("models=qwen7b_qwen30b").models.policy
    full = tm.decode_model(spec, HW, cudagraph="full")
    decode_only = tm.decode_model(spec, HW, cudagraph="decode_only")
    off = tm.decode_model(spec, HW, cudagraph="off")
    eager = 28 * HW.eager_layer_s  # Qwen2.5-7B: 28 layers of launches without a graph
    assert off.D == pytest.approx(full.D - HW.d0 + eager)
    assert decode_only == full and off.P1 == full.P1  # a prefill chunk's launches hide behind its work
    models = make_cfg("models=qwen7b_qwen30b").models
    costs = tm.role_costs(models, HW, Role.ROLLOUT)
    assert costs.model.P1 == pytest.approx(decode_only.P1)  # verl's rollout: decode-only graphs
    assert costs.max_num_seqs == 256
    judge = tm.role_costs(models, HW, Role.REWARD)  # verl's reward model: enforce_eager, 1024 sequences
    assert judge.max_num_seqs == 1024
    assert judge.model.D == pytest.approx(tm.decode_model(models.genrm, HW, cudagraph="off").D)
