"""`VLLMEngine`: vLLM's v1 `AsyncLLM` behind the project's synchronous `InferenceEngine` protocol.

Owns: one streaming task per sequence (`RequestOutputKind.DELTA`, so the tokens so far and their
behaviour log-probs are always known here), abort that returns those tokens, resume by
re-prefilling `prompt + tokens so far`, weight loads with their version, memory release and
reacquire for role shifts, and load/timing stats. The engine process itself (loop thread, start,
stop, calls into the workers) is `vllm_client.py`'s; timing samples come from `vllm_stats.py`.
Knows nothing about schedulers or Ray: a Ray actor wraps this object like any other engine.

Memory release (vLLM's RLHF recipe, as verl, slime and ROLL do it): where vLLM can sleep (CUDA,
ROCm, XPU) `release_memory(level)` is `sleep(level)`, level 1 (the frozen GenRM) keeping the
weights in host memory and level 2 (the policy) dropping them; `reacquire_memory` wakes the weights,
loads (new weights, or the folder's after level 2), then wakes the KV cache, so weights and KV
cache are never both being allocated during a load, and resets the prefix cache. A failed wake or
load shuts the engine down and raises `EngineWakeError`/`EngineLoadError` with the aborted tokens:
a half-loaded engine never serves. The CPU build cannot sleep: `EngineConfig.vllm_release_fallback`
then keeps the engine resident (`keep`) or restarts its process at the next shift up (`restart`).
Each request carries its own seed, so a sequence's tokens never depend on its batch-mates.
The measurements behind these choices: docs/vllm_engine.md.
Install: `docs/install.md`.
"""
from __future__ import annotations

import asyncio
import itertools
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from pivotrl.config.engine import EngineConfig
from pivotrl.engines.hf_model import eos_ids_of, load_hf_tokenizer
from pivotrl.engines.errors import EngineFailedError, EngineLoadError, EngineWakeError
from pivotrl.engines.vllm_stats import StatState, make_stat_logger
from pivotrl.engines.vllm_client import VLLMClient, async_engine_args, sleep_supported
from pivotrl.engines.protocol import (FINISH_LENGTH, FINISH_STOP, Completion, EngineStats,
                                      GenerationRequest, TokenDeltas, TokensSoFar, run_to_completion)

if TYPE_CHECKING:
    from pivotrl.gps.handles import FileManifest


def vllm_available() -> bool:
    """Whether vLLM imports here (without importing it: a failed import can be slow)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _start_async_llm(engine: "VLLMEngine") -> Any:
    """The default client factory: vLLM's v1 `AsyncLLM`, with the engine's stat logger."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(engine.engine_args(), stat_loggers=[engine.stat_logger_factory()])


@dataclass
class _Live:
    req: GenerationRequest
    generated: list[int]
    version: int
    segment: int
    reprefill: int = 0
    task: object = None
    done: bool = False
    logprobs: list[float] | None = None  # behaviour log-prob per generated token; None = unknown
    reported: int = 0  # tokens of `generated` already reported by `new_tokens` (or given at submit)

    def so_far(self) -> TokensSoFar:
        return TokensSoFar(self.generated, self.logprobs)


