"""vLLM's engine process as `VLLMEngine` (`vllm_engine.py`) drives it: an `AsyncLLM` on a
background asyncio loop thread.

Owns: the loop thread, starting `AsyncLLM` (the environment its engine-core process needs, and
`AsyncEngineArgs` from an `EngineConfig`), stopping it, and the calls that reach vLLM's workers
by method name through the worker extension (`vllm_worker.py`: load a safetensors file or a GPS
node file, weight checksum), plus sleep, wake and prefix-cache reset. Knows nothing about
sequences, versions or the engine protocol.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from pivotrl.config.engine import EngineConfig
from pivotrl.engines.vllm_worker import write_weights_file
from pivotrl.orphans import remove_orphans

if TYPE_CHECKING:
    from pivotrl.gps.handles import FileManifest

WORKER_EXTENSION = "pivotrl.engines.vllm_worker.PivotWorkerExtension"

#: Name of an engine's socket folder in the system temp folder: this prefix, its owner's pid, "-".
IPC_PREFIX = "pivotrl-vllm-ipc-"


def remove_orphan_ipc_dirs(root: Path | None = None) -> list[Path]:
    """Delete the socket folders (in `root`, default the system temp folder) whose owner process is
    gone: a SIGKILLed device actor never stops its engine. Returns the folders removed."""
    return remove_orphans(Path(root or tempfile.gettempdir()), f"{IPC_PREFIX}*", IPC_PREFIX)


def platform_is_cpu() -> bool:
    """Whether vLLM runs on its CPU build here (no chunked prefill: see `async_engine_args`)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _vllm_cpu_build() -> bool:
    """`platform_is_cpu()`, or False where vLLM is not installed (an engine on a test's client)."""
    try:
        return platform_is_cpu()
    except ImportError:
        return False


def sleep_supported() -> bool:
    """Whether vLLM can sleep on this platform (CUDA, ROCm, XPU: yes; the CPU build: no)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


@contextlib.contextmanager
def one_process_cpu_engine() -> Iterator[None]:
    """While it is open, a one-rank engine started on vLLM's CPU build runs in one engine-core
    process, its worker inside it.

    `AsyncLLM` always starts its engine core in a process of its own. vLLM's CPU platform then
    turns a one-rank engine's in-process ("uni") executor into the multiprocess one, so each engine
    was three processes (caller, engine core, worker), two of them importing vLLM and torch, unless
    `VLLM_ENABLE_V1_MULTIPROCESSING=0`, which this sets while the engine starts (its process
    inherits it) and restores after: the flag's other reader is vLLM's synchronous `LLMEngine`,
    which would otherwise run in-process in a caller that builds one later. Engines of several
    ranks ask for "mp" by name (`async_engine_args`) and are unaffected. Measured on a tiny Qwen2
    (2 cores): start 16.1 -> 11.4 s, 25 -> 19 CPU-s, one process fewer and ~0.7 GB less of the
    machine in use at peak. CUDA builds keep vLLM's own choice (already in-process for one rank).
    vLLM then warns at each start that its seed "may affect the random state of the Python process
    that launched vLLM": true of the synchronous engine only (here the seed is applied in the
    engine-core process), so that one warning is filtered out."""
    import logging

    log = logging.getLogger("vllm.engine.arg_utils")
    if _not_the_seed_warning not in log.filters:
        log.addFilter(_not_the_seed_warning)
    with _environ_set("VLLM_ENABLE_V1_MULTIPROCESSING", "0"):
        yield


@contextlib.contextmanager
def _environ_set(key: str, value: str) -> Iterator[None]:
    """`os.environ[key] = value` while open; the variable's previous state after."""
    before = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def _not_the_seed_warning(record) -> bool:
    return "VLLM_ENABLE_V1_MULTIPROCESSING is set to False" not in record.getMessage()


