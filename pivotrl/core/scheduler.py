"""Shift-aware scheduler of one inference role (DESIGN §4.2, paper §6, App. C).

Owns: the shift-time operations on top of dispatch (`pivotrl/core/dispatch.py`, which owns the
queue, the replica states and dispatch by largest throughput gain): shift down (Alg. 3: abort
everything on the leaving replicas, dispatch to the rest), shift up (Alg. 4: dispatch onto the new
replicas, then migrate), and rebalance. It returns `Move`s; the runtime carries them out. It knows
nothing about engines, devices or time.

Decisions (the brief and paper are silent or loose; written down here):
  * Rebalance (`rebalance`, beyond the paper: the paper migrates only at shift up): with an empty
    queue, the same improvement loop as Alg. 4 moves shortest sequences off the highest-throughput
    replicas while the aggregate throughput rises, applied only if it rises by at least
    `min_gain` (relative). Controllers call it on monitor ticks when `deploy.planner.rebalance`
    is on, so replicas left idle by completions get work without waiting for a shift up.
  * Shift up (Alg. 4): the queue is dispatched onto the new replicas first, then onto all replicas.
    Migration runs only if the queue is then empty (a non-empty queue means no spare KV anywhere,
    so moving a running sequence cannot raise throughput). Heap keys are kept exact (the source
    and the destination replica are both re-keyed after a move; the paper's pseudocode re-keys
    only the source). The loop stops at the first move that does not raise the aggregate
    throughput, and undoes it. At most one move per running sequence (the paper's bound).
"""
from __future__ import annotations

import heapq

import numpy as np

from pivotrl.core.dispatch import Dispatcher, Move
from pivotrl.core.types import Sequence


class ShiftAwareScheduler(Dispatcher):
    """Shared priority queue + throughput-maximising dispatch + shift-time migration for one role."""

    def shift_down(self, replica_ids: list[str]) -> list[Move]:
        """Alg. 3: abort everything on `replica_ids`, remove them, dispatch to the remaining ones."""
        for rid in replica_ids:
            self._replica(rid)
        if len(set(replica_ids)) != len(replica_ids):
            raise ValueError(f"shift_down({replica_ids}): a replica is named twice")
        self._begin()
        for rid in replica_ids:
            self._abort(rid, "all")
        for rid in replica_ids:
            del self.replicas[rid]
        self._rebuild_arrays()
        self._dispatch()
        return self._end()

    def shift_up(self, replicas: list[tuple[str, int]], migrate: bool = True) -> list[Move]:
        """Alg. 4: add `replicas` (id, kv_capacity), dispatch the queue onto them first, then (with
        `migrate`) move shortest sequences off the highest-throughput replicas while that raises
        the aggregate throughput."""
        states = self._new_states(replicas)  # validates all before anything changes
        self._begin()
        for st_ in states:
            self.replicas[st_.replica_id] = st_
        self._rebuild_arrays()
        new_pos = np.array([self._pos[st_.replica_id] for st_ in states], dtype=np.int64)
        if len(new_pos):
            self._dispatch(new_pos)
        self._dispatch()
        if migrate and not self.queued():
            self._migrate()
        return self._end()

    def _migrate(self) -> int:
        """The improvement loop of Alg. 4. Returns the number of kept moves."""
        eps = 1e-12
        heap = [(-self._T[i], i) for i in range(len(self._ids)) if self._n[i] > 0]
        heapq.heapify(heap)
        budget = sum(r.n for r in self.replicas.values())
        moves = 0
        order: dict[int, list[Sequence]] = {}
        while heap and moves < budget:
            negT, i = heapq.heappop(heap)
            if negT != -self._T[i] or self._n[i] == 0:
                continue  # stale key
            before = self._total_T
            # shortest first: each source's sequences sorted once per migration (lengths do not
            # change during one), the cache dropped when a replica receives a sequence
            lst = order.get(i)
            if lst is None:
                lst = order[i] = sorted(self.replicas[self._ids[i]].running.values(),
                                        key=lambda s: (s.length, s.seq_id), reverse=True)
            seq = lst.pop()
            self._unplace(seq, i)  # abort + immediate re-dispatch: the queue is empty here
            j = self._best_replica(seq.length)
            if j < 0:  # cannot happen without a reserve; with one, put it back and stop
                self._place(seq, i)
                break
            self._place(seq, j)
            if self._total_T <= before + eps * max(1.0, before):
                if j != i:  # undo the move that did not help
                    self._unplace(seq, j)
                    self._place(seq, i)
                break
            moves += 1
            order.pop(j, None)
            heapq.heappush(heap, (-self._T[i], i))
            heapq.heappush(heap, (-self._T[j], j))
        return moves

    def rebalance(self, min_gain: float = 0.0) -> list[Move]:
        """Alg. 4's improvement loop without a shift (module docstring: Rebalance): with an empty
        queue, move shortest sequences off the highest-throughput replicas while that raises the
        aggregate throughput; kept only if it rises by more than `min_gain` (relative)."""
        if not min_gain >= 0.0:
            raise ValueError(f"rebalance(min_gain={min_gain}): must be >= 0")
        if self.queued() or len(self._ids) < 2:
            return []
        trial = self.clone()
        before = trial.throughput()
        if not trial._migrate() or trial.throughput() <= before * (1.0 + min_gain):
            return []
        self._begin()
        self._migrate()
        return self._end()
