"""What-if evaluation of a shift for the planner (DESIGN §4.3 step 4): a role's aggregate throughput
after `k` new replicas shift up, or after a set of its replicas shifts down.

Owns two evaluators with one interface, chosen by `PlannerConfig.evaluation`:

* `MigrateWhatIf` ("migrate") is the reference: it clones the role's `ShiftAwareScheduler` and runs
  the real Alg. 3 / Alg. 4 migration on the clone. Exact, but its cost grows with the number of
  migrated sequences times the number of candidates (hundreds of ms at 128 GPUs with 64 sequences
  per replica, see `python -m pivotrl.bench planner`).
* `SummaryWhatIf` ("summary") evaluates the same migration on a compact per-role summary (arrays of
  per-replica N, K, T and free KV; the queue's lengths in priority order) in O(1) per shift-up count
  and O(|down set|) per shift-down set. It treats the sequences that move as having the mean length
  of the moving set, which makes the migration's end state computable in closed form:
  - dispatch onto replicas by largest gain with equal lengths and a concave T(N) is water-filling,
    and Alg. 4's migration on identical new replicas ends balanced (counts differ by at most one),
    so the post-shift-up throughput is that of the balanced placement (never below the
    no-migration placement, since Alg. 4 only keeps improving moves);
  - after a shift down the aborted sequences are water-filled onto the remaining replicas, whose
    own sequences stay put: when they fill every replica's free KV the gain is computed per
    replica (exact for equal lengths), otherwise it is the pool's balanced gain capped by that;
  - admission is pooled: the queue (in priority order) is admitted while the pool's free KV holds
    its lengths plus the reserve (KV fragmentation across replicas is ignored), and no more than
    the pool's free sequence slots under each replica's `max_num_seqs` (new replicas get the
    scheduler's default cap).
  tests/core/test_whatif.py bounds its error against `MigrateWhatIf` on random states.

Both take a `zero_one` flag: the `vanilla` strategy's throughput model, in which a replica with any
running sequence counts 1 and an idle one 0.
"""
from __future__ import annotations

from typing import Iterable, Protocol

import numpy as np

from pivotrl.core.scheduler import ShiftAwareScheduler
from pivotrl.core.throughput import ThroughputModel


class WhatIf(Protocol):
    def now(self) -> float: ...
    def replica_throughput(self, replica_id: str) -> float: ...
    def after_shift_up(self, k: int, capacity: int, migrate: bool) -> float: ...
    def after_shift_down(self, replica_ids: Iterable[str]) -> float: ...


def balanced_throughput(model: ThroughputModel, replicas: int, n: float, k: float) -> float:
    """Throughput of `n` sequences holding `k` tokens spread as evenly as possible (counts differ by
    at most one, equal length per sequence) over `replicas` replicas."""
    if replicas <= 0 or n <= 0:
        return 0.0
    n_int = int(round(n))
    if n_int <= 0:
        return 0.0
    lbar = k / n_int
    q, r = divmod(n_int, replicas)
    total = (replicas - r) * model.throughput(q, q * lbar) if q else 0.0
    if r:
        total += r * model.throughput(q + 1, (q + 1) * lbar)
    return total


class MigrateWhatIf:
    """Reference evaluator: the real scheduler's migration on a clone, per question asked."""

    def __init__(self, scheduler: ShiftAwareScheduler, zero_one: bool = False) -> None:
        self.sched = scheduler
        self.zero_one = zero_one
        self._cache_up: dict[tuple[int, int, bool], float] = {}

    def _measure(self, s: ShiftAwareScheduler) -> float:
        if self.zero_one:
            return float(sum(1 for r in s.replicas.values() if r.n > 0))
        return s.throughput()

    def now(self) -> float:
        return self._measure(self.sched)

    def replica_throughput(self, replica_id: str) -> float:
        rep = self.sched.replicas.get(replica_id)
        if rep is None:
            return 0.0
        return float(rep.n > 0) if self.zero_one else self.sched.replica_throughput(replica_id)

    def after_shift_up(self, k: int, capacity: int, migrate: bool) -> float:
        key = (k, capacity, migrate)
        if key not in self._cache_up:  # the result depends only on how many replicas shift up
            c = self.sched.clone()
            c.shift_up([(f"__whatif_{i}", capacity) for i in range(k)], migrate=migrate)
            self._cache_up[key] = self._measure(c)
        return self._cache_up[key]

    def after_shift_down(self, replica_ids: Iterable[str]) -> float:
        ids = [r for r in replica_ids if r in self.sched.replicas]
        c = self.sched.clone()
        c.shift_down(ids)
        return self._measure(c)


