"""A run's Perfetto trace: `trace.json` in the run folder, in the Chrome trace event format (open it
in ui.perfetto.dev or chrome://tracing), derived from the run folder's records like `timeline.png`.

Owns `chrome_trace(records) -> dict` (pure: plain dicts in, plain dicts out) and
`write_trace(run_dir)`, which `pivotrl.run` calls at the end of every run (sim, local and ray) and
`python -m pivotrl.report` too. Everything comes from `timeline.build_timeline` (the one reading of
the records, resumed runs included), so the trace and the picture never disagree:

| process (pid)         | tracks (tid)                    | events                                                   |
|-----------------------|---------------------------------|----------------------------------------------------------|
| 1 devices: role held  | one per device                  | a slice per state (rollout, reward, train, free, shifting), a mark per death |
| 2 devices: operations | one per device                  | its shift halves (down, up; `cold` builds), its weight loads |
| 3 run                 | training, weights, checkpoints, validation, planner, steps | training steps; publishes into GPS and refreshes of the engines; checkpoint staging; held-out validation; planner decisions; step ends |
| 3 run                 | (async) shift plans             | one span per shift plan, start to completion (plans overlap) |
| 4 load                | counters                        | per inference role: running and queued sequences, KV tokens used and capacity (`role_load` records) |

Timestamps are microseconds on the run's clock (simulated seconds in the simulator), shifted so that
the earliest event is at 0 (the validation before a real run ends when its clock starts). Slices on
one track never overlap: a slice that would is started where the previous one ends.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pivotrl.report.timeline import Timeline, number, slot_devices

TRACE_JSON = "trace.json"

PID_ROLES, PID_OPS, PID_RUN, PID_LOAD = 1, 2, 3, 4
#: tracks of the run process
RUN_TRACKS = {"training": 1, "weights": 2, "checkpoints": 3, "validation": 4, "planner": 5, "steps": 6}


def _us(t: float) -> float:
    return round(float(t) * 1e6, 3)


class _Events:
    """The trace's events as they are made (seconds in; the time shift and the no-overlap rule at
    the end, `done`)."""

    def __init__(self) -> None:
        self.slices: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self.other: list[dict[str, Any]] = []
        self._async = 0

    def slice(self, pid: int, tid: int, name: str, start: float, end: float, **args: Any) -> None:
        if end > start:
            self.slices.setdefault((pid, tid), []).append(
                {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": start, "dur": end - start, "args": args})

    def mark(self, pid: int, tid: int, name: str, t: float, **args: Any) -> None:
        self.other.append({"ph": "i", "s": "t", "name": name, "pid": pid, "tid": tid, "ts": t, "args": args})

    def span(self, name: str, start: float, end: float, **args: Any) -> None:
        """An async span on the run process (spans may overlap)."""
        self._async += 1
        ev = {"cat": "shift", "name": name, "pid": PID_RUN, "tid": 0, "id": self._async}
        self.other += [{**ev, "ph": "b", "ts": start, "args": args}, {**ev, "ph": "e", "ts": end}]

    def counter(self, name: str, t: float, **values: float) -> None:
        self.other.append({"ph": "C", "name": name, "pid": PID_LOAD, "tid": 0, "ts": t, "args": values})

    def done(self, names: dict[tuple[int, int | None], str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for evs in self.slices.values():
            evs.sort(key=lambda e: e["ts"])
            end = None
            for e in evs:
                if end is not None and e["ts"] < end:  # no overlap on a track
                    e["dur"] -= end - e["ts"]
                    e["ts"] = end
                if e["dur"] > 0:
                    out.append(e)
                    end = e["ts"] + e["dur"]
        out += self.other
        t0 = min([0.0] + [e["ts"] for e in out])
        for e in out:  # the end rounded as the next start is, so rounding never makes slices overlap
            start = e["ts"] - t0
            e["ts"] = _us(start)
            if "dur" in e:
                e["dur"] = round(_us(start + e["dur"]) - e["ts"], 3)
        out = [e for e in out if e.get("dur", 1) > 0]  # a slice shorter than the rounding
        meta = []
        for (pid, tid), name in sorted(names.items(), key=lambda x: (x[0][0], -1 if x[0][1] is None else x[0][1])):
            if tid is None:
                meta += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}},
                         {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                          "args": {"sort_index": pid}}]
            else:
                meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}})
        return meta + sorted(out, key=lambda e: e["ts"])


def _shift_halves(ev: _Events, tl: Timeline) -> None:
    """Each device's halves of each completed shift: as measured per device (real runtimes), else
    the plan's own halves on every device of it (the simulator)."""
    for sh in tl.shifts:
        if sh.end is None:
            continue
        ev.span(f"shift {sh.role_up} up", sh.start, sh.end, up=list(sh.up), down=list(sh.down), penalty=sh.penalty)
        down_s = sh.halves[0] if sh.halves else 0.0
        if sh.timings:
            for t in sh.timings:
                d, secs = t.get("device"), number(t.get("seconds"))
                if not isinstance(d, int) or secs is None:
                    continue
                start = sh.start if t.get("direction") == "down" else sh.start + down_s
                cold = " (cold)" if t.get("cold") else ""
                ev.slice(PID_OPS, d, f"{t.get('direction')} {t.get('role')}{cold}", start, min(start + secs, sh.end),
                         seconds=secs, cold=bool(t.get("cold")), version=t.get("version"))
        elif sh.halves:
            up_s = sh.halves[1]
            for slot in sh.down:
                role, devs = slot_devices(slot)
                for d in devs:
                    ev.slice(PID_OPS, d, f"down {role}", sh.start, sh.start + down_s, seconds=down_s)
            for slot in sh.up:
                role, devs = slot_devices(slot)
                for d in devs:
                    ev.slice(PID_OPS, d, f"up {role}", sh.start + down_s, sh.start + down_s + up_s, seconds=up_s)


