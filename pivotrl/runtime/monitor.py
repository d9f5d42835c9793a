"""Per-role workload state of a real run, and the throughput model fitted online from the engines.

Owns: collecting what device polls report (completed tokens, per-iteration timing samples, KV
use), the per-role state the planner and the records need (running and queued sequences, measured
throughput, KV utilisation, batch readiness), and the online fit of the decode model
`tau = A*K + max(B, C*N) + D` with core's `ThroughputModel.fit`, the same fitting code the
simulator's calibration uses. There is no offline profiling step: until a role has enough samples
the prior model the runtime started with stays in use.

Knows nothing about Ray or devices beyond the `DevicePoll` fields it reads.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import INFERENCE_ROLES, Role

#: Fit only once a role has this many decode samples with at least 3 distinct batch sizes N.
MIN_FIT_SAMPLES = 24
#: Samples kept per role (a sliding window: the load changes as lengths grow).
MAX_SAMPLES = 4096


@dataclass
class RoleState:
    """One role's load now (a record for timeline.jsonl and the console)."""

    role: str
    replicas: int = 0
    running: int = 0
    queued: int = 0
    kv_tokens: int = 0
    kv_capacity: int = 0
    throughput_tokens_per_s: float = 0.0
    """Generated tokens per second over the last window, summed over replicas."""
    batch_ready: bool = False

    @property
    def kv_utilisation(self) -> float:
        return self.kv_tokens / self.kv_capacity if self.kv_capacity else 0.0


@dataclass
class _RoleData:
    iters: collections.deque = field(default_factory=lambda: collections.deque(maxlen=MAX_SAMPLES))
    prefills: collections.deque = field(default_factory=lambda: collections.deque(maxlen=MAX_SAMPLES))
    tokens: collections.deque = field(default_factory=collections.deque)  # (time, tokens)
    load: dict[int, Any] = field(default_factory=dict)  # device -> last EngineStats
    fits: int = 0


class Monitor:
    """Folds device polls into per-role state and fits each role's throughput model online."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self.data: dict[Role, _RoleData] = {r: _RoleData() for r in INFERENCE_ROLES}
        self.fitted: dict[Role, ThroughputModel] = {}

    def ingest(self, role: Role, device: int, stats: Any, new_tokens: int, now: float | None = None) -> None:
        """One poll of `device` serving `role`: its EngineStats (samples drained) and new tokens."""
        if role not in self.data:
            return
        d = self.data[role]
        now = time.monotonic() if now is None else now
        if stats is not None:
            d.load[device] = stats
            d.iters.extend((s.num_seqs, s.kv_tokens, s.seconds) for s in stats.iterations if s.num_seqs > 0)
            d.prefills.extend((s.tokens, s.seconds) for s in stats.prefills)
        if new_tokens:
            d.tokens.append((now, new_tokens))
        while d.tokens and d.tokens[0][0] < now - self.window_s:
            d.tokens.popleft()

    def forget(self, device: int) -> None:
        """A device left its role (shift down or death): its load no longer counts."""
        for d in self.data.values():
            d.load.pop(device, None)

    def samples(self, role: Role) -> list[tuple[int, int, float]]:
        return list(self.data[role].iters)

    def fit(self, role: Role) -> ThroughputModel | None:
        """Refit `role`'s model from its samples; None while there are too few to trust."""
        d = self.data[role]
        if len(d.iters) < MIN_FIT_SAMPLES or len({n for n, _, _ in d.iters}) < 3:
            return None
        try:
            model = ThroughputModel.fit(list(d.iters), list(d.prefills))
        except (ValueError, ArithmeticError):
            return None
        self.fitted[role] = model
        d.fits += 1
        return model

    def state(self, role: Role, scheduler: Any = None, batch_ready: bool = False,
              now: float | None = None) -> RoleState:
        d = self.data[role]
        now = time.monotonic() if now is None else now
        span = min(self.window_s, max(1e-9, now - d.tokens[0][0])) if d.tokens else 0.0
        toks = sum(t for _, t in d.tokens)
        st = RoleState(role=role.value, replicas=len(d.load), batch_ready=batch_ready,
                       running=sum(s.running for s in d.load.values()),
                       kv_tokens=sum(s.kv_tokens for s in d.load.values()),
                       kv_capacity=sum(s.kv_capacity_tokens for s in d.load.values()),
                       throughput_tokens_per_s=toks / span if span > 0 else 0.0)
        if scheduler is not None:
            st.queued = scheduler.queued()
        return st
