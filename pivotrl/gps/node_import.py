"""What a GPS node takes from a checkpoint folder it sees itself, without the driver in between.

Owns:
- `mapped_safetensors` / `read_safetensors_dir`: a folder's tensors as views of file mappings, in
  the dtype the files store (nothing is read until a tensor is used; the trainer's rank 0 and GPS's
  import both read this way);
- `fill_from_folder(buf, entries, folder)`: one node buffer's share of a model's version 0, copied
  row range by row range from the mapped files into the buffer (a replicated node takes every row,
  a node of a sharded placement only its chunk). Each node runs it in its own process on the
  folder its own filesystem shows (`RayTransport`: in its `NodeStore`), so the start-up import is
  one read of the files per node, all nodes at once, and no byte crosses the driver or the network;
- `host_copy(folder, dst)`: a frozen judge's checkpoint folder copied once into host memory
  (`/dev/shm`): the files its engine then opens with its own loader (vLLM's, or transformers' on
  the CPU engine). No GPS partition rules are needed, so any architecture its engine serves works
  as a judge. The copy is written to a temporary name and renamed when whole, so a reader never
  sees half a copy, and a second call finds it done.
Knows nothing about versions, placements or transports (store.py decides what a node fills).
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Sequence

import torch
from safetensors import safe_open

from pivotrl.gps.checkpoint import INDEX_FILE, weight_files
from pivotrl.gps.buffers import chunk_view, copy_into

__all__ = ["FillEntry", "fill_from_folder", "folder_bytes", "host_copy", "mapped_safetensors",
           "read_safetensors_dir"]

_ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}

#: (stored tensor name, byte offset of its chunk in the node buffer, (first row, end row), chunk
#: shape, dtype name): what one node buffer holds of one tensor (`ChunkLayout` entries).
FillEntry = tuple[str, int, tuple[int, int], tuple[int, ...], str]


def mapped_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of one safetensors file as views of a private (copy-on-write) file mapping, so a
    reader holds no second copy of the checkpoint: pages come from the page cache as they are
    copied. Falls back to `safe_open` for layouts the views cannot express (misaligned offsets)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    size = Path(path).stat().st_size
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
        out.update(mapped_safetensors(f))
    return out


def fill_from_folder(buf: torch.Tensor, entries: Sequence[FillEntry], folder: str | Path) -> int:
    """Copy each entry's rows of its tensor from `folder`'s files into node buffer `buf` (a uint8
    tensor); returns the bytes copied. A tensor the folder lacks, or of another shape or dtype
    than the entry says, raises ValueError naming the folder and the tensor: the folder this node
    sees is not the checkpoint the store was registered from."""
    tensors = read_safetensors_dir(folder)
    done = 0
    for name, offset, (r0, r1), shape, dtype in entries:
        src = tensors.get(name)
        if src is None:
            raise ValueError(f"{folder}: tensor {name} is missing here (this node's copy of the checkpoint "
                             "differs from the one GPS registered)")
        dst = chunk_view(buf, offset, tuple(shape), dtype)
        if str(src.dtype).replace("torch.", "") != dtype or tuple(src.shape[1:]) != tuple(shape[1:]) \
                or src.shape[0] < r1:
            raise ValueError(f"{folder}: tensor {name} is {tuple(src.shape)} {src.dtype} here, GPS registered "
                             f"rows [{r0}, {r1}) of shape {tuple(shape)} {dtype}")
        if r1 > r0:
            copy_into(dst, src[r0:r1])
            done += dst.numel() * dst.element_size()
    return done


_SIDE_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".py", ".tiktoken")


def folder_bytes(folder: str | Path) -> int:
    """Bytes `host_copy` will take for `folder`: its weight files and small side files."""
    folder = Path(folder)
    files = set(weight_files(folder)) | {p for p in folder.iterdir() if p.is_file() and p.suffix in _SIDE_SUFFIXES}
    return sum(p.stat().st_size for p in files)


def host_copy(folder: str | Path, dst: str | Path) -> Path:
    """`folder`'s checkpoint (weight files, config, tokenizer and chat-template files) copied to
    `dst` (module docstring); returns `dst`. Idempotent: an existing whole copy is kept."""
    folder, dst = Path(folder), Path(dst)
    if (dst / "config.json").is_file():
        return dst
    files = [*weight_files(folder), *(p for p in sorted(folder.iterdir())
                                      if p.is_file() and p.suffix in _SIDE_SUFFIXES)]
    tmp = dst.parent / f".{dst.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        for f in dict.fromkeys(files):  # ordered, once each
            shutil.copyfile(f, tmp / f.name)
        if (folder / INDEX_FILE).is_file():
            shutil.copyfile(folder / INDEX_FILE, tmp / INDEX_FILE)
        try:
            os.rename(tmp, dst)
        except OSError:  # another process of this node made it first
            if not (dst / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dst