def _record_spans(ev: _Events, tl: Timeline) -> None:
    """Spans and counters of the other records (weights, checkpoints, validation, planner, load)."""
    run = RUN_TRACKS
    for t, r in tl.records:
        kind = r.get("kind")
        if kind == "weight_publish":
            secs = number(r.get("seconds")) or 0.0
            ev.slice(PID_RUN, run["weights"], f"publish v{r.get('version')}", t - secs, t, seconds=secs)
        elif kind == "weight_refresh":
            wait = number(r.get("wait_s")) or 0.0
            ev.slice(PID_RUN, run["weights"], f"refresh v{r.get('version')}", t - wait, t, wait_s=wait)
            for x in r.get("devices") or []:
                secs = number(x.get("seconds")) if isinstance(x, dict) else None
                if secs is not None and isinstance(x.get("device"), int):
                    ev.slice(PID_OPS, x["device"], f"load v{r.get('version')}", t - wait, t - wait + secs,
                             seconds=secs, bytes=x.get("bytes"), path=x.get("path"))
        elif kind == "checkpoint":
            secs = number(r.get("step_blocked_s")) or 0.0
            ev.slice(PID_RUN, run["checkpoints"], f"checkpoint v{r.get('version')}", t - secs, t,
                     background=r.get("background"), path=r.get("path"))
        elif kind == "checkpoint_finished":
            ev.mark(PID_RUN, run["checkpoints"], "checkpoint written", t, path=r.get("path"), wait_s=r.get("wait_s"))
        elif kind == "validation":
            secs = number(r.get("seconds")) or 0.0
            ev.slice(PID_RUN, run["validation"], f"validation {r.get('which')}", t - secs, t,
                     accuracy=r.get("accuracy"), greedy=r.get("greedy"))
        elif kind == "decision":
            ev.mark(PID_RUN, run["planner"], "decision", t, reason=r.get("reason"), role_up=r.get("role_up"),
                    applied=r.get("applied"))
        elif kind == "role_load":
            for role in ("rollout", "reward"):
                x = r.get(role)
                if isinstance(x, dict):
                    ev.counter(f"{role} sequences", t, running=x.get("running", 0), queued=x.get("queued", 0))
                    ev.counter(f"{role} KV tokens", t, used=x.get("kv_used", 0), capacity=x.get("kv_capacity", 0))


def chrome_trace(tl: Timeline, title: str = "") -> dict[str, Any]:
    """The trace of timeline `tl` (module docstring) as a Chrome trace JSON object."""
    ev = _Events()
    for iv in tl.intervals:
        ev.slice(PID_ROLES, iv.device, iv.role, iv.start, iv.end)
    for t, d in tl.deaths:
        ev.mark(PID_ROLES, d, "device death", t)
    _shift_halves(ev, tl)
    for step, a, b in tl.training:
        ev.slice(PID_RUN, RUN_TRACKS["training"], f"train step {step}", a, b)
    for step, t in tl.steps:
        ev.mark(PID_RUN, RUN_TRACKS["steps"], f"step {step} done", t)
    _record_spans(ev, tl)
    names: dict[tuple[int, int | None], str] = {
        (PID_ROLES, None): "devices: role held", (PID_OPS, None): "devices: shift halves and weight loads",
        (PID_RUN, None): "run", (PID_LOAD, None): "load per role"}
    for d in range(tl.num_devices):
        names[(PID_ROLES, d)] = names[(PID_OPS, d)] = f"device {d}"
    for name, tid in RUN_TRACKS.items():
        names[(PID_RUN, tid)] = name
    return {"traceEvents": ev.done(names), "displayTimeUnit": "ms",
            "otherData": {"run": title, "clock": "seconds on the run's clock, as microseconds from its first event"}}


def write_trace(run_dir: Path | str, out: Path | str | None = None) -> Path:
    """`run_dir`'s trace into `out` (default `run_dir/trace.json`); returns the path."""
    from pivotrl.report.records import RunRecords

    rec = RunRecords.read(run_dir)
    path = Path(out) if out is not None else Path(run_dir) / TRACE_JSON
    path.write_text(json.dumps(chrome_trace(rec.timeline_view(), f"{rec.label()} ({rec.name})")))
    return path
