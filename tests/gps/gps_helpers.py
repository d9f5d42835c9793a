"""Helpers for GPS tests (import as `tests.gps.gps_helpers`)."""
from __future__ import annotations

import hashlib

import torch

from pivotrl.gps.layout import ModelSpec
from pivotrl.gps.transports import torch_dtype

# GQA (8 query heads, 4 kv heads) so TP in {1, 2, 4} divides every partitioned dim
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=8,
            num_key_value_heads=4, tie_word_embeddings=False, torch_dtype="float32")
TINY_MOE = dict(TINY, num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                num_hidden_layers=2)


def random_state_dict(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {t.name: torch.randn(t.shape, generator=g).to(torch_dtype(t.dtype)) for t in spec.tensors}


def digest(sd: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(sd[k].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
