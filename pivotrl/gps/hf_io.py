"""Hugging Face interchange: import a safetensors model directory into GPS, export a version back.

Owns only file formats. Which tensors exist, their shapes and partition rules come from
`checkpoint.checkpoint_spec` (config.json's family rules held against the safetensors index: a
partial checkpoint or an architecture without rules stops here, naming the folder); each tensor's
dtype comes from the safetensors header and is kept as stored (bf16 stays bf16). Names are the
checkpoint's (MoE experts one tensor per expert, as vLLM loads them; `state_dict.py` converts
transformers 5's fused in-memory experts). Import maps the files instead of loading them, so it needs no
second copy of the checkpoint in memory. Export writes `model.safetensors` plus the original
`config.json` (and tokenizer/generation files when the import directory had them), so
`transformers.AutoModelForCausalLM.from_pretrained(path)` loads it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pivotrl.gps.checkpoint import checkpoint_spec, read_config, weight_files
from pivotrl.gps.layout import Layout
from pivotrl.gps.planner import Device
from pivotrl.gps.store import GlobalParameterStore

_SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")


_ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


def _mapped_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of one safetensors file as views of a private (copy-on-write) file mapping, so an
    import holds no second copy of the checkpoint: pages come from the page cache as GPS copies
    them. Falls back to `safe_open` for layouts the views cannot express (misaligned offsets)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    size = path.stat().st_size
    storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=size)
    base = 8 + n
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _ST_DTYPES.get(info["dtype"])
        start, _ = info["data_offsets"]
        if dt is None or (base + start) % dt.itemsize:
            with safe_open(str(path), framework="pt") as h:
                return {k: h.get_tensor(k) for k in h.keys()}
        shape = tuple(info["shape"])
        stride, acc = [], 1
        for s in reversed(shape):
            stride.append(acc)
            acc *= s
        out[name] = torch.empty(0, dtype=dt).set_(storage, (base + start) // dt.itemsize, shape, tuple(reversed(stride)))
    return out


def read_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a folder's weight files (those its index lists, else `*.safetensors`), mapped."""
    out: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        out.update(_mapped_safetensors(f))
    return out


def import_hf(store: GlobalParameterStore, model: str, path: str | Path, *, frozen: bool = False) -> int:
    """Register `model` from an HF directory and load its weights as version 0, in the dtypes the
    checkpoint stores. Raises before registering anything when the folder is not a checkpoint of a
    supported architecture or is partial."""
    path = Path(path)
    cfg = read_config(path)
    spec = checkpoint_spec(path, cfg)
    sd = read_safetensors_dir(path)
    if spec.tie_word_embeddings:
        sd.pop("lm_head.weight", None)  # tied: the embedding is the head
    v = store.register(model, spec=spec, frozen=frozen, state_dict=sd)
    store.attachments.setdefault(model, {})["hf"] = (cfg, str(path))  # for export: config + tokenizer
    assert v is not None
    return v


def export_hf(store: GlobalParameterStore, model: str, out_dir: str | Path, *, version: int | None = None,
              config: dict | None = None) -> int:
    """Write `version` (default: current) of `model` as an HF checkpoint directory; returns the
    version written. `config` (a config.json dict) is needed when the model was not imported."""
    src_dir = None
    if config is None:
        hf = store.attachments.get(model, {}).get("hf")
        if hf is None:
            raise ValueError(f"export_hf({model!r}) needs config=: the model was not imported from HF here")
        config, src_dir = hf
    dev = Device(0, 0)
    res = store.read(model, [dev], Layout(), version=version)
    sd = {k: t.contiguous() for k, t in res.shards[dev].items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if src_dir is not None:
        for name in _SIDE_FILES:
            if (Path(src_dir) / name).exists():
                shutil.copy(Path(src_dir) / name, out / name)
    return res.version
