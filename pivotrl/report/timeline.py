"""What a run did, rebuilt from its records: a pure function of `timeline.jsonl` and `metrics.jsonl` rows.

Owns `build_timeline(timeline_rows, metrics_rows, num_devices) -> Timeline`: per-device intervals by
role (rollout, reward, train, free, shifting) that cover every device from 0 to the end of the run
with no gap and no overlap; each shift once, with its start, end, devices and penalty; the step
boundaries and the training intervals (from metrics rows); per-role throughput series, actual and
modelled; the planner's decisions with their benefit; device deaths. Knows nothing of matplotlib,
wandb or the runtimes: it reads plain dicts (the formats below), so it works on a copied folder.

Record formats it reads (written by `pivotrl/deploy/base.py`, `pivotrl/deploy/pivot.py`,
`pivotrl/sim/runtime.py` and `pivotrl/runtime/local.py` through `Tracker.log_event`/`log_step`):
- `shift` {now, role_up, up: [slot_id], down: [slot_id], penalty}: a plan starts; every device of
  `up` and `down` is shifting from `now`. A slot id is `role@first_devicextp` (`core.types.Slot`).
- `allocation` {now, allocation, shift_seconds: [down_s, up_s]}: a plan completed (the controller's
  `ShiftDone`). The record does not name its plan, so it is matched to the in-flight plan whose
  start + down_s + up_s is closest to `now` without passing it (exact in the simulator, where a
  shift ends exactly then; on real devices the driver sees the end a poll later, and the tie goes
  to the plan started first). The real runtimes write a `shift_timing` {now, role_up, devices:
  [{device, direction, seconds}]} just before the allocation record of the same plan: when there
  is one, only in-flight plans of that `role_up` holding those devices are candidates (plans
  started together, as at start-up, are then told apart). Then `down` devices not also in `up`
  become free, `up` devices take `role_up`.
- `decision` {now, role_up, reason, chosen, candidates: [{k, up, down, penalty, benefit, ...}],
  applied, trigger}: one planner call; its benefit is that of the chosen candidate (the candidate
  with the chosen plan's `up`), else the largest candidate benefit.
- `throughput` (written by the simulator, `models.sim.throughput_sample_s`; read from any runtime
  that writes it): {now, rollout, reward, overall (modelled: what the planner sees), actual:
  {rollout, reward} (tokens emitted over the interval since the previous sample / interval),
  actual_total}.
- `device_death` {now, device, role}; `resume` {now, version}: a resumed run appends to the same
  files with its clock restarted at 0, so the records after a `resume` (and the metrics rows from
  where `time_s` goes back) are shifted to start where the previous segment ended (its last record
  or step end, whichever is later), and every device starts that segment free.
- metrics rows {step, time_s, train_start, train_end, role_state?: {role: {throughput_tokens_per_s}},
  allocation}: step boundaries at `time_s`, training intervals [train_start, train_end].

Throughput on real devices: `cluster=local|ray` write no `throughput` records, so the actual
series per role is each metrics row's `role_state.<role>.throughput_tokens_per_s` (the monitor's
windowed rate of tokens the engines emitted, at each step end), and the modelled series is, at
each applied decision, the planner's modelled throughput of the plan it chose
(`candidates[chosen].role_throughput`, and `throughput` for overall).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

ROLES = ("rollout", "reward", "train", "free", "shifting")
"""Device states, in drawing order."""
SERIES_ROLES = ("rollout", "reward", "overall")
"""Throughput series: one per inference role and paper Eq. 1's overall."""
EPS = 1e-6


@dataclass(frozen=True)
class Interval:
    """Device `device` was in state `role` over [start, end)."""

    device: int
    start: float
    end: float
    role: str

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Shift:
    """One plan: devices `devices` shift from `start` to `end` (None: still in flight at the end)."""

    start: float
    end: float | None
    role_up: str
    up: tuple[str, ...]
    down: tuple[str, ...]
    devices: tuple[int, ...]
    penalty: float


