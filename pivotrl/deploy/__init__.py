"""Deployment controllers (pure): one event-driven state machine per `deploy.mode`.

`CONTROLLERS` maps the config string to the class; `make_controller(mode, env)` builds one. Each
controller owns the sample pipeline, the staleness bound and the policy versions of its mode, and
returns actions (`pivotrl/deploy/events.py`) that a runtime carries out.
"""
from __future__ import annotations

from pivotrl.deploy.base import ControlEnv, Controller
from pivotrl.deploy.pivot import PivotController
from pivotrl.deploy.static import ColocatedController, DisaggregatedController, RRColocatedController

CONTROLLERS: dict[str, type[Controller]] = {
    "colocated": ColocatedController,
    "disaggregated": DisaggregatedController,
    "rr_colocated": RRColocatedController,
    "pivot": PivotController,
}


def make_controller(mode: str, env: ControlEnv) -> Controller:
    """Build the controller registered under `mode` (a `deploy.mode` string or enum)."""
    key = getattr(mode, "value", mode)
    if key not in CONTROLLERS:
        raise ValueError(f"deploy.mode={key!r} is not a deployment mode; allowed: {sorted(CONTROLLERS)}")
    return CONTROLLERS[key](env)


__all__ = ["CONTROLLERS", "ControlEnv", "Controller", "make_controller"]
