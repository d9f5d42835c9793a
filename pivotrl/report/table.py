"""The closing table of a run, and the same figures side by side for several runs.

Owns `closing_rows(records) -> [(label, value)]` (pure: from the run folder's summary, metrics and
timeline) and `format_table(columns)`: one column per run. The figures: throughput, held-out
accuracy before and after (real runtimes), train accuracy of the first and last step, the judge's
parse failures (and the steps over `models.genrm.judge.max_parse_failure_rate`), shifts, time
per device state (from the timeline), ideal efficiency where the runtime knows it (sim), wall
time, whether the run finished (a summary was written), and which of its files are missing or
damaged: the figures read from such a file are shown as unknown (issue 22: a folder without
`timeline.jsonl` showed 0 plans, 0 decisions and `free=100%`).
"""
from __future__ import annotations

import math
from typing import Any

from pivotrl.report.records import RunRecords
from pivotrl.report.timeline import ROLES


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    if isinstance(x, bool) or x is None:
        return "-"
    if isinstance(x, str):
        try:
            x = float(x)
        except ValueError:
            return x
    if isinstance(x, (int, float)) and math.isfinite(x):
        return fmt.format(x)
    return "-"


def _parse_failures(p: Any) -> str:
    """`failures/judged (rate)`, and the steps over the judge's threshold (summary `genrm_parse`)."""
    if not isinstance(p, dict) or not p.get("total"):
        return "-"
    failures = int(p.get("failures") or 0)
    out = f"{failures}/{p['total']} ({100 * failures / p['total']:.0f}%)"
    over = p.get("steps_over") or []
    if over:
        out += f", {len(over)} step(s) over {100 * float(p.get('max_parse_failure_rate', 0)):.0f}%"
    return out


def closing_rows(rec: RunRecords) -> list[tuple[str, str]]:
    """(label, value) rows of one run's closing table. A figure read from a missing or damaged file
    is `? (<file> missing|damaged)`, never a zero, and the `records` row names every such file."""
    s = rec.summary or {}
    m = rec.metrics
    tl = rec.timeline_view()
    acc = [r.get("train_accuracy") for r in m if r.get("train_accuracy") is not None]
    held = tl.device_seconds()
    total = sum(held.values())
    per_role = " ".join(f"{r}={100 * held[r] / total:.0f}%" for r in ROLES if held[r] >= 5e-4 * total) if total > 0 else "-"
    clock = "simulated" if (s.get("cluster") or (rec.config.get("cluster") or {}).get("kind")) == "sim" else "wall"
    no_timeline = rec.unknown("timeline.jsonl")
    no_metrics = rec.unknown("metrics.jsonl")
    if "summary.json" in rec.problems:
        status = f"summary.json {rec.problems['summary.json'][0]} ({len(m)} steps recorded)"
    elif rec.summary is not None:
        status = "finished"
    else:
        status = f"partial ({no_metrics or len(m)} steps recorded, no summary)"
    rows = [
        ("run", rec.label()),
        ("folder", rec.name),
        ("status", status),
        ("records", "; ".join(f"{name} {what}" for name, (what, _) in rec.problems.items()) or "complete"),
        ("devices", str(rec.num_devices)),
        ("steps (measured)", f"{s['steps'] if 'steps' in s else (no_metrics or len(m))} ({s.get('measured_steps', '-')})"),
        ("throughput tokens/s", _f(s.get("throughput_tokens_per_s"), "{:.1f}")),
        ("val accuracy before -> after",
         f"{_f(s.get('val_accuracy_before'))} -> {_f(s.get('val_accuracy_after'))}"),
        ("  greedy before -> after",
         f"{_f(s.get('val_accuracy_greedy_before'))} -> {_f(s.get('val_accuracy_greedy_after'))}"),
        ("train accuracy first -> last step",
         no_metrics or f"{_f(acc[0] if acc else None)} -> {_f(acc[-1] if acc else None)}"),
        ("shifts (replica moves)", str(s.get("num_shifts", "-"))),
        ("shift plans", no_timeline or str(len(tl.shifts))),
        ("planner decisions applied", no_timeline or str(sum(1 for d in tl.decisions if d.applied))),
        ("device time per state", no_timeline or per_role),
        ("judge parse failures", _parse_failures(s.get("genrm_parse"))),
        ("tau_shift s (up+down)", ", ".join(f"{k}={_f(v, '{:.2f}')}" for k, v in (s.get("tau_shift") or {}).items())
         or "-"),
        ("training step device-s", _f(s.get("train_busy_device_s"), "{:.1f}")),
        ("ideal efficiency", _f(s.get("ideal_efficiency"))),
        ("run clock s (timeline)", no_timeline or f"{_f(tl.end, '{:.1f}')} ({clock})"),
        ("wall s", _f(s.get("wall_s"), "{:.1f}")),
    ]
    return rows


def format_table(columns: list[list[tuple[str, str]]]) -> str:
    """Runs side by side: the first column's labels, one value column per run."""
    if not columns:
        return ""
    labels = list(dict.fromkeys(k for col in columns for k, _ in col))  # every run's rows, in order
    vals = [[dict(c).get(k, "-") for k in labels] for c in columns]
    lw = max(len(k) for k in labels)
    ws = [max(len(v) for v in col) for col in vals]
    rule = "-" * (lw + sum(w + 2 for w in ws))
    out = [rule]
    for i, k in enumerate(labels):
        out.append(f"{k:<{lw}}" + "".join(f"  {col[i]:<{w}}" for col, w in zip(vals, ws)))
    out.append(rule)
    return "\n".join(out)
