"""What a run did, rebuilt from its records: a pure function of `timeline.jsonl` and `metrics.jsonl` rows.

Owns `build_timeline(timeline_rows, metrics_rows, num_devices) -> Timeline`: per-device intervals by
role (rollout, reward, train, free, shifting) that cover every device from 0 to the end of the run
with no gap and no overlap; each shift once, with its start, end, devices and penalty; the step
boundaries and the training intervals (from metrics rows); per-role throughput series, actual and
modelled; the planner's decisions with their benefit; device deaths. Knows nothing of matplotlib,
wandb or the runtimes: it reads plain dicts (the formats below), so it works on a copied folder.

Record formats it reads (written by `pivotrl/deploy/base.py`, `pivotrl/deploy/pivot.py`,
`pivotrl/sim/runtime.py` and `pivotrl/runtime/driver.py` (with `runtime/recorder.py`) through `Tracker.log_event`/`log_step`):
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
    halves: tuple[float, float] | None = None
    """(down seconds, up seconds) as the completing `allocation` record measured them."""
    timings: tuple[dict[str, Any], ...] = ()
    """Each device's own half, as the real runtimes' `shift_timing` record gives them: `{device,
    role, direction, seconds, cold, ...}` (none in the simulator)."""


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
    records: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    """Every timeline record with its time on the run's clock (resumed segments shifted like the
    rest), in file order: what the run's trace (`trace.py`) draws its other spans from."""

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
    b = _Builder(int(num_devices), [r for r in metrics_rows if number(r.get("time_s")) is not None])
    for rec in timeline_rows:
        b.feed(rec)
    return b.finish()


