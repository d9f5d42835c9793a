"""Accuracy of several runs per step and per second of the run clock, in one figure (paper Fig. 15).

Owns `accuracy_curves(records) -> [AccuracyCurve]` (pure: each run's train accuracy per step from
metrics.jsonl, at the step's end time, plus held-out accuracy before and after from the summary)
and `draw_accuracy(curves, path)`. Runs without an accuracy (the simulator) are left out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pivotrl.report.records import RunRecords
from pivotrl.report.timeline import number


@dataclass
class AccuracyCurve:
    label: str
    steps: list[int] = field(default_factory=list)
    time_s: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    val_before: float | None = None
    val_after: float | None = None


def accuracy_curves(runs: list[RunRecords]) -> list[AccuracyCurve]:
    out = []
    for rec in runs:
        c = AccuracyCurve(f"{rec.label()} ({rec.name})")
        for row in rec.metrics:
            a, t = number(row.get("train_accuracy")), number(row.get("time_s"))
            if a is None or t is None:
                continue
            c.steps.append(int(row.get("step", len(c.steps) + 1)))
            c.time_s.append(t)
            c.accuracy.append(a)
        s = rec.summary or {}
        c.val_before, c.val_after = number(s.get("val_accuracy_before")), number(s.get("val_accuracy_after"))
        if c.accuracy:
            out.append(c)
    return out


def draw_accuracy(curves: list[AccuracyCurve], path: Path, dpi: int = 110) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True, layout="constrained")
    for i, c in enumerate(curves):
        color = f"C{i}"
        a1.plot(c.steps, c.accuracy, "-o", ms=3, color=color, label=c.label)
        a2.plot(c.time_s, c.accuracy, "-o", ms=3, color=color, label=c.label)
        if c.val_before is not None and c.val_after is not None:  # held-out: start and end
            a1.plot([0, c.steps[-1]], [c.val_before, c.val_after], "s", color=color, ms=7, alpha=0.7,
                    label=f"held-out before / after: {c.val_before:.3f} / {c.val_after:.3f}")
            a2.plot([0, c.time_s[-1]], [c.val_before, c.val_after], "s", color=color, ms=7, alpha=0.7)
    a1.set_xlabel("RL step")
    a2.set_xlabel("run clock (s)")
    a1.set_ylabel("accuracy (train batch: solid; held-out: squares)")
    a1.set_title("accuracy per step", fontsize=10)
    a2.set_title("accuracy per second (a faster mode reaches it sooner)", fontsize=10)
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
    a1.legend(fontsize=7, loc="best")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)
