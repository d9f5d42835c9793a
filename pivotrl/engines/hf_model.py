"""Hugging Face folders into the engines: the model, its tokenizer, its EOS ids, and in-place weight
loads.

Owns: `load_hf_model` (a causal-LM folder for inference, in a dtype named by the config),
`load_hf_tokenizer`, `eos_ids_of`, and `load_state_dict_in_place` (new weights copied into a
loaded model, every name and shape checked before the first copy). Errors name the folder or the
parameter. Knows nothing about batching, KV caches or engines' lifecycles.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

__all__ = ["eos_ids_of", "load_hf_model", "load_hf_tokenizer", "load_state_dict_in_place"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_hf_model(model_path: str | Path, dtype: str = "float32") -> torch.nn.Module:
    """Load a Hugging Face causal-LM folder for inference; ValueError naming the folder if it fails."""
    from transformers import AutoModelForCausalLM

    path = Path(model_path)
    if not path.is_dir():
        raise ValueError(f"model folder {str(path)!r} does not exist or is not a folder")
    if not (path / "config.json").is_file():
        raise ValueError(f"model folder {str(path)!r} has no config.json (not a Hugging Face model folder)")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_DTYPES[dtype], attn_implementation="sdpa")
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
    """Copy `state_dict` into `model`'s parameters and buffers. Every name and shape is checked
    before any copy: a bad state dict never leaves the model half-loaded."""
    own = model.state_dict()
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
