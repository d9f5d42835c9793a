"""The real runtimes drive the very control plane the simulator drives, through the same loop:
same module objects, no forked copies of the scheduler, planner, strategies, controllers,
throughput fit or runtime loop."""
from __future__ import annotations

import ast
from pathlib import Path

import pivotrl.core.scheduler as core_scheduler
import pivotrl.core.strategies as core_strategies
import pivotrl.core.throughput as core_throughput
import pivotrl.deploy as deploy
import pivotrl.deploy.events as events
import pivotrl.runtime.driver as driver
import pivotrl.runtime.loop as loop
import pivotrl.runtime.monitor as monitor
import pivotrl.runtime.real as real
import pivotrl.sim.runtime as sim_runtime

RUNTIME = Path(real.__file__).parent


def test_controllers_events_and_loop_are_the_simulators():
    assert sim_runtime.make_controller is deploy.make_controller
    for name in ("SequenceFinished", "ShiftDone", "TrainingDone", "Tick"):
        assert getattr(driver, name) is getattr(sim_runtime, name) is getattr(events, name), name
    for name in ("Dispatch", "StartShift", "StartTraining", "PublishWeights", "Record", "StepDone", "Finish", "Start"):
        assert getattr(loop, name) is getattr(events, name), name
    # both drivers run under the one loop: neither module defines its own
    src = {m: Path(m.__file__).read_text() for m in (sim_runtime, driver, real)}
    assert all("RunLoop(" in src[m] for m in (sim_runtime, real)) and "class RunLoop" not in "".join(src.values())
    assert real.ThroughputModel is core_throughput.ThroughputModel
    assert monitor.ThroughputModel.fit is core_throughput.ThroughputModel.fit


def test_controller_built_by_local_uses_core_scheduler_and_strategy():
    from pivotrl.config.planner import PivotPlannerConfig
    from pivotrl.core.types import Role
    from pivotrl.deploy.base import ControlEnv

    class Prompts:
        def prompts(self, batch):
            return []

    env = ControlEnv(num_devices=4, node_size=8, tp={Role.ROLLOUT: 1, Role.REWARD: 1},
                     models={r: real.PRIOR_MODEL for r in (Role.ROLLOUT, Role.REWARD)},
                     tau_shift={r: 1.0 for r in Role}, prompts=Prompts(), prompts_per_step=1, group_size=1,
                     steps=1, staleness=2, allocation={Role.TRAIN: 1}, planner=PivotPlannerConfig())
    ctrl = deploy.make_controller("pivot", env)
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
