"""Bookkeeping cost as tokens accumulate, at paper scale: the device poll and the driver's pass.

`python -m pivotrl.bench bookkeeping [--json PATH] [--replicas 24] [--seqs 256]
[--lengths 1000,2000,4000,8000,15000] [--tokens-per-poll 4] [--passes 10]`

What runs is the real code of a real run, with a scripted engine in place of a model: one
`DeviceWorker` per replica (`runtime/device.py`: its `poll`, its background loop, its abort-free
completion path), each hosting a `ScriptedEngine` whose sequences grow by `--tokens-per-poll`
tokens per poll; the `DevicePoll` goes through pickle as Ray would send it; the driver side is
`driver.take_poll` (the ledger's `fold` and the monitor's `ingest`) plus, per completion,
`Tokens.of` and `SequenceLedger.accept`, as `DeviceDriver._on_poll` does. Judge prompts and scores
(per-sample work, once per sequence) are not bookkeeping and are left out.

Scale (issue 19): `--replicas` replicas of `--seqs` live sequences, half rollout and half reward;
responses grow to each of `--lengths` in turn (judgements to 4/3 of it: 15K responses, 20K
judgements). At each length: a few passes, each advancing every sequence by the tokens per poll,
polling every device once (device side) and folding all polls (driver side, "a driver pass"). A
sequence completes at the rate of a steady run (a replica of S sequences of length L finishes
about S*k/L of them per poll of k tokens), and a fresh one takes its place.

Reported per length: device poll ms (median over devices and passes, CPU time of the polling
thread, pickling included) and per new token; driver pass ms (CPU time, and wall) and per new
token. Flat per-token cost means bookkeeping proportional to new tokens. Memory: the engines and
the ledger hold every token (about 16 bytes per token each: 3.5 GB at the defaults' last length).
"""
from __future__ import annotations

import itertools
import pickle
import random
import statistics
import tempfile
import threading
import time
from array import array
from typing import Any, Iterator
from unittest import mock

from pivotrl.bench.common import parser, print_table, write_json
from pivotrl.core.types import Role
from pivotrl.engines.protocol import Completion, EngineStats, GenerationRequest, IterationSample, TokenDeltas

#: A judgement is this much longer than its response at paper scale (20K against 15K tokens).
JUDGE_OVER_RESPONSE = 4 / 3
_CHUNK = 1 << 15  # distinct token ids / log-probs the scripted engine cycles through


class _Seq:
    """A scripted sequence. Its tokens are arrays, not lists as in the real engines: those live in
    the device processes, and lists of millions of tokens here would make the benchmark's own
    garbage collections (which traverse lists) part of the driver's measured cost."""

    __slots__ = ("req", "generated", "logprobs", "reported")

    def __init__(self, req: GenerationRequest) -> None:
        self.req = req
        self.generated = array("q", req.generated)
        self.logprobs = array("d", req.generated_logprobs or [])
        self.reported = len(self.generated)


class ScriptedEngine:
    """An engine without a model: `advance(k)` gives every live sequence k more tokens (with
    log-probs); `finish(n)` completes n of them (collected by the device's loop through `step`).
    It reports progress as the real engines do (`TokenDeltas.since_reported`)."""

    name = "scripted"
    tensor_parallel_size = 1

    def __init__(self, kv_capacity_tokens: int) -> None:
        self.live: dict[int, _Seq] = {}
        self.done: list[Completion] = []
        self.lock = threading.Lock()  # `done` is shared with the device's loop thread
        self.kv_capacity_tokens = kv_capacity_tokens
        self.iters: list[IterationSample] = []
        rng = random.Random(0)
        self.ids = array("q", [rng.randrange(150_000) for _ in range(_CHUNK)])
        self.lps = array("d", [-rng.random() for _ in range(_CHUNK)])

    def submit(self, r: GenerationRequest) -> None:
        self.live[r.seq_id] = _Seq(r)

    def _extend(self, s: _Seq, n: int) -> None:
        while n > 0:
            at = len(s.generated) % _CHUNK
            take = min(n, _CHUNK - at)
            s.generated.extend(self.ids[at:at + take])
            s.logprobs.extend(self.lps[at:at + take])
            n -= take

    def advance(self, k: int) -> None:
        """k decode iterations: every live sequence gains k tokens (k timing samples)."""
        for s in self.live.values():
            self._extend(s, k)
        n, kv = len(self.live), sum(len(s.req.prompt_ids) + len(s.generated) for s in self.live.values())
        self.iters.extend(IterationSample(n, kv, 0.03) for _ in range(k))

    def grow_to(self, length: int) -> None:
        """Every live sequence to `length` tokens (the fill between measured lengths; no samples)."""
        for s in self.live.values():
            self._extend(s, length - len(s.generated))

    def finish(self, n: int) -> None:
        with self.lock:
            for sid in list(self.live)[:n]:
                s = self.live.pop(sid)
                self.done.append(Completion(sid, s.req.prompt_ids, s.generated.tolist(), "length", 0,
                                            logprobs=s.logprobs.tolist()))

    def new_tokens(self) -> TokenDeltas:
        return TokenDeltas.since_reported(self.live.values())

    def has_unfinished(self) -> bool:
        return bool(self.done)  # the device's loop only collects completions: `advance` decodes

    def step(self, timeout: float | None = None) -> list[Completion]:
        with self.lock:
            out, self.done = self.done, []
        return out

    def stats(self, drain: bool = True) -> EngineStats:
        st = EngineStats(running=len(self.live), waiting=0, kv_tokens=0, kv_capacity_tokens=self.kv_capacity_tokens,
                         version=0, iterations=list(self.iters))
        if drain:
            self.iters = []
        return st

    def release_memory(self, level: int = 2) -> None:
        self.live.clear()

    def shutdown(self) -> None:
        self.live.clear()


