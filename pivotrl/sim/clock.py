"""The simulator's event queue: timed events and the replicas' next completions.

Owns the two heaps the discrete-event driver (`pivotrl.sim.runtime.SimDriver`) pops from, in one
order: runtime events (`tick`, `sample`, `shift_done`, `train_done`, ...) pushed at a time, and each
replica's next completion, keyed by the replica's `epoch` so an entry made stale by a later change
to the replica (a dispatch, an abort, a stall) is dropped when it surfaces. One counter breaks ties
in push order across both heaps; at equal times a runtime event goes before a completion.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any, Mapping

from pivotrl.sim.engine import SimReplica

PASSIVE = ("tick", "sample")  # events that never make progress by themselves


class EventQueue:
    """Timed runtime events and replica completions, popped in time order."""

    def __init__(self) -> None:
        self._events: list[tuple[float, int, str, Any]] = []
        self._finishes: list[tuple[float, int, str, int]] = []
        self._seq = itertools.count()

    def push(self, t: float, kind: str, payload: Any = None) -> None:
        """A runtime event of `kind` at simulated time `t`."""
        heapq.heappush(self._events, (t, next(self._seq), kind, payload))

    def watch(self, rid: str, rep: SimReplica | None) -> None:
        """Queue the next completion (or KV-full moment) of replica `rid` as it stands now."""
        if rep is None:
            return
        t = rep.next_finish()
        if t is not None:
            heapq.heappush(self._finishes, (t, next(self._seq), rid, rep.epoch))

    def pop(self, replicas: Mapping[str, SimReplica]) -> tuple[float, str, Any] | None:
        """The earliest live entry as `(t, kind, payload)`: `kind` "finish" with the replica id as
        payload for a completion; None when nothing is queued."""
        while self._finishes:
            t, _, rid, epoch = self._finishes[0]
            rep = replicas.get(rid)
            if rep is None or rep.epoch != epoch:
                heapq.heappop(self._finishes)
                continue
            break
        te = self._events[0][0] if self._events else float("inf")
        tf = self._finishes[0][0] if self._finishes else float("inf")
        if te == tf == float("inf"):
            return None
        if tf < te:
            t, _, rid, _ = heapq.heappop(self._finishes)
            return t, "finish", rid
        t, _, kind, payload = heapq.heappop(self._events)
        return t, kind, payload

    def empty(self) -> bool:
        return not self._events and not self._finishes

    def work_pending(self, replicas: Mapping[str, SimReplica]) -> bool:
        """A training step, shift or sequence completion is still queued (slow is not stuck)."""
        if any(kind not in PASSIVE for _, _, kind, _ in self._events):
            return True
        return any(rid in replicas and replicas[rid].epoch == ep for _, _, rid, ep in self._finishes)
