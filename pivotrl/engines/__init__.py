"""Inference engines (rollout and GenRM) behind one protocol (the trainer is `pivotrl.trainer`).

File map:
  protocol.py     SamplingParams, requests/completions/stats, the InferenceEngine Protocol
  cpu_engine.py   CPUEngine: continuous batching over a transformers model (fallback, tests): intake,
                  admission, the step, timing samples
  cpu_batch.py    its running batch: one left-padded KV cache, batched prefill/decode, sampling
  hf_model.py     Hugging Face folders -> model, tokenizer, EOS ids; weights loaded in place
  vllm_engine.py  VLLMEngine: the protocol over vLLM AsyncLLM (streams, abort/resume, weights, sleep/wake)
  vllm_client.py  the AsyncLLM process on a background loop thread: start/stop (its sockets in a folder of
                  its own), calls into the workers
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
