"""A simulated inference replica: decode advanced analytically between events.

Owns the ground truth of one replica in the simulator: which sequences run on it, how many tokens
each has generated, when the next one finishes, and its busy/low-throughput accounting. Knows
nothing about schedulers or controllers (the runtime connects them).

Analytic advance. With N running sequences fixed, one iteration takes `tau_i = A*(K + i*N) + c`
(`c = max(B(N), C*N) + D`) and emits N tokens, so j iterations take

    T(j) = j*(A*K + c) + A*N*j*(j-1)/2,

core's `ThroughputModel.decode_time`. We extend T to real j (a fluid approximation, error under one
iteration) so the time to the next completion is T(r) for the smallest remaining length r, and the
iterations done in `dt` solve `T(j) = dt` in closed form. T(j1) followed by T'(j2) from the
advanced state equals T(j1 + j2) exactly, so advancing in pieces never drifts.

Prefill (new sequences and re-prefill after an abort) and weight publishes stall decode: the replica
is busy for their time and emits no tokens (vLLM runs prefill ahead of decode). Prefills run one
after another; a sequence removed before its prefill ran takes its unfinished prefill time with it
(an engine drops a request it has not prefilled yet), so the stall of the rest shrinks by that much.

Concurrency cap. At most `max_num_seqs` sequences run at once (vLLM's `max_num_seqs`); the
scheduler admits no more, and any extra waits inside the engine like a preempted one.

Hybrid models. A linear-attention model's sequence also holds a fixed recurrent state from the same
memory pool (vLLM's hybrid KV cache manager pages it like KV blocks): `seq_tokens` counts it as that
many KV tokens for every running sequence, in K (its read each step) and against the capacity.

KV capacity. The scheduler admits by current lengths, so running sequences can outgrow the KV
cache. Like vLLM's recompute preemption, the replica then pauses its most recently started sequence
(tokens kept, engine-internal: the control plane is not told) and resumes paused ones, oldest first,
with a re-prefill once a completion frees room. The moment K reaches capacity is one more event,
found in closed form (K grows by N per iteration).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from pivotrl.core.throughput import ThroughputModel

_EPS = 1e-7


@dataclass
class _Run:
    prompt: int       # prompt tokens
    gen0: int         # generated tokens when it joined
    iter0: float      # replica iteration count when it joined
    length0: int      # KV length when it joined (prompt + gen0)
    finish_iter: float
    target: int
    order: int = 0    # admission order (the newest is preempted first)


class SimReplica:
    """One replica of an inference role on `tp` devices."""

    def __init__(self, replica_id: str, model: ThroughputModel, tp: int, now: float,
                 low_threshold: float = 0.0, kv_capacity: float = math.inf,
                 max_num_seqs: int | None = None, seq_tokens: int = 0) -> None:
        self.replica_id = replica_id
        self.model = model
        self.tp = tp
        self.t = now
        self.stall_until = now
        self.iters = 0.0
        self.k = 0.0
        self.runs: dict[int, _Run] = {}
        self.kv_capacity = float(kv_capacity)
        self.max_num_seqs = max_num_seqs  # vLLM's cap on running sequences (None = none)
        self.seq_tokens = seq_tokens  # a running sequence's fixed state, in KV tokens (hybrid models)
        self.paused: dict[int, tuple[int, int, int]] = {}  # preempted: seq -> (prompt, generated, target)
        self.preemptions = 0
        self._order = 0
        self._heap: list[tuple[float, int]] = []
        self.low_threshold = low_threshold  # tokens/s per device under which time counts as "low"
        # accounting (seconds of the replica, not device-seconds)
        self.busy_s = 0.0
        self.high_s = 0.0
        self.tokens = 0.0
        self.peak_k = 0.0  # most KV tokens held at once (admission checks current lengths only)
        self.epoch = 0  # bumped whenever the next-finish time may change
        self._pf: dict[int, list[float]] = {}  # seq -> [end, seconds] of its prefill (serial stalls)
        self._c_n, self._c_val = -1, 0.0

    def set_model(self, model: ThroughputModel, now: float) -> None:
        """Run on `model` from `now` on (the time so far is advanced on the old one)."""
        self.advance(now)
        self.model = model
        self._c_n = -1  # the per-N iteration time is cached
        self.epoch += 1

    # -- closed forms ------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return len(self.runs)

    def _c(self) -> float:
        """`max(B(N), C*N) + D`, cached per N (it changes only when N does)."""
        n = len(self.runs)
        if n != self._c_n:
            m = self.model
            self._c_n, self._c_val = n, max(m.floor(n), m.C * n) + m.D
        return self._c_val

    def time_for(self, j: float) -> float:
        """Seconds for j (real) iterations from the current state."""
        if j <= 0 or self.n == 0:
            return 0.0
        A, N = self.model.A, self.n
        return j * (A * self.k + self._c()) + A * N * j * (j - 1.0) / 2.0

    def iters_in(self, dt: float) -> float:
        """Real iterations done in dt seconds (inverse of `time_for`)."""
        if dt <= 0 or self.n == 0:
            return 0.0
        A, N = self.model.A, self.n
        a = A * N / 2.0
        b = A * self.k + self._c() - a
        if a <= 0:
            return dt / b
        return 2.0 * dt / (b + math.sqrt(b * b + 4.0 * a * dt))

    # -- time --------------------------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Bring the replica's state to time `now`."""
        if now <= self.t:
            return
        start = self.t
        if self.stall_until > start:
            stall_end = min(now, self.stall_until)
            self.busy_s += stall_end - start
            self.high_s += stall_end - start  # prefill/publish is useful work
            start = stall_end
        dt = now - start
        if dt > 0 and self.n:
            j = self.iters_in(dt)
            self.iters += j
            self.k += self.n * j
            self.peak_k = max(self.peak_k, self.k)
            produced = self.n * j
            self.tokens += produced
            self.busy_s += dt
            if produced / dt / self.tp >= self.low_threshold:
                self.high_s += dt
        self.t = now

    def next_finish(self) -> float | None:
        """Time of the next event of this replica: a completion, or K reaching KV capacity
        (None when idle)."""
        while self._heap:
            fin, sid = self._heap[0]
            r = self.runs.get(sid)
            if r is not None and r.finish_iter == fin:
                break
            heapq.heappop(self._heap)  # stale entry of a removed sequence
        if not self._heap:
            return None
        start = max(self.t, self.stall_until)
        t = start + self.time_for(max(self._heap[0][0] - self.iters, 0.0))
        if self.n > 1 and self.kv_capacity < math.inf:
            room = (self.kv_capacity - self.k) / self.n  # iterations until K hits capacity
            t = min(t, start + self.time_for(max(room, 0.0)))
        return t

    def relieve(self) -> int:
        """Preempt the newest running sequences while K is at capacity (after `advance`)."""
        done = 0
        while self.n > 1 and self.k >= self.kv_capacity * (1.0 - 1e-9):
            sid = max(self.runs, key=lambda x: self.runs[x].order)
            r = self.runs[sid]
            gen = self.remove(sid)
            self.paused[sid] = (r.prompt, gen, r.target)
            done += 1
        self.preemptions += done
        return done

    def resume(self) -> None:
        """Restart paused sequences, oldest first, while they fit (with a re-prefill each)."""
        while self.paused:
            sid = next(iter(self.paused))
            prompt, gen, target = self.paused[sid]
            if self.n and (self.k + prompt + gen + self.seq_tokens > 0.95 * self.kv_capacity
                           or not self._slot_free()):
                break
            del self.paused[sid]
            self.add(sid, prompt, gen, target, self.model.prefill_time(prompt + gen))

    # -- membership --------------------------------------------------------------------------
    def add(self, seq_id: int, prompt_len: int, generated: int, target: int, prefill_s: float) -> None:
        """Start a sequence (after `advance(now)`): prefill stalls decode for `prefill_s`."""
        if seq_id in self.runs or seq_id in self.paused:
            raise RuntimeError(f"seq {seq_id} is already on {self.replica_id}")
        length = prompt_len + generated + self.seq_tokens
        if self.n and (self.k + length > self.kv_capacity or not self._slot_free()):  # waits inside
            self.paused[seq_id] = (prompt_len, generated, target)
            self.epoch += 1
            return
        fin = self.iters + max(target - generated, 0)
        self._order += 1
        self.runs[seq_id] = _Run(prompt_len, generated, self.iters, length, fin, target, self._order)
        self.k += length
        heapq.heappush(self._heap, (fin, seq_id))
        self.stall_until = max(self.stall_until, self.t) + prefill_s
        if prefill_s > 0:
            self._pf[seq_id] = [self.stall_until, prefill_s]
        self.epoch += 1

    def _slot_free(self) -> bool:
        return self.max_num_seqs is None or self.n < self.max_num_seqs

    def generated(self, seq_id: int) -> int:
        if seq_id in self.paused:
            return self.paused[seq_id][1]
        r = self.runs[seq_id]
        return min(r.target, r.gen0 + int(math.floor(self.iters - r.iter0 + _EPS)))

    def remove(self, seq_id: int) -> int:
        """Stop a sequence (after `advance(now)`); returns its generated tokens."""
        if seq_id in self.paused:
            self.epoch += 1
            return self.paused.pop(seq_id)[1]
        r = self.runs.pop(seq_id)
        self._cancel_prefill(seq_id)
        gen = min(r.target, r.gen0 + int(math.floor(self.iters - r.iter0 + _EPS)))
        self.k -= r.length0 + (self.iters - r.iter0)
        if not self.runs:
            self.k = 0.0  # no float residue on an empty replica
        self.epoch += 1
        return gen

    def _cancel_prefill(self, seq_id: int) -> None:
        """Drop the unfinished part of a removed sequence's prefill from the serial stall: every
        stall queued after it (prefills, weight loads) moves earlier by that much."""
        pf = self._pf.pop(seq_id, None)
        if pf is None:
            return
        end, secs = pf
        rem = min(secs, end - self.t)
        if rem <= 0:
            return
        done = []
        for sid, v in self._pf.items():
            if v[0] <= self.t:
                done.append(sid)  # prefill already over: forget it
            elif v[0] > end:
                v[0] -= rem
        for sid in done:
            del self._pf[sid]
        self.stall_until -= rem

    def pop_finished(self) -> tuple[int, int] | None:
        """Remove and return (seq_id, generated) of one sequence done by now, or None.

        One at a time: the runtime tells the controller about each before taking the next, so a
        controller move in between never refers to a sequence the runtime already retired."""
        while self._heap and self._heap[0][0] <= self.iters + _EPS * max(1.0, self.iters):
            fin, sid = heapq.heappop(self._heap)
            r = self.runs.get(sid)
            if r is None or r.finish_iter != fin:
                continue  # removed earlier (lazy heap)
            self.remove(sid)
            return sid, r.target
        return None

    def stall(self, seconds: float) -> None:
        """Stop decoding for `seconds` from now (e.g. loading new weights)."""
        self.stall_until = max(self.stall_until, self.t) + seconds
        self.epoch += 1

    def snapshot(self) -> dict[int, int]:
        """seq_id -> generated tokens now (paused sequences included)."""
        # `generated` of each, inlined: this runs on every report, over every running sequence
        iters, floor = self.iters, math.floor
        out = {sid: min(r.target, r.gen0 + floor(iters - r.iter0 + _EPS)) for sid, r in self.runs.items()}
        out.update((sid, p[1]) for sid, p in self.paused.items())
        return out

    @property
    def empty(self) -> bool:
        return not self.runs and not self.paused
