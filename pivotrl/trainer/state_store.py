"""The trainer's whole state in host memory between steps, readable at any world size (elastic
training, DESIGN §4.6: GPS's idea applied to the trainer).

Owns the state's GPS model and the two collective halves that move a trainer in and out of it:

- `state_spec(model_path)`: what is stored, as a GPS `ModelSpec` built from the model's config on
  the meta device (no weights read): for every trainable parameter (FSDP's names, tied weights
  once) its float32 master weights, `<name>::exp_avg` and `<name>::exp_avg_sq` (AdamW's moments,
  float32, the parameter's shape), and `__meta__`, a fixed-size byte blob of JSON: the policy
  version, counters, AdamW's step count, and each world size's per-rank RNG streams (a world size
  the trainer comes back to continues its own streams). Gradients are not kept: every update
  ends with `zero_grad(set_to_none=True)`, so none exist between steps. 12 bytes per parameter.
- `register_state(store, name, model_path)`: add it to a GPS store; a store whose host-memory
  budget cannot hold it raises GPS's `BudgetError`, which names the sizes (the caller keeps the
  trainer on its home set and says so).
- `write_state(worker, store, name)`: collective over the trainer's ranks, after a step. A GPS
  row write (`row_write.collective_row_write`, the policy publish's protocol): every rank
  writes the dim-0 rows of the parameters and moments it holds (FSDP2's `Shard(0)`:
  `weight_sync.fsdp_row_range`), rank 0 also the meta blob; no gather, one host copy. The version
  becomes visible in one step once every row of every tensor arrived (GPS's commit check), so a
  reader sees the state before the write or after it, never a mix.
- `read_state(worker, store, name)`: collective over the ranks of a trainer of any world size,
  built without weights (`TrainerWorker(..., load_weights=False)`). Rank 0 names the version
  (broadcast: every rank reads the same one), each rank leases it on its own GPS node and copies
  its rows of every tensor from the node's buffer (mapped as a file, no copy through another
  process; where the node holds no whole file, a GPS read of the whole state instead), then
  sets AdamW's state, the version, counters and its RNG streams.

Resharding W -> W' is therefore a write at W and a read at W', through host memory, never disk,
on one node or across nodes (GPS places the state on every node that has room and moves it
between them). `TrainerWorker.save_state` / `load_state` call these.
"""
from __future__ import annotations

import base64
import json
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from pivotrl.trainer.row_write import collective_row_write

if TYPE_CHECKING:
    import os

    from pivotrl.gps.handles import RowWrite
    from pivotrl.gps.layout import ModelSpec
    from pivotrl.gps.store import GlobalParameterStore
    from pivotrl.trainer.trainer_worker import TrainerWorker

__all__ = ["META", "StateHandle", "read_state", "register_state", "state_bytes", "state_spec", "stored_version",
           "write_state"]

#: The stored name of the meta blob, and its size (JSON, zero-padded; 8-byte length prefix).
META = "__meta__"
META_BYTES = 1 << 20
MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class StateHandle:
    """Where a trainer's state lives: a GPS store (a picklable Ray store handle) and the model
    name in it. Travels to the device actors in `RoleSpec.state`."""

    store: GlobalParameterStore
    name: str


def _stored(name: str, kind: str | None) -> str:
    return name if kind is None else f"{name}::{kind}"


def _parameter_shapes(model_path: str | os.PathLike) -> tuple[list[tuple[str, tuple[int, ...]]], int]:
    """(name, shape) of every parameter of the model at `model_path`, built on the meta device,
    and its number of decoder layers (GPS places `model.layers.<i>.` tensors by layer)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(model_path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    layers = int(getattr(cfg.get_text_config(), "num_hidden_layers", 0) or 0)
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()], layers


def state_spec(model_path: str | os.PathLike) -> ModelSpec:
    """The GPS `ModelSpec` of a trainer's state for the model at `model_path` (module docstring)."""
    from pivotrl.gps.layout import ModelSpec, TensorSpec

    shapes, layers = _parameter_shapes(model_path)
    tensors = []
    for name, shape in shapes:
        tensors += [TensorSpec(_stored(name, k), shape, "float32") for k in (None, *MOMENTS)]
    tensors.append(TensorSpec(META, (META_BYTES,), "uint8"))
    return ModelSpec(tuple(tensors), num_layers=layers, head_dim=0, family="trainer_state")


