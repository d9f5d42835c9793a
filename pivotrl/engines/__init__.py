"""Inference engines (rollout and GenRM) behind one protocol (the trainer is `pivotrl.trainer`).

File map:
  protocol.py     SamplingParams, requests/completions/stats, the InferenceEngine Protocol
  cpu_engine.py   continuous batching over a transformers model with a KV cache (fallback, tests)
  vllm_engine.py  vLLM AsyncLLM in a background loop thread; weights via a worker extension
  vllm_worker.py  the worker extension vLLM mixes into its workers (weight loads by file / GPS file)
  vllm_stats.py   vLLM stat logger -> iteration and prefill samples
  errors.py       EngineFailedError / EngineWakeError / EngineLoadError (failed wake or load)
  registry.py     engines by name (`cpu`, `vllm`, `auto`) and create_engine()
  weight_sync.py  the bridge to the trainer: publish_shards (ranks -> GPS rows), GPSWeights and
                  load_from_gps (node GPS file -> engine)

Importing this package imports neither torch nor vLLM; the engine modules do.
"""
from pivotrl.engines.protocol import (Completion, EngineStats, GenerationRequest, InferenceEngine,
                                      IterationSample, PrefillSample, SamplingParams)
from pivotrl.engines.registry import create_engine, engine_names, resolve_engine_name

__all__ = ["Completion", "EngineStats", "GenerationRequest", "InferenceEngine", "IterationSample",
           "PrefillSample", "SamplingParams", "create_engine", "engine_names", "resolve_engine_name"]
