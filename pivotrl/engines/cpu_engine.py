"""`CPUEngine`: continuous batching over a `transformers` causal LM with a real KV cache.

Owns: intake and admission (by `max_num_seqs` and a KV token budget), the step (decode the running
batch, then prefill admitted sequences), abort with tokens-so-far and resume by re-prefill, weight
loads and memory release with their versions, and timing samples for the throughput model. It is
the fallback engine and the engine of the tests. It knows nothing about Ray, schedulers or vLLM.

The running batch (one shared left-padded KV cache, batched prefill and decode, sampling) is
`cpu_batch.py`'s; loading Hugging Face folders and weights in place is `hf_model.py`'s. One
`step()` decodes one token for every sequence already running, then admits and prefills waiting
ones (which also yields their first token), so each running sequence advances exactly one token
per step.

Timing samples (what the throughput model is fitted from: what a replica delivers, not only its
forward pass). A `PrefillSample` times one batched prefill (the model call and sampling). An
`IterationSample`'s `seconds` is the wall time the replica spent on that decode iteration while its
batch stayed busy: from the end of the previous decode iteration (or from the moment the batch went
from empty to busy, or from the end of an abort or weight load that interrupted it) to the end of
this one, minus the prefill time recorded in between. So it covers the model call and sampling, and
also what a replica does around them every iteration: token bookkeeping, dropping finished rows and
merging admitted ones into the cache, the device loop and its lock (waits for the driver's polls,
and submits), and contention for the cores. Time with no running sequence is not
counted (the replica had no work), nor are aborts and weight loads (a weight load is timed by the
runtime as a refresh). The busy time of a replica is thus split exactly into iteration and prefill
samples. The forward-only time (model call and sampling) of the last iteration stays in
`last_forward_s` for diagnostics.

Intake (why `submit` does not wait for a step). `step()` holds the engine lock for a whole decode
and prefill. A driver that submits work (the device actor, on the driver's dispatch) would wait
that long for every submit, and the runtime's driver waits for its submits: on shared cores that
made dispatch the driver's main occupation (57 s of an 80 s run) while replicas starved. So
`submit` validates the request and hands it over under a small intake lock only; every entry that
looks at sequences (`step`, `abort`, `snapshot`, `has_unfinished`, `stats`, `release_memory`) first
moves the handed-over sequences into the waiting queue, in submission order. A sequence's version
tag is the engine's version when it moves into the queue (before any of its tokens is generated).

Behaviour log-probs (protocol docstring, `cpu_batch.sample_next`): a resume continues the list it
was given (`GenerationRequest.generated_logprobs`).
"""
from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Iterable, Mapping

import torch

from pivotrl.config.engine import EngineConfig
from pivotrl.engines.cpu_batch import CPUSeq, batch_class_for, sample_next
from pivotrl.engines.hf_model import eos_ids_of, load_hf_model, load_hf_tokenizer, load_state_dict_in_place
from pivotrl.engines.protocol import (FINISH_LENGTH, FINISH_STOP, Completion, EngineStats,
                                      GenerationRequest, IterationSample, PrefillSample, TokenDeltas,
                                      run_to_completion)

_MAX_SAMPLES = 10_000  # timing samples kept between stats() calls (oldest dropped)


