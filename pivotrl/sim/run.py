"""`cluster=sim` entry (`pivotrl.run`'s registry): choose the allocation, then simulate.

Baselines get their best static split by a sweep (`sweep.py`, as the paper tuned its baselines)
unless `deploy.allocation` is given; the run itself is `runtime.simulate`.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivotrl.config import PivotConfig
from pivotrl.sim.runtime import simulate
from pivotrl.sim.sweep import resolve_allocation

if TYPE_CHECKING:
    from pivotrl.logging.tracker import Tracker


def run_sim(cfg: PivotConfig, run_dir: Path, tracker: Tracker | None) -> dict[str, Any]:
    """`cluster=sim` entry (pivotrl.run's registry): resolve the allocation (sweeping baselines to
    their best static split unless `deploy.allocation` is given), simulate, and return the summary."""
    alloc, info = resolve_allocation(cfg, progress=bool(cfg.logging.progress))
    if tracker is not None:
        tracker.log_event("allocation_choice", **info)
    summary = simulate(cfg, alloc, tracker=tracker, progress=bool(cfg.logging.progress))
    summary.update(allocation_choice=info)
    return summary
