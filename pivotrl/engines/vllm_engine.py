"""`VLLMEngine`: vLLM's v1 `AsyncLLM` behind the project's synchronous `InferenceEngine` protocol.

Owns: starting `AsyncLLM` in a background asyncio loop thread, one streaming task per sequence
(`RequestOutputKind.DELTA`, so tokens so far are always known here), abort that returns those
tokens, resume by re-prefilling `prompt + tokens so far`, weight loading through a worker
extension class, memory release for role shifts, and load/timing stats. Knows nothing about
schedulers or Ray: a Ray actor wraps this object like any other engine.

Weight loading. vLLM runs the model in its engine-core process. `load_weights` writes the state
dict to a safetensors file in `/dev/shm` (RAM) and calls the worker extension
`PivotWorkerExtension.pivot_load_weights_from_file` (`vllm_worker.py`) through `collective_rpc` by method *name*
(vLLM resolves `worker_extension_cls` by qualified name inside the worker; nothing is pickled).
The worker feeds the tensors to vLLM's in-place `reload_weights`, which knows vLLM's fused QKV and
gate/up layouts and redoes any post-load weight processing (the CPU build repacks linears). The same method loads a model folder's safetensors, which is how
`reacquire_memory()` restores GenRM weights, and it is where a GPS read lands later.

Memory release, as vLLM's RLHF recipe and the anchors (verl, slime, ROLL) do it. Where vLLM
supports sleep mode (CUDA, ROCm, XPU) `release_memory(level)` is `sleep(level)`: level 1 (the
frozen GenRM) copies the weights to host memory and drops the KV cache, level 2 (the policy) drops
both. `reacquire_memory` then wakes in three steps so weights and KV cache are never both being
allocated while a load needs room: `wake_up(tags=["weights"])`, the weight load (a level-1 wake
restores them in place and loads nothing unless new weights are given; a level-2 wake loads
the given state dict, else the model folder), then `wake_up(tags=["kv_cache"])`, and resets the
prefix cache (its blocks were computed under the old weights). A failure in any step shuts the
engine down and raises `EngineWakeError` (`pivotrl.engines.errors`); a failed `load_weights` on a
serving engine aborts its sequences (returned on the error for the queue), shuts it down and
raises `EngineLoadError`: a half-loaded engine never serves. vLLM's CPU build has no sleep mode;
there `EngineConfig.vllm_release_fallback` decides: `keep` (default) leaves the engine resident
and frees nothing (a level-2 shift up still loads the given weights, or the folder's; a level-1
one loads nothing), `restart` shuts the engine process down and starts a fresh one at the next
shift up (memory really goes back to the system; about 20 s per shift up on 2 cores, which
dominates a shifting run). The client (`AsyncLLM`) is built by `client_factory`, so tests
drive these branches with a recording stand-in, as on a GPU.

Timing samples for the throughput model come from a vLLM stat logger (`vllm_stats.py`).

Behaviour log-probs. Each request asks for the sampled token's log-prob (`logprobs=0`) and the
engine starts with `logprobs_mode="processed_logprobs"`. vLLM's default, `raw_logprobs`, is the
log-softmax of the raw logits, before temperature, so at T != 1 it is not the distribution the
token was drawn from. Checked in the installed vLLM 0.32 source (`v1/sample/sampler.py`,
`v1/sample/ops/topk_topp_sampler.py`): in processed mode the reported log-probs are
`log_softmax` of the logits after temperature (greedy rows use T = 1, `apply_temperature`) and
after top-k/top-p masking. That is the protocol's `log_softmax(logits / T)` whenever top_p = 1 and
top_k is off (the runtime's rollouts); with top_p < 1 vLLM reports the nucleus-renormalised value.
A resume continues the list it was given.

Seeds and chunked prefill. Each request carries its own `SamplingParams.seed`, so a sequence's
tokens depend on its seed only, not on which other sequences share its batches (an engine-wide
seed alone would make them depend on the batching, so no run would be reproducible). vLLM's CPU
build cannot combine those seeds with chunked prefill: after a step that prefilled only part of a
prompt, the model runner rewinds the request's generator over the discarded sample
(`gen.set_offset(gen.get_offset() - 4)` in `v1/worker/gpu_model_runner.py`, inherited by the CPU
runner), which only a Philox (CUDA) generator supports; a CPU generator raises `RuntimeError: CPU
Generator does not use offset` and the engine process dies. That happens whenever the prompts
waiting exceed a step's token budget (2,048 by default), e.g. a dozen 900-token prompts. So on the
CPU build the engine starts with chunked prefill off (`enable_chunked_prefill=False`); vLLM then
sets the step budget `max_num_batched_tokens` to at least `max_model_len`, so any prompt that fits
the model fits a step whole, and a step takes as many whole prompts as fit its budget (the others
wait for the next step). Per-request seeds stay, so runs are reproducible and batches of any size
run. Other platforms keep vLLM's default (chunked prefill on).

Install: `docs/install.md` (the CPU build's caveats, and the `gpu` extra for CUDA machines).
"""
from __future__ import annotations

