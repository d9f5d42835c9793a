"""Reading one run folder: `config.yaml`, `metrics.jsonl`, `timeline.jsonl`, `summary.json`.

Owns `RunRecords.read(run_dir)`: only the files, never wandb or the runtimes, so a folder copied
from another machine reads the same. A run cut short (killed, crashed) may have no summary and a
last line cut mid-write: the rows before it are kept and the cut line is counted in `skipped`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivotrl.report.timeline import Timeline, build_timeline


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Rows of a jsonl file and how many lines were not JSON (a cut last line)."""
    rows, bad = [], 0
    if not path.exists():
        return rows, 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows, bad


@dataclass
class RunRecords:
    run_dir: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    timeline: list[dict[str, Any]]
    summary: dict[str, Any] | None
    skipped: int = 0
    _built: Timeline | None = field(default=None, repr=False)

    @classmethod
    def read(cls, run_dir: Path | str) -> "RunRecords":
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise FileNotFoundError(f"{run_dir} is not a run folder (no such directory)")
        if not (run_dir / "timeline.jsonl").exists() and not (run_dir / "metrics.jsonl").exists():
            raise FileNotFoundError(f"{run_dir} is not a run folder: it has no timeline.jsonl or metrics.jsonl")
        config: dict[str, Any] = {}
        if (run_dir / "config.yaml").exists():
            import yaml

            config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
        metrics, b1 = read_jsonl(run_dir / "metrics.jsonl")
        timeline, b2 = read_jsonl(run_dir / "timeline.jsonl")
        summary = None
        if (run_dir / "summary.json").exists():
            try:
                summary = json.loads((run_dir / "summary.json").read_text())
            except json.JSONDecodeError:
                b1 += 1
        return cls(run_dir, config, metrics, timeline, summary, b1 + b2)

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def num_devices(self) -> int:
        if self.summary and isinstance(self.summary.get("devices"), int):
            return int(self.summary["devices"])
        n = (self.config.get("cluster") or {}).get("num_devices") or (self.config.get("models") or {}).get("devices")
        if isinstance(n, int) and n > 0:
            return n
        # neither: count the devices the slot ids name
        from pivotrl.report.timeline import slot_devices

        top = -1
        for r in self.timeline:
            for s in (r.get("up") or []) + (r.get("down") or []) if r.get("kind") == "shift" else []:
                top = max(top, max(slot_devices(s)[1]))
        return top + 1

    def label(self) -> str:
        """`deploy/models/cluster` of the run (from the summary, else the config)."""
        s = self.summary or {}
        c = self.config
        mode = s.get("deploy") or (c.get("deploy") or {}).get("mode", "?")
        models = s.get("models") or (c.get("models") or {}).get("name", "?")
        cluster = s.get("cluster") or (c.get("cluster") or {}).get("kind", "?")
        return f"{mode}/{models}/{cluster}"

    def timeline_view(self) -> Timeline:
        if self._built is None:
            self._built = build_timeline(self.timeline, self.metrics, self.num_devices)
        return self._built