class SummaryWhatIf:
    """Closed-form evaluator on a compact summary of one role (see the module docstring)."""

    def __init__(self, scheduler: ShiftAwareScheduler, zero_one: bool = False) -> None:
        s = scheduler
        self.model = s.model
        self.zero_one = zero_one
        self.reserve = s.kv_reserve
        self.ids = list(s.replicas)
        self.pos = {rid: i for i, rid in enumerate(self.ids)}
        reps = [s.replicas[r] for r in self.ids]
        self.n = np.array([r.n for r in reps], dtype=np.float64)
        self.k = np.array([r.k for r in reps], dtype=np.float64)
        self.free = np.maximum(np.array([r.free_kv for r in reps], dtype=np.float64), 0.0)
        self.slots = np.maximum(np.array([r.free_seqs for r in reps], dtype=np.float64), 0.0)  # inf: no cap
        self.new_cap = float("inf") if s.max_num_seqs is None else float(s.max_num_seqs)
        self.T = self.model.throughput_v(self.n, self.k) if reps else np.zeros(0)
        self.busy = (self.n > 0).astype(np.float64)
        self.N_run, self.K_run = float(self.n.sum()), float(self.k.sum())
        self.T_sum, self.busy_sum, self.free_sum = float(self.T.sum()), float(self.busy.sum()), float(self.free.sum())
        q = np.array([x.length for x in s.queued_sequences()], dtype=np.float64)
        self.q_len = q
        self.q_need_cum = np.cumsum(q + self.reserve)  # KV needed to admit the first j queued sequences
        self.q_len_cum = np.cumsum(q)
        self.N_q = len(q)
        self._cache_up: dict[tuple[int, int, bool], float] = {}

    # ------------------------------------------------------------------ helpers
    def _admit(self, start: int, capacity: float) -> int:
        """How many queued sequences from index `start` on fit in `capacity` pooled KV tokens."""
        if start >= self.N_q or capacity <= 0:
            return 0
        base = self.q_need_cum[start - 1] if start > 0 else 0.0
        return int(np.searchsorted(self.q_need_cum[start:], base + capacity, side="right"))

    def _q_tokens(self, a: int, b: int) -> float:
        if b <= a:
            return 0.0
        return float(self.q_len_cum[b - 1] - (self.q_len_cum[a - 1] if a > 0 else 0.0))

    def now(self) -> float:
        return self.busy_sum if self.zero_one else self.T_sum

    def replica_throughput(self, replica_id: str) -> float:
        i = self.pos.get(replica_id)
        if i is None:
            return 0.0
        return float(self.busy[i] if self.zero_one else self.T[i])

    # ------------------------------------------------------------------ shift up (Alg. 4)
    def after_shift_up(self, k: int, capacity: int, migrate: bool) -> float:
        key = (k, capacity, migrate)
        if key not in self._cache_up:
            self._cache_up[key] = self._shift_up(k, capacity, migrate)
        return self._cache_up[key]

    def _shift_up(self, k: int, capacity: int, migrate: bool) -> float:
        m = self.model
        R0 = len(self.ids)
        # Dispatch(Q, R_up): the queue's head fills the new replicas, balanced
        m1 = int(min(self._admit(0, k * capacity), k * self.new_cap if k else 0))
        K1 = self._q_tokens(0, m1)
        # Dispatch(Q, R): what is left goes to the existing replicas' free KV and sequence slots
        m2 = int(min(self._admit(m1, self.free_sum), float(self.slots.sum())))
        K2 = self._q_tokens(m1, m1 + m2)
        if self.zero_one:
            idle_old = R0 - self.busy_sum
            return self.busy_sum + min(idle_old, m2) + min(k, m1)
        new_T = balanced_throughput(m, k, m1, K1)
        old_T = self.T_sum
        if m2:
            old_T += self._fill_gain(np.ones(R0, dtype=bool), m2, K2 / m2, self.N_run, self.K_run)
        no_mig = old_T + new_T
        if not migrate or m1 + m2 < self.N_q:
            return no_mig  # Alg. 4 migrates only once the queue is empty
        return max(no_mig, balanced_throughput(m, R0 + k, self.N_run + self.N_q, self.K_run + K1 + K2))

    # ------------------------------------------------------------------ shift down (Alg. 3)
    def after_shift_down(self, replica_ids: Iterable[str]) -> float:
        idx = [self.pos[r] for r in replica_ids if r in self.pos]
        if not idx:
            return self.now()
        sel = np.asarray(idx, dtype=np.int64)
        R = len(self.ids) - len(idx)
        N_S, K_S = float(self.n[sel].sum()), float(self.k[sel].sum())
        N_rest, K_rest = self.N_run - N_S, self.K_run - K_S
        free_rest = self.free_sum - float(self.free[sel].sum())
        # the stream to dispatch: aborted sequences merged with the queue, mean length of the lot
        M = N_S + self.N_q
        if M <= 0 or R <= 0:
            return 0.0 if R <= 0 else (self.busy_sum - float(self.busy[sel].sum()) if self.zero_one
                                       else self.T_sum - float(self.T[sel].sum()))
        lbar = (K_S + float(self.q_len.sum())) / M
        keep = np.ones(len(self.ids), dtype=bool)
        keep[sel] = False
        if self.zero_one:
            room = np.minimum(np.floor(self.free[keep] / max(lbar + self.reserve, 1e-9)), self.slots[keep])
            adm = min(M, float(room.sum()))
            busy_rest = self.busy_sum - float(self.busy[sel].sum())
            idle_with_room = float(np.count_nonzero((self.busy[keep] == 0) & (room > 0)))
            return busy_rest + min(idle_with_room, adm)
        T_rest = self.T_sum - float(self.T[sel].sum())
        return T_rest + self._fill_gain(keep, M, lbar, N_rest, K_rest)

    def _fill_gain(self, keep: np.ndarray, M: float, lbar: float, N_rest: float, K_rest: float) -> float:
        """Throughput gained by dispatching M sequences of length `lbar` onto the replicas `keep`.
        Each replica holds at most floor(free / (lbar + reserve)) more. When the stream fills them
        all, the gain is exact per replica; otherwise it is the pool's balanced gain, which never
        exceeds the fill-everything gain."""
        n, k, free = self.n[keep], self.k[keep], self.free[keep]
        R = len(n)
        if R == 0 or M <= 0:
            return 0.0
        room = np.minimum(np.floor(free / max(lbar + self.reserve, 1e-9)), self.slots[keep])
        full = float((self.model.throughput_v(n + room, k + room * lbar) - self.T[keep]).sum())
        if M >= room.sum():
            return max(0.0, full)
        bal = (balanced_throughput(self.model, R, N_rest + M, K_rest + M * lbar)
               - balanced_throughput(self.model, R, N_rest, K_rest))
        return max(0.0, min(bal, full))