import asyncio
import itertools
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pivotrl.config.engine import EngineConfig
from pivotrl.engines.cpu_engine import eos_ids_of, load_hf_tokenizer
from pivotrl.engines.errors import EngineFailedError, EngineLoadError, EngineWakeError
from pivotrl.engines.vllm_stats import StatState, make_stat_logger
from pivotrl.engines.vllm_worker import PivotWorkerExtension  # noqa: F401 - resolved by name in the workers
from pivotrl.engines.vllm_worker import write_weights_file
from pivotrl.engines.protocol import (FINISH_LENGTH, FINISH_STOP, Completion, EngineStats,
                                      GenerationRequest, TokensSoFar, run_to_completion)


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

    def so_far(self) -> TokensSoFar:
        return TokensSoFar(self.generated, self.logprobs)


class VLLMEngine:
    """vLLM AsyncLLM engine with the synchronous protocol (see module docstring)."""

    name = "vllm"

    def __init__(self, model_path: str | Path, cfg: EngineConfig | None = None, version: int = 0,
                 tokenizer_path: str | Path | None = None, *,
                 client_factory: Callable[["VLLMEngine"], Any] | None = None,
                 sleep_mode: bool | None = None) -> None:
        """`client_factory(engine)` builds the AsyncLLM-like client on the engine's loop thread
        (default: vLLM's `AsyncLLM` from this engine's settings); `sleep_mode` None asks the
        platform whether vLLM can sleep (CUDA, ROCm, XPU: yes; the CPU build: no)."""
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
        self._kv_capacity = 0
        self.tensor_parallel_size = int(self.cfg.vllm_tensor_parallel_size)
        self._released = False
        self._sleep_level = 0  # level of the current sleep (0: awake or stopped)
        self._failed: str | None = None
        self.last_wake: dict[str, float] = {}
        self._client_factory = client_factory or _start_async_llm
        self.sleep_mode = self._sleep_supported() if sleep_mode is None else bool(sleep_mode)
        self._llm = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()
        self._start_llm()

    # ------------------------------------------------------------------ engine lifecycle
    def _run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _start_llm(self) -> None:
        # The engine-core process must import this module to resolve the worker extension; the
        # repo may be on sys.path only through the working directory, so hand it on explicitly.
        pkg_root = str(Path(__file__).resolve().parents[2])
        parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if pkg_root not in parts:
            os.environ["PYTHONPATH"] = os.pathsep.join([pkg_root, *parts])
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(self.cfg.vllm_kv_cache_gib)))))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if self.cfg.num_threads:
            os.environ["OMP_NUM_THREADS"] = str(self.cfg.num_threads)
        self._run(self._astart(), timeout=self.cfg.vllm_start_timeout_s)

    async def _astart(self) -> None:
        try:
            self._llm = self._client_factory(self)
        except Exception as e:  # noqa: BLE001 - name the folder the user gave
            raise ValueError(f"vLLM could not start on model folder {str(self.model_path)!r}: "
                             f"{type(e).__name__}: {e}") from e
        cc = self._llm.vllm_config.cache_config
        self._kv_capacity = int((cc.num_gpu_blocks or 0) * (cc.block_size or 0))
        self.tensor_parallel_size = int(self._llm.vllm_config.parallel_config.tensor_parallel_size)
        """Devices the started engine runs across (vLLM's own parallel config)."""

    def engine_args(self) -> Any:
        """vLLM's `AsyncEngineArgs` for this engine (what the default client factory starts)."""
        from vllm.engine.arg_utils import AsyncEngineArgs

        return AsyncEngineArgs(
            model=str(self.model_path), tokenizer=str(self.model_path), dtype=self.cfg.dtype,
            max_model_len=self.max_model_len, max_num_seqs=self.cfg.max_num_seqs, seed=self.cfg.seed,
            enforce_eager=self.cfg.vllm_enforce_eager, tensor_parallel_size=self.cfg.vllm_tensor_parallel_size,
            # the replica's actor owns its devices: its ranks are this engine's own processes
            # (inside a Ray placement group vLLM would otherwise ask Ray for workers of its own)
            distributed_executor_backend="mp" if self.cfg.vllm_tensor_parallel_size > 1 else None,
            enable_expert_parallel=self.cfg.vllm_expert_parallel and self.cfg.vllm_tensor_parallel_size > 1,
            gpu_memory_utilization=self.cfg.vllm_gpu_memory_utilization,
            worker_extension_cls="pivotrl.engines.vllm_worker.PivotWorkerExtension",
            enable_sleep_mode=self.sleep_mode, disable_log_stats=False,
            # The CPU build cannot chunk a seeded request's prefill: see "Seeds and chunked
            # prefill" in the module docstring (None keeps vLLM's default elsewhere).
            enable_chunked_prefill=False if self.platform_is_cpu() else None,
            # Log-probs of the distribution sampled from (after temperature), not of the raw
            # logits: see "Behaviour log-probs" in the module docstring.
            logprobs_mode="processed_logprobs",
        )

    def _stop_llm(self) -> None:
        """Shut AsyncLLM down on the loop thread: its output handler then cannot run between the
        engine-core exit and its own cancellation (which would log a spurious EngineDeadError)."""
        async def stop(llm) -> None:
            llm.shutdown()

        llm, self._llm = self._llm, None
        if llm is not None:
            if self._loop.is_running():
                self._run(stop(llm), timeout=120)
            else:
                llm.shutdown()

    @staticmethod
    def platform_is_cpu() -> bool:
        """Whether vLLM runs on its CPU build here (no chunked prefill: see the module docstring)."""
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())

    @staticmethod
    def _sleep_supported() -> bool:
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())

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
                         reprefill=total if request.resumed else 0,
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
            self._loop.call_soon_threadsafe(self._spawn, live)

    def _spawn(self, live: _Live) -> None:
        live.task = self._loop.create_task(self._consume(live))

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
            async for out in self._llm.generate(prompt, sp, request_id=f"{live.req.seq_id}.{live.segment}"):
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

    def abort(self, seq_ids: Iterable[int] | None = None) -> dict[int, list[int]]:
        want = None if seq_ids is None else set(seq_ids)
        return self._run(self._aabort(want))

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
            await self._llm.abort(ids)
        return out

    # ------------------------------------------------------------------ weights / memory
    def _rpc_load_files(self, paths: list[str]) -> None:
        self._run(self._llm.collective_rpc("pivot_load_weights_from_file", args=(paths,)))

    def _load_state_dict(self, state_dict: Mapping[str, object]) -> None:
        """Hand `state_dict` to the workers as a `/dev/shm` safetensors file (module docstring)."""
        path = write_weights_file(state_dict)
        try:
            self._rpc_load_files([path])
        finally:
            os.unlink(path)

    def _reset_prefix_cache(self) -> None:
        reset = getattr(self._llm, "reset_prefix_cache", None)
        if reset is not None:
            self._run(reset())

    def load_weights(self, state_dict: Mapping[str, object], version: int) -> None:
        """Replace the weights of the serving engine in place and drop its prefix cache (those
        blocks were computed under the old weights). `state_dict` may also be a leased GPS
        `FileManifest`: the workers map its file and read the tensors as views (`vllm_worker.py`),
        in buckets of `EngineConfig.vllm_weight_bucket_mb` on CUDA. On failure the engine aborts
        its sequences, shuts down and raises `EngineLoadError` carrying their tokens."""
        self._check_live()
        try:
            self._load(state_dict)
            self._reset_prefix_cache()
        except Exception as e:  # noqa: BLE001 - typed for the runtime, engine made unusable
            raise self._fail(EngineLoadError, "load", e) from e
        self.version = int(version)

    def _load(self, weights: Any) -> None:
        """Into the workers: a GPS `FileManifest` (they map its file) or a state dict."""
        if hasattr(weights, "to_wire"):
            self._rpc_gps(weights)
        else:
            self._load_state_dict(weights)

    def _rpc_gps(self, manifest: Any) -> None:
        self._run(self._llm.collective_rpc("pivot_load_weights_from_gps",
                                           args=(manifest.to_wire(), self.cfg.vllm_weight_bucket_mb << 20)))

    def weight_checksum(self) -> float:
        """Sum of the worker's parameters (through the worker extension)."""
        return self._run(self._llm.collective_rpc("pivot_weight_checksum"))[0]

    def release_memory(self, level: int | None = None) -> None:
        """Free device memory (module docstring, "Memory release"). `level` 1 keeps the weights in
        host memory (frozen models), 2 discards them; None takes `EngineConfig.vllm_sleep_level`."""
        level = self.cfg.vllm_sleep_level if level is None else level
        if level not in (1, 2):
            raise ValueError(f"release_memory: level must be 1 or 2, got {level!r}")
        with self._lock:
            if self._live:
                raise RuntimeError(f"release_memory: engine {self.name} still has live sequences "
                                   f"{sorted(self._live)[:8]}...; abort them first")
            if self._released:
                return
            if self.sleep_mode:
                self._run(self._llm.sleep(level=level))
            elif self.cfg.vllm_release_fallback == "restart":
                self._stop_llm()
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
                if self._llm is None:  # no sleep mode: a fresh engine process loads the folder
                    self._start_llm()
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
                        self._run(self._llm.wake_up(tags=["weights"]))
                        times["wake_weights_s"] = time.perf_counter() - t
                    phase = "load_weights"
                    t = time.perf_counter()
                    if state_dict is not None:
                        self._load(state_dict)
                    elif self._sleep_level == 2:  # the weights were discarded: the folder's, again
                        self._rpc_load_files(sorted(str(p) for p in self.model_path.glob("*.safetensors")))
                        self.version = self.initial_version
                    times["load_s"] = time.perf_counter() - t
                    phase = "wake_kv_cache"
                    t = time.perf_counter()
                    if self.sleep_mode:
                        self._run(self._llm.wake_up(tags=["kv_cache"]))
                    self._reset_prefix_cache()
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
            if self._llm is not None and self._live:
                aborted = self.abort(None)
        except Exception:  # noqa: BLE001 - failing already; keep what could be taken
            pass
        try:
            self._stop_llm()
        except Exception:  # noqa: BLE001
            self._llm = None
        self._failed = f"{phase}: {type(cause).__name__}: {cause}"
        self._released = True
        return kind(f"engine {self.name} on {str(self.model_path)!r} failed in {phase}: "
                    f"{type(cause).__name__}: {cause}; it is shut down (rebuild it)", aborted=aborted, phase=phase)

    def shutdown(self) -> None:
        if threading.current_thread() is self._thread or not self._loop.is_running():
            # garbage-collected on the loop thread itself, or the loop already stopped: nothing
            # can wait on the loop here, so hand the client's own shutdown the rest
            llm, self._llm = self._llm, None
            if llm is not None:
                llm.shutdown()
            self._released = True
            return
        if self._llm is not None:
            try:
                self.abort()
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
            self._stop_llm()
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
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
                running=min(st.running, len(self._live)) if self._llm is not None else 0,
                waiting=min(st.waiting, len(self._live)), kv_tokens=k,
                kv_capacity_tokens=self._kv_capacity, version=self.version, memory_released=self._released,
                generated_tokens=self._generated_total, reprefill_tokens=self._reprefill_total,
                iterations=list(st.iters), prefills=list(st.prefills))
            if drain:
                st.iters.clear()
                st.prefills.clear()
            return out

    def _kv_tokens(self) -> int:
        """K: exact tokens of the live sequences while vLLM queues none of them; else vLLM's
        block usage (block-granular) so queued sequences are not counted."""
        if self._stat.waiting == 0 or not self._kv_capacity:
            return sum(len(l.req.prompt_ids) + len(l.generated) for l in list(self._live.values()))
        return int(round(self._stat.kv_usage * self._kv_capacity))

    def _check_live(self) -> None:
        if self._failed is not None:
            raise EngineFailedError(f"engine {self.name} failed ({self._failed}); rebuild it", phase="failed")
        if self._released or self._llm is None:
            raise RuntimeError(f"engine {self.name}: memory is released (call reacquire_memory() first)")


if __name__ == "__main__":  # pragma: no cover - manual smoke run: python -m pivotrl.engines.vllm_engine DIR
    from pivotrl.engines.protocol import SamplingParams

    eng = VLLMEngine(sys.argv[1])
    tok = eng.tokenizer
    print(eng.generate([GenerationRequest(0, tok.encode("hello"), SamplingParams(temperature=0, max_tokens=16))]))
    eng.shutdown()
