"""See what a run did, from its run folder's files only (config.yaml, metrics.jsonl, timeline.jsonl,
summary.json): the timeline picture, the closing table, and several runs side by side.

- `timeline.py`: records -> per-device intervals by state, shifts, steps, training, throughput
  series, planner decisions (pure).
- `plot.py`: the `timeline.png` picture drawn from that (examples: `docs/figures/timeline_local_4dev.png`,
  `docs/figures/timeline_sim_128dev.png`).
- `trace.py`: `trace.json`, the same records as a Perfetto (Chrome trace format) trace: a track
  per device with its role, shift halves, weight loads, training, validation, per-role load counters.
- `table.py`: the closing table; `accuracy.py`: accuracy per step and per second (paper Fig. 15).
- `records.py`: reading a run folder; `__main__.py`: `python -m pivotrl.report RUN_DIR [RUN_DIR ...]`.

`write_timeline(run_dir)` and `trace.write_trace(run_dir)` are what `pivotrl.run` calls at the end of
every run (sim, local, ray).
Imports no torch, Ray or vLLM.
"""
from __future__ import annotations

from pathlib import Path

TIMELINE_PNG = "timeline.png"


def write_timeline(run_dir: Path | str, out: Path | str | None = None) -> Path:
    """Draw `run_dir`'s timeline into `out` (default `run_dir/timeline.png`); returns the path."""
    from pivotrl.report.plot import draw_timeline, timeline_figure
    from pivotrl.report.records import RunRecords

    rec = RunRecords.read(run_dir)
    path = Path(out) if out is not None else Path(run_dir) / TIMELINE_PNG
    title = f"{rec.label()}  ({rec.name})" + ("" if rec.summary is not None else "  [partial: no summary]")
    return draw_timeline(timeline_figure(rec.timeline_view(), title), path)
