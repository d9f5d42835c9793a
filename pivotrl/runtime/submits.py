"""Submits to the device actors, coalesced per device and not waited for (the executor's).

Why: the controller dispatches one sequence at a time (every finished response is judged on its
own), and a submit that waits for its Ray round trip made dispatch the driver's main occupation:
66 s of a 187 s default run, nothing taken in meanwhile (BENCHMARKS.md, "Main job"). So a submit
is only buffered (`add`), every buffered request of a device goes out in one call when the driver
next turns to the devices (`flush`, at the start of each `wait`: the events of one batch share a
call per device), and its result is looked at later (`check`, each `wait`).

What stays exact:
- Order. Ray does not order the calls of a threaded actor, so an abort could overtake a submit of
  the same sequence. Before an abort or a shift reaches a device, every submit to it is sent and
  waited for (`settle`).
- Deaths. A submit that finds its device dead respawns it (`Executor.respawn`, with the
  generation of the handle it used: counted once, whichever call finds the death). A request
  buffered for a device that died (or was retired) since is dropped, never sent to the fresh
  actor: its sequence was placed on the dead device, so the runtime re-queues it with that death.
  A submit still unanswered past `cluster.limits.call_s` once waited for counts as a death (the
  device is replaced).
- Errors. Any other submit failure is raised, as a waited-for submit raised it.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pivotrl.runtime.faults import point
from pivotrl.runtime.outcomes import death_reason

if TYPE_CHECKING:
    from pivotrl.runtime.executor import Executor


class Submits:
    """Buffered and in-flight submits of one executor (module docstring)."""

    def __init__(self, executor: "Executor", dead: Callable[[BaseException], bool]) -> None:
        """`dead(exc)`: whether a call's exception means its actor must be replaced (gone, or past
        its time limit: the executor's test)."""
        self.ex, self.dead = executor, dead
        self._lock = threading.Lock()  # shifts and training run in driver threads
        self._buffer: dict[int, tuple[int, list[Any]]] = {}  # device -> (generation, requests)
        self._inflight: dict[int, list[tuple[Any, int]]] = {}  # device -> [(ref, generation)]
        self.calls = 0  # submit calls sent (one per device per flush)
        self.requests = 0  # requests they carried

    def add(self, device: int, generation: int, requests: list[Any]) -> None:
        """Buffer `requests` for `device`, whose handle had `generation` when they were made."""
        with self._lock:
            gen, buf = self._buffer.setdefault(device, (generation, []))
            if gen != generation:  # the device died and came back since: those are not its own
                buf = []
            self._buffer[device] = (generation, buf + list(requests))

    def flush(self, devices: Iterable[int] | None = None) -> None:
        """Send each device's buffered requests in one call (all devices when None)."""
        with self._lock:
            take = list(self._buffer) if devices is None else [d for d in devices if d in self._buffer]
            out = {d: self._buffer.pop(d) for d in take}
        for d, (gen, reqs) in out.items():
            actor, now = self.ex.handle(d)
            if now != gen or not self.ex.reachable(d):
                continue  # died since: the runtime re-queues these with that death
            point("submit", d, actor)
            ref = actor.submit.remote(reqs)
            with self._lock:
                self._inflight.setdefault(d, []).append((ref, gen))
                self.calls += 1
                self.requests += len(reqs)

    def check(self) -> None:
        """Look at the submits that have finished: a dead device is respawned, another error raised."""
        import ray

        with self._lock:
            refs = [r for calls in self._inflight.values() for r, _ in calls]
        if not refs:
            return
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        self._settle_refs(set(ready))

    def settle(self, devices: Iterable[int] | None = None) -> None:
        """Send and wait for every submit to `devices` (all when None): before an abort or a shift
        reaches them (module docstring: Order)."""
        devices = None if devices is None else list(devices)
        self.flush(devices)
        with self._lock:
            take = list(self._inflight) if devices is None else [d for d in devices if d in self._inflight]
            refs = {r for d in take for r, _ in self._inflight[d]}
        if refs:
            self._settle_refs(refs)

    def pending(self) -> bool:
        """Whether any submit is buffered or in flight."""
        with self._lock:
            return bool(self._buffer) or any(self._inflight.values())

    def _settle_refs(self, refs: set[Any]) -> None:
        """Wait for `refs` (each a submit in flight, within `cluster.limits.call_s`) and take their
        outcomes."""
        with self._lock:
            done = [(d, r, g) for d, calls in self._inflight.items() for r, g in calls if r in refs]
            for d in {d for d, _, _ in done}:
                self._inflight[d] = [(r, g) for r, g in self._inflight[d] if r not in refs]
                if not self._inflight[d]:
                    del self._inflight[d]
        t0, limit = time.monotonic(), self.ex.limits.of("call")
        for d, ref, gen in done:
            try:
                self.ex.limits.wait(ref, limit, "submit", d, t0)
            except Exception as e:
                if not self.dead(e):
                    raise
                self.ex.respawn(d, death_reason("submit", e), gen)