def state_bytes(spec: ModelSpec) -> int:
    """Host bytes of one copy of the state."""
    return int(spec.nbytes)


def register_state(store: GlobalParameterStore, name: str, model_path: str | os.PathLike) -> int:
    """Register the trainer's state of `model_path` as GPS model `name` (no version yet); returns
    its bytes. Raises GPS's `BudgetError` when the store's host memory cannot hold it."""
    spec = state_spec(model_path)
    store.register(name, spec=spec, frozen=False)
    return state_bytes(spec)


# ---------------------------------------------------------------------------------- meta blob
def _rng_state(device: torch.device) -> dict[str, Any]:
    np_state = np.random.get_state()
    py = random.getstate()
    return {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "cuda": (base64.b64encode(torch.cuda.get_rng_state(device).numpy().tobytes()).decode()
                 if device.type == "cuda" else None),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py[0], list(py[1]), py[2]],
    }


def _set_rng_state(rng: dict[str, Any], device: torch.device) -> None:
    def tensor(b64: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.uint8)

    torch.set_rng_state(tensor(rng["torch"]))
    if rng.get("cuda") and device.type == "cuda":
        torch.cuda.set_rng_state(tensor(rng["cuda"]), device)
    n = rng["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = rng["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


def _encode(meta: dict[str, Any]) -> torch.Tensor:
    raw = json.dumps(meta).encode()
    if len(raw) + 8 > META_BYTES:
        raise ValueError(f"trainer state meta is {len(raw)} bytes, more than its {META_BYTES - 8}-byte blob")
    out = torch.zeros(META_BYTES, dtype=torch.uint8)
    out[:8] = torch.frombuffer(bytearray(len(raw).to_bytes(8, "little")), dtype=torch.uint8)
    out[8:8 + len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return out


def _decode(blob: torch.Tensor) -> dict[str, Any]:
    b = blob.numpy().tobytes()
    n = int.from_bytes(b[:8], "little")
    return json.loads(b[8:8 + n].decode())


# ---------------------------------------------------------------------------------- rows
def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _rows(worker: TrainerWorker, create_moments: bool) -> list[tuple[str, int, torch.Tensor]]:
    """(stored name, first row, this rank's rows: a view of its shard) of every stored tensor.
    AdamW's moments of a parameter that has none yet (no step taken) are created as zeros when
    `create_moments`, else given as zeros not attached to the optimizer (what a write stores)."""
    from pivotrl.engines.weight_sync import fsdp_row_range

    out = []
    for name, p in worker.model.named_parameters():
        a, b = fsdp_row_range(p.shape[0], worker.world_size, worker.rank) if hasattr(p, "to_local") \
            else (0, p.shape[0])
        st = worker.optimizer.state[p] if create_moments else worker.optimizer.state.get(p, {})
        for kind in (None, *MOMENTS):
            if kind is not None and kind not in st:
                zeros = torch.zeros_like(p.data)
                if create_moments:
                    st[kind] = zeros
                t = zeros
            else:
                t = p.data if kind is None else st[kind]
            local = _local(t).detach()
            if local.shape[0] != b - a:
                raise ValueError(f"{name}: local shard has {local.shape[0]} rows, FSDP2's Shard(0) gives rank "
                                 f"{worker.rank} of {worker.world_size} {b - a}")
            out.append((_stored(name, kind), a, local))
    return out


def _optim_step(worker: TrainerWorker) -> float:
    steps = {float(st["step"]) for st in worker.optimizer.state.values() if "step" in st}
    if len(steps) > 1:
        raise RuntimeError(f"AdamW's step counts differ across parameters ({sorted(steps)[:4]}): not one trainer state")
    return steps.pop() if steps else 0.0


def write_state(worker: TrainerWorker, store: GlobalParameterStore, name: str) -> dict[str, float]:
    """Write `worker`'s whole state as a new version of GPS model `name` (module docstring).
    Collective. Returns `{"gps_version", "seconds", "bytes"}` (bytes this rank wrote)."""
    t0 = time.perf_counter()
    rank, world = worker.rank, worker.world_size
    rngs: list[Any] = [None] * world
    dist.all_gather_object(rngs, _rng_state(worker.device))
    written = 0

    def fill(w: RowWrite) -> dict[str, int]:
        nonlocal written
        rows: dict[str, int] = {}
        with torch.no_grad():
            for sname, start, local in _rows(worker, create_moments=False):
                if local.shape[0]:
                    rows[sname] = rows.get(sname, 0) + store.write_rows(w, sname, start, local)
                    written += local.numel() * local.element_size()
            if rank == 0:
                meta = dict(worker.state_meta)
                meta.update(version=int(worker.version), counters=dict(worker.counters),
                            optim_step=_optim_step(worker), world_size=world)
                meta["rng"] = {**meta.get("rng", {}), str(world): rngs}
                rows[META] = store.write_rows(w, META, 0, _encode(meta))
        return rows

    version = collective_row_write(store, name, rank, world, fill, "trainer state write")
    return {"gps_version": float(version), "seconds": time.perf_counter() - t0, "bytes": float(written)}


def _open(store: GlobalParameterStore, name: str, version: int):
    """(a leased handle to release, name -> full CPU tensor view) of `version` on this process's
    GPS node: the node's buffer mapped as a file, else a GPS read of the whole state."""
    node = store.local_node()
    man = store.file_manifest(name, node, version) if node is not None else None
    if man is not None:
        buf = torch.from_file(man.path, shared=True, size=int(man.nbytes), dtype=torch.uint8)
        views = {}
        for n, off, shape, dt in man.entries:
            dtype = getattr(torch, dt)
            views[n] = buf[off:off + int(np.prod(shape)) * dtype.itemsize].view(dtype).view(tuple(shape))
        return man, views
    from pivotrl.gps.layout import Layout
    from pivotrl.gps.planner import Device

    dev = Device(0 if node is None else node, 0)
    res = store.read(name, [dev], Layout(), version=version)
    return res, res.shards[dev]


def stored_version(store: GlobalParameterStore, name: str) -> int | None:
    """The policy version of the state GPS model `name` holds now (None: none written yet)."""
    v = int(store.current_version(name))
    if v < 0:
        return None
    lease, views = _open(store, name, v)
    try:
        return int(_decode(views[META])["version"])
    finally:
        lease.release()


def read_state(worker: TrainerWorker, store: GlobalParameterStore, name: str) -> dict[str, float]:
    """Fill `worker` (any world size) from the current version of GPS model `name` (module
    docstring). Collective. Returns `{"gps_version", "seconds", "bytes"}` (bytes this rank read)."""
    t0 = time.perf_counter()
    box = [int(store.current_version(name)) if worker.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    version = box[0]
    if version < 0:
        raise RuntimeError(f"GPS model {name!r} holds no trainer state yet")
    lease, views = _open(store, name, version)
    read = 0
    try:
        meta = _decode(views[META])
        step = float(meta["optim_step"])
        with torch.no_grad():
            # AdamW that has not stepped keeps no state: its moments and step appear at its first step
            for sname, start, local in _rows(worker, create_moments=step > 0):
                if "::" in sname and step <= 0:
                    continue
                n = local.shape[0]
                if n:
                    local.copy_(views[sname][start:start + n])
                    read += local.numel() * local.element_size()
            if step > 0:
                for st in worker.optimizer.state.values():
                    st["step"] = torch.tensor(step, dtype=torch.float32)
    finally:
        lease.release()
    worker.version = int(meta["version"])
    worker.counters = {k: int(v) for k, v in meta["counters"].items()}
    worker.state_meta = {k: v for k, v in meta.items() if k == "rng"}
    mine = meta.get("rng", {}).get(str(worker.world_size))
    if mine is not None:
        _set_rng_state(mine[worker.rank], worker.device)
    dist.barrier()
    return {"gps_version": float(version), "seconds": time.perf_counter() - t0, "bytes": float(read)}
