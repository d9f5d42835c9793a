"""Hugging Face folders into the engines: the model, its tokenizer, its EOS ids, and in-place weight
loads.

Owns: `load_hf_model` (a causal-LM folder for inference, in a dtype named by the config),
`load_hf_tokenizer`, `eos_ids_of`, and `load_state_dict_in_place` (new weights copied into a
loaded model, every name and shape checked before the first copy). Errors name the folder or the
parameter. Knows nothing about batching, KV caches or engines' lifecycles.

Attention: transformers' `sdpa` copies every key and value head `num_key_value_groups` times
(`repeat_kv`) whenever a mask is passed, and the CPU engine always passes one (its rows are
left-padded). Inference models load with `SDPA_GQA` instead: the same mask functions and the same
`scaled_dot_product_attention` call, with `enable_gqa=True` in place of the copies (the same
numbers; BENCHMARKS.md has the saving).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

__all__ = ["eos_ids_of", "load_hf_model", "load_hf_tokenizer", "load_state_dict_in_place", "unloadable_tensors"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SDPA_GQA = "pivotrl_sdpa_gqa"
"""The attention implementation inference models load with (module docstring)."""


def _sdpa_gqa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' `sdpa_attention_forward` for a masked call on plain key/value heads, with the
    grouped heads left to SDPA; any other call goes to transformers' own function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (attention_mask is None or getattr(module, "num_key_value_groups", 1) == 1
            or any(kwargs.get(k) is not None for k in ("position_bias", "cache")) or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    # with a mask, transformers runs SDPA with is_causal=False too: the mask carries causality
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _register_sdpa_gqa() -> None:
    """Make `SDPA_GQA` a name transformers loads (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(SDPA_GQA, _sdpa_gqa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SDPA_GQA, sdpa_mask)


def load_hf_model(model_path: str | Path, dtype: str = "float32", read_weights: bool = True) -> torch.nn.Module:
    """Load a Hugging Face causal-LM folder for inference; ValueError naming the folder if it fails.
    `read_weights` False builds the model from its config.json alone (random values, no weight
    file read), for a caller that loads the real weights next."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _register_sdpa_gqa()
    path = Path(model_path)
    if not path.is_dir():
        raise ValueError(f"model folder {str(path)!r} does not exist or is not a folder")
    if not (path / "config.json").is_file():
        raise ValueError(f"model folder {str(path)!r} has no config.json (not a Hugging Face model folder)")
    try:
        if not read_weights:
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(path)), dtype=_DTYPES[dtype],
                                                    attn_implementation=SDPA_GQA).eval()
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_DTYPES[dtype], attn_implementation=SDPA_GQA)
    except Exception as e:  # noqa: BLE001 - re-raised naming the folder
        raise ValueError(f"model folder {str(path)!r} does not load: {type(e).__name__}: {e}") from e
    return model.eval()


def load_hf_tokenizer(tokenizer_path: str | Path):
    """Load a Hugging Face tokenizer folder; ValueError naming the folder if it fails."""
    from transformers import AutoTokenizer

    path = Path(tokenizer_path)
    if not path.is_dir():
        raise ValueError(f"tokenizer folder {str(path)!r} does not exist or is not a folder")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - re-raised naming the folder
        raise ValueError(f"tokenizer folder {str(path)!r} does not load: {type(e).__name__}: {e}") from e


def eos_ids_of(config) -> set[int]:
    """The model's EOS token ids (an int or a list in HF configs)."""
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def load_state_dict_in_place(model: torch.nn.Module, state_dict: Mapping[str, object]) -> None:
    """Copy `state_dict` (checkpoint names: per-expert MoE tensors are fused here, as the module
    holds them) into `model`'s parameters and buffers. Every name and shape is checked before any
    copy: a bad state dict never leaves the model half-loaded."""
    from pivotrl.gps.state_dict import to_module

    own = model.state_dict()
    # GPS and checkpoints hold one tensor per MoE expert; transformers 5 modules hold them fused
    state_dict = to_module(state_dict, own.keys())
    unknown = [k for k in state_dict if k not in own]
    if unknown:
        raise ValueError(f"load_weights: {len(unknown)} unknown parameter names, e.g. {unknown[:3]}; "
                         f"expected names like {list(own)[:3]}")
    incoming = {k: torch.as_tensor(v) for k, v in state_dict.items()}
    for k, t in incoming.items():
        if tuple(t.shape) != tuple(own[k].shape):
            raise ValueError(f"load_weights: {k} has shape {tuple(t.shape)}, expected {tuple(own[k].shape)}")
    with torch.no_grad():
        for k, t in incoming.items():
            own[k].copy_(t)  # state_dict tensors share storage with the parameters


def unloadable_tensors(model_path: str | Path, tensors: Mapping[str, tuple[tuple[int, ...], str]]) -> list[str]:
    """Which checkpoint tensors (`{name: (shape, dtype)}`, as GPS indexes them) the transformers
    module of `model_path` would not take through `load_state_dict_in_place`: an unknown name or
    a wrong shape, after fusing MoE experts (or the experts that do not fuse, as one message).
    Builds the module on the meta device (no memory, no weights read), so the check at start
    costs a config read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pivotrl.gps.state_dict import to_module

    config = AutoConfig.from_pretrained(str(model_path))
    with torch.device("meta"):
        module = AutoModelForCausalLM.from_config(config)
    own = module.state_dict()
    try:
        incoming = to_module({k: torch.empty(shape, device="meta") for k, (shape, _) in tensors.items()}, own.keys())
    except ValueError as e:  # experts that do not fuse (a missing or misnamed one): named by the error
        return [str(e)]
    return sorted(k for k, t in incoming.items() if k not in own or tuple(t.shape) != tuple(own[k].shape))