def _segments(metrics_rows: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """A resumed run restarts its clock: each row's segment (a new one where `time_s` goes back)
    and each segment's last `time_s`."""
    seg, ends = [], []
    for row in metrics_rows:
        ts = number(row["time_s"])
        if not ends or ts < ends[-1] - EPS:
            ends.append(ts)
        else:
            ends[-1] = ts
        seg.append(len(ends) - 1)
    return seg, ends


class _Builder:
    """The state `build_timeline` carries through the records, one method per record kind."""

    def __init__(self, n: int, metrics_rows: list[dict[str, Any]]) -> None:
        self.devs = _Devices(n)
        self.metrics = metrics_rows
        self.m_seg, self.m_end = _segments(metrics_rows)
        self.offsets = [0.0]  # clock offset of each resumed segment
        self.seg_max = 0.0  # the current segment's latest local time in the timeline
        self.last_t = 0.0
        self.shifts: list[tuple[int, Shift]] = []
        self.open: list[_Open] = []
        self.seq = itertools.count()  # shifts keep their record order
        self.timing: dict[str, Any] | None = None  # `shift_timing`, just before its allocation
        self.decisions: list[Decision] = []
        self.deaths: list[tuple[float, int]] = []
        self.thr = {r: {"actual": Series(), "modelled": Series()} for r in SERIES_ROLES}
        self.samples = False  # `throughput` records seen: they are the series
        self.records: list[tuple[float, dict[str, Any]]] = []

    def feed(self, rec: dict[str, Any]) -> None:
        kind = rec.get("kind")
        if kind == "resume":
            self._resume()
        raw = number(rec.get("now"))
        if raw is not None:
            self.seg_max = max(self.seg_max, raw)
        t = raw + self.offsets[-1] if raw is not None else self.last_t
        self.last_t = max(self.last_t, t)
        self.records.append((t, rec))
        if kind == "shift":
            self._shift(rec, t)
        elif kind == "shift_timing":
            self.timing = rec
        elif kind == "allocation":
            self._allocation(rec, t)
        elif kind == "decision":
            self._decision(rec, t)
        elif kind == "throughput":
            self._throughput(rec, t)
        elif kind == "device_death" and isinstance(rec.get("device"), int):
            self.deaths.append((t, rec["device"]))

    def _resume(self) -> None:
        k = len(self.offsets) - 1
        offset = self.offsets[-1] + max(self.seg_max, self.m_end[k] if k < len(self.m_end) else 0.0)
        self.offsets.append(offset)
        self.seg_max = 0.0
        self._close_open()
        for d in range(self.devs.n):
            self.devs.set(d, "free", offset)
        self.last_t = max(self.last_t, offset)

    def _close_open(self) -> None:
        self.shifts += [(o.seq, _shift(o, None)) for o in self.open]
        self.open.clear()

    def _shift(self, rec: dict[str, Any], t: float) -> None:
        up = [d for s in rec.get("up") or [] for d in slot_devices(s)[1]]
        down = [d for s in rec.get("down") or [] for d in slot_devices(s)[1]]
        ds = tuple(sorted(set(up) | set(down)))
        for d in ds:
            self.devs.set(d, "shifting", t)
        self.open.append(_Open(next(self.seq), t, rec, ds, tuple(sorted(set(up)))))

    def _allocation(self, rec: dict[str, Any], t: float) -> None:
        secs = sum(x for x in (number(s) for s in rec.get("shift_seconds") or []) if x is not None)
        o = _match(self.open, t, secs, self.timing)
        timing, self.timing = self.timing, None
        if o is None:
            return  # an allocation no plan explains (a file cut mid-run): nothing to move
        self.open.remove(o)
        halves = [number(x) for x in rec.get("shift_seconds") or []]
        self.shifts.append((o.seq, _shift(o, t, tuple(halves) if len(halves) == 2 and None not in halves else None,
                                          (timing or {}).get("devices") or ())))
        busy = {d for p in self.open for d in p.devices}
        role_up = str(o.rec.get("role_up"))
        for d in o.devices:
            if d not in busy:  # else another plan in flight still holds it
                self.devs.set(d, role_up if d in o.up_devices else "free", t)

    def _decision(self, rec: dict[str, Any], t: float) -> None:
        dec = _decision(rec, t)
        self.decisions.append(dec)
        c = _chosen_candidate(rec) if dec.applied else None
        if c is not None and not self.samples:
            rt = c.get("role_throughput") or {}
            self.thr["rollout"]["modelled"].add(t, rt.get("rollout"))
            self.thr["reward"]["modelled"].add(t, rt.get("reward"))
            self.thr["overall"]["modelled"].add(t, c.get("throughput"))

    def _throughput(self, rec: dict[str, Any], t: float) -> None:
        if not self.samples:  # samples are the better modelled view: drop decision points
            self.samples = True
            for r in SERIES_ROLES:
                self.thr[r]["modelled"] = Series()
        actual = rec.get("actual") or {}
        for r in ("rollout", "reward"):
            self.thr[r]["modelled"].add(t, rec.get(r))
            self.thr[r]["actual"].add(t, actual.get(r))
        self.thr["overall"]["modelled"].add(t, rec.get("overall"))
        self.thr["overall"]["actual"].add(t, rec.get("actual_total"))

    def finish(self) -> Timeline:
        steps: list[tuple[int, float]] = []
        training: list[tuple[int, float, float]] = []
        m_last, offs = 0.0, self.offsets
        for row, k in zip(self.metrics, self.m_seg):
            # a restart the timeline has no `resume` record for continues from the previous segment
            off = offs[k] if k < len(offs) else offs[-1] + sum(self.m_end[len(offs) - 1:k])
            ts = number(row["time_s"]) + off
            m_last = max(m_last, ts)
            step = int(row.get("step", len(steps) + 1))
            steps.append((step, ts))
            a, b = number(row.get("train_start")), number(row.get("train_end"))
            if a is not None and b is not None:
                training.append((step, a + off, b + off))
            if not self.samples:
                rs = row.get("role_state") or {}
                vals = [number((rs.get(r) or {}).get("throughput_tokens_per_s")) for r in ("rollout", "reward")]
                self.thr["rollout"]["actual"].add(ts, vals[0])
                self.thr["reward"]["actual"].add(ts, vals[1])
                if all(v is not None for v in vals):
                    self.thr["overall"]["actual"].add(ts, sum(vals))
        end = max([self.last_t, m_last] + [b for _, _, b in training])
        self._close_open()
        self.shifts.sort(key=lambda x: x[0])
        return Timeline(num_devices=self.devs.n, end=end, intervals=self.devs.close(end),
                        shifts=[x[1] for x in self.shifts], steps=steps, training=training,
                        throughput=self.thr, decisions=self.decisions, deaths=self.deaths, records=self.records)


def _shift(o: _Open, end: float | None, halves: tuple[float, float] | None = None,
           timings: Iterable[Any] = ()) -> Shift:
    r = o.rec
    return Shift(start=o.start, end=end, role_up=str(r.get("role_up")), up=tuple(r.get("up") or ()),
                 down=tuple(r.get("down") or ()), devices=o.devices, penalty=number(r.get("penalty")) or 0.0,
                 halves=halves, timings=tuple(x for x in timings if isinstance(x, dict)))


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
