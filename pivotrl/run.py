"""`run(cfg)`: pick the runtime named by `cluster.kind`, run it, and always tear down.

Runtimes register by name in `RUNTIMES`. Each is a callable `(cfg, run_dir, tracker) -> summary`.
The run folder is Hydra's output folder when called from `train.py`, else a fresh folder.

Around the runtime, in this order: the console mode (`logging.verbose`, `logging/console.py`), the
folder's lock (one run per folder, `logging/runlock.py`), the resume check (`train.resume=true`
needs a checkpoint in the folder unless `train.allow_fresh_start=true`), the tracker; after it:
the closing table (`pivotrl.report.table`, every runtime), and, in `finally` so a partial run gets
them too, `timeline.png` (and `accuracy.png` where steps have an accuracy) drawn from the folder's
records and logged to wandb, then the tracker and the lock are closed. The first error is the one raised; teardown errors are logged after it
(`logging/teardown.py`). A picture that cannot be drawn is logged, never fatal: the records are
what matters, and `python -m pivotrl.report RUN_DIR` redraws it.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from pivotrl.config import PivotConfig
from pivotrl.registry import Registry

# name -> "module:function". Imported lazily so `cluster=sim` never imports torch or Ray.
RUNTIMES: Registry[Callable[..., dict[str, Any]]] = Registry("cluster.kind", {
    "sim": "pivotrl.sim.run:run_sim",
    "local": "pivotrl.runtime.real:run_real",
    "ray": "pivotrl.runtime.real:run_real",
})

log = logging.getLogger(__name__)

#: checks a runtime makes before anything is written to the run folder (a missing checkpoint stops
#: the run with only Hydra's log there)
PREFLIGHT: Registry[Callable[[PivotConfig], None]] = Registry("cluster.kind", {
    "local": "pivotrl.runtime.assets:preflight",
    "ray": "pivotrl.runtime.assets:preflight",
})

#: runtimes that can continue from a checkpoint in the run folder (`train.resume`)
RESUMABLE = ("local", "ray")


def run_dir_for(cfg: PivotConfig) -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # not under Hydra: library use or tests
        import tempfile

        return Path(tempfile.mkdtemp(prefix=f"pivotrl_{cfg.deploy.mode.value}_"))


def check_resume(cfg: PivotConfig, kind: str, run_dir: Path) -> None:
    """`train.resume=true` must find something to resume in `run_dir`, unless the user allows a
    fresh start (`train.allow_fresh_start=true`). Without `hydra.run.dir`, Hydra makes a new empty
    folder, and a resume that silently starts over would look like a resumed run."""
    if not cfg.train.resume or cfg.train.allow_fresh_start:
        return
    if kind not in RESUMABLE:
        raise ValueError(f"train.resume=true: cluster={kind} does not resume (allowed with resume: "
                         f"{list(RESUMABLE)}); drop train.resume, or set train.allow_fresh_start=true")
    from pivotrl.trainer.trainer_checkpoint import latest_checkpoint

    if latest_checkpoint(run_dir / "checkpoints") is None:
        raise ValueError(
            f"train.resume=true but the run folder {run_dir} holds no complete checkpoint "
            f"(checkpoints/step_*/trainer_state.json): point hydra.run.dir at the folder of the run to "
            f"continue, or set train.allow_fresh_start=true to start over there")


def draw_pictures(run_dir: Path, tracker: object | None) -> None:
    """`timeline.png` (and `accuracy.png` when steps record an accuracy) into the run folder, and to
    wandb; logged, never raised (module docstring)."""
    try:
        from pivotrl.report import write_timeline
        from pivotrl.report.accuracy import accuracy_curves, draw_accuracy
        from pivotrl.report.records import RunRecords

        if not (run_dir / "timeline.jsonl").exists() or (run_dir / "timeline.jsonl").stat().st_size == 0:
            return  # the run stopped before its first record: nothing to draw
        images = {"timeline": write_timeline(run_dir)}
        curves = accuracy_curves([RunRecords.read(run_dir)])
        if curves:
            images["accuracy"] = draw_accuracy(curves, run_dir / "accuracy.png")
        if tracker is not None:
            tracker.log_images(images)
    except Exception:  # noqa: BLE001 - a sink: the records are kept, the report command redraws
        log.exception("could not draw the run's pictures from %s (redraw with: python -m pivotrl.report %s)",
                      run_dir, run_dir)


def print_closing_table(run_dir: Path) -> None:
    from pivotrl.report.records import RunRecords
    from pivotrl.report.table import closing_rows, format_table

    print(format_table([closing_rows(RunRecords.read(run_dir))]), flush=True)


def run(cfg: PivotConfig, run_dir: Path | None = None) -> dict[str, Any]:
    """Run one job and return its summary (also written to `run_dir/summary.json`)."""
    from pivotrl.logging.console import console_mode

    kind = cfg.cluster.kind.value if hasattr(cfg.cluster.kind, "value") else str(cfg.cluster.kind)
    runtime = RUNTIMES[kind]
    run_dir = Path(run_dir) if run_dir is not None else run_dir_for(cfg)
    with console_mode(bool(cfg.logging.verbose)):
        return _run_locked(cfg, kind, runtime, run_dir)


def _run_locked(cfg: PivotConfig, kind: str, runtime: Callable[..., dict[str, Any]], run_dir: Path) -> dict[str, Any]:
    from pivotrl.logging.runlock import RunLock
    from pivotrl.logging.teardown import close_all
    from pivotrl.logging.tracker import Tracker

    lock = RunLock.acquire(run_dir, resume=bool(cfg.train.resume))
    tracker = None
    error: BaseException | None = None
    try:
        if lock.took_over is not None:
            log.warning("run folder %s: taking over the stale lock of pid %s, a run that died", run_dir,
                        lock.took_over.get("pid"))
        check_resume(cfg, kind, run_dir)
        if kind in PREFLIGHT:
            PREFLIGHT[kind](cfg)
        tracker = Tracker(cfg, run_dir)
        summary = runtime(cfg, run_dir, tracker)
        tracker.write_summary(summary)
        if cfg.logging.progress:
            print_closing_table(run_dir)
        return summary
    except BaseException as e:
        error = e
        raise
    finally:
        steps = [("drawing timeline.png", lambda: draw_pictures(run_dir, tracker))] if tracker is not None else []
        if tracker is not None:
            steps.append(("closing the tracker", tracker.close))
        steps.append(("releasing the run folder lock", lock.release))
        close_all(error, steps)
