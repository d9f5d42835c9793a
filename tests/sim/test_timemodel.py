"""Time-model formulas against calibration.md §3/§5 table values."""
from __future__ import annotations

import pytest

from pivotrl.config.cluster import HardwareProfile
from pivotrl.core.types import Role
from pivotrl.sim import timemodel as tm

HW = HardwareProfile()  # the H20 "measured" defaults of calibration.md §3


def _spec(cfg, role):
    return cfg.models.policy if role == "policy" else cfg.models.genrm


@pytest.mark.parametrize("group,role,A_us,B_ms,C_ms", [
    ("qwen7b_qwen30b", "policy", 0.032, 10.9, 0.139),    # Qwen2.5-7B tp1
    ("qwen1.5b_glm9b", "policy", 0.016, 2.2, 0.028),     # Qwen2.5-1.5B tp1
    ("qwen1.5b_glm9b", "genrm", 0.023, 13.4, 0.171),     # GLM-Z1-9B tp1
])
def test_dense_decode_constants_match_calibration(make_cfg, group, role, A_us, B_ms, C_ms):
    m = tm.decode_model(_spec(make_cfg(f"models={group}"), role), HW)
    assert m.A * 1e6 == pytest.approx(A_us, rel=0.03)
    assert m.B * 1e3 == pytest.approx(B_ms, rel=0.03)
    assert m.C * 1e3 == pytest.approx(C_ms, rel=0.03)
    assert m.D == pytest.approx(HW.d0)  # tp1: no all-reduce


def test_moe_floor_rises_with_batch_as_calibrated(make_cfg):
    spec = make_cfg("models=qwen7b_qwen30b").models.genrm  # Qwen3-30B-A3B
    m = tm.decode_model(spec, HW, tp=1)
    assert m.A * 1e6 == pytest.approx(0.055, rel=0.03)
    assert m.C * 1e3 == pytest.approx(0.094, rel=0.03)
    assert m.floor(1) * 1e3 == pytest.approx(4.7, rel=0.05)
    assert m.floor(128) * 1e3 == pytest.approx(43.6, rel=0.03)
    assert m.floor(1) < m.floor(8) < m.floor(64)


def test_tensor_parallel_divides_and_adds_allreduce(make_cfg):
    spec = make_cfg("models=qwen7b_qwen30b").models.genrm
    m1, m4 = tm.decode_model(spec, HW, tp=1), tm.decode_model(spec, HW, tp=4)
    assert m4.A == pytest.approx(m1.A / 4) and m4.B == pytest.approx(m1.B / 4)
    assert m4.D == pytest.approx(HW.d0 + 2 * spec.layers * HW.t_allreduce)


def test_prefill_of_17k_tokens_on_glm9b_is_seconds(make_cfg):
    # calibration §3: "about 2.9 s for 17K tokens on GLM-Z1-9B"; our P2 adds attention FLOPs
    m = tm.decode_model(make_cfg("models=qwen1.5b_glm9b").models.genrm, HW)
    assert 2.5 < m.prefill_time(17_000) < 4.5
    assert m.P1 * 17_000 == pytest.approx(2.9, rel=0.05)


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
