"""Per-role workload state of a real run, and the throughput model fitted online from the engines.

Owns: collecting what device polls report (completed tokens, per-iteration timing samples, KV
use), the per-role state the planner and the records need (running and queued sequences, measured
throughput, KV utilisation, batch readiness), and the online fit of the decode model
`tau = A*K + max(B, C*N) + D` with core's `ThroughputModel.fit`, the same fitting code the
simulator's calibration uses. There is no offline profiling step: until a role has enough samples
the prior model the runtime started with stays in use.

What the fit is made to predict: the time a replica actually spends, on average, at a given load.
Two steps on top of core's fit make it so (`fit_delivered`):
- Prefill per sequence. Engines prefill the sequences admitted together as one batch and report one
  sample for the batch; the model's `prefill_time(L)` is charged per sequence (by the scheduler's
  migration cost and by the simulator). So each batched sample of m sequences and L tokens enters
  the fit as m samples of its per-sequence share: (L/m tokens, seconds/m).
- Mean-preserving scale. Core's fit minimises the *relative* error of each sample. On shared cores
  the timing noise is heavy-tailed (a descheduled iteration takes tens of times its typical time;
  measured on the default run: at N=64 the median iteration took 16 ms, the mean 31 ms, the
  longest 1.8 s), and the relative-error optimum then sits near the typical iteration, well below
  the mean (a fit of the raw samples predicted 44 % of the decode time and 28 % of the prefill
  time the engines spent on those very samples). A replica's throughput over time is set by the
  mean. So the fitted shape is kept and its scale is set by the moment condition that the model's
  total time over the fitted samples equals their measured total: decode coefficients (A, B, C, D)
  times sum(seconds) / sum(tau(N, K)) over the decode samples, prefill coefficients (P0, P1, P2)
  likewise over the prefill samples. No constant is chosen: both factors come from the samples.

Knows nothing about Ray or devices beyond the `DevicePoll` fields it reads.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import INFERENCE_ROLES, Role

if TYPE_CHECKING:
    from pivotrl.core.scheduler import ShiftAwareScheduler
    from pivotrl.engines.protocol import EngineStats, PrefillSample

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
    """Generated tokens per second over the last window (at the time of the record), summed over
    replicas; 0 once a role has produced nothing for a whole window."""

    @property
    def kv_utilisation(self) -> float:
        return self.kv_tokens / self.kv_capacity if self.kv_capacity else 0.0


@dataclass
class _RoleData:
    iters: collections.deque = field(default_factory=lambda: collections.deque(maxlen=MAX_SAMPLES))
    prefills: collections.deque = field(default_factory=lambda: collections.deque(maxlen=MAX_SAMPLES))
    tokens: collections.deque = field(default_factory=collections.deque)  # (time, tokens)
    load: dict[int, EngineStats] = field(default_factory=dict)  # device -> last stats
    fits: int = 0


class Monitor:
    """Folds device polls into per-role state and fits each role's throughput model online."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self.data: dict[Role, _RoleData] = {r: _RoleData() for r in INFERENCE_ROLES}

    def ingest(self, role: Role, device: int, stats: EngineStats | None, new_tokens: int, now: float | None = None
               ) -> None:
        """One poll of `device` serving `role`: its EngineStats (samples drained) and new tokens."""
        if role not in self.data:
            return
        d = self.data[role]
        now = time.monotonic() if now is None else now
        if stats is not None:
            d.load[device] = stats
            d.iters.extend((s.num_seqs, s.kv_tokens, s.seconds) for s in stats.iterations if s.num_seqs > 0)
            d.prefills.extend(_per_sequence(s) for s in stats.prefills)
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
            model = fit_delivered(list(d.iters), [p for batch in d.prefills for p in batch])
        except (ValueError, ArithmeticError):
            return None
        d.fits += 1
        return model

    def prefill_samples(self, role: Role) -> list[tuple[float, float]]:
        """The per-sequence prefill samples (L, seconds) the fit uses (module docstring)."""
        return [p for batch in self.data[role].prefills for p in batch]

    def state(self, role: Role, scheduler: ShiftAwareScheduler | None = None, now: float | None = None) -> RoleState:
        d = self.data[role]
        now = time.monotonic() if now is None else now
        recent = [(t, n) for t, n in d.tokens if t >= now - self.window_s]  # ingest ages them only on new tokens
        span = min(self.window_s, max(1e-9, now - recent[0][0])) if recent else 0.0
        toks = sum(n for _, n in recent)
        st = RoleState(role=role.value, replicas=len(d.load),
                       running=sum(s.running for s in d.load.values()),
                       kv_tokens=sum(s.kv_tokens for s in d.load.values()),
                       kv_capacity=sum(s.kv_capacity_tokens for s in d.load.values()),
                       throughput_tokens_per_s=toks / span if span > 0 else 0.0)
        if scheduler is not None:
            st.queued = scheduler.queued()
        return st


def _per_sequence(sample: PrefillSample) -> tuple[tuple[float, float], ...]:
    """A batched `PrefillSample` as `num_seqs` samples of its per-sequence share (module docstring)."""
    m = max(1, int(getattr(sample, "num_seqs", 1) or 1))
    return ((sample.tokens / m, sample.seconds / m),) * m


def fit_delivered(iters: list[tuple[int, int, float]], prefills: list[tuple[float, float]]) -> ThroughputModel:
    """Core's relative-error fit of the samples, rescaled so that the model's total time over the
    decode samples, and separately over the prefill samples, equals the measured total (the
    module docstring says why). Raises ValueError when core's fit does."""
    model = ThroughputModel.fit(iters, prefills)
    pred = sum(model.iter_time(n, k) for n, k, _ in iters)
    meas = sum(t for _, _, t in iters)
    dec = meas / pred if pred > 0 and meas > 0 else 1.0
    ppred = sum(model.prefill_time(L) for L, _ in prefills)
    pmeas = sum(t for _, t in prefills)
    pre = pmeas / ppred if ppred > 0 and pmeas > 0 else 1.0
    return dataclasses.replace(model, A=model.A * dec, B=model.B * dec, C=model.C * dec, D=model.D * dec,
                               P0=model.P0 * pre, P1=model.P1 * pre, P2=model.P2 * pre)
