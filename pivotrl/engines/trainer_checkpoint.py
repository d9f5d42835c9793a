"""Trainer checkpoints: what one `TrainerWorker` writes and reads (collective over its ranks).

A checkpoint folder holds:
- `hf/`: the policy as a Hugging Face folder (float32 weights + the source folder's config and
  tokenizer files), loadable by `AutoModelForCausalLM.from_pretrained`;
- `dcp/`: sharded model + optimizer state (torch.distributed.checkpoint; reshardable, so a run may
  resume on a different world size);
- `rng/rank_<r>.pt`: each rank's torch/numpy/python (and CUDA) RNG states;
- `trainer_state.json`: version and counters; `extra.json`: the caller's state (the data cursor).
`save(worker, path, extra)` and `load(worker, path)` use the worker's public attributes only.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

__all__ = ["checkpoint_dir", "latest_checkpoint", "load", "save"]

_CKPT_RE = re.compile(r"^step_(\d+)$")

# Files of a model folder that are weights; everything else (config, tokenizer, generation config)
# is copied into the Hugging Face part of a checkpoint unchanged.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".safetensors.index.json", ".bin.index.json")


def save(w: Any, path: Path, extra: dict[str, Any] | None = None) -> None:
    """Write a checkpoint of worker `w` into the (empty or new) folder `path` (module docstring)."""
    if w.rank == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(w.model, w.optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path / "dcp"))
    full = w.full_state_dict("float32")
    (path / "rng").mkdir(exist_ok=True)
    rng = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state(w.device) if w.device.type == "cuda" else None,
    }
    torch.save(rng, path / "rng" / f"rank_{w.rank}.pt")
    if w.rank == 0:
        _save_hf(w, path / "hf", full)
        (path / "trainer_state.json").write_text(json.dumps(w.state(), indent=2))
        (path / "extra.json").write_text(json.dumps(extra or {}, indent=2))
    dist.barrier()


def _save_hf(w: Any, out: Path, full: dict[str, torch.Tensor]) -> None:
    from transformers import AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    for f in w.model_path.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, out / f.name)
    # A meta-device skeleton takes the gathered tensors by assignment: no second random init,
    # and save_pretrained handles tied weights and large-file sharding the HF way.
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(w.hf_config, dtype=torch.float32)
    skeleton.load_state_dict(full, assign=True, strict=True)
    skeleton.tie_weights()
    skeleton.save_pretrained(str(out), safe_serialization=True)


def load(w: Any, path: Path) -> dict[str, Any]:
    """Restore model, optimizer, version, counters and RNG from `path`; return its extra state.
    RNG is restored only when the checkpoint was written by the same world size (per-rank
    streams do not map onto a different rank count). The KL reference is not in checkpoints:
    it is always the initial policy at `model_path`, so resume with the same `model_path`."""
    if not (path / "trainer_state.json").is_file():
        raise ValueError(f"checkpoint {str(path)!r} has no trainer_state.json (not a trainer checkpoint)")
    model_sd, optim_sd = get_state_dict(w.model, w.optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    set_state_dict(w.model, w.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    w.optimizer.zero_grad(set_to_none=True)
    meta = json.loads((path / "trainer_state.json").read_text())
    w.version = int(meta["version"])
    w.counters = {k: int(v) for k, v in meta["counters"].items()}
    rng_file = path / "rng" / f"rank_{w.rank}.pt"
    if int(meta["world_size"]) == w.world_size and rng_file.is_file():
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if rng.get("cuda") is not None and w.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], w.device)
    dist.barrier()
    return json.loads((path / "extra.json").read_text()) if (path / "extra.json").is_file() else {}


def checkpoint_dir(root: str | os.PathLike, version: int) -> Path:
    """The conventional folder of the checkpoint at `version` under `root`: `root/step_00000042`."""
    return Path(root) / f"step_{version:08d}"


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The complete checkpoint under `root` with the highest version, or None if there is none.
    A folder without `trainer_state.json` (a save that crashed) is skipped."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _CKPT_RE.match(p.name)) and (p / "trainer_state.json").is_file()
    ]
    return max(found)[1] if found else None
