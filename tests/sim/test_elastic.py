"""Elastic training in the simulator: the trainer grows onto idle devices and back, priced by the
planner, with the simulator's own training clock (`timemodel.training_model`) and reshard cost."""
from __future__ import annotations

import pytest

from pivotrl.core.types import Role
from pivotrl.sim.runtime import simulate


class Rows:
    """A tracker that keeps the metrics rows and timeline records in memory."""

    def __init__(self):
        self.rows, self.events = [], []

    def log_step(self, m):
        self.rows.append(m)

    def log_event(self, kind, **f):
        self.events.append({"kind": kind, **f})

    def __getattr__(self, name):
        return lambda *a, **kw: None


def _run(make_cfg, elastic: bool):
    cfg = make_cfg("models=qwen7b_qwen30b", "deploy=pivot", "train.steps=6",
                   f"deploy.planner.elastic_training={str(elastic).lower()}")
    t = Rows()
    return simulate(cfg, {Role.TRAIN: 8}, tracker=t), t


def test_the_training_bound_group_grows_its_trainer_and_gains(make_cfg):
    """qwen7b_qwen30b at Table 4's home set is training-bound (pivot ties disaggregated): with
    elastic training the trainer borrows devices for its steps, each such step pays a reshard,
    every sample is trained once, and the run is faster."""
    base, _ = _run(make_cfg, False)
    el, t = _run(make_cfg, True)
    worlds = [r["train_world"] for r in t.rows]
    assert max(worlds) > 8 and all(w % 4 == 0 and w >= 8 for w in worlds)  # whole GenRM replicas (tp 4)
    assert all((r["reshard_s"] > 0) == (r["train_world"] != 8) for r in t.rows)
    assert [r["samples"] for r in t.rows] == [256 * 8] * 6  # every batch whole (the pipeline refuses repeats)
    assert el["measured_tokens"] == base["measured_tokens"]  # the same samples, so the ratio is one of time
    assert el["throughput_tokens_per_s"] > 1.2 * base["throughput_tokens_per_s"]
    grown = [e for e in t.events if e["kind"] == "decision" and e.get("role_up") == "train"
             and "grows" in e["reason"]]
    assert grown and all({"step_s", "drain_s", "benefit_s", "lost_tokens"} <= set(c["training"])
                         for c in grown[0]["candidates"])


def test_elastic_training_off_keeps_the_paper_behaviour(make_cfg):
    _, t = _run(make_cfg, False)
    assert {r["train_world"] for r in t.rows} == {8} and not any(r["reshard_s"] for r in t.rows)
