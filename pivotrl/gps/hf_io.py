"""Hugging Face interchange: import a safetensors model directory into GPS, export a version back.

Owns only file formats. Which tensors exist, their shapes and partition rules come from
`checkpoint.checkpoint_spec` (config.json's family rules held against the safetensors index: a
partial checkpoint or an architecture without rules stops here, naming the folder); each tensor's
dtype comes from the safetensors header and is kept as stored (bf16 stays bf16). Names are the
checkpoint's (MoE experts one tensor per expert, as vLLM loads them; `state_dict.py` converts
transformers 5's fused in-memory experts). Import has every GPS node fill its own buffer from the
files it maps itself (`GlobalParameterStore.import_folder`, `node_import.py`), so it needs no
second copy of the checkpoint in memory and nothing passes through the importing process. Export writes `model.safetensors` plus the original
`config.json` (and tokenizer/generation files when the import directory had them), so
`transformers.AutoModelForCausalLM.from_pretrained(path)` loads it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import save_file

from pivotrl.gps.checkpoint import checkpoint_spec, read_config
from pivotrl.gps.layout import Layout
from pivotrl.gps.planner import Device
from pivotrl.gps.store import GlobalParameterStore

_SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")


def import_hf(store: GlobalParameterStore, model: str, path: str | Path, *, frozen: bool = False) -> int:
    """Register `model` from an HF directory and load its weights as version 0, in the dtypes the
    checkpoint stores. Raises before registering anything when the folder is not a checkpoint of a
    supported architecture or is partial."""
    path = Path(path)
    cfg = read_config(path)
    spec = checkpoint_spec(path, cfg)  # a tied lm_head is not stored: the embedding is the head
    v = store.import_folder(model, str(path), spec, frozen=frozen)  # every node reads its own files
    store.attachments.setdefault(model, {})["hf"] = (cfg, str(path))  # for export: config + tokenizer
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
