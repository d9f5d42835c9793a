"""Named fault points of the real device loop, for deterministic kill tests (test-only in effect).

The driver and the executor call `point(phase, device, actor)` at each place where a device may
die: just before a `submit` reaches it, after a poll of it reported tokens or completions, before a
shift down or shift up call, before a training step, before a weight publish, when a
training-home device holding the trainer's offloaded state was lent to inference, and before a
respawned device is re-hosted (`PHASES`). With no hook installed
(every real run) `point` returns at once. A test installs one with `set_hook(fn)`; `fn(phase,
device, actor)` runs synchronously in the loop, so a kill it makes lands exactly at that phase
(`kill_at` is such a hook: it kills one device once and waits until Ray reports the actor dead;
`stall_at` makes the device hang instead, holding its step lock as a stuck engine call would, so
the call that follows runs into its time limit, `cluster.limits.*`).
"""
from __future__ import annotations

import time
from typing import Any, Callable

PHASES = ("submit", "poll", "shift_down", "shift_up", "train", "publish", "lent_home", "rehost")

_hook: Callable[[str, int, Any], None] | None = None


def set_hook(fn: Callable[[str, int, Any], None] | None) -> None:
    """Install (or with None remove) the fault hook."""
    global _hook
    _hook = fn


def point(phase: str, device: int, actor: Any) -> None:
    """The device loop reached `phase` for `device` (whose actor is `actor`)."""
    if _hook is not None:
        _hook(phase, device, actor)


def kill_at(phase: str | tuple[str, ...], device: int | None = None, after: int = 0, times: int = 1,
            when: Callable[[], bool] | None = None) -> Callable:
    """A hook that kills the actor from the `after`-th time (0 = the first) `phase` (or any of a
    tuple of phases) is reached for `device` (any device when None) while `when()` holds, `times`
    times in all; `fired` lists the (phase, device) it killed."""
    phases = (phase,) if isinstance(phase, str) else tuple(phase)
    for ph in phases:
        if ph not in PHASES:
            raise ValueError(f"fault phase {ph!r}: allowed {', '.join(PHASES)}")
    seen = [0]

    def hook(ph: str, dev: int, actor: Any) -> None:
        if ph not in phases or (device is not None and dev != device) or len(hook.fired) >= times:
            return
        if when is not None and not when():
            return
        if seen[0] < after:
            seen[0] += 1
            return
        import ray

        ray.kill(actor, no_restart=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a call made after this returns must find it dead
            try:
                ray.get(actor.ping.remote(), timeout=5)
            except Exception:
                break
            time.sleep(0.05)
        hook.fired.append((ph, dev))

    hook.fired = []
    return hook


def stall_at(phase: str, device: int, seconds: float, times: int = 1) -> Callable:
    """A hook that, the first `times` times `phase` is reached for `device`, makes that device's
    actor hold its step lock for `seconds` (`DeviceWorker.stall`) before the call goes on: the
    call then waits behind a hung device. `fired` lists the (phase, device) it stalled."""
    if phase not in PHASES:
        raise ValueError(f"fault phase {phase!r}: allowed {', '.join(PHASES)}")

    def hook(ph: str, dev: int, actor: Any) -> None:
        if ph != phase or dev != device or len(hook.fired) >= times:
            return
        import ray

        ray.get(actor.stall.remote(seconds), timeout=60)
        hook.fired.append((ph, dev))

    hook.fired = []
    return hook
