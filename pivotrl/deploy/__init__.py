"""Deployment controllers (pure): one event-driven state machine per `deploy.mode`.

`CONTROLLERS` maps the config string to the class; `make_controller(mode, env)` builds one. Each
controller owns the sample pipeline, the staleness bound and the policy versions of its mode, and
returns actions (`pivotrl/deploy/events.py`) that a runtime carries out.
"""
from __future__ import annotations

from pivotrl.deploy.base import ControlEnv, Controller
from pivotrl.deploy.pivot import PivotController
from pivotrl.deploy.static import ColocatedController, DisaggregatedController, RRColocatedController
from pivotrl.registry import Registry

CONTROLLERS: Registry[type[Controller]] = Registry("deploy.mode", {
    "colocated": ColocatedController,
    "disaggregated": DisaggregatedController,
    "rr_colocated": RRColocatedController,
    "pivot": PivotController,
})


def make_controller(mode: str, env: ControlEnv) -> Controller:
    """Build the controller registered under `mode` (a `deploy.mode` string or enum)."""
    return CONTROLLERS.build(getattr(mode, "value", mode), env)


__all__ = ["CONTROLLERS", "ControlEnv", "Controller", "make_controller"]
