"""`run(cfg)`: pick the runtime named by `cluster.kind`, run it, and always tear down.

Runtimes register by name in `RUNTIMES`. Each is a callable `(cfg, run_dir, tracker) -> summary`.
The run folder is Hydra's output folder when called from `train.py`, else a fresh folder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pivotrl.config import PivotConfig
from pivotrl.registry import Registry

# name -> "module:function". Imported lazily so `cluster=sim` never imports torch or Ray.
RUNTIMES: Registry[Callable[..., dict[str, Any]]] = Registry("cluster.kind", {
    "sim": "pivotrl.sim.run:run_sim",
    "local": "pivotrl.runtime.real:run_real",
    "ray": "pivotrl.runtime.real:run_real",
    "inproc": "pivotrl.runtime.inproc:run_inproc",
})


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
    runtime = RUNTIMES[kind]
    run_dir = Path(run_dir) if run_dir is not None else run_dir_for(cfg)
    tracker = Tracker(cfg, run_dir)
    try:
        summary = runtime(cfg, run_dir, tracker)
        tracker.write_summary(summary)
        return summary
    finally:
        tracker.close()
