"""Throughput-maximising dispatch of one inference role's sequences onto its replicas (DESIGN §4.2,
paper §6, App. C), the base of the shift-aware scheduler (`pivotrl/core/scheduler.py`).

Owns: the per-replica states (running sequences, N, K, KV capacity, concurrency cap) with their
numpy mirror arrays, the shared waiting queue (`pivotrl/core/waiting_queue.py`), where each
sequence is, and the operations on them: submit, dispatch by largest throughput gain, abort with
tokens kept, progress, finish, and clones for the planner's what-if. Every operation returns
`Move`s; the runtime carries them out. It knows nothing about engines, devices or time, and nothing
about shifts: adding and removing replicas with migration is the scheduler's.

Invariants (asserted by `check_invariants`, property-tested in tests/core/test_scheduler_props.py):
  * every submitted, unfinished sequence is in exactly one place: the queue or one replica;
  * a sequence's `generated` never decreases (abort keeps tokens; `progress` refuses to go back);
  * each replica's K equals the sum of its running sequences' lengths, and the numpy mirror arrays
    used for fast dispatch agree with the replica states.

Decisions (the brief and paper are silent or loose; written down here):
  * Admission (vLLM's rules, per replica): a replica takes a sequence only while it runs fewer
    than its `max_num_seqs` (vLLM's concurrency cap; None = no cap) and has `length + kv_reserve`
    free KV tokens (current lengths: K grows by `progress`/`advance` as tokens are generated, the
    engine preempts by recompute when its cache fills, and `kv_reserve` is the growth headroom,
    vLLM's watermark). The runtime gives both limits per replica at `shift_up`/`add_replicas`,
    from what the engine reports (the sim: its KV model and `models.sim.max_num_seqs`).
  * Dispatch goes in priority order and skips: a sequence that fits on no replica now stays in the
    queue at its place, and the sequences behind it are still tried; every later `dispatch`
    (called as capacity frees: a finish, a shift up) tries it first again. So one long sequence
    never blocks short ones (a 17K-token resume used to hold 64 short prompts back). The scan of
    one call stops as soon as no replica has a free sequence slot, and skips without a lookup any
    sequence at least as long as one that already failed in that call (free KV only shrinks
    while a call places sequences), which bounds its cost on a huge queue.
  * Atomic calls: every public call validates its arguments before it changes anything, so a call
    that raises leaves the scheduler exactly as it was.
  * Ties in gain go to the replica added first (deterministic).
  * Moves returned by one operation are net: a sequence aborted and re-dispatched to the same
    replica produces no move; otherwise all aborts come first, then all assigns, so a runtime
    frees KV before it fills it.
  * A clone shares the (immutable during what-if) Sequence objects with its parent, so `progress`,
    `advance` and `submit` raise on a clone: clones are for the planner's what-if only.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping, Self

import numpy as np

from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import Role, Sequence
from pivotrl.core.waiting_queue import WaitingQueue

QUEUE = "queue"


@dataclass
class ReplicaState:
    """One active replica: its running sequences, KV capacity in tokens, and concurrency cap."""

    replica_id: str
    kv_capacity: int
    running: dict[int, Sequence] = field(default_factory=dict)
    _k: int = 0
    max_seqs: int | None = None
    """vLLM's `max_num_seqs` of this replica's engine (None = no cap)."""

    @property
    def n(self) -> int:
        return len(self.running)

    @property
    def k(self) -> int:
        """Tokens in KV cache: the sum of the running sequences' lengths."""
        return self._k

    @property
    def free_kv(self) -> int:
        return self.kv_capacity - self._k

    @property
    def free_seqs(self) -> float:
        """Sequence slots left under `max_seqs` (inf without a cap)."""
        return float("inf") if self.max_seqs is None else float(self.max_seqs - len(self.running))


@dataclass(frozen=True)
class Move:
    """One step for the runtime: stop `seq_id` on `replica_id` (abort), or start it there (assign)."""

    kind: Literal["assign", "abort"]
    seq_id: int
    replica_id: str


def _check_progress(seq: Sequence, generated: int) -> None:
    if generated < seq.generated:
        raise ValueError(f"progress(seq {seq.seq_id}): generated may not decrease "
                         f"({seq.generated} -> {generated})")