class VLLMEngine:
    """vLLM AsyncLLM engine with the synchronous protocol (see module docstring)."""

    name = "vllm"

    def __init__(self, model_path: str | Path, cfg: EngineConfig | None = None, version: int = 0,
                 tokenizer_path: str | Path | None = None, *,
                 client_factory: Callable[["VLLMEngine"], Any] | None = None,
                 sleep_mode: bool | None = None, tensor_parallel_size: int = 1, read_weights: bool = True) -> None:
        """`client_factory(engine)` builds the AsyncLLM-like client on the engine's loop thread
        (default: vLLM's `AsyncLLM` from this engine's settings); `sleep_mode` None asks the
        platform whether vLLM can sleep (CUDA, ROCm, XPU: yes; the CPU build: no);
        `tensor_parallel_size`: the devices the engine runs across (`EngineSpec`); `read_weights`
        False starts without reading the folder's weights (vLLM's `load_format="dummy"`: random
        values, for a caller that loads the real ones next, e.g. a cold policy engine from GPS)."""
        from transformers import AutoConfig

        self.cfg = cfg or EngineConfig(name="vllm")
        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").is_file():
            raise ValueError(f"model folder {str(self.model_path)!r} does not exist or has no config.json")
        try:
            hf_cfg = AutoConfig.from_pretrained(str(self.model_path))
        except Exception as e:  # noqa: BLE001 - re-raised naming the folder
            raise ValueError(f"model folder {str(self.model_path)!r} does not load: {type(e).__name__}: {e}") from e
        self.tokenizer = load_hf_tokenizer(tokenizer_path or self.model_path)
        self.eos_ids = eos_ids_of(hf_cfg)
        model_max = int(getattr(hf_cfg, "max_position_embeddings", 1 << 30))
        self.max_model_len = min(self.cfg.max_model_len or model_max, model_max)
        self.initial_version = self.version = version
        self._lock = threading.RLock()
        self._live: dict[int, _Live] = {}
        self._done: queue.Queue[Completion] = queue.Queue()
        self._segments = itertools.count()
        self._stat = StatState()
        self._generated_total = 0
        self._reprefill_total = 0
        self._released = False
        self._sleep_level = 0  # level of the current sleep (0: awake or stopped)
        self._failed: str | None = None
        self.last_wake: dict[str, float] = {}
        self.sleep_mode = sleep_supported() if sleep_mode is None else bool(sleep_mode)
        factory = client_factory or _start_async_llm
        self._requested_tp = int(tensor_parallel_size)
        self._read_weights = bool(read_weights)
        self._client = VLLMClient(lambda: factory(self), self._requested_tp)
        self._client.start(self.cfg, self.model_path)

    # ------------------------------------------------------------------ engine lifecycle
    @property
    def tensor_parallel_size(self) -> int:
        """Devices the engine runs across (vLLM's own parallel config once started)."""
        return self._client.tensor_parallel_size

    @property
    def executor_backend(self) -> str:
        """Where the started engine's ranks run: "uni" (inside its engine-core process) or "mp"."""
        return self._client.executor_backend

    @property
    def ipc_dir(self) -> Path | None:
        """The running engine process's socket folder (None while stopped): `VLLMClient.ipc_dir`."""
        return self._client.ipc_dir

    def engine_args(self) -> Any:
        """vLLM's `AsyncEngineArgs` for this engine (what the default client factory starts)."""
        return async_engine_args(self.model_path, self.cfg, self.max_model_len, self._requested_tp, self.sleep_mode,
                                 read_weights=self._read_weights)

    def stat_logger_factory(self) -> type:
        """The vLLM stat logger class that turns engine batches into this engine's timing samples."""
        return make_stat_logger(self._stat, self._kv_tokens)

    # ------------------------------------------------------------------ submission / driving
    def submit(self, request: GenerationRequest) -> None:
        with self._lock:
            self._check_live()
            if request.seq_id in self._live:
                raise ValueError(f"seq_id {request.seq_id} is already live in engine {self.name}")
            total = len(request.prompt_ids) + len(request.generated)
            if len(request.prompt_ids) >= self.max_model_len:
                raise ValueError(f"seq {request.seq_id}: prompt of {len(request.prompt_ids)} tokens does not fit "
                                 f"max_model_len={self.max_model_len}")
            live = _Live(request, list(request.generated), self.version, next(self._segments),
                         reprefill=total if request.resumed else 0, reported=len(request.generated),
                         logprobs=None if request.generated_logprobs is None else list(request.generated_logprobs))
            stops = set() if request.params.ignore_eos else set(request.params.stop_token_ids) | self.eos_ids
            if live.generated and live.generated[-1] in stops:
                self._finish(live, FINISH_STOP)
                return
            if min(request.remaining, self.max_model_len - total) <= 0:
                self._finish(live, FINISH_LENGTH)
                return
            self._live[request.seq_id] = live
            self._reprefill_total += live.reprefill
            self._client.loop.call_soon_threadsafe(self._spawn, live)

    def _spawn(self, live: _Live) -> None:
        live.task = self._client.loop.create_task(self._consume(live))

    async def _consume(self, live: _Live) -> None:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        p, total = live.req.params, len(live.req.prompt_ids) + len(live.generated)
        sp = VSamplingParams(
            temperature=p.temperature, top_p=p.top_p, seed=p.seed,
            max_tokens=min(live.req.remaining, self.max_model_len - total),
            stop_token_ids=list(p.stop_token_ids), ignore_eos=p.ignore_eos,
            output_kind=RequestOutputKind.DELTA, detokenize=False, logprobs=0)
        prompt = {"prompt_token_ids": live.req.prompt_ids + live.generated}
        reason = None
        try:
            async for out in self._client.llm.generate(prompt, sp, request_id=f"{live.req.seq_id}.{live.segment}"):
                o = out.outputs[0]
                new_lps = self._sampled_logprobs(o)
                with self._lock:
                    live.generated.extend(o.token_ids)
                    if live.logprobs is not None:
                        live.logprobs.extend(new_lps)
                    self._generated_total += len(o.token_ids)
                if out.finished:
                    reason = o.finish_reason
        except asyncio.CancelledError:
            return  # aborted: abort() already took the tokens
        except Exception as e:  # noqa: BLE001 - surface in step(), do not kill the loop
            reason = f"error: {type(e).__name__}: {e}"
        with self._lock:
            if self._live.get(live.req.seq_id) is live:
                del self._live[live.req.seq_id]
                self._finish(live, FINISH_LENGTH if reason == "length" else
                             FINISH_STOP if reason == "stop" else str(reason))

    @staticmethod
    def _sampled_logprobs(o) -> list[float]:
        """The sampled tokens' log-probs of one DELTA output (`logprobs=0`: each position's dict
        holds the sampled token, perhaps beside a tied top-1 entry)."""
        lps = o.logprobs
        if not o.token_ids:  # a final output may carry no new token (and then no log-probs)
            return []
        if lps is None or len(lps) != len(o.token_ids):
            raise RuntimeError(f"vLLM returned {0 if lps is None else len(lps)} log-prob entries for "
                               f"{len(o.token_ids)} tokens (SamplingParams.logprobs=0 was requested)")
        return [float(d[t].logprob) for t, d in zip(o.token_ids, lps)]

    def _finish(self, live: _Live, reason: str) -> None:
        live.done = True
        self._done.put(Completion(seq_id=live.req.seq_id, prompt_ids=list(live.req.prompt_ids),
                                  token_ids=list(live.generated), finish_reason=reason, version=live.version,
                                  reprefill_tokens=live.reprefill,
                                  logprobs=None if live.logprobs is None else list(live.logprobs)))

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._live) or not self._done.empty()

    def step(self, timeout: float | None = 0.05) -> list[Completion]:
        """Wait up to `timeout` s (None: until one finishes or nothing is live) for completions."""
        out: list[Completion] = []
        try:
            if timeout is None:
                while not out and (self._live or not self._done.empty()):
                    try:
                        out.append(self._done.get(timeout=0.05))
                    except queue.Empty:
                        pass
            else:
                out.append(self._done.get(timeout=timeout))
        except queue.Empty:
            pass
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        for c in out:
            if c.finish_reason.startswith("error"):
                raise RuntimeError(f"vLLM engine: seq {c.seq_id} failed: {c.finish_reason}")
        return out

    def generate(self, requests: Iterable[GenerationRequest]) -> list[Completion]:
        return run_to_completion(self, requests, timeout=None)

    def snapshot(self, seq_ids: Iterable[int] | None = None) -> dict[int, list[int]]:
        with self._lock:
            want = None if seq_ids is None else set(seq_ids)
            return {i: l.so_far() for i, l in self._live.items() if want is None or i in want}

    def new_tokens(self) -> TokenDeltas:
        """Each live sequence's tokens since the last call (the streaming tasks append them)."""
        with self._lock:
            return TokenDeltas.since_reported(self._live.values())

    def abort(self, seq_ids: Iterable[int] | None = None) -> dict[int, list[int]]:
        want = None if seq_ids is None else set(seq_ids)
        return self._client.run(self._aabort(want))

    async def _aabort(self, want: set[int] | None) -> dict[int, list[int]]:
        # Runs on the loop thread, so no consumer task runs while tokens are taken and cancelled.
        with self._lock:
            hit = [l for i, l in self._live.items() if want is None or i in want]
            for l in hit:
                del self._live[l.req.seq_id]
                if l.task is not None:
                    l.task.cancel()
            out = {l.req.seq_id: l.so_far() for l in hit}
        ids = [f"{l.req.seq_id}.{l.segment}" for l in hit]
        if ids:
            await self._client.llm.abort(ids)
        return out

    # ------------------------------------------------------------------ weights / memory
    def load_weights(self, state_dict: Mapping[str, object], version: int) -> None:
        """Replace the weights of the serving engine in place and drop its prefix cache (those
        blocks were computed under the old weights). `state_dict` may also be a leased GPS
        `FileManifest`: the workers map its file and vLLM's loaders read each rank's shard from
        views of it (`vllm_worker.py`, `weight_sync.py`). On failure the engine aborts
        its sequences, shuts down and raises `EngineLoadError` carrying their tokens."""
        self._check_live()
        try:
            self._load(state_dict)
            self._client.reset_prefix_cache()
        except Exception as e:  # noqa: BLE001 - typed for the runtime, engine made unusable
            raise self._fail(EngineLoadError, "load", e) from e
        self.version = int(version)

    def _load(self, weights: FileManifest | Mapping[str, object]) -> None:
        """Into the workers: a GPS `FileManifest` (they map its file) or a state dict."""
        if hasattr(weights, "to_wire"):
            self._client.load_gps(weights)
        else:
            self._client.load_state_dict(weights)

    def weight_checksum(self) -> float:
        """Sum of the worker's parameters (through the worker extension)."""
        return self._client.weight_checksum()

    def release_memory(self, level: int = 2) -> None:
        """Free device memory (module docstring: Memory release). `level` 1 keeps the weights in
        host memory (frozen models), 2 discards them (the role hosts pass their `EngineSpec`'s)."""
        if level not in (1, 2):
            raise ValueError(f"release_memory: level must be 1 or 2, got {level!r}")
        with self._lock:
            if self._live:
                raise RuntimeError(f"release_memory: engine {self.name} still has live sequences "
                                   f"{sorted(self._live)[:8]}...; abort them first")
            if self._released:
                return
            if self.sleep_mode:
                self._client.sleep(level)
            elif self.cfg.vllm_release_fallback == "restart":
                self._client.stop()
            # else `keep`: the engine stays resident; the shift up loads what level 2 discarded
            self._sleep_level = level
            self._released = True

    def reacquire_memory(self, state_dict: Mapping[str, object] | None = None,
                         version: int | None = None) -> dict[str, float]:
        """Wake weights, load, wake the KV cache (module docstring); seconds of each phase (also
        kept in `last_wake`). `state_dict` may also be a leased GPS `FileManifest` (the workers
        then map the node buffer). Raises `EngineWakeError` (engine shut down) if any phase fails."""
        with self._lock:
            if self._failed is not None:
                raise EngineWakeError(f"engine {self.name} failed earlier ({self._failed}); rebuild it",
                                      phase="failed")
            if not self._released:
                return {}
            times: dict[str, float] = {}
            phase = "restart"
            try:
                t = time.perf_counter()
                if self._client.llm is None:  # no sleep mode: a fresh engine process (the folder's
                    self._read_weights = state_dict is None  # weights only when no others follow)
                    self._client.start(self.cfg, self.model_path)
                    times["restart_s"] = time.perf_counter() - t
                    self.version = self.initial_version
                    if state_dict is not None:
                        phase = "load_weights"
                        t = time.perf_counter()
                        self._load(state_dict)
                        times["load_s"] = time.perf_counter() - t
                else:  # asleep, or kept resident where vLLM cannot sleep (`vllm_release_fallback=keep`)
                    if self.sleep_mode:
                        phase = "wake_weights"
                        self._client.wake_up(["weights"])
                        times["wake_weights_s"] = time.perf_counter() - t
                    phase = "load_weights"
                    t = time.perf_counter()
                    if state_dict is not None:
                        self._load(state_dict)
                    elif self._sleep_level == 2:  # the weights were discarded: the folder's, again
                        self._client.load_files(sorted(str(p) for p in self.model_path.glob("*.safetensors")))
                        self.version = self.initial_version
                    times["load_s"] = time.perf_counter() - t
                    phase = "wake_kv_cache"
                    t = time.perf_counter()
                    if self.sleep_mode:
                        self._client.wake_up(["kv_cache"])
                    self._client.reset_prefix_cache()
                    times["wake_kv_s"] = time.perf_counter() - t
            except Exception as e:  # noqa: BLE001 - typed for the runtime, engine made unusable
                raise self._fail(EngineWakeError, phase, e) from e
            if state_dict is not None:
                self.version = self.initial_version if version is None else int(version)
            self._released = False
            self._sleep_level = 0
            self.last_wake = times
            return dict(times)

    def _fail(self, kind: type[EngineFailedError], phase: str, cause: BaseException) -> EngineFailedError:
        """Make the engine unusable (abort what is live, shut the client down) and build the error."""
        aborted: dict[int, Any] = {}
        try:
            if self._client.llm is not None and self._live:
                aborted = self.abort(None)
        except Exception:  # noqa: BLE001 - failing already; keep what could be taken
            pass
        try:
            self._client.stop()
        except Exception:  # noqa: BLE001
            self._client.llm = None
        self._failed = f"{phase}: {type(cause).__name__}: {cause}"
        self._released = True
        return kind(f"engine {self.name} on {str(self.model_path)!r} failed in {phase}: "
                    f"{type(cause).__name__}: {cause}; it is shut down (rebuild it)", aborted=aborted, phase=phase)

    def shutdown(self) -> None:
        if self._client.llm is not None and self._client.can_wait_on_loop():
            try:
                self.abort()
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
        self._client.close()
        self._released = True

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - interpreter teardown
            pass

    # ------------------------------------------------------------------ stats
    def stats(self, drain: bool = True) -> EngineStats:
        with self._lock:
            st = self._stat
            k = self._kv_tokens()
            out = EngineStats(
                # The stat logger reports vLLM's view as of its last output batch; never more
                # sequences than are live here (a finished batch may not be recorded yet).
                running=min(st.running, len(self._live)) if self._client.llm is not None else 0,
                waiting=min(st.waiting, len(self._live)), kv_tokens=k,
                kv_capacity_tokens=self._client.kv_capacity, version=self.version, memory_released=self._released,
                generated_tokens=self._generated_total, reprefill_tokens=self._reprefill_total,
                iterations=list(st.iters), prefills=list(st.prefills))
            if drain:
                st.iters.clear()
                st.prefills.clear()
            return out

    def _kv_tokens(self) -> int:
        """K: exact tokens of the live sequences while vLLM queues none of them; else vLLM's
        block usage (block-granular) so queued sequences are not counted."""
        if self._stat.waiting == 0 or not self._client.kv_capacity:
            return sum(len(l.req.prompt_ids) + len(l.generated) for l in list(self._live.values()))
        return int(round(self._stat.kv_usage * self._client.kv_capacity))

    def _check_live(self) -> None:
        if self._failed is not None:
            raise EngineFailedError(f"engine {self.name} failed ({self._failed}); rebuild it", phase="failed")
        if self._released or self._client.llm is None:
            raise RuntimeError(f"engine {self.name}: memory is released (call reacquire_memory() first)")


if __name__ == "__main__":  # pragma: no cover - manual smoke run: python -m pivotrl.engines.vllm_engine DIR
    from pivotrl.engines.protocol import SamplingParams

    eng = VLLMEngine(sys.argv[1])
    tok = eng.tokenizer
    print(eng.generate([GenerationRequest(0, tok.encode("hello"), SamplingParams(temperature=0, max_tokens=16))]))
    eng.shutdown()
