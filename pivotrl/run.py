"""`run(cfg)`: pick the runtime named by `cluster.kind`, run it, and always tear down.

Runtimes register by name in `RUNTIMES`. Each is a callable `(cfg, run_dir, tracker) -> summary`.
The run folder is Hydra's output folder when called from `train.py`, else a fresh folder.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

from pivotrl.config import PivotConfig

# name -> "module:function". Imported lazily so `cluster=sim` never imports torch or Ray.
RUNTIMES: dict[str, str] = {
    "sim": "pivotrl.sim.runtime:run_sim",
    "local": "pivotrl.runtime.real:run_real",
    "ray": "pivotrl.runtime.real:run_real",
    "inproc": "pivotrl.runtime.inproc:run_inproc",
}


class NotImplementedRuntime(RuntimeError):
    pass


def resolve_runtime(kind: str) -> Callable[..., dict[str, Any]]:
    if kind not in RUNTIMES:
        raise ValueError(f"cluster.kind={kind!r} is not a runtime; allowed: {sorted(RUNTIMES)}")
    module, fn = RUNTIMES[kind].split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            raise NotImplementedRuntime(
                f"cluster={kind} is not implemented yet (module {module} is missing); "
                f"use cluster=sim for now") from None
        raise
    return getattr(mod, fn)


def run_dir_for(cfg: PivotConfig) -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # not under Hydra: library use or tests
        import tempfile

        return Path(tempfile.mkdtemp(prefix=f"pivotrl_{cfg.deploy.mode.value}_"))


def run(cfg: PivotConfig, run_dir: Path | None = None) -> dict[str, Any]:
    """Run one job and return its summary (also written to `run_dir/summary.json`)."""
    from pivotrl.logging.tracker import Tracker

    kind = cfg.cluster.kind.value if hasattr(cfg.cluster.kind, "value") else str(cfg.cluster.kind)
    runtime = resolve_runtime(kind)
    run_dir = Path(run_dir) if run_dir is not None else run_dir_for(cfg)
    tracker = Tracker(cfg, run_dir)
    try:
        summary = runtime(cfg, run_dir, tracker)
        tracker.write_summary(summary)
        return summary
    finally:
        tracker.close()