@dataclass(frozen=True)
class Decision:
    """One planner call that weighed candidates or applied a plan."""

    now: float
    role_up: str | None
    applied: bool
    k: int
    """Replicas the chosen plan shifts up (0 if none was chosen)."""
    benefit: float | None
    penalty: float | None
    trigger: str
    reason: str


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    v: list[float] = field(default_factory=list)

    def add(self, t: float, v: Any) -> None:
        x = number(v)
        if x is not None:
            self.t.append(t)
            self.v.append(x)


@dataclass
class Timeline:
    num_devices: int
    end: float
    intervals: list[Interval]
    """Sorted by device, then start."""
    shifts: list[Shift]
    steps: list[tuple[int, float]]
    """(step, time it ended)."""
    training: list[tuple[int, float, float]]
    """(step, train_start, train_end)."""
    throughput: dict[str, dict[str, Series]]
    """role (`SERIES_ROLES`) -> view (`actual`, `modelled`) -> series."""
    decisions: list[Decision]
    deaths: list[tuple[float, int]]
    """(time, device)."""

    def device_intervals(self, device: int) -> list[Interval]:
        return [iv for iv in self.intervals if iv.device == device]

    def device_seconds(self) -> dict[str, float]:
        """Device-seconds spent in each state (adds up to num_devices * end)."""
        out = {r: 0.0 for r in ROLES}
        for iv in self.intervals:
            out[iv.role] += iv.seconds
        return out

    def largest_decisions(self, n: int = 6) -> list[Decision]:
        """The `n` applied decisions of largest benefit, largest first."""
        got = [d for d in self.decisions if d.applied and d.benefit is not None]
        return sorted(got, key=lambda d: -d.benefit)[:n]


def number(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, str):
        try:
            v = float(v)  # to_jsonable writes "inf" / "-inf"
        except ValueError:
            return None
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


def slot_devices(slot_id: str) -> tuple[str, tuple[int, ...]]:
    """`"rollout@16x2"` -> ("rollout", (16, 17))."""
    try:
        role, rest = slot_id.split("@")
        first, tp = rest.split("x")
        return role, tuple(range(int(first), int(first) + int(tp)))
    except ValueError:
        raise ValueError(f"bad slot id {slot_id!r} in timeline.jsonl (expected role@FIRSTxTP)") from None


