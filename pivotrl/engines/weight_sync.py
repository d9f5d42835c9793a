"""Weight sync without the driver: trainer ranks write their shards into GPS; engines read their
node's GPS copy straight into the model. The driver only says when (and which version).

Owns the two public halves and the tensor iterator they share:

- `publish_shards(worker, store, model)`: collective over the trainer's ranks (each in its own
  process, each holding the store, e.g. a `make_ray_store` handle). Rank 0 opens a row write
  (`GlobalParameterStore.begin_row_write`) and broadcasts it; every rank copies the dim-0 rows of
  every parameter it holds (FSDP2 shards are `Shard(0)`: rank r holds rows
  `[r * ceil(n / W), ...)`) straight into the node buffers, cast to the store's dtype in that copy
  (on a GPU the cast runs on the device, so bf16 crosses PCIe), all in one
  `GlobalParameterStore.write_rows_many` (another node's buffer takes them in one call); rank 0
  commits once every row of every tensor has arrived. No gather, no rank holds the whole model, and one host copy per byte
  per node buffer (a device-to-host copy on GPU). Returns the new GPS version on every rank.
- `load_from_gps(engine, store, model, node, version)`: lease the version, get the node buffer's
  file manifest (`GlobalParameterStore.file_manifest`) and let the engine load it (both
  engines' `load_weights` take a manifest: vLLM's workers map the file and hand vLLM's own weight
  loaders views of it; the CPU engine copies from the views). Where the buffer is no
  file (the single-process `shm` transport) or not a whole copy, it falls back to a GPS read into
  fresh tensors and `load_weights`. Returns the timing as a measured event (seconds, bytes, GB/s,
  which path), never a timeout: a slow load is recorded, not fatal.
- `GPSWeights` / `opened(weights, version)`: what the driver hands a device instead of a state dict (the
  store handle, the model, the GPS version, the policy version it carries): the device opens it
  itself, in its own process, for its own node (`GlobalParameterStore.local_node`): a leased file
  manifest both engines load from, or a GPS read where there is none. The driver never holds the
  weights.
- `iter_manifest_tensors(wire)`: (name, tensor view) of a manifest in its plain-data form (what
  `collective_rpc` carries), used by both engines.

Each tensor-parallel rank reads only its own shard. vLLM's weight loaders take checkpoint-format
tensors and narrow them to the rank's rows or columns (`narrow` on a view: no bytes move) before
the one copy into the rank's parameter. Handing them views of the host mapping, not device
tensors, makes that copy the only one, of the shard only: a TP=4 rank moves a quarter of the model
from host memory, the four ranks at once, each in its own process. On CUDA that copy goes from
pageable memory, which the driver stages through its own pinned buffers and DMA, overlapped (no
bucket of ours, no device memory beyond the parameters). Registering the mapping instead
(`cudaHostRegister`) would pin every page of the whole file on every rank at every load (a new
file per version) to save part of a copy of a quarter of it: not done. CPU and GPU run the same
code; `python -m pivotrl.bench weight_load` measures the shard reads.

Fused MoE experts (transformers 5 keeps `mlp.experts.gate_up_proj` of shape (E, 2I, H) in memory;
GPS keeps one tensor per expert, `gps.state_dict`): an FSDP2 rank holds whole experts (dim 0), so
it writes each of its experts' per-expert tensors whole (`gps.state_dict.rows_in_store`).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch

from pivotrl.trainer.row_write import collective_row_write

if TYPE_CHECKING:
    from pivotrl.engines.protocol import InferenceEngine
    from pivotrl.gps.handles import RowWrite
    from pivotrl.gps.layout import ModelSpec
    from pivotrl.gps.store import GlobalParameterStore
    from pivotrl.trainer.trainer_worker import TrainerWorker

__all__ = ["GPSWeights", "publish_shards", "load_from_gps", "opened", "iter_manifest_tensors", "fsdp_row_range"]


@dataclass(frozen=True)
class GPSWeights:
    """Weights a device reads from GPS itself: `model` at GPS version `gps_version`, loaded as
    `version` (the policy's version; it differs from the GPS one after a resume). Nothing is
    leased while this travels: if a newer version superseded `gps_version` (and freed it) before
    the device read, the device takes the newest one, tagged by the same offset (a shift up and a
    publish both want the policy's current version; newer weights only make tokens less stale).
    Picklable: the store travels as its handle (a `make_ray_store` store: version table and node
    buffers live in their own actors)."""

    store: GlobalParameterStore
    model: str
    gps_version: int
    version: int

    def version_of(self, gps_version: int) -> int:
        """The policy version GPS version `gps_version` of this model holds."""
        return int(gps_version) + self.version - self.gps_version


def fsdp_row_range(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rows of a dim-0 tensor that FSDP2's `Shard(0)` gives `rank` (torch.chunk: ceil-sized
    pieces, the last ones short or empty)."""
    size = math.ceil(rows / world_size) if rows else 0
    a = min(rows, rank * size)
    return a, min(rows, a + size)


def _local_rows(p: torch.Tensor, rows: int, world_size: int, rank: int) -> tuple[int, torch.Tensor]:
    local = p.to_local() if hasattr(p, "to_local") else p
    placements = getattr(p, "placements", None)
    if placements is not None and any(type(pl).__name__ != "Shard" or getattr(pl, "dim", 0) != 0 for pl in placements):
        raise ValueError(f"parameter with placements {placements} is not an FSDP2 dim-0 shard")
    a, b = fsdp_row_range(rows, world_size, rank) if placements is not None else (0, rows)
    if local.shape[0] != b - a:
        raise ValueError(f"local shard has {local.shape[0]} rows, FSDP2's Shard(0) gives rank {rank} {b - a}")
    return a, local.detach()


def rows_in_store(name: str, p: torch.Tensor, spec: ModelSpec, world: int, rank: int) -> list[tuple[str, int, torch.Tensor]]:
    """(stored name, first row, rows) that rank `rank`'s shard of parameter `name` fills in GPS:
    its own rows of a stored tensor; each whole per-expert tensor of the experts it holds, for a
    fused MoE expert parameter; nothing for a tensor GPS does not store (a tied `lm_head`)."""
    from pivotrl.gps.state_dict import is_fused_experts, split_fused_experts

    if name in spec:
        start, local = _local_rows(p, spec[name].shape[0], world, rank)
        return [(name, start, local)]
    if not is_fused_experts(name):
        return []  # not stored
    start, local = _local_rows(p, p.shape[0], world, rank)
    return [(n, 0, t) for n, t in split_fused_experts({name: local}, first_expert=start).items() if n in spec]


def publish_shards(worker: TrainerWorker, store: GlobalParameterStore, model: str) -> int:
    """Write `worker`'s policy as a new version of GPS model `model` from every rank's own shard
    (module docstring). Collective: call on every trainer rank. Parameters GPS does not store (a
    tied `lm_head.weight`: GPS keeps the embedding once) are skipped; a stored tensor no rank
    wrote makes the commit fail with ShardMismatchError and the version is dropped."""
    worker_rank, world = worker.rank, worker.world_size

    def fill(w: RowWrite) -> dict[str, int]:
        rows: dict[str, int] = {}
        spec = store.spec(model)
        with torch.no_grad():
            mine = [r for name, p in worker.model.named_parameters()
                    for r in rows_in_store(name, p, spec, world, worker_rank)]
            for sname, _, _ in mine:
                rows.setdefault(sname, 0)
            # all at once: another node's rows go there in one call, not one per tensor
            for sname, n in store.write_rows_many(w, [r for r in mine if r[2].shape[0]]).items():
                rows[sname] += n
        return rows

    return collective_row_write(store, model, worker_rank, world, fill, "publish_shards")


def iter_manifest_tensors(wire: Mapping[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every entry of a manifest's plain-data form: views of the mapped node
    file, nothing copied or read yet (module docstring: one copy, the loader's)."""
    buf = torch.from_file(wire["path"], shared=True, size=int(wire["nbytes"]), dtype=torch.uint8)
    for name, offset, shape, dtype in wire["entries"]:
        dt = getattr(torch, dtype)
        yield name, buf[offset:offset + dt.itemsize * math.prod(shape)].view(dt).view(tuple(shape))


@contextlib.contextmanager
def open_gps(store: GlobalParameterStore, model: str, node: int | None,
             version: int | None = None) -> Iterator[dict[str, Any]]:
    """One leased GPS version (default: current) of `model` as an engine loads it, for a process
    on GPS node `node`: `{"weights", "version", "bytes", "path"}`, `weights` being that node's
    buffer as a `FileManifest` (path `file`: the engine maps it, no copy here), or, where there is
    none (a sharded placement, a single-process transport, a process on no GPS node: `node`
    None), a state dict read from GPS (path `read`). The lease ends on exit."""
    man = store.file_manifest(model, node, version) if node is not None else None
    if man is not None:
        with man:
            yield {"weights": man, "version": man.version, "bytes": man.nbytes, "path": "file"}
        return
    from pivotrl.gps.layout import Layout
    from pivotrl.gps.planner import Device

    dev = Device(0 if node is None else node, 0)
    with store.read(model, [dev], Layout(), version=version) as res:
        sd = res.shards[dev]
        yield {"weights": sd, "version": res.version, "bytes": sum(t.numel() * t.element_size() for t in sd.values()),
               "path": "read"}


@contextlib.contextmanager
def opened(weights: GPSWeights | Mapping[str, Any] | None, version: int
           ) -> Iterator[tuple[Any, int, dict[str, Any]]]:
    """(what an engine's `load_weights` takes, the version to tag it with, the load's facts) for
    `weights`: a `GPSWeights` opened on this process's own GPS node (`open_gps`; superseded by a
    newer version: the newest, `GPSWeights`), or a state dict (or None) as it is, at `version`."""
    if not isinstance(weights, GPSWeights):
        yield weights, version, {}
        return
    from pivotrl.gps.errors import UnknownVersionError

    node = weights.store.local_node()
    with contextlib.ExitStack() as stack:
        try:
            o = stack.enter_context(open_gps(weights.store, weights.model, node, weights.gps_version))
        except UnknownVersionError:  # freed once a newer version was committed: read the newest
            o = stack.enter_context(open_gps(weights.store, weights.model, node, None))
            if o["version"] < weights.gps_version:
                raise
        yield o["weights"], weights.version_of(o["version"]), {"gps_version": o["version"], "bytes": o["bytes"],
                                                                 "path": o["path"]}


def load_from_gps(engine: InferenceEngine, store: GlobalParameterStore, model: str, node: int | None, version: int | None = None,
                  engine_version: int | None = None) -> dict[str, float | str]:
    """Load GPS version `version` (default: current) of `model` from node `node`'s copy into
    `engine` (`open_gps`), tagged `engine_version` (default: the GPS version; the runtime passes
    the policy version). Returns the load as a measured event, `{"version", "seconds", "bytes",
    "gb_per_s", "path"}`: a slow load is recorded, never a timeout."""
    t0 = time.perf_counter()
    with open_gps(store, model, node, version) as o:
        engine.load_weights(o["weights"], o["version"] if engine_version is None else engine_version)
    secs = time.perf_counter() - t0
    return {"version": float(o["version"]), "seconds": secs, "bytes": float(o["bytes"]),
            "gb_per_s": o["bytes"] / 1e9 / secs if secs > 0 else float("inf"), "path": o["path"]}
