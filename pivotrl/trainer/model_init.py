"""Building the trainer's FSDP2-sharded policy from a Hugging Face folder.

Owns `build_sharded_model`: the skeleton, gradient checkpointing, the chunked-log-prob LM head,
`fully_shard` per decoder layer and then the root, and the weight load. Two ways to load:

- `init_on_meta=True` (torchtitan's and verl's FSDP2 way): every rank builds the skeleton on the
  `meta` device (no memory), shards it, allocates only its own shards (`to_empty`), and rank 0
  alone reads the safetensors files and broadcasts them into every rank's shards
  (`set_model_state_dict(..., full_state_dict=True, broadcast_from_rank0=True)`). Rank 0 hands
  over the files' tensors as views of a file mapping, in the dtype the checkpoint stores (bf16
  stays bf16): torch broadcasts one tensor at a time in that dtype and each rank casts its own
  rows into its float32 shard (`_distribute_tensors`' `copy_`). So no rank ever holds the model
  whole, let alone in float32: rank 0's extra host memory is the page cache of the file (shared,
  reclaimable) plus one tensor in flight; device memory: the shard.
  Non-persistent buffers (rotary `inv_freq`) are not in the files, so rotary modules are rebuilt
  from the config on the device; any other non-persistent buffer is an error naming it.
- `init_on_meta=False` (the original path): every rank loads the whole model in float32 on its
  device, then shards it. Kept because it needs nothing from the checkpoint format; tests compare
  the two.

Master weights are float32 either way; `param_dtype` is FSDP2's compute dtype (mixed precision:
bf16 gathers and compute, float32 gradient reduction, float32 AdamW state on the float32 shards).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from pivotrl.trainer.logprobs import install_hidden_head

__all__ = ["build_sharded_model", "read_mapped_state_dict"]


def read_mapped_state_dict(model_path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's weight files (those its index lists, else `*.safetensors`) as a
    view of a file mapping, in the dtype the file stores: nothing is read until a tensor is used."""
    from pivotrl.gps.node_import import read_safetensors_dir

    if not any(Path(model_path).glob("*.safetensors")):
        raise ValueError(f"model folder {str(model_path)!r} has no *.safetensors files "
                         "(meta-device init reads safetensors; set algo.init_on_meta=false)")
    return read_safetensors_dir(model_path)


def _rebuild_rotary(model: torch.nn.Module, device: torch.device) -> None:
    """Recreate every rotary-embedding module (its `inv_freq` is a non-persistent buffer the
    files do not hold); raise if any other module has a non-persistent buffer."""
    for name, mod in list(model.named_modules()):
        if type(mod).__name__.endswith("RotaryEmbedding"):
            fresh = type(mod)(mod.config).to(device)
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, attr, fresh)
    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("RotaryEmbedding"):
            continue
        lost = [b for b in getattr(mod, "_non_persistent_buffers_set", ()) if getattr(mod, b, None) is not None]
        if lost:
            raise ValueError(f"module {name or type(model).__name__} has non-persistent buffers {sorted(lost)} that "
                             "meta-device init cannot restore; set algo.init_on_meta=false")


def build_sharded_model(auto_cls: Any, model_path: Path, device: torch.device, *, world_size: int,
                        param_dtype: str, init_on_meta: bool, gradient_checkpointing: bool,
                        hidden_head: bool, load_weights: bool = True) -> torch.nn.Module:
    """The FSDP2-sharded model of `model_path` on `device` (see the module docstring). Collective:
    every rank of the default group calls it at once. `load_weights=False` (with `init_on_meta`):
    the shards are allocated but left unset, for a caller that fills them itself (the trainer's
    state from host memory, `pivotrl.trainer.state_store`): the files are not read."""
    from transformers import AutoConfig

    if init_on_meta:
        hf_cfg = AutoConfig.from_pretrained(str(model_path))
        with torch.device("meta"):
            model = auto_cls.from_config(hf_cfg, dtype=torch.float32)
    else:
        model = auto_cls.from_pretrained(str(model_path), dtype=torch.float32).to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hidden_head:
        install_hidden_head(model)
    mesh = init_device_mesh(device.type, (world_size,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if param_dtype == "bfloat16" else MixedPrecisionPolicy())
    # One FSDP unit per decoder layer (transformers names them in _no_split_modules), then the
    # root for embeddings, final norm and the (possibly tied) LM head.
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"cannot find decoder layers of {type(model).__name__} (_no_split_modules={layer_classes})")
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    if init_on_meta:
        model.to_empty(device=device)
        _rebuild_rotary(model, device)
        if not load_weights:
            return model
        full = read_mapped_state_dict(model_path) if dist.get_rank() == 0 else {}
        # Tied heads are not in the files (they are the embedding); every other name must be.
        if dist.get_rank() == 0:
            want = set(model.state_dict())
            tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
            missing = sorted(want - set(full) - tied)
            if missing:
                raise ValueError(f"model folder {str(model_path)!r} lacks tensors {missing[:5]}")
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                                   strict=False))
        del full
        if getattr(model.config, "tie_word_embeddings", False):
            emb, head = model.get_input_embeddings(), model.get_output_embeddings()
            if emb.weight is not head.weight:
                raise ValueError("tied embeddings came apart during sharding")
    return model
