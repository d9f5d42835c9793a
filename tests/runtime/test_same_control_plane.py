"""The local runtime drives the very control plane the simulator drives: same module objects, no
forked copies of the scheduler, planner, strategies, controllers or throughput fit."""
from __future__ import annotations

import ast
from pathlib import Path

import pivotrl.core.scheduler as core_scheduler
import pivotrl.core.strategies as core_strategies
import pivotrl.core.throughput as core_throughput
import pivotrl.deploy as deploy
import pivotrl.deploy.events as events
import pivotrl.runtime.local as local
import pivotrl.runtime.local_setup as local_setup
import pivotrl.runtime.monitor as monitor
import pivotrl.sim.runtime as sim_runtime

RUNTIME = Path(local.__file__).parent


def test_controllers_and_events_are_the_simulators():
    assert local.make_controller is sim_runtime.make_controller is deploy.make_controller
    for name in ("Dispatch", "StartShift", "StartTraining", "PublishWeights", "Record", "StepDone", "Finish",
                 "SequenceFinished", "ShiftDone", "TrainingDone", "Tick", "Start"):
        assert getattr(local, name) is getattr(sim_runtime, name) is getattr(events, name), name
    assert local_setup.ThroughputModel is core_throughput.ThroughputModel
    assert monitor.ThroughputModel.fit is core_throughput.ThroughputModel.fit


def test_controller_built_by_local_uses_core_scheduler_and_strategy():
    from pivotrl.config.planner import PlannerConfig
    from pivotrl.core.types import Role
    from pivotrl.deploy.base import ControlEnv

    class Prompts:
        def prompts(self, batch):
            return []

    env = ControlEnv(num_devices=4, node_size=8, tp={Role.ROLLOUT: 1, Role.REWARD: 1},
                     models={r: local_setup.PRIOR_MODEL for r in (Role.ROLLOUT, Role.REWARD)},
                     tau_shift={r: 1.0 for r in Role}, prompts=Prompts(), prompts_per_step=1, group_size=1,
                     steps=1, staleness=2, allocation={Role.TRAIN: 1}, planner=PlannerConfig())
    ctrl = local.make_controller("pivot", env)
    assert all(type(s) is core_scheduler.ShiftAwareScheduler for s in ctrl.sched.values())
    assert type(ctrl.strategy) is core_strategies.STRATEGIES["pivot"]


def test_runtime_defines_no_scheduler_planner_or_controller():
    """No class or function in pivotrl/runtime re-implements a control-plane piece."""
    banned = {"ShiftAwareScheduler", "Planner", "Controller", "ThroughputModel", "SamplePipeline",
              "ClusterView", "decide", "dispatch_moves", "shift_pairs"}
    for f in RUNTIME.glob("*.py"):
        tree = ast.parse(f.read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        assert not names & banned, f"{f.name} defines {names & banned}"