class Replica:
    """One device actor's body hosting a scripted engine, and the driver's view of it."""

    def __init__(self, device: int, role: Role, seqs: int, ids: Iterator[int], model_dir: str) -> None:
        from pivotrl.config.engine import EngineConfig, EngineSpec
        from pivotrl.runtime import roles
        from pivotrl.runtime.device import DeviceWorker

        self.device, self.role, self.next_ids = device, role, ids
        self.engine = ScriptedEngine(kv_capacity_tokens=seqs * 40_000)
        self.worker = DeviceWorker(device, threads=1)
        spec = roles.RoleSpec(role, "policy" if role == Role.ROLLOUT else "genrm", model_dir,
                              engine=EngineSpec.for_role(EngineConfig(name="cpu"), role.value))
        with mock.patch.object(roles, "build_engine", lambda spec, **kw: self.engine):
            self.worker.shift_up(spec)  # the real shift up, with this engine in place of a model's
        self.ids: list[int] = []
        self.add(seqs, ledger=None)

    def add(self, n: int, ledger: Any) -> None:
        reqs = [GenerationRequest(next(self.next_ids), [1, 2, 3]) for _ in range(n)]
        self.worker.submit(reqs)
        for r in reqs:
            self.ids.append(r.seq_id)
            if ledger is not None:
                ledger.place(self.role, r.seq_id, self.device)

    def close(self) -> None:
        self.worker.close()


def _poll(rep: Replica, expect_completions: bool) -> tuple[bytes, float]:
    """The device side of one poll: `DeviceWorker.poll` (waiting for the completions the device's
    loop collects, if any) and the pickling Ray would do; CPU seconds of the polling thread."""
    t = time.thread_time()
    blob = pickle.dumps(rep.worker.poll(5.0 if expect_completions else 0.0), protocol=5)
    return blob, time.thread_time() - t


def _driver_pass(blobs: list[tuple[Replica, bytes]], ledger: Any, monitor: Any) -> tuple[int, int]:
    """The driver's side of one round of polls: what `DeviceDriver._on_poll` does per poll."""
    from pivotrl.runtime.driver import take_poll
    from pivotrl.runtime.ledger import Tokens
    from pivotrl.runtime.monitor import Monitor

    new = done = 0
    for rep, blob in blobs:
        res = pickle.loads(blob)
        new += take_poll(ledger, monitor or Monitor(), rep.role, rep.device, res)
        for c in res.completions:
            done += ledger.accept(rep.role, c.seq_id, rep.device, Tokens.of(c.token_ids, c.logprobs))
    return new, done


def verify(reps: list[Replica], ledger: Any) -> None:
    """The ledger holds exactly what each engine reported of its live sequences (after a final
    poll of each), and every sequence the engines finished as its completion had it."""
    for rep in reps:
        _driver_pass([(rep, _poll(rep, False)[0])], ledger, None)
        for sid, s in rep.engine.live.items():
            got = ledger.so_far(rep.role, sid)
            if list(got.ids) != s.generated.tolist() or list(got.logprobs) != s.logprobs.tolist():
                raise AssertionError(f"device {rep.device} seq {sid}: the ledger holds {len(got)} tokens "
                                     f"that differ from the engine's {len(s.generated)}")


