"""Run records: the run folder's files, a wandb run, and the console.

Owns `config.yaml`, `metrics.jsonl` (one line per RL step), `timeline.jsonl` (allocations, shifts,
planner decisions) and `summary.json`. wandb is one more sink: offline unless the user is logged in
(`logging.wandb_mode=auto`), with each step's scalars and devices per role (`wandb_row`) and the
pictures drawn from the files at the end (`log_images`). Plots read the files, never the wandb
API. Knows nothing about runtimes.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pivotrl.config import PivotConfig

REQUIRED_SUMMARY_KEYS = ("deploy", "models", "cluster", "steps", "throughput_tokens_per_s",
                         "ideal_efficiency", "num_shifts")


def to_jsonable(x: Any) -> Any:
    """Dataclasses, enums, numpy scalars and non-finite floats into plain JSON values."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: to_jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, enum.Enum):
        return x.value
    if isinstance(x, dict):
        return {str(k.value if isinstance(k, enum.Enum) else k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, Path):
        return str(x)
    return x


def wandb_row(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of one metrics row that go to wandb: every scalar, and the allocation at the
    step's end as `allocation/<role>` (devices per role: rollout, reward, train, free)."""
    out = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    alloc = row.get("allocation")
    if isinstance(alloc, dict):
        for role, n in alloc.items():
            if isinstance(n, (int, float)) and not isinstance(n, bool):
                out[f"allocation/{role}"] = n
    return out


def _wandb_mode(requested: str) -> str:
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


class Tracker:
    """Writes a run's files and mirrors metrics to wandb. Use as the only sink in runtimes."""

    def __init__(self, cfg: PivotConfig, run_dir: Path, use_wandb: bool = True) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._cfg_dict = to_jsonable(cfg)
        self._write_config()
        self._metrics = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        self._timeline = open(self.run_dir / "timeline.jsonl", "a", buffering=1)
        self._wandb = None
        mode = _wandb_mode(getattr(getattr(cfg, "logging", None), "wandb_mode", "offline"))
        if use_wandb and mode != "disabled":
            self._wandb = self._start_wandb(mode)

    # -- files ---------------------------------------------------------------------------
    def _write_config(self) -> None:
        from omegaconf import OmegaConf

        text = OmegaConf.to_yaml(OmegaConf.create(self._cfg_dict))
        (self.run_dir / "config.yaml").write_text(text)

    def log_step(self, metrics: dict[str, Any]) -> None:
        """One line per RL step in metrics.jsonl, and the same numbers to wandb (`wandb_row`)."""
        row = to_jsonable(metrics)
        self._metrics.write(json.dumps(row) + "\n")
        if self._wandb is not None:
            self._wandb.log(wandb_row(row), step=int(row.get("step", 0)))

    def log_images(self, images: dict[str, Path]) -> None:
        """Pictures drawn from the run's files (the timeline, accuracy), to wandb as images, logged
        beside the last step's metrics. The files themselves stay in the run folder."""
        if self._wandb is None or not images:
            return
        import wandb

        self._wandb.log({f"pictures/{k}": wandb.Image(str(p)) for k, p in images.items()})

    def log_event(self, kind: str, **fields: Any) -> None:
        """One timeline record: an allocation, a shift, a planner decision."""
        self._timeline.write(json.dumps({"kind": kind, **to_jsonable(fields)}) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        missing = [k for k in REQUIRED_SUMMARY_KEYS if k not in summary]
        if missing:
            raise ValueError(f"summary is missing required keys {missing}")
        row = to_jsonable(summary)
        (self.run_dir / "summary.json").write_text(json.dumps(row, indent=2))
        if self._wandb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float, str)):
                    self._wandb.summary[k] = v

    # -- wandb ---------------------------------------------------------------------------
    def _start_wandb(self, mode: str) -> Any:
        try:
            import wandb
        except ImportError:  # wandb is a dependency, but a run must not die for a sink
            return None
        os.environ.setdefault("WANDB_SILENT", "true")
        name = self.run_dir.name
        project = getattr(getattr(self.cfg, "logging", None), "wandb_project", "pivotrl")
        return wandb.init(project=project, name=name, dir=str(self.run_dir), mode=mode,
                          config=self._cfg_dict, reinit="finish_previous")

    @property
    def wandb_dir(self) -> Path | None:
        return Path(self._wandb.dir) if self._wandb is not None else None

    def close(self) -> None:
        for f in (self._metrics, self._timeline):
            if not f.closed:
                f.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
