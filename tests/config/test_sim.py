"""Sim-only and planner refusals at start (issue 12 item 4): a simulated cluster beyond the memory
budget names the number it can hold; non-finite planner and simulator numbers are refused."""
from __future__ import annotations

import time

import pytest
from pivotrl.config import compose_config
from pivotrl.config.base import ConfigError
from pivotrl.config.planner import PivotPlannerConfig
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


@pytest.mark.parametrize("override", ["train.prompts_per_step=1000000000", "train.group_size=100000000"])
def test_a_simulated_batch_beyond_the_memory_budget_is_refused_at_start(override):
    """Issue 22: prompts_per_step=1e9 ran silent until killed, group_size=1e8 raised MemoryError."""
    key, value = override.split("=")
    with pytest.raises(ValueError) as exc:
        make(["cluster=sim", "models=qwen7b_qwen30b", override])
    msg = str(exc.value)
    assert f"{key}={value}" in msg and "train.prompts_per_step" in msg and "train.group_size" in msg
    assert "models.sim.memory_budget_gib=2.0" in msg and "deploy.staleness=2" in msg
    cap = SimConfig().memory_budget_gib * 2**30 // (4 * 1024)
    assert f"holds at most {int(cap)} samples per step" in msg
    # the paper's batch (256 x 8) is far inside it, and a real runtime's batch is not the simulator's
    make(["cluster=sim", "models=qwen72b_qwen122b"])
    make(["cluster=local", override])


def test_the_batch_bound_follows_budget_and_staleness():
    SimConfig().check_batch(512, 1024, 0)
    with pytest.raises(ValueError, match="holds at most 262144 samples"):
        SimConfig().check_batch(512, 1024, 6)
    SimConfig(memory_budget_gib=4.0).check_batch(512, 1024, 6)


def test_max_devices_follows_the_budget():
    assert SimConfig(memory_budget_gib=0.5).max_devices() < SimConfig().max_devices() < SimConfig().max_devices(4)
    with pytest.raises(ValueError, match="memory_budget_gib"):
        SimConfig(memory_budget_gib=0.0)


@pytest.mark.parametrize("override,needle", [
    # non-finite numbers anywhere: the loader (pivotrl/config/loader.py), with the full path
    ("deploy.planner.horizon_s=inf", "deploy.planner.horizon_s=inf is invalid; allowed: a finite number"),
    ("deploy.planner.horizon_s=nan", "deploy.planner.horizon_s=nan is invalid; allowed: a finite number"),
    ("deploy.planner.tick_s=inf", "deploy.planner.tick_s=inf is invalid; allowed: a finite number"),
    ("deploy/planner=rule deploy.planner.up_kv=nan", "deploy.planner.up_kv=nan is invalid; allowed: a finite number"),
    ("deploy.planner.rebalance_min_gain=-0.1", "deploy.planner.rebalance_min_gain=-0.1 is invalid; allowed: >= 0"),
    ("models.sim.train_fixed_s=inf", "models.sim.train_fixed_s=inf is invalid; allowed: a finite number"),
    ("models.sim.mem_util=nan", "models.sim.mem_util=nan is invalid; allowed: a finite number"),
    ("models.sim.max_num_seqs=0", "models.sim.max_num_seqs=0 is invalid; allowed: an int >= 1"),
    ("models.sim.mem_util=1.5", "models.sim.mem_util=1.5 is invalid; allowed: in (0, 1]"),
    ("models.sim.phase_switch=nap", "models.sim.phase_switch='nap' is invalid; allowed: shift | sleep"),
    ("models.sim.sweep_steps=1", "models.sim.sweep_steps=1 is invalid; allowed: null or an int >= 2"),
])
def test_non_finite_and_bad_numbers_are_refused(override, needle):
    with pytest.raises(ConfigError) as exc:
        make(["cluster=sim", "models=qwen7b_qwen30b", *override.split()])
    assert str(exc.value).startswith(needle), str(exc.value)


def test_one_non_finite_check_the_loaders():
    """Non-finite numbers have one definition (`pivotrl.config.base.finite`, used by the loader for
    every float of the tree): no dataclass loops over its own fields for them."""
    import inspect

    import pivotrl.config.loader as loader
    import pivotrl.config.planner as planner
    import pivotrl.config.sim as sim

    assert "finite(" in inspect.getsource(loader._check_value)
    for mod in (planner, sim, loader):
        assert "isfinite" not in inspect.getsource(mod), mod.__name__
    # a field no dataclass range-checks is still refused, by the loader, with its path
    with pytest.raises(ConfigError, match=r"^models\.sim\.publish_bw=inf is invalid; allowed: a finite number"):
        make(["cluster=sim", "models=qwen7b_qwen30b", "models.sim.publish_bw=inf"])


def test_planner_defaults_are_valid_and_rebalance_is_a_choice():
    assert PivotPlannerConfig().rebalance is True
    assert PivotPlannerConfig(rebalance=False).rebalance is False
