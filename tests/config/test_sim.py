"""Sim-only and planner refusals at start (issue 12 item 4): a simulated cluster beyond the memory
budget names the number it can hold; non-finite planner and simulator numbers are refused."""
from __future__ import annotations

import time

import pytest
from pivotrl.config import compose_config
from pivotrl.config.planner import PlannerConfig
from pivotrl.config.sim import SimConfig



def make(overrides):
    return compose_config(overrides)  # the entry's conversion (pivotrl.config.loader)


def test_too_many_simulated_devices_is_refused_at_start_with_the_number_it_holds():
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as exc:
        make(["cluster=sim", "models=qwen7b_qwen30b", "cluster.num_devices=100000"])
    msg = str(exc.value)
    assert "cluster.num_devices=100000" in msg and "models.sim.memory_budget_gib" in msg
    assert f"at most {SimConfig().max_devices(1)} devices" in msg
    assert time.perf_counter() - t0 < 10  # at start, not after a 51 s simulation
    # the paper's largest cluster is far inside the budget; the local runtime is not checked
    make(["cluster=sim", "models=qwen72b_qwen122b", "cluster.num_devices=1024"])


def test_max_devices_follows_the_budget():
    assert SimConfig(memory_budget_gib=0.5).max_devices() < SimConfig().max_devices() < SimConfig().max_devices(4)
    with pytest.raises(ValueError, match="memory_budget_gib"):
        SimConfig(memory_budget_gib=0.0)


@pytest.mark.parametrize("override,needle", [
    # non-finite numbers anywhere: the loader (pivotrl/config/loader.py), with the full path
    ("deploy.planner.horizon_s=inf", "deploy.planner.horizon_s=inf is invalid; allowed: a finite number"),
    ("deploy.planner.horizon_s=nan", "deploy.planner.horizon_s=nan is invalid; allowed: a finite number"),
    ("deploy.planner.tick_s=inf", "deploy.planner.tick_s=inf is invalid; allowed: a finite number"),
    ("deploy.planner.rule_up_kv=nan", "deploy.planner.rule_up_kv=nan is invalid; allowed: a finite number"),
    ("deploy.planner.rebalance_min_gain=-0.1", "deploy.planner.rebalance_min_gain must be >= 0"),
    ("models.sim.train_fixed_s=inf", "models.sim.train_fixed_s=inf is invalid; allowed: a finite number"),
    ("models.sim.max_num_seqs=0", "models.sim.max_num_seqs must be >= 1"),
])
def test_non_finite_and_bad_numbers_are_refused(override, needle):
    with pytest.raises(Exception) as exc:
        make(["cluster=sim", "models=qwen7b_qwen30b", override])
    text = str(exc.value) + " " + str(exc.value.__cause__ or "")
    assert needle in text, text


def test_planner_defaults_are_valid_and_rebalance_is_a_choice():
    assert PlannerConfig().rebalance is True
    assert PlannerConfig(rebalance=False).rebalance is False