class _Devices:
    """Per-device state machine: each device has one open interval; `set` closes it at `t`."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.state = ["free"] * n
        self.since = [0.0] * n
        self.done: list[Interval] = []

    def grow(self, d: int) -> None:
        while d >= self.n:  # a device beyond the configured count (old folders): keep it, free from 0
            self.state.append("free")
            self.since.append(0.0)
            self.n += 1

    def set(self, d: int, role: str, t: float) -> None:
        self.grow(d)
        if self.state[d] == role:
            return
        t = max(t, self.since[d])  # never backwards: records are written in clock order
        if t > self.since[d]:
            self.done.append(Interval(d, self.since[d], t, self.state[d]))
        self.state[d], self.since[d] = role, t

    def close(self, end: float) -> list[Interval]:
        out = list(self.done)
        for d in range(self.n):
            if end > self.since[d]:
                out.append(Interval(d, self.since[d], end, self.state[d]))
        # merge neighbours of the same state (a device whose state was set to itself via a plan)
        out.sort(key=lambda iv: (iv.device, iv.start))
        merged: list[Interval] = []
        for iv in out:
            if merged and merged[-1].device == iv.device and merged[-1].role == iv.role \
                    and abs(merged[-1].end - iv.start) <= EPS:
                merged[-1] = Interval(iv.device, merged[-1].start, iv.end, iv.role)
            else:
                merged.append(iv)
        return merged


@dataclass
class _Open:
    seq: int
    start: float
    rec: dict[str, Any]
    devices: tuple[int, ...]
    up_devices: tuple[int, ...]


def _decision(rec: dict[str, Any], t: float) -> Decision:
    chosen = rec.get("chosen") or None
    cands = rec.get("candidates") or []
    benefit = penalty = None
    k = 0
    if chosen:
        k = len(chosen.get("up") or [])
        penalty = number(chosen.get("penalty"))
        match = [c for c in cands if list(c.get("up") or []) == list(chosen.get("up") or [])]
        if match:
            benefit = number(match[0].get("benefit"))
    if benefit is None and cands:
        vals = [b for b in (number(c.get("benefit")) for c in cands) if b is not None]
        benefit = max(vals) if vals else None
    return Decision(now=t, role_up=rec.get("role_up"), applied=bool(rec.get("applied", chosen is not None)),
                    k=k, benefit=benefit, penalty=penalty, trigger=str(rec.get("trigger", "")),
                    reason=str(rec.get("reason", "")))


def _chosen_candidate(rec: dict[str, Any]) -> dict[str, Any] | None:
    chosen = rec.get("chosen")
    if not chosen:
        return None
    for c in rec.get("candidates") or []:
        if list(c.get("up") or []) == list(chosen.get("up") or []):
            return c
    return None


def build_timeline(timeline_rows: Iterable[dict[str, Any]], metrics_rows: Iterable[dict[str, Any]],
                   num_devices: int) -> Timeline:
    """Records -> `Timeline` (module docstring). `num_devices` is the run's device count (config)."""
    devs = _Devices(int(num_devices))
    shifts: list[tuple[int, Shift]] = []
    open_: list[_Open] = []
    decisions: list[Decision] = []
    deaths: list[tuple[float, int]] = []
    thr = {r: {"actual": Series(), "modelled": Series()} for r in SERIES_ROLES}
    samples = False
    # a resumed run restarts its clock: split metrics rows into segments where time_s goes back,
    # and give segment k the offset where segment k-1 ended (in the timeline or the metrics)
    metrics_rows = [r for r in metrics_rows if number(r.get("time_s")) is not None]
    m_seg, m_end = [], []
    for row in metrics_rows:
        ts = number(row["time_s"])
        if m_end and ts < m_end[-1] - EPS:
            m_end.append(ts)
        elif not m_end:
            m_end.append(ts)
        else:
            m_end[-1] = ts
        m_seg.append(len(m_end) - 1)
    offsets = [0.0]
    seg_max = 0.0  # the current segment's latest local time in the timeline
    offset, last_t = 0.0, 0.0

    def close_open(t: float) -> None:
        for o in open_:
            shifts.append((o.seq, _shift(o, None)))
        open_.clear()

    seq = itertools.count()  # shifts keep their record order
    timing: dict[str, Any] | None = None  # the real runtimes' `shift_timing`, just before its allocation
    for rec in timeline_rows:
        kind = rec.get("kind")
        if kind == "resume":
            k = len(offsets) - 1
            offset += max(seg_max, m_end[k] if k < len(m_end) else 0.0)
            offsets.append(offset)
            seg_max = 0.0
            close_open(offset)
            for d in range(devs.n):
                devs.set(d, "free", offset)
            last_t = max(last_t, offset)
        raw = number(rec.get("now"))
        if raw is not None:
            seg_max = max(seg_max, raw)
        t = (raw + offset) if raw is not None else last_t
        last_t = max(last_t, t)
        if kind == "shift":
            up = [d for s in rec.get("up") or [] for d in slot_devices(s)[1]]
            down = [d for s in rec.get("down") or [] for d in slot_devices(s)[1]]
            ds = tuple(sorted(set(up) | set(down)))
            for d in ds:
                devs.set(d, "shifting", t)
            open_.append(_Open(next(seq), t, rec, ds, tuple(sorted(set(up)))))
        elif kind == "shift_timing":
            timing = rec
        elif kind == "allocation":
            secs = sum(x for x in (number(s) for s in rec.get("shift_seconds") or []) if x is not None)
            o = _match(open_, t, secs, timing)
            timing = None
            if o is None:
                continue  # an allocation no plan explains (a file cut mid-run): nothing to move
            open_.remove(o)
            shifts.append((o.seq, _shift(o, t)))
            busy = {d for p in open_ for d in p.devices}
            role_up = str(o.rec.get("role_up"))
            for d in o.devices:
                if d in busy:
                    continue  # another plan in flight still holds it
                devs.set(d, role_up if d in o.up_devices else "free", t)
        elif kind == "decision":
            dec = _decision(rec, t)
            decisions.append(dec)
            c = _chosen_candidate(rec) if dec.applied else None
            if c is not None and not samples:
                rt = c.get("role_throughput") or {}
                thr["rollout"]["modelled"].add(t, rt.get("rollout"))
                thr["reward"]["modelled"].add(t, rt.get("reward"))
                thr["overall"]["modelled"].add(t, c.get("throughput"))
        elif kind == "throughput":
            if not samples:  # samples are the better modelled view: drop decision points
                samples = True
                for r in SERIES_ROLES:
                    thr[r]["modelled"] = Series()
            actual = rec.get("actual") or {}
            for r in ("rollout", "reward"):
                thr[r]["modelled"].add(t, rec.get(r))
                thr[r]["actual"].add(t, actual.get(r))
            thr["overall"]["modelled"].add(t, rec.get("overall"))
            thr["overall"]["actual"].add(t, rec.get("actual_total"))
        elif kind == "device_death":
            d = rec.get("device")
            if isinstance(d, int):
                deaths.append((t, d))

    steps: list[tuple[int, float]] = []
    training: list[tuple[int, float, float]] = []
    m_last = 0.0
    for row, k in zip(metrics_rows, m_seg):
        m_off = offsets[k] if k < len(offsets) else offsets[-1] + sum(m_end[len(offsets) - 1:k])
        ts = number(row["time_s"]) + m_off
        m_last = max(m_last, ts)
        step = int(row.get("step", len(steps) + 1))
        steps.append((step, ts))
        a, b = number(row.get("train_start")), number(row.get("train_end"))
        if a is not None and b is not None:
            training.append((step, a + m_off, b + m_off))
        if not samples:
            rs = row.get("role_state") or {}
            vals = []
            for r in ("rollout", "reward"):
                v = number((rs.get(r) or {}).get("throughput_tokens_per_s"))
                thr[r]["actual"].add(ts, v)
                vals.append(v)
            if all(v is not None for v in vals) and vals:
                thr["overall"]["actual"].add(ts, sum(vals))
    end = max([last_t, m_last] + [b for _, _, b in training])
    close_open(end)
    shifts.sort(key=lambda x: x[0])
    return Timeline(num_devices=devs.n, end=end, intervals=devs.close(end), shifts=[x[1] for x in shifts],
                    steps=steps,
                    training=training, throughput=thr, decisions=decisions, deaths=deaths)


