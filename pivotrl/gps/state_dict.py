"""Trainer state dicts <-> GPS (checkpoint-format) state dicts, in both directions.

Owns the two name/dtype conversions a trainer needs around GPS:
- `to_store(state_dict, spec)`: what a trainer publishes. transformers 5 keeps MoE experts fused in
  memory (`mlp.experts.gate_up_proj` of shape (E, 2I, H) = per expert cat(gate, up) on dim 1, and
  `mlp.experts.down_proj` (E, H, I)); checkpoints, GPS and vLLM hold one tensor per expert
  (`mlp.experts.{e}.{gate,up,down}_proj.weight`). Fused tensors are split into per-expert views (no
  copy), names GPS does not store (a tied `lm_head.weight`) are dropped, and every tensor is cast to
  its stored dtype (the store's dtype is the checkpoint's: an fp32 trainer publishing into a bf16
  store casts here, not in GPS).
- `to_module(state_dict, module_keys)`: a GPS read turned into what a transformers module loads:
  per-expert tensors stacked back into the fused parameters when `module_keys` (the module's own
  `state_dict().keys()`) has them; otherwise unchanged.
The split/stack follows transformers' own conversion (`conversion_mapping.py`, `qwen2_moe`:
MergeModulelist(dim=0) then Concatenate(dim=1)), checked by tests/gps/test_gps_families.py
against a real transformers 5 module on both sides.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping

import torch

from pivotrl.gps.layout import ModelSpec
from pivotrl.gps.transports import torch_dtype

_FUSED = re.compile(r"^(?P<p>.*\.mlp\.experts)\.(?P<w>gate_up_proj|down_proj)$")
_PER_EXPERT = re.compile(r"^(?P<p>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<w>gate_proj|up_proj|down_proj)\.weight$")


def is_fused_experts(name: str) -> bool:
    """Whether `name` is a transformers 5 fused expert parameter (`...mlp.experts.gate_up_proj`
    or `...mlp.experts.down_proj`)."""
    return _FUSED.match(name) is not None


def split_fused_experts(state_dict: Mapping[str, torch.Tensor], first_expert: int = 0) -> dict[str, torch.Tensor]:
    """Fused expert parameters -> per-expert checkpoint tensors (views); other names unchanged.
    `first_expert`: the global index of row 0 (an FSDP2 rank's shard starts at its first expert)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        m = _FUSED.match(name)
        if m is None:
            out[name] = t
            continue
        p = m["p"]
        if m["w"] == "gate_up_proj":
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{p}.{first_expert + e}.gate_proj.weight"] = t[e, :inter]
                out[f"{p}.{first_expert + e}.up_proj.weight"] = t[e, inter:]
        else:
            for e in range(t.shape[0]):
                out[f"{p}.{first_expert + e}.down_proj.weight"] = t[e]
    return out


def fuse_experts(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert checkpoint tensors -> transformers 5's fused expert parameters (new tensors)."""
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, t in state_dict.items():
        m = _PER_EXPERT.match(name)
        if m is None:
            out[name] = t
        else:
            groups.setdefault(m["p"], {}).setdefault(m["w"], {})[int(m["e"])] = t
    for p, ws in groups.items():
        n = len(ws.get("down_proj", {}))
        for w in ("gate_proj", "up_proj", "down_proj"):
            if sorted(ws.get(w, {})) != list(range(n)):
                raise ValueError(f"{p}: experts of {w} are {sorted(ws.get(w, {}))}, expected 0..{n - 1}")
        out[f"{p}.gate_up_proj"] = torch.stack([torch.cat([ws["gate_proj"][e], ws["up_proj"][e]], dim=0)
                                                for e in range(n)])
        out[f"{p}.down_proj"] = torch.stack([ws["down_proj"][e] for e in range(n)])
    return out


def to_store(state_dict: Mapping[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """A trainer's (module) state dict as GPS stores `spec`: checkpoint names, only the tensors the
    spec has, each in its stored dtype (a no-op cast when it already is). Raises ValueError naming
    the tensors the spec has but the state dict lacks."""
    sd = split_fused_experts(state_dict)
    missing = [t.name for t in spec.tensors if t.name not in sd]
    if missing:
        raise ValueError(f"state dict lacks {len(missing)} tensors GPS stores (first: {', '.join(missing[:3])})")
    out = {}
    for t in spec.tensors:
        x = sd[t.name].detach()
        want = torch_dtype(t.dtype)
        out[t.name] = x if x.dtype == want else x.to(want)
    return out


def to_module(state_dict: Mapping[str, torch.Tensor], module_keys: Iterable[str]) -> dict[str, torch.Tensor]:
    """A GPS (checkpoint-format) state dict in the names of a module whose keys are `module_keys`:
    experts fused when the module fuses them."""
    keys = set(module_keys)
    if any(_FUSED.match(k) for k in keys):
        return fuse_experts(state_dict)
    return dict(state_dict)
