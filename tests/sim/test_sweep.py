"""Allocation sweep: the grid, Table 4 on it, best pick, and the cache."""
from __future__ import annotations

import pytest

from pivotrl.core.types import Role
from pivotrl.sim.sweep import candidates, paper_allocation, resolve_allocation, sweep

GROUPS = ["qwen1.5b_glm9b", "qwen7b_qwen30b", "qwen32b_qwen30b", "qwen72b_qwen122b"]


@pytest.mark.parametrize("group", GROUPS)
def test_grid_is_valid_and_holds_table4(make_cfg, group):
    for mode, n_expected in (("disaggregated", 21), ("rr_colocated", 7), ("pivot", 7)):
        cfg = make_cfg(f"models={group}", f"deploy={mode}")
        cands = candidates(cfg)
        assert len(cands) == n_expected  # 8 units: C(7,2) splits in three, 7 in two
        n = cfg.models.devices
        align = max(cfg.models.policy.tp, cfg.models.genrm.tp)
        for c in cands:
            if mode != "pivot":
                assert sum(c.values()) == n
            assert all(v % align == 0 for v in c.values())
        assert paper_allocation(cfg) in cands


def test_sweep_picks_the_best_and_caches(make_cfg, tmp_path):
    cfg = make_cfg("models=qwen1.5b_glm9b", "deploy=rr_colocated", "cluster.num_devices=8",
                   "train.prompts_per_step=4", "train.group_size=2", "models.sim.sweep_units=4",
                   "train.steps=3")
    res = sweep(cfg, tmp_path)
    assert res["runs"] == 3 and res["cached"] == 0
    best = max(res["results"], key=res["results"].get)
    assert best == "{}/0/{}".format(res["best"][Role.ROLLOUT], res["best"][Role.TRAIN])
    again = sweep(cfg, tmp_path)
    assert again["runs"] == 0 and again["results"] == res["results"]
    alloc, info = resolve_allocation(cfg, tmp_path)
    assert alloc == res["best"] and info["sweep_cached"] == 3


def test_given_allocation_and_pivot_home(make_cfg):
    cfg = make_cfg("models=qwen7b_qwen30b", "deploy=disaggregated", "deploy.allocation.rollout=12",
                   "deploy.allocation.reward=12", "deploy.allocation.train=8")
    alloc, info = resolve_allocation(cfg)
    assert alloc == {Role.ROLLOUT: 12, Role.REWARD: 12, Role.TRAIN: 8} and info["source"] == "deploy.allocation"
    alloc, info = resolve_allocation(make_cfg("models=qwen7b_qwen30b", "deploy=pivot"))
    assert alloc == {Role.TRAIN: 8} and info["source"] == "paper Table 4"
    with pytest.raises(ValueError, match="pivot_home"):
        make_cfg("models=qwen7b_qwen30b", "models.sim.pivot_home=bogus")
