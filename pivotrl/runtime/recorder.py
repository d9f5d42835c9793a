"""The run's records, the same for every runtime: metrics rows per step, timeline events, the
summary's common figures, and the console step line.

Owns the measurement window (throughput over the steps after `train.warmup_steps`, DESIGN §4.6):
`throughput_tokens_per_s = tokens of the measured steps / (end - end of the warm-up step)`, and
the common summary keys. A driver adds its own fields to each row (`Driver.step_fields`) and to
the summary (`Driver.finish`); the tracker writes them (`metrics.jsonl`, `timeline.jsonl`, wandb).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pivotrl.deploy.events import StepDone
    from pivotrl.logging.tracker import Tracker


class Recorder:
    """Rows and summary of one run of controller mode `mode` on runtime `runtime`."""

    def __init__(self, tracker: Tracker | None, *, mode: str, models: str, runtime: str, devices: int, steps: int,
                 warmup: int, prompts_per_step: int, group_size: int, console: str | None = None) -> None:
        self.tracker = tracker
        self.head = {"deploy": mode, "models": models, "cluster": runtime, "devices": devices}
        self.steps, self.warmup, self.P, self.G = steps, warmup, prompts_per_step, group_size
        self.console = console  # prefix of the console step line; None: no line (progress bars instead)
        self.rows: list[dict[str, Any]] = []
        self.window0: float | None = None
        self.last_step_end = 0.0

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        if self.tracker is not None:
            self.tracker.log_event(kind, **fields)

    def step(self, act: StepDone, now: float, fields: dict[str, Any]) -> dict[str, Any]:
        f = dict(act.fields)
        step_time = now - self.last_step_end
        row = {"step": act.step, "time_s": now, "step_time_s": step_time,
               "throughput_tokens_per_s": f.get("tokens", 0) / step_time if step_time > 0 else 0.0,
               **fields, **f}
        self.last_step_end = now
        self.rows.append(row)
        if act.step == self.warmup:
            self.window0 = now
        if self.tracker is not None:
            self.tracker.log_step(row)
        if self.console is not None:
            shown = " ".join(f"{label}={row[k]:.3f}" for k, label in (("reward_mean", "reward"), ("train_accuracy", "acc"))
                             if row.get(k) is not None)
            print(f"[{self.console}] step {act.step}/{self.steps} {step_time:.1f}s {shown} "
                  f"tok/s={row['throughput_tokens_per_s']:.0f} shifts={f.get('shifts', 0)}", flush=True)
        return row

    def summary(self, now: float, extra: dict[str, Any]) -> dict[str, Any]:
        measured = [r for r in self.rows if r["step"] > self.warmup]
        t0 = self.window0 if self.window0 is not None else 0.0
        span = now - t0
        tokens = sum(r["tokens"] for r in measured)
        return {**self.head, "steps": len(self.rows), "warmup_steps": self.warmup, "measured_steps": len(measured),
                "prompts_per_step": self.P, "group_size": self.G,
                "throughput_tokens_per_s": tokens / span if span > 0 else 0.0,
                "measured_tokens": tokens, "measured_time_s": span,
                "step_time_s": [r["step_time_s"] for r in self.rows], **extra}