def async_engine_args(model_path: Path, cfg: EngineConfig, max_model_len: int, tensor_parallel_size: int,
                      sleep_mode: bool, read_weights: bool = True) -> Any:
    """vLLM's `AsyncEngineArgs` for one engine (docs/vllm_engine.md has the measurements behind
    the chunked-prefill and log-prob choices)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from pivotrl.config.engine import by_platform

    cpu = platform_is_cpu()
    # an engine built from bare settings (not a runtime EngineSpec) takes the platform's choices here;
    # an unknown role gets the policy's (no expert parallelism unless asked)
    cfg = by_platform(cfg, "cpu" if cpu else "cuda", "rollout", tensor_parallel_size)
    return AsyncEngineArgs(
        model=str(model_path), tokenizer=str(model_path), dtype=cfg.dtype,
        max_model_len=max_model_len, max_num_seqs=cfg.max_num_seqs, seed=cfg.seed,
        enforce_eager=cfg.vllm_enforce_eager, tensor_parallel_size=tensor_parallel_size,
        # the replica's actor owns its devices: its ranks are this engine's own processes
        # (inside a Ray placement group vLLM would otherwise ask Ray for workers of its own)
        distributed_executor_backend="mp" if tensor_parallel_size > 1 else None,
        enable_expert_parallel=bool(cfg.vllm_expert_parallel) and tensor_parallel_size > 1,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        worker_extension_cls=WORKER_EXTENSION,
        # without the folder's weights (random values) when the caller loads others next (GPS's)
        load_format="auto" if read_weights else "dummy",
        enable_sleep_mode=sleep_mode, disable_log_stats=False,
        # The CPU build cannot chunk a seeded request's prefill: its model runner rewinds the
        # request's generator over a discarded sample, which only a CUDA (Philox) generator
        # supports, and the engine process dies. Chunked prefill off makes vLLM's step budget at
        # least max_model_len, so every prompt fits a step whole (None keeps vLLM's default).
        enable_chunked_prefill=False if cpu else None,
        # Log-probs of the distribution sampled from (after temperature and top-k/top-p), not
        # vLLM's default `raw_logprobs` of the logits before temperature.
        logprobs_mode="processed_logprobs",
    )


class VLLMClient:
    """One `AsyncLLM` (None while stopped) and the loop thread every call into it runs on."""

    def __init__(self, build: Callable[[], Any], tensor_parallel_size: int) -> None:
        """`build()` makes the AsyncLLM-like client (asked for `tensor_parallel_size` devices); it
        runs on the loop thread."""
        self._build = build
        self.llm: Any = None
        self.kv_capacity = 0
        """KV cache tokens the started engine reports (blocks x block size)."""
        self.tensor_parallel_size = int(tensor_parallel_size)
        """Devices the engine runs across: as asked until it starts, then vLLM's own parallel config."""
        self.executor_backend = ""
        """How the started engine runs its ranks (vLLM's `distributed_executor_backend`): "uni" inside
        the engine-core process, "mp" in processes of their own."""
        self.ipc_dir: Path | None = None
        """The folder of the started engine's ZMQ sockets (vLLM's `VLLM_RPC_BASE_PATH`, read as it
        starts), removed when it stops: vLLM leaves its socket files behind, and in the system
        temp folder, where each start left a few (174 after a day of test-suite runs). A start
        also removes the folders of owners that died without stopping (`remove_orphan_ipc_dirs`)."""
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()

    def run(self, coro, timeout: float | None = None):
        """Run `coro` on the loop thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, cfg: EngineConfig, model_path: Path) -> None:
        """Start the engine process (within `cfg.vllm_start_timeout_s`)."""
        # The engine-core process must import the worker extension's module; the repo may be on
        # sys.path only through the working directory, so hand it on explicitly.
        pkg_root = str(Path(__file__).resolve().parents[2])
        parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if pkg_root not in parts:
            os.environ["PYTHONPATH"] = os.pathsep.join([pkg_root, *parts])
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(cfg.vllm_kv_cache_gib)))))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # CUDA graphs' memory inside gpu_memory_utilization (vLLM 0.32's default; never turned off here)
        os.environ["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] = "1"
        if cfg.num_threads:
            os.environ["OMP_NUM_THREADS"] = str(cfg.num_threads)
        one_process = self.tensor_parallel_size == 1 and _vllm_cpu_build()
        remove_orphan_ipc_dirs()
        self.ipc_dir = Path(tempfile.mkdtemp(prefix=f"{IPC_PREFIX}{os.getpid()}-"))
        try:
            with _environ_set("VLLM_RPC_BASE_PATH", str(self.ipc_dir)), \
                    one_process_cpu_engine() if one_process else contextlib.nullcontext():
                self.run(self._astart(model_path), timeout=cfg.vllm_start_timeout_s)
        except BaseException:
            self._remove_ipc_dir()
            raise

    def _remove_ipc_dir(self) -> None:
        ipc_dir, self.ipc_dir = self.ipc_dir, None
        if ipc_dir is not None:
            shutil.rmtree(ipc_dir, ignore_errors=True)

    async def _astart(self, model_path: Path) -> None:
        try:
            self.llm = self._build()
        except Exception as e:  # noqa: BLE001 - name the folder the user gave
            raise ValueError(f"vLLM could not start on model folder {str(model_path)!r}: "
                             f"{type(e).__name__}: {e}") from e
        cc = self.llm.vllm_config.cache_config
        self.kv_capacity = int((cc.num_gpu_blocks or 0) * (cc.block_size or 0))
        parallel = self.llm.vllm_config.parallel_config
        self.tensor_parallel_size = int(parallel.tensor_parallel_size)
        self.executor_backend = str(getattr(parallel, "distributed_executor_backend", ""))

    def stop(self) -> None:
        """Shut AsyncLLM down on the loop thread: its output handler then cannot run between the
        engine-core exit and its own cancellation (which would log a spurious EngineDeadError)."""
        async def stop(llm) -> None:
            llm.shutdown()

        llm, self.llm = self.llm, None
        try:
            if llm is not None:
                if self.loop.is_running():
                    self.run(stop(llm), timeout=120)
                else:
                    llm.shutdown()
        finally:
            self._remove_ipc_dir()

    def can_wait_on_loop(self) -> bool:
        """False when called on the loop thread itself (e.g. garbage collection there) or after the
        loop stopped: nothing may then wait on the loop."""
        return threading.current_thread() is not self._thread and self.loop.is_running()

    def close(self) -> None:
        """Stop the engine process and the loop thread."""
        if not self.can_wait_on_loop():
            llm, self.llm = self.llm, None  # the client's own shutdown does the rest
            if llm is not None:
                llm.shutdown()
            self._remove_ipc_dir()
            return
        self.stop()
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    # ------------------------------------------------------------------ into the workers
    def load_files(self, paths: list[str]) -> None:
        """Load safetensors files into every worker's model (in place)."""
        self.run(self.llm.collective_rpc("pivot_load_weights_from_file", args=(paths,)))

    def load_state_dict(self, state_dict: Mapping[str, object]) -> None:
        """Hand `state_dict` to the workers as a `/dev/shm` safetensors file."""
        path = write_weights_file(state_dict)
        try:
            self.load_files([path])
        finally:
            os.unlink(path)

    def load_gps(self, manifest: FileManifest) -> None:
        """Load a leased GPS `FileManifest`: each worker maps the node file itself."""
        self.run(self.llm.collective_rpc("pivot_load_weights_from_gps", args=(manifest.to_wire(),)))

    def weight_checksum(self) -> float:
        return self.run(self.llm.collective_rpc("pivot_weight_checksum"))[0]

    def reset_prefix_cache(self) -> None:
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            self.run(reset())

    def sleep(self, level: int) -> None:
        self.run(self.llm.sleep(level=level))

    def wake_up(self, tags: list[str]) -> None:
        self.run(self.llm.wake_up(tags=tags))
