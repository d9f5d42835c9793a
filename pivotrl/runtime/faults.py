"""Named fault points of the real device loop, for kill tests and the chaos soak (test-only in effect).

The driver and the executor call `point(phase, device, actor)` at each place where a device may die:
just before a `submit` reaches it, after a poll of it reported tokens or completions, before a shift
down or shift up call, before a training step, once a checkpoint's background write has started on
the training ranks, before a weight publish (the rollout engines' weight load), when a training-home
device holding the trainer's offloaded state was lent to inference, and before a respawned device is
re-hosted (`PHASES`). With no hook installed (every real run) `point` returns at once. A test
installs one with `set_hook(fn)`; `fn(phase, device, actor)` runs synchronously in the loop, so a
kill it makes lands exactly at that phase. Three such hooks: `kill_at` kills one device once
(deterministic kill tests), `Chaos` kills a device every N seconds or every N fault points, cycling
through the phases (`python -m pivotrl.bench chaos`); each kill waits until Ray reports the actor
dead (`kill_device`). `stall_at` makes a device hang instead, holding its step lock as a stuck
engine call would, so the call that follows runs into its time limit (`cluster.limits.*`).
"""
from __future__ import annotations

import time
from typing import Any, Callable

PHASES = ("submit", "poll", "shift_down", "shift_up", "train", "checkpoint", "publish", "lent_home", "rehost")

_hook: Callable[[str, int, Any], None] | None = None


def set_hook(fn: Callable[[str, int, Any], None] | None) -> None:
    """Install (or with None remove) the fault hook."""
    global _hook
    _hook = fn


def point(phase: str, device: int, actor: Any) -> None:
    """The device loop reached `phase` for `device` (whose actor is `actor`)."""
    if _hook is not None:
        _hook(phase, device, actor)


def kill_device(actor: Any, timeout_s: float = 60.0) -> None:
    """Kill a device's actor and return once Ray reports it dead (a call made after this returns
    finds it dead)."""
    import ray

    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=5)
        except Exception:
            return
        time.sleep(0.05)


def _check_phases(phases: tuple[str, ...]) -> None:
    for ph in phases:
        if ph not in PHASES:
            raise ValueError(f"fault phase {ph!r}: allowed {', '.join(PHASES)}")


def kill_at(phase: str | tuple[str, ...], device: int | None = None, after: int = 0, times: int = 1,
            when: Callable[[], bool] | None = None) -> Callable:
    """A hook that kills the actor from the `after`-th time (0 = the first) `phase` (or any of a
    tuple of phases) is reached for `device` (any device when None) while `when()` holds, `times`
    times in all; `fired` lists the (phase, device) it killed."""
    phases = (phase,) if isinstance(phase, str) else tuple(phase)
    _check_phases(phases)
    seen = [0]

    def hook(ph: str, dev: int, actor: Any) -> None:
        if ph not in phases or (device is not None and dev != device) or len(hook.fired) >= times:
            return
        if when is not None and not when():
            return
        if seen[0] < after:
            seen[0] += 1
            return
        kill_device(actor)
        hook.fired.append((ph, dev))

    hook.fired = []
    return hook


class Chaos:
    """A hook that kills a device every `every` seconds (`unit="s"`) or every `every` fault points
    (`unit="points"`: any phase, any device), in turn at each of `phases`.

    Every `every` units (from the first fault point) it arms for the next phase of the cycle; the
    `skip`-th point of that phase reached after that (`skip` drawn from 0..2 by the seeded
    `random.Random(seed)`, so the device varies) kills the device there, and the interval restarts.
    A phase not reached within `every` more units (a pivot run that never shifts down while armed, a
    checkpoint that is not due) is passed over for the next one (`missed` counts them). Seconds suit
    a soak of a given length; points make a short run's kills independent of how fast it goes (a run
    on warm devices can end before a clock's first kill). `fired` lists each kill:
    `{"t": units since the first point, "phase", "device"}`."""

    UNITS = ("s", "points")

    def __init__(self, every: float, phases: tuple[str, ...] = PHASES, seed: int = 0, unit: str = "s") -> None:
        import random

        if unit not in self.UNITS:
            raise ValueError(f"chaos unit={unit!r}: allowed {', '.join(self.UNITS)}")
        if not every > 0:
            raise ValueError(f"chaos every={every} {unit}: must be > 0")
        _check_phases(tuple(phases))
        self.every, self.unit, self.phases, self.rng = float(every), unit, tuple(phases), random.Random(seed)
        self.fired: list[dict[str, Any]] = []
        self.missed: dict[str, int] = {}
        self._t0: float | None = None
        self._points = 0  # fault points seen
        self._due = 0.0  # units (since the first point) the next kill is armed from
        self._turn = 0  # index into phases of the armed one
        self._skip = self.rng.randint(0, 2)

    @property
    def target(self) -> str:
        return self.phases[self._turn % len(self.phases)]

    def _elapsed(self) -> float:
        return time.monotonic() - self._t0 if self.unit == "s" else float(self._points)

    def __call__(self, phase: str, device: int, actor: Any) -> None:
        self._points += 1
        if self._t0 is None:
            self._t0, self._due = time.monotonic(), self.every
        t = self._elapsed()
        if t < self._due:
            return
        if t > self._due + self.every:  # the armed phase did not come: pass it over
            self.missed[self.target] = self.missed.get(self.target, 0) + 1
            self._turn += 1
            self._due = t
        if phase != self.target:
            return
        if self._skip > 0:
            self._skip -= 1
            return
        kill_device(actor)
        self.fired.append({"t": round(t, 3), "phase": phase, "device": int(device)})
        self._turn += 1
        self._skip = self.rng.randint(0, 2)
        self._due = self._elapsed() + self.every


def stall_at(phase: str, device: int, seconds: float, times: int = 1) -> Callable:
    """A hook that, the first `times` times `phase` is reached for `device`, makes that device's
    actor hold its step lock for `seconds` (`DeviceWorker.stall`) before the call goes on: the
    call then waits behind a hung device. `fired` lists the (phase, device) it stalled."""
    _check_phases((phase,))

    def hook(ph: str, dev: int, actor: Any) -> None:
        if ph != phase or dev != device or len(hook.fired) >= times:
            return
        import ray

        ray.get(actor.stall.remote(seconds), timeout=60)
        hook.fired.append((ph, dev))

    hook.fired = []
    return hook