def measure(replicas: int, seqs: int, lengths: list[int], k: int, passes: int, seed: int = 0,
            check: bool = False) -> list[dict[str, Any]]:
    """One row per length (module docstring); `check`: `verify` the ledger after each length."""
    from pivotrl.runtime.ledger import SequenceLedger
    from pivotrl.runtime.monitor import Monitor

    rng = random.Random(seed)
    # rows as wide as the longest sequence, as the driver makes them (no widening mid-run)
    longest = max(lengths) + k * (passes + 1)
    ledger = SequenceLedger(widths={Role.ROLLOUT: longest, Role.REWARD: int(longest * JUDGE_OVER_RESPONSE) + k})
    monitor = Monitor()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as model_dir:
        ids = itertools.count()  # dense, as a run's sample ids
        reps = [Replica(d, Role.ROLLOUT if d % 2 == 0 else Role.REWARD, seqs, ids, model_dir) for d in range(replicas)]
        try:
            for rep in reps:
                for sid in rep.ids:
                    ledger.place(rep.role, sid, rep.device)
            for L in lengths:
                for rep in reps:  # grow to this length through the real path, one device at a time
                    rep.engine.grow_to(int(L * (JUDGE_OVER_RESPONSE if rep.role == Role.REWARD else 1)))
                    _driver_pass([(rep, _poll(rep, False)[0])], ledger, monitor)
                dev_s, drv_cpu, drv_wall, new_tokens, finished = [], [], [], [], 0
                for _ in range(passes):
                    blobs, per_dev = [], []
                    for rep in reps:
                        length = L * (JUDGE_OVER_RESPONSE if rep.role == Role.REWARD else 1)
                        rate = seqs * k / length  # completions per poll in a steady run
                        n_done = int(rate) + (rng.random() < rate - int(rate))
                        rep.engine.advance(k)
                        rep.engine.finish(n_done)
                        blob, secs = _poll(rep, n_done > 0)
                        blobs.append((rep, blob))
                        per_dev.append(secs)
                        if n_done:
                            rep.add(n_done, ledger)
                    t0, c0 = time.perf_counter(), time.thread_time()
                    new, done = _driver_pass(blobs, ledger, monitor)
                    drv_cpu.append(time.thread_time() - c0)
                    drv_wall.append(time.perf_counter() - t0)
                    dev_s.extend(per_dev)
                    new_tokens.append(new)
                    finished += done
                tok = sum(new_tokens)
                rows.append({
                    "response_len": L, "judgement_len": int(L * JUDGE_OVER_RESPONSE),
                    "new_tokens_per_pass": int(statistics.median(new_tokens)), "completions": finished,
                    "device_poll_ms": statistics.median(dev_s) * 1e3,
                    # per token: all passes' CPU over all their new tokens (completions amortised)
                    "device_us_per_token": sum(dev_s) / tok * 1e6,
                    "driver_pass_ms": statistics.median(drv_cpu) * 1e3,
                    "driver_pass_max_ms": max(drv_cpu) * 1e3,
                    "driver_pass_wall_ms": statistics.median(drv_wall) * 1e3,
                    "driver_us_per_token": sum(drv_cpu) / tok * 1e6,
                })
                if check:
                    verify(reps, ledger)
                print(f"length {L}: device poll {rows[-1]['device_poll_ms']:.3f} ms, driver pass "
                      f"{rows[-1]['driver_pass_ms']:.2f} ms CPU", flush=True)
        finally:
            for rep in reps:
                rep.close()
    return rows


def main(argv: list[str]) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=24)
    p.add_argument("--seqs", type=int, default=256, help="live sequences per replica")
    p.add_argument("--lengths", default="1000,2000,4000,8000,15000", help="response lengths to grow to")
    p.add_argument("--tokens-per-poll", type=int, default=4, help="new tokens per sequence per poll")
    p.add_argument("--passes", type=int, default=10)
    a = p.parse_args(argv)
    lengths = [int(x) for x in a.lengths.split(",")]
    rows = measure(a.replicas, a.seqs, lengths, a.tokens_per_poll, a.passes)
    print()
    print_table(rows, "bookkeeping per length (CPU time; wall where named)")
    first, last = rows[0], rows[-1]
    ratio = last["driver_us_per_token"] / first["driver_us_per_token"]
    print(f"driver cost per new token at {last['response_len']} / at {first['response_len']}: {ratio:.2f}x "
          f"(target <= 1.5); driver pass at {last['response_len']}: {last['driver_pass_ms']:.2f} ms CPU (target < 10)")
    write_json(a.json, "bookkeeping", rows, replicas=a.replicas, seqs=a.seqs, tokens_per_poll=a.tokens_per_poll,
               passes=a.passes, per_token_ratio=ratio)
    return 0