class CPUEngine:
    """Continuous-batching engine over a `transformers` model on the CPU (see module docstring)."""

    name = "cpu"
    tensor_parallel_size = 1
    """One device per replica (a replica of several devices needs vLLM)."""

    def __init__(self, model_path: str | Path, cfg: EngineConfig | None = None, version: int = 0,
                 tokenizer_path: str | Path | None = None, *, tensor_parallel_size: int = 1,
                 read_weights: bool = True) -> None:
        """`read_weights` False builds the model from its config alone, without reading the
        folder's weights, for a caller that loads others next (a cold policy engine, from GPS)."""
        if tensor_parallel_size != 1:
            raise ValueError(f"the cpu engine runs one device per replica, not tensor_parallel_size="
                             f"{tensor_parallel_size} (a replica of several devices needs engine=vllm)")
        self.cfg = cfg or EngineConfig(name="cpu")
        self.model_path = Path(model_path)
        if self.cfg.num_threads:
            torch.set_num_threads(self.cfg.num_threads)
        self.model = load_hf_model(self.model_path, self.cfg.dtype, read_weights)
        self.tokenizer = load_hf_tokenizer(tokenizer_path or self.model_path)
        self.initial_version = version
        self.version = version
        self.eos_ids = eos_ids_of(self.model.config)
        model_max = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        self.max_model_len = min(self.cfg.max_model_len or model_max, model_max)
        self._gen = torch.Generator().manual_seed(self.cfg.seed)
        self._lock = threading.RLock()
        self._intake = threading.Lock()  # guards _incoming and _live (module docstring: Intake)
        self._incoming: list[CPUSeq] = []
        self._live: set[int] = set()  # submitted and not yet finished or aborted
        self._waiting: collections.deque[CPUSeq] = collections.deque()
        self._batch = batch_class_for(self.model.config)()  # the running rows and their cache
        self._finished: list[Completion] = []
        self._iters: collections.deque[IterationSample] = collections.deque(maxlen=_MAX_SAMPLES)
        self._prefills: collections.deque[PrefillSample] = collections.deque(maxlen=_MAX_SAMPLES)
        self._generated_total = 0
        self._reprefill_total = 0
        self._released = False
        # iteration timing (module docstring): start of the current busy interval, and prefill
        # seconds recorded since then (subtracted from the next iteration sample)
        self._mark: float | None = None
        self._prefill_since_mark = 0.0
        self.last_forward_s = 0.0

    # ------------------------------------------------------------------ submission / driving
    def submit(self, request: GenerationRequest) -> None:
        """Validate and hand over (module docstring: Intake); never waits for a running step."""
        self._check_live()
        if len(request.prompt_ids) >= self.max_model_len:
            raise ValueError(f"seq {request.seq_id}: prompt of {len(request.prompt_ids)} tokens does not fit "
                             f"max_model_len={self.max_model_len}")
        p = request.params
        stops = frozenset() if p.ignore_eos else frozenset(p.stop_token_ids) | self.eos_ids
        gen = torch.Generator().manual_seed(p.seed) if p.seed is not None else None
        lps = None if request.generated_logprobs is None else list(request.generated_logprobs)
        seq = CPUSeq(request, list(request.generated), self.version, stops, gen, logprobs=lps,
                     reported=len(request.generated))
        if request.resumed:
            seq.reprefill = seq.total
        with self._intake:
            if request.seq_id in self._live:
                raise ValueError(f"seq_id {request.seq_id} is already live in engine {self.name}")
            self._live.add(request.seq_id)
            self._incoming.append(seq)

    def _take_incoming(self) -> None:
        """Move handed-over sequences into the waiting queue (call with `_lock` held)."""
        with self._intake:
            new, self._incoming = self._incoming, []
        for seq in new:
            seq.version = self.version
            reason = self._finish_reason(seq)
            if reason is not None:  # resumed with nothing left to generate
                self._finished.append(self._completion(seq, reason))
            else:
                self._waiting.append(seq)

    def has_unfinished(self) -> bool:
        with self._lock:
            self._take_incoming()
            return bool(self._waiting or self._batch.seqs or self._finished)

    def step(self, timeout: float | None = None) -> list[Completion]:
        """One iteration: decode the running batch, then admit and prefill waiting sequences."""
        del timeout  # synchronous: the work is done in this call
        with self._lock:
            self._check_live()
            self._take_incoming()
            if self._batch.seqs:
                self._decode()
            self._admit()
            out, self._finished = self._finished, []
            return out

    def generate(self, requests: Iterable[GenerationRequest]) -> list[Completion]:
        return run_to_completion(self, requests)

    def snapshot(self, seq_ids: Iterable[int] | None = None) -> dict[int, list[int]]:
        with self._lock:
            self._take_incoming()
            want = None if seq_ids is None else set(seq_ids)
            return {s.req.seq_id: s.so_far() for s in (*self._waiting, *self._batch.seqs)
                    if want is None or s.req.seq_id in want}

    def new_tokens(self) -> TokenDeltas:
        """Each running sequence's tokens since the last call (waiting ones have generated none)."""
        with self._lock:
            return TokenDeltas.since_reported(self._batch.seqs)

    def abort(self, seq_ids: Iterable[int] | None = None) -> dict[int, list[int]]:
        with self._lock:
            self._take_incoming()
            want = None if seq_ids is None else set(seq_ids)
            hit = lambda s: want is None or s.req.seq_id in want  # noqa: E731
            out = {s.req.seq_id: s.so_far() for s in self._waiting if hit(s)}
            self._waiting = collections.deque(s for s in self._waiting if not hit(s))
            keep = [i for i, s in enumerate(self._batch.seqs) if not hit(s)]
            for i, s in enumerate(self._batch.seqs):
                if hit(s):
                    out[s.req.seq_id] = s.so_far()
            if len(keep) != len(self._batch.seqs):
                self._batch.keep_rows(keep)
            self._restart_interval()
            with self._intake:
                self._live.difference_update(out)
            return out

    # ------------------------------------------------------------------ weights / memory
    def load_weights(self, state_dict: Mapping[str, object], version: int) -> None:
        """Replace the weights in place. `state_dict` may also be a leased GPS `FileManifest`:
        its node buffer is mapped and its tensors read as views (one copy, from the GPS pages into
        the parameters)."""
        if hasattr(state_dict, "to_wire"):
            from pivotrl.engines.weight_sync import iter_manifest_tensors

            state_dict = dict(iter_manifest_tensors(state_dict.to_wire()))
        with self._lock:
            self._check_live()
            load_state_dict_in_place(self.model, state_dict)
            self.version = int(version)
            self._restart_interval()  # the load is not decode time (the runtime times it)

    def release_memory(self, level: int = 2) -> None:
        """Drop the KV cache; level 2 also drops the model (re-read from the folder on
        reacquire), level 1 keeps it (on CPU host memory *is* the device: a frozen model then
        comes back without a read, as vLLM's level-1 sleep keeps weights in host memory)."""
        if level not in (1, 2):
            raise ValueError(f"release_memory: level must be 1 or 2, got {level!r}")
        with self._lock:
            self._take_incoming()
            if self._live_ids():
                raise RuntimeError(f"release_memory: engine {self.name} still has live sequences "
                                   f"{sorted(self._live_ids())[:8]}...; abort them first")
            self._batch.clear()
            if level == 2:
                self.model = None
            self._released = True
            self._restart_interval()
            # no gc.collect(): the cache and model hold no reference cycles, so they are freed
            # here by reference counting; a full collection cost 0.19 CPU-s per shift down (4.5-
            # 11.6 % of an inference device's CPU in the default run; docs/benchmarks-history.md,
            # issue 19 item 4)

    def reacquire_memory(self, state_dict: Mapping[str, object] | None = None,
                         version: int | None = None) -> dict[str, float]:
        with self._lock:
            if not self._released:
                return {}
            times: dict[str, float] = {}
            t = time.perf_counter()
            if self.model is None:  # level-2 release: the folder's weights, at the initial version,
                # unless others come next (then the folder's config alone)
                self.model = load_hf_model(self.model_path, self.cfg.dtype, read_weights=state_dict is None)
                self.version = self.initial_version
                times["read_folder_s" if state_dict is None else "build_s"] = time.perf_counter() - t
            self._released = False
            if state_dict is not None:  # a state dict, or a leased GPS FileManifest
                t = time.perf_counter()
                self.load_weights(state_dict, self.initial_version if version is None else version)
                times["load_s"] = time.perf_counter() - t
            return times

    def shutdown(self) -> None:
        with self._lock:
            with self._intake:
                self._incoming.clear()
                self._live.clear()
            self._waiting.clear()
            self._batch.clear()
            self._restart_interval()
            self.model = None
            self._released = True

    # ------------------------------------------------------------------ stats
    def stats(self, drain: bool = True) -> EngineStats:
        with self._lock:
            self._take_incoming()
            st = EngineStats(
                running=len(self._batch.seqs), waiting=len(self._waiting), kv_tokens=self._kv_tokens(),
                kv_capacity_tokens=self.cfg.kv_capacity_tokens, version=self.version,
                memory_released=self._released, generated_tokens=self._generated_total,
                reprefill_tokens=self._reprefill_total, iterations=list(self._iters),
                prefills=list(self._prefills))
            if drain:
                self._iters.clear()
                self._prefills.clear()
            return st

    # ------------------------------------------------------------------ internals
    def _check_live(self) -> None:
        if self._released:
            raise RuntimeError(f"engine {self.name}: memory is released (call reacquire_memory() first)")

    def _restart_interval(self) -> None:
        """Start a new busy interval now (None if the batch is empty): what happened before (an
        abort, a weight load, idle time) is not charged to the next iteration sample."""
        self._mark = time.perf_counter() if self._batch.seqs else None
        self._prefill_since_mark = 0.0

    def _live_ids(self) -> set[int]:
        return {s.req.seq_id for s in (*self._waiting, *self._batch.seqs)}

    def _kv_tokens(self) -> int:
        return self._batch.kv_tokens()

    def _finish_reason(self, s: CPUSeq) -> str | None:
        if s.generated and s.generated[-1] in s.stops:
            return FINISH_STOP
        if len(s.generated) >= s.req.params.max_tokens or s.total >= self.max_model_len:
            return FINISH_LENGTH
        return None

    def _completion(self, s: CPUSeq, reason: str) -> Completion:
        with self._intake:
            self._live.discard(s.req.seq_id)
        return Completion(seq_id=s.req.seq_id, prompt_ids=list(s.req.prompt_ids), token_ids=list(s.generated),
                          finish_reason=reason, version=s.version, reprefill_tokens=s.reprefill,
                          logprobs=None if s.logprobs is None else list(s.logprobs))

    def _admit(self) -> None:
        room = self.cfg.max_num_seqs - len(self._batch.seqs)
        kv = self._kv_tokens()
        new: list[CPUSeq] = []
        while self._waiting and len(new) < room:
            need = self._waiting[0].total
            # Admit at least one sequence into an empty engine, so an oversized one cannot wedge it.
            if kv + need > self.cfg.kv_capacity_tokens and (self._batch.seqs or new):
                break
            s = self._waiting.popleft()
            new.append(s)
            kv += need
        if new:
            self._prefill(new)

    def _prefill(self, seqs: list[CPUSeq]) -> None:
        t0 = time.perf_counter()
        if self._mark is None or not self._batch.seqs:  # the batch turns busy: an interval starts
            self._mark, self._prefill_since_mark = t0, 0.0
        cache, valid, logits = self._batch.prefill(self.model, seqs)
        nxt, lps = sample_next(logits, seqs, self._gen)
        secs = time.perf_counter() - t0
        self._prefills.append(PrefillSample(tokens=sum(s.total for s in seqs), num_seqs=len(seqs), seconds=secs))
        self._prefill_since_mark += secs
        self._reprefill_total += sum(s.reprefill for s in seqs)
        offset = len(self._batch.seqs)
        self._batch.merge(seqs, cache, valid)
        self._append_tokens(nxt, lps, offset)

    def _decode(self) -> None:
        bt = self._batch
        t0 = time.perf_counter()
        n, k = len(bt.seqs), self._kv_tokens()
        nxt, lps = sample_next(bt.decode(self.model), bt.seqs, self._gen)
        self.last_forward_s = time.perf_counter() - t0
        self._append_tokens(nxt, lps)
        end = time.perf_counter()
        # the busy interval since the previous iteration ended, less the prefills inside it
        # (module docstring); without a mark (cannot happen with rows running) the forward only
        secs = end - t0 if self._mark is None else max(end - self._mark - self._prefill_since_mark, end - t0)
        self._iters.append(IterationSample(num_seqs=n, kv_tokens=k, seconds=secs))
        self._mark = end if self._batch.seqs else None
        self._prefill_since_mark = 0.0

    def _append_tokens(self, nxt: list[int], lps: list[float], offset: int = 0) -> None:
        """Give row offset+j the token nxt[j] (log-prob lps[j]); finished rows leave the batch."""
        keep = list(range(offset))
        for j, t in enumerate(nxt):
            s = self._batch.seqs[offset + j]
            s.generated.append(t)
            if s.logprobs is not None:
                s.logprobs.append(lps[j])
            self._generated_total += 1
            reason = self._finish_reason(s)
            if reason is None:
                keep.append(offset + j)
            else:
                self._finished.append(self._completion(s, reason))
        if len(keep) != len(self._batch.seqs):
            self._batch.keep_rows(keep)