def _shift(o: _Open, end: float | None) -> Shift:
    r = o.rec
    return Shift(start=o.start, end=end, role_up=str(r.get("role_up")), up=tuple(r.get("up") or ()),
                 down=tuple(r.get("down") or ()), devices=o.devices, penalty=number(r.get("penalty")) or 0.0)


def _match(open_: list[_Open], t: float, secs: float, timing: dict[str, Any] | None) -> _Open | None:
    """The in-flight plan an `allocation` record at `t` completes (module docstring)."""
    pool = open_
    if timing is not None:  # real runtimes name the plan's role and devices: keep the plans that fit
        ds = {x.get("device") for x in timing.get("devices") or [] if isinstance(x, dict)}
        fit = [o for o in open_ if str(o.rec.get("role_up")) == str(timing.get("role_up")) and ds <= set(o.devices)]
        pool = fit or open_
    best, best_slack = None, math.inf
    for o in pool:  # started-first order: a tie keeps the earlier plan
        slack = t - (o.start + secs)
        tol = 1e-6 * max(1.0, abs(t))
        if slack < -tol:
            continue
        if slack < best_slack - tol:
            best, best_slack = o, slack
    if best is None and pool:
        best = pool[0]  # measured seconds past the wall span (clock skew): the oldest plan
    return best