class Dispatcher:
    """Shared priority queue + throughput-maximising dispatch over a role's active replicas."""

    def __init__(self, role: Role, model: ThroughputModel, kv_reserve: int = 0,
                 priority: Callable[[Sequence], Any] | None = None, max_num_seqs: int | None = None) -> None:
        if kv_reserve < 0:
            raise ValueError(f"{type(self).__name__}.kv_reserve must be >= 0 tokens, got {kv_reserve}")
        _check_cap("max_num_seqs", max_num_seqs)
        self.role = role
        self.model = model
        self.kv_reserve = int(kv_reserve)
        self.max_num_seqs = max_num_seqs  # default cap of replicas added without their own
        self.replicas: dict[str, ReplicaState] = {}
        self._queue = WaitingQueue(priority)
        self._where: dict[int, str] = {}
        self._is_clone = False
        self._journal: dict[int, str] | None = None
        self._rebuild_arrays()

    @property
    def priority(self) -> Callable[[Sequence], Any] | None:
        return self._queue.priority

    # ------------------------------------------------------------------ fast mirror arrays
    def set_model(self, model: ThroughputModel) -> None:
        """Use a refitted throughput model for every later decision (dispatch gains, migration)."""
        self.model = model
        self._rebuild_arrays()

    def _rebuild_arrays(self) -> None:
        """Positions and numpy mirrors of (N, K, capacity) plus the cached terms of dT."""
        self._ids: list[str] = list(self.replicas)
        self._pos: dict[str, int] = {rid: i for i, rid in enumerate(self._ids)}
        reps = [self.replicas[r] for r in self._ids]
        self._n = np.array([r.n for r in reps], dtype=np.float64)
        self._k = np.array([r.k for r in reps], dtype=np.float64)
        self._free = np.array([r.free_kv for r in reps], dtype=np.float64)
        self._room = np.array([r.free_seqs for r in reps], dtype=np.float64)
        m = self.model
        self._T = m.throughput_v(self._n, self._k)
        self._num1 = self._n + 1.0
        # tau(N+1, K+l) = _base1 + A*l
        # clamped like iter_time, so A*l added on top never divides by zero
        self._base1 = np.maximum(m.A * self._k + np.maximum(m.floor_v(self._num1), m.C * self._num1) + m.D, 1e-9)
        self._total_T = float(self._T.sum())

    def _refresh(self, i: int) -> None:
        rep = self.replicas[self._ids[i]]
        n, k, m = rep.n, rep._k, self.model
        self._n[i] = n
        self._k[i] = k
        self._free[i] = rep.kv_capacity - k
        self._room[i] = rep.free_seqs
        t = m.throughput(n, k)
        self._total_T += t - self._T[i]
        self._T[i] = t
        self._num1[i] = n + 1
        self._base1[i] = max(m.A * k + max(m.floor(n + 1), m.C * (n + 1)) + m.D, 1e-9)

    def _best_replica(self, length: int, positions: np.ndarray | None = None) -> int:
        """Position of the eligible replica with the largest dT for a sequence of `length`, or -1.

        Hot path (one call per dispatched sequence): four numpy calls over the replica arrays in the
        common case where the best replica also has room; the capacity mask only when it has not."""
        if not self._ids:
            return -1
        need = length + self.kv_reserve
        gain = self._num1 / (self._base1 + self.model.A * length)
        gain -= self._T
        if positions is not None:
            masked = np.full_like(gain, -np.inf)
            masked[positions] = gain[positions]
            gain = masked
        i = int(gain.argmax())
        if self._free[i] >= need and self._room[i] >= 1 and gain[i] > -np.inf:
            return i
        np.putmask(gain, (self._free < need) | (self._room < 1), -np.inf)
        i = int(gain.argmax())
        return i if gain[i] > -np.inf else -1

    # ------------------------------------------------------------------ placement primitives
    def _note(self, sid: int) -> None:
        if self._journal is not None and sid not in self._journal:
            self._journal[sid] = self._where[sid]

    def _place(self, seq: Sequence, i: int) -> None:
        rep = self.replicas[self._ids[i]]
        self._note(seq.seq_id)
        rep.running[seq.seq_id] = seq
        rep._k += seq.length
        self._where[seq.seq_id] = rep.replica_id
        self._refresh(i)

    def _unplace(self, seq: Sequence, i: int) -> None:
        rep = self.replicas[self._ids[i]]
        self._note(seq.seq_id)
        del rep.running[seq.seq_id]
        rep._k -= seq.length
        self._refresh(i)

    def _enqueue(self, seq: Sequence) -> None:
        self._note(seq.seq_id)
        self._where[seq.seq_id] = QUEUE
        self._queue.push(seq)

    def _fit(self, positions: np.ndarray | None) -> float:
        """The most free KV on a replica with a free sequence slot (-inf: none has a slot)."""
        free, room = (self._free, self._room) if positions is None else (self._free[positions], self._room[positions])
        ok = room >= 1
        return float(free[ok].max()) if ok.any() else -math.inf

    def _begin(self) -> None:
        self._journal = {}
        self._total_T = float(self._T.sum())  # re-anchor the running sum (no float drift)

    def _end(self) -> list[Move]:
        """Net moves since `_begin`: aborts first, then assigns."""
        journal, self._journal = self._journal or {}, None
        aborts, assigns = [], []
        for sid, before in journal.items():
            after = self._where.get(sid)
            if after == before:
                continue
            if before not in (QUEUE, None):
                aborts.append(Move("abort", sid, before))
            if after not in (QUEUE, None):
                assigns.append(Move("assign", sid, after))
        return aborts + assigns

    def _dispatch(self, positions: np.ndarray | None = None) -> None:
        """Place queued sequences in priority order; those that fit nowhere are skipped and keep
        their place (module docstring: Admission, Dispatch)."""
        queue = self._queue
        heap, queued = queue.heap, queue.seqs
        room = self._room if positions is None else self._room[positions]
        if not len(room) or room.max() < 1:
            return  # no replica has a free sequence slot
        skipped: list[tuple[Any, int]] = []
        failed = float("inf")  # shortest length that found no replica in this call
        reserve = self.kv_reserve
        fit: float | None = None  # once a sequence fits nowhere: the most free KV on a replica with a slot
        while heap:
            if fit is not None:
                shortest = queue.shortest_length()
                if shortest is None or shortest + reserve > fit:
                    break  # every sequence left fits nowhere now: all keep their places
            entry = heapq.heappop(heap)
            seq = queued.get(entry[1])
            if seq is None:  # stale entry (dispatched or finished since it was pushed)
                continue
            fits = seq.length < failed and (fit is None or seq.length + reserve <= fit)
            i = self._best_replica(seq.length, positions) if fits else -1
            if i < 0:
                failed = min(failed, seq.length)
                skipped.append(entry)  # fits nowhere now: keeps its place for the next call
                if fit is None:  # from here on kept exact by the placements below
                    fit = self._fit(positions)
                continue
            del queued[entry[1]]
            held_fit = fit is not None and self._free[i] >= fit
            self._place(seq, i)
            if held_fit:  # only replica i lost KV and maybe its last slot: elsewhere the most is unchanged
                fit = self._fit(positions)
        for entry in skipped:
            heapq.heappush(heap, entry)

    # ------------------------------------------------------------------ public API
    def submit(self, seqs: Iterable[Sequence]) -> None:
        """Put new sequences into the shared waiting queue (call `dispatch` to start them)."""
        self._no_clone("submit")
        batch = list(seqs)
        seen: set[int] = set()
        for s in batch:  # validate the whole batch first: a refused submit adds nothing
            if s.seq_id in self._where or s.seq_id in seen:
                raise ValueError(f"seq_id {s.seq_id} is already in the {self.role.value} scheduler "
                                 f"(at {self._where.get(s.seq_id, 'this submit')!r})")
            if s.role != self.role:
                raise ValueError(f"sequence {s.seq_id} has role {s.role.value!r}, this scheduler is "
                                 f"{self.role.value!r}")
            seen.add(s.seq_id)
        for s in batch:
            self._enqueue(s)

    def dispatch(self) -> list[Move]:
        """Assign queued sequences, in priority order, each to the eligible replica with max dT."""
        self._begin()
        self._dispatch()
        return self._end()

    def abort(self, replica_id: str, which: Literal["all", "shortest"] = "all") -> list[Move]:
        """Stop sequences on `replica_id` and put them back in the queue with their tokens."""
        self._replica(replica_id)
        _check_which(which)
        self._begin()
        self._abort(replica_id, which)
        return self._end()

    def _abort(self, replica_id: str, which: str) -> Sequence | None:
        rep = self._replica(replica_id)
        if which == "all":
            victims = sorted(rep.running.values(), key=lambda s: s.seq_id)
        elif which == "shortest":
            if not rep.running:
                return None
            victims = [min(rep.running.values(), key=lambda s: (s.length, s.seq_id))]
        else:
            _check_which(which)
            return None
        i = self._pos[replica_id]
        for s in victims:
            self._unplace(s, i)
            self._enqueue(s)
        return victims[0] if victims else None

    def add_replicas(self, replicas: list[tuple]) -> None:
        """Register new, empty replicas (no dispatch): `(id, kv_capacity)` or
        `(id, kv_capacity, max_num_seqs)`, the limits the replica's engine reports (without a cap,
        the scheduler's `max_num_seqs`). All are checked before any is added. `shift_up` is the
        usual entry point."""
        states = self._new_states(replicas)
        for st_ in states:
            self.replicas[st_.replica_id] = st_
        self._rebuild_arrays()

    def _new_states(self, replicas: list[tuple]) -> list[ReplicaState]:
        out: list[ReplicaState] = []
        seen: set[str] = set()
        for r in replicas:
            if len(r) not in (2, 3):
                raise ValueError(f"replica {r!r}: give (id, kv_capacity) or (id, kv_capacity, max_num_seqs)")
            rid, cap = r[0], r[1]
            mx = r[2] if len(r) == 3 else self.max_num_seqs
            if rid in self.replicas or rid in seen:
                raise ValueError(f"replica {rid!r} is already active in the {self.role.value} scheduler")
            if not cap > 0:
                raise ValueError(f"replica {rid!r}: kv_capacity must be > 0 tokens, got {cap}")
            _check_cap(f"replica {rid!r}: max_num_seqs", mx)
            seen.add(rid)
            out.append(ReplicaState(rid, int(cap), max_seqs=None if mx is None else int(mx)))
        return out

    def progress(self, seq_id: int, generated: int) -> None:
        """Set a sequence's generated-token count (never lower than before)."""
        self._no_clone("progress")
        seq = self._seq(seq_id)
        where = self._where[seq_id]
        if where != QUEUE:
            self.progress_replica(where, {seq_id: generated})
            return
        _check_progress(seq, generated)
        if generated != seq.generated:
            seq.generated = generated
            self._queue.note_length(seq)

    def progress_replica(self, replica_id: str, generated: Mapping[int, int]) -> None:
        """`progress` for sequences running on `replica_id`, with one refresh of the replica's
        terms for all of them (an engine's report names most of its sequences)."""
        self._no_clone("progress")
        rep = self._replica(replica_id)
        delta = 0
        for seq_id, count in generated.items():
            seq = rep.running.get(seq_id)
            if seq is None:
                raise ValueError(f"progress_replica({replica_id!r}): seq {seq_id} is not running there")
            _check_progress(seq, count)
            delta += count - seq.generated
            seq.generated = count
        if delta:
            rep._k += delta
            self._refresh(self._pos[replica_id])

    def advance(self, replica_id: str, tokens: int) -> None:
        """Every sequence running on `replica_id` generated `tokens` more (a decode stretch)."""
        self._no_clone("advance")
        if tokens < 0:
            raise ValueError(f"advance({replica_id!r}): tokens must be >= 0, got {tokens}")
        rep = self._replica(replica_id)
        for s in rep.running.values():
            s.generated += int(tokens)
        rep._k += tokens * rep.n
        self._refresh(self._pos[replica_id])

    def finish(self, seq_id: int) -> Sequence:
        """Remove a finished sequence from its replica (freeing its KV) or from the queue."""
        seq = self._seq(seq_id)
        where = self._where.pop(seq_id)
        if where == QUEUE:
            self._queue.remove(seq_id)
        else:
            rep = self.replicas[where]
            del rep.running[seq_id]
            rep._k -= seq.length
            self._refresh(self._pos[where])
        return seq

    def where(self, seq_id: int) -> str | None:
        """Replica id, "queue", or None (finished or unknown)."""
        return self._where.get(seq_id)

    def get(self, seq_id: int) -> Sequence:
        return self._seq(seq_id)

    def throughput(self) -> float:
        """Aggregate modelled tokens/s: sum of replica throughputs."""
        return float(self._T.sum()) if self._ids else 0.0

    def replica_throughput(self, replica_id: str) -> float:
        return float(self._T[self._pos[replica_id]])

    def num_sequences(self) -> int:
        """Running + queued sequences (N_role in the planner's Eq. 1)."""
        return len(self._where)

    def queued(self) -> int:
        return len(self._queue)

    def queued_sequences(self) -> list[Sequence]:
        """Queued sequences in dispatch order."""
        return self._queue.in_order()

    def kv_utilisation(self) -> float:
        """Used / total KV tokens over active replicas (0.0 with no replicas)."""
        cap = sum(r.kv_capacity for r in self.replicas.values())
        return float(self._k.sum()) / cap if cap > 0 else 0.0

    def clone(self) -> Self:
        """A copy for what-if simulation (of this object's class): own replica/queue structures,
        shared Sequence objects."""
        c = type(self).__new__(type(self))
        c.role, c.model, c.kv_reserve = self.role, self.model, self.kv_reserve
        c.max_num_seqs = self.max_num_seqs
        c.replicas = {rid: ReplicaState(rid, r.kv_capacity, dict(r.running), r._k, r.max_seqs)
                      for rid, r in self.replicas.items()}
        c._queue = self._queue.copy()
        c._where = dict(self._where)
        c._is_clone = True
        c._journal = None
        c._ids, c._pos = list(self._ids), dict(self._pos)
        for name in ("_n", "_k", "_free", "_room", "_T", "_num1", "_base1"):
            setattr(c, name, getattr(self, name).copy())
        c._total_T = self._total_T
        return c

    def check_invariants(self) -> None:
        """Raise AssertionError if the scheduler's state is inconsistent."""
        seen: dict[int, str] = {}
        for rid, rep in self.replicas.items():
            assert rep.replica_id == rid
            for sid, s in rep.running.items():
                assert sid == s.seq_id, f"replica {rid} keys seq {s.seq_id} as {sid}"
                assert sid not in seen, f"seq {sid} on {rid} and {seen[sid]}"
                seen[sid] = rid
            assert rep._k == sum(s.length for s in rep.running.values()), f"K of {rid} out of sync"
            assert rep.max_seqs is None or rep.n <= rep.max_seqs, f"{rid} runs {rep.n} > max_num_seqs {rep.max_seqs}"
        for sid in self._queue.seqs:
            assert sid not in seen, f"seq {sid} both queued and on {seen[sid]}"
            seen[sid] = QUEUE
        assert seen == self._where, "location index out of sync"
        self._queue.check()
        assert self._ids == list(self.replicas) and len(self._n) == len(self._ids)
        for i, rid in enumerate(self._ids):
            rep = self.replicas[rid]
            assert self._n[i] == rep.n and self._k[i] == rep.k and self._free[i] == rep.free_kv
            assert self._room[i] == rep.free_seqs
        assert abs(self._total_T - float(self._T.sum())) <= 1e-6 * max(1.0, abs(self._total_T))
        assert self._journal is None, "an operation's journal was left open"

    # ------------------------------------------------------------------ helpers
    def _replica(self, replica_id: str) -> ReplicaState:
        try:
            return self.replicas[replica_id]
        except KeyError:
            raise KeyError(f"no active {self.role.value} replica {replica_id!r}; active: "
                           f"{sorted(self.replicas)}") from None

    def _seq(self, seq_id: int) -> Sequence:
        where = self._where.get(seq_id)
        if where is None:
            raise KeyError(f"seq {seq_id} is not in the {self.role.value} scheduler (finished or unknown)")
        return self._queue.seqs[seq_id] if where == QUEUE else self.replicas[where].running[seq_id]

    def _no_clone(self, op: str) -> None:
        if self._is_clone:
            raise RuntimeError(f"{op}() on a scheduler clone: clones share Sequence objects and are "
                               f"for what-if simulation only")


def _check_which(which: str) -> None:
    if which not in ("all", "shortest"):
        raise ValueError(f"abort(which={which!r}): allowed values are 'all', 'shortest'")


def _check_cap(name: str, cap: int | None) -> None:
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1):
        raise ValueError(f"{name} must be an int >= 1 or None (no cap), got {cap!r}")
