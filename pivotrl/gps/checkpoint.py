"""A Hugging Face checkpoint folder as GPS sees it, read without loading weights (pure: stdlib only).

Owns: reading `config.json`, the tensor index (every safetensors file's header: name, shape, dtype;
plus `model.safetensors.index.json` when there is one, so a file it lists but that is absent is a
partial checkpoint), and `checkpoint_spec`, the `ModelSpec` of a folder: tensors and shapes from the
index, held against what config.json implies (families.py), dtypes as stored. Knows nothing about
where the folder came from (pivotrl/models/resolve.py) or how weights are copied (hf_io.py).

Dtype contract: each tensor's GPS dtype is its safetensors dtype (a bf16 checkpoint is stored bf16).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pivotrl.gps.families import CheckpointMismatchError, check_index, expected_tensors
from pivotrl.gps.layout import ModelSpec

#: safetensors header dtype -> torch dtype name
ST_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64",
             "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
             "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}

#: bytes per element of each safetensors dtype
ST_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                  "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}

INDEX_FILE = "model.safetensors.index.json"


def read_config(path: str | Path) -> dict[str, Any]:
    """`config.json` of a model folder; FileNotFoundError naming it when absent."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: not a Hugging Face model directory")
    return json.loads(f.read_text())


def safetensors_header(file: str | Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (its tensors' dtype, shape and byte offsets), checked
    against the file: the header must fit in it and parse, and the file must be exactly as long as
    the header says (8 + header + the end of its last tensor), each tensor's bytes its shape times
    its dtype's size. A file cut short (a partial copy) or that is not safetensors at all (random
    bytes) is a `CheckpointMismatchError` naming the file, found from its header and size alone
    (issue 22: such files passed and failed after Ray started, naming neither file nor key)."""
    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointMismatchError(f"{file}: truncated safetensors file ({len(raw)} bytes)")
        n = int.from_bytes(raw, "little")
        if n > size - 8:
            raise CheckpointMismatchError(f"{file}: not a safetensors file, or cut short: its header length {n} "
                                          f"is beyond the file's {size} bytes")
        header = f.read(n)
    try:
        got = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointMismatchError(f"{file}: not a safetensors file: its {n}-byte header is not JSON") from None
    if not isinstance(got, dict):
        raise CheckpointMismatchError(f"{file}: not a safetensors file: its header is not a JSON object")
    _check_data_length(Path(file), got, size - 8 - n)
    return got


def _check_data_length(file: Path, header: dict[str, Any], data_bytes: int) -> None:
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            a, b = (int(x) for x in info["data_offsets"])
            numel = 1
            for d in info["shape"]:
                numel *= int(d)
            width = ST_DTYPE_BYTES.get(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointMismatchError(f"{file}: tensor {name}: a malformed header entry {info!r}") from None
        if not 0 <= a <= b or (width is not None and b - a != numel * width):
            raise CheckpointMismatchError(f"{file}: tensor {name}: data_offsets {[a, b]} do not hold its shape "
                                          f"{info['shape']} of {info['dtype']}")
        end = max(end, b)
    if data_bytes != end:
        how = "cut short" if data_bytes < end else "longer than its header says"
        raise CheckpointMismatchError(f"{file}: {how}: its header's tensors need {end} bytes of data, the file "
                                      f"holds {data_bytes}")


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a folder. With an index file, every file it names must exist
    (CheckpointMismatchError lists the absent ones: a partial download)."""
    path = Path(path)
    idx = path / INDEX_FILE
    if idx.is_file():
        names = sorted(set(json.loads(idx.read_text()).get("weight_map", {}).values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise CheckpointMismatchError(
                f"{path}: partial checkpoint: {len(missing)} of {len(names)} weight files listed in {INDEX_FILE} "
                f"are missing (first: {', '.join(missing[:3])})")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    return files


def tensor_index(path: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """`{name: (shape, dtype)}` over all weight files of a folder, from their headers only."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for f in weight_files(path):
        for name, info in safetensors_header(f).items():
            if name == "__metadata__":
                continue
            dt = ST_DTYPES.get(info["dtype"])
            if dt is None:
                raise CheckpointMismatchError(f"{f}: tensor {name} has dtype {info['dtype']}, which GPS does not "
                                              f"store; allowed: {sorted(ST_DTYPES)}")
            out[name] = (tuple(info["shape"]), dt)
    return out


def checkpoint_spec(path: str | Path, config: dict[str, Any] | None = None) -> ModelSpec:
    """The ModelSpec of a checkpoint folder: family rules from config.json, tensors checked against
    the index, dtypes as stored. Raises UnsupportedArchitectureError or CheckpointMismatchError (both
    ValueError) naming the folder."""
    path = Path(path)
    cfg = config if config is not None else read_config(path)
    fam, geom, entries = expected_tensors(cfg, where=str(path))
    idx = check_index(entries, tensor_index(path), geom.tie_word_embeddings, where=str(path))
    return ModelSpec.from_entries(entries, geom, fam.name, {n: idx[n][1] for n, _, _ in entries})
