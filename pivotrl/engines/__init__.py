"""Inference engines (rollout and GenRM) behind one protocol, and the FSDP2 trainer.

File map:
  protocol.py     SamplingParams, requests/completions/stats, the InferenceEngine Protocol
  cpu_engine.py   continuous batching over a transformers model with a KV cache (fallback, tests)
  vllm_engine.py  vLLM AsyncLLM in a background loop thread; weights via a worker extension
  registry.py     engines by name (`cpu`, `vllm`, `auto`) and create_engine()
  trainer*.py     the FSDP2 GRPO trainer (separate owner)

Importing this package imports neither torch nor vLLM; the engine modules do.
"""
from pivotrl.engines.protocol import (Completion, EngineStats, GenerationRequest, InferenceEngine,
                                      IterationSample, PrefillSample, SamplingParams)
from pivotrl.engines.registry import create_engine, engine_names, resolve_engine_name

__all__ = ["Completion", "EngineStats", "GenerationRequest", "InferenceEngine", "IterationSample",
           "PrefillSample", "SamplingParams", "create_engine", "engine_names", "resolve_engine_name"]
