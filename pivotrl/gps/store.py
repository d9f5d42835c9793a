"""`GlobalParameterStore`: read and write any model under any parallel layout (DESIGN.md §4.4).

Owns the two operations and their execution:
- `read(model, devices, layout)` leases one version, takes the (cached) read plan, and copies each
  atomic slice from its chosen holder's buffer straight into the device tensor (one copy, no
  staging), or with `zero_copy=True` hands out views of node-local buffers wherever a device
  tensor is one whole slice;
- `write(model, devices, layout, shards)` validates every name, shape and dtype first, then fills
  a fresh, invisible version on every holder and publishes it in one step.
- a *row write* (`begin_row_write` / `write_rows` / `commit_row_write`): a new version filled
  piecewise by many processes, each writing the dim-0 rows it holds (an FSDP2 rank's shard of every
  parameter) straight into the node buffers, with the cast to the stored dtype done by that copy:
  no gather, one host copy; the committer checks every row of every tensor arrived;
- `file_manifest`: a leased version's node buffer as (file path, offset, shape, dtype) per tensor,
  for a process on that node to map and read without a copy through this one (vLLM's workers).
Owns too: the registered models (spec, placement, chunk layouts), the plan cache (by model,
devices, layout), the version lifecycle of each write (begin, commit or abort, one write of a model
at a time) and the leases of reads and manifests. Carrying out a plan and checking shards against
it is execute.py's; placement, planning and version bookkeeping live in placement.py, planner.py
and versions.py; byte movement in transports.py.
"""
from __future__ import annotations

import os
import re
import threading
import weakref
from collections import OrderedDict, defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Mapping, Sequence

import torch

from pivotrl.config.gps import GPSConfig
from pivotrl.gps.errors import ShardMismatchError
from pivotrl.gps.execute import check_shards, check_state_dict, execute_read, execute_write
from pivotrl.gps.handles import FileManifest, ReadResult, RowWrite, StateDict
from pivotrl.gps.layout import Layout, ModelSpec, validate_layout
from pivotrl.gps.placement import ChunkLayout, Placement, budget_bytes
from pivotrl.gps.planner import Device, LinkProfile, Plan, plan_read, plan_write
from pivotrl.gps.transports import BufferRef, Transport, chunk_view, make_transport, torch_dtype
from pivotrl.gps.versions import VersionTable


class GlobalParameterStore:
    """Pooled host-memory weight store over `num_nodes` nodes. Thread-safe."""

    def __init__(self, config: GPSConfig | None = None, num_nodes: int = 1, *,
                 transport: Transport | None = None, table: VersionTable | None = None) -> None:
        self.config = config or GPSConfig()
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
        self.num_nodes = num_nodes
        self.links = LinkProfile(self.config.local_bandwidth_bytes_per_s,
                                 self.config.remote_bandwidth_bytes_per_s, self.config.transfer_overhead_s)
        self.transport = transport or make_transport(self.config, num_nodes)
        self.table = table or VersionTable(num_nodes, budget_bytes(self.config),
                                           self.config.write_headroom_versions, self.config.alignment_bytes)
        #: per-model side data kept with the store (hf_io keeps the imported config.json here)
        self.attachments: dict[str, dict[str, Any]] = {}
        self._init_local()

    def _init_local(self) -> None:
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._models: dict[str, tuple[ModelSpec, Placement, bool, list[ChunkLayout]]] = {}
        self._lock = threading.Lock()
        self._write_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._executor: ThreadPoolExecutor | None = None
        self._row_views: dict[tuple[str, int], dict[int, torch.Tensor | None]] = {}

    def __getstate__(self) -> dict:  # ship to device actors: config, transport and table handles
        return {"config": self.config, "num_nodes": self.num_nodes, "links": self.links,
                "transport": self.transport, "table": self.table, "attachments": self.attachments}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_local()

    # -- models -------------------------------------------------------------------------------
    def register(self, model: str, model_config: Any = None, *, spec: ModelSpec | None = None,
                 frozen: bool = False, dtype: str | None = None, state_dict: Mapping[str, torch.Tensor] | None = None) -> int | None:
        """Add `model` (shapes from a Qwen2 config/dict, or an explicit `spec`), choose its placement
        within the budget, and with `state_dict` load it as version 0. Returns the version or None."""
        if spec is None:
            if model_config is None:
                raise ValueError("register needs model_config or spec")
            spec = ModelSpec.from_config(model_config, dtype=dtype)
        if state_dict is not None:
            check_state_dict(model, spec, state_dict)  # before anything is reserved
        self.table.add_model(model, spec, frozen)
        if state_dict is None:
            return None
        try:
            return self._write_full(model, state_dict, initial=True)
        except BaseException:
            self._free(self.table.remove_model(model))
            raise

    def unregister(self, model: str) -> None:
        self._free(self.table.remove_model(model))
        self.attachments.pop(model, None)
        with self._lock:
            self._models.pop(model, None)
            for key in [k for k in self._plans if k[1] == model]:
                del self._plans[key]

    def models(self) -> list[str]:
        return self.table.models()

    def spec(self, model: str) -> ModelSpec:
        return self._model(model)[0]

    def placement(self, model: str) -> Placement:
        return self._model(model)[1]

    def local_node(self) -> int | None:
        """The GPS node this process runs on, whose copy it reads without a transfer (None: this
        process is on no GPS node; a read then fetches from a holder)."""
        return self.transport.local_node

    def current_version(self, model: str) -> int:
        return self.table.current(model)

    def live_versions(self, model: str) -> list[int]:
        return self.table.live_versions(model)

    def _model(self, model: str) -> tuple[ModelSpec, Placement, bool, list[ChunkLayout]]:
        hit = self._models.get(model)
        if hit is None:
            spec, placement, frozen = self.table.model(model)
            chunks = [ChunkLayout(spec, placement, j, self.config.alignment_bytes) for j in range(placement.k)]
            hit = self._models[model] = (spec, placement, frozen, chunks)
        return hit

    # -- plans --------------------------------------------------------------------------------
    def plan(self, kind: str, model: str, devices: Sequence[Device], layout: Layout) -> Plan:
        """The cached read/write plan for this signature (planned on first use)."""
        key = (kind, model, tuple(devices), layout)
        with self._lock:
            hit = self._plans.get(key)
            if hit is not None:
                self._plans.move_to_end(key)
                return hit
        spec, placement, _, _ = self._model(model)
        fn = plan_read if kind == "read" else plan_write
        p = fn(spec, key[2], layout, placement, self.links, self.config.prefer_local)
        with self._lock:
            self._plans[key] = p
            while len(self._plans) > self.config.plan_cache_size:
                self._plans.popitem(last=False)
        return p

    # -- read ---------------------------------------------------------------------------------
    def read(self, model: str, devices: Sequence[Device], layout: Layout, *, version: int | None = None,
             zero_copy: bool = False, out: Mapping[Device, StateDict] | None = None) -> ReadResult:
        """Weights of one version (default: current) of `model`, partitioned for `devices` under
        `layout`. `out` supplies destination tensors (e.g. device parameters) to fill in place."""
        spec, placement, _, chunks = self._model(model)
        validate_layout(spec, layout)
        plan = self.plan("read", model, devices, layout)  # raises on bad devices before leasing
        v, bufs = self.table.acquire(model, version)
        try:
            result = execute_read(self.transport, spec, plan, bufs, chunks, v, zero_copy, out)
        except BaseException:
            self._free(self.table.release(model, v))
            raise
        if zero_copy:
            result._finalizer = weakref.finalize(result, _release, self.table, self.transport, model, v)
        else:
            self._free(self.table.release(model, v))
        return result

    # -- write --------------------------------------------------------------------------------
    def write(self, model: str, devices: Sequence[Device], layout: Layout,
              shards: Mapping[Device, Mapping[str, torch.Tensor]]) -> int:
        """Publish a new version of `model` from the devices' shards under `layout`; returns it.
        Everything is validated before any memory is touched, so a bad write changes nothing."""
        plan = self._validated_write_plan(model, devices, layout, shards)
        return self._commit(model, plan, shards, initial=False)

    def write_async(self, model: str, devices: Sequence[Device], layout: Layout,
                    shards: Mapping[Device, Mapping[str, torch.Tensor]]) -> "Future[int]":
        """`write` off the caller's critical path (paper §5.1: the policy write overlaps the next
        training step). Validation errors raise here, at once; the copy and the publish run on a
        background thread, and the future gives the new version. The caller must not modify
        `shards` until the future is done (e.g. wait on it before the next optimizer step)."""
        plan = self._validated_write_plan(model, devices, layout, shards)
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gps-write")
        return self._executor.submit(self._commit, model, plan, shards, False)

    def _validated_write_plan(self, model: str, devices: Sequence[Device], layout: Layout,
                              shards: Mapping[Device, Mapping[str, torch.Tensor]]) -> Plan:
        spec, _, frozen, _ = self._model(model)
        if frozen:
            self.table.begin_write(model)  # raises FrozenModelError with the model's name
        validate_layout(spec, layout)
        plan = self.plan("write", model, devices, layout)
        check_shards(model, plan, shards)
        return plan

    def _write_full(self, model: str, state_dict: Mapping[str, torch.Tensor], initial: bool) -> int:
        dev = Device(0, 0)
        plan = self.plan("write", model, [dev], Layout())
        check_shards(model, plan, {dev: state_dict})
        return self._commit(model, plan, {dev: state_dict}, initial=initial)

    def load_state_dict(self, model: str, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Write a whole (unpartitioned) HF state dict as the next version. A frozen model takes
        this only as its initial load (when registered without weights)."""
        frozen = self._model(model)[2]
        if frozen and self.table.current(model) >= 0:
            self.table.begin_write(model)  # raises FrozenModelError naming the model
        return self._write_full(model, state_dict, initial=frozen)

    def _commit(self, model: str, plan: Plan, shards: Mapping[Device, Mapping[str, torch.Tensor]],
                initial: bool) -> int:
        spec, _, _, chunks = self._model(model)
        with self._write_locks[model]:
            v = self.table.begin_write(model, initial=initial)
            bufs = self._allocate_version(model, v)
            try:
                execute_write(self.transport, spec, plan, bufs, chunks, shards)
                dead = self.table.commit(model, v, bufs)
            except BaseException:
                self.table.abort(model, v)
                self._free(list(bufs.values()))
                raise
        self._free(dead)
        return v

    # -- row writes (many writers, no gather) ---------------------------------------------------
    def begin_row_write(self, model: str) -> RowWrite:
        """Open a new, invisible version of `model` for `write_rows` from any process that holds
        this store (pickled); finish with `commit_row_write` or `abort_row_write` here."""
        frozen = self._model(model)[2]
        if frozen:
            self.table.begin_write(model)  # raises FrozenModelError with the model's name
        lock = self._write_locks[model]
        lock.acquire()
        try:
            v = self.table.begin_write(model)
            bufs = self._allocate_version(model, v)
        except BaseException:
            lock.release()
            raise
        return RowWrite(model, v, bufs)

    def _allocate_version(self, model: str, v: int) -> dict[int, BufferRef]:
        """Every node's buffer of the new version `v` (begun); on failure `v` is aborted."""
        _, placement, _, chunks = self._model(model)
        bufs: dict[int, BufferRef] = {}
        try:
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model)
            for n in range(self.num_nodes):
                bufs[n] = self.transport.allocate(n, f"{safe}-v{v}-n{n}", chunks[placement.chunk_of(n)].nbytes)
        except BaseException:
            self.table.abort(model, v)
            self._free(list(bufs.values()))
            raise
        return bufs

    def write_rows(self, w: RowWrite, name: str, row_start: int, tensor: torch.Tensor) -> int:
        """Copy `tensor` as rows `[row_start, row_start + len(tensor))` of stored tensor `name`
        into every node buffer holding any of them (casting to the stored dtype in the copy; a
        device tensor is cast on its device first, halving the bytes that cross PCIe). Returns
        the rows written, for `commit_row_write`'s count."""
        spec, placement, _, chunks = self._model(w.model)
        if name not in spec:
            raise ShardMismatchError(f"row write to {w.model!r}: {name!r} is not a stored tensor")
        ts = spec[name]
        n = int(tensor.shape[0]) if tensor.dim() else 0
        if tuple(tensor.shape[1:]) != tuple(ts.shape[1:]) or row_start < 0 or row_start + n > ts.shape[0]:
            raise ShardMismatchError(f"row write to {w.model!r}: {name} rows [{row_start}, {row_start + n}) of shape "
                                     f"{tuple(tensor.shape)} do not fit the stored {ts.shape}")
        want = torch_dtype(ts.dtype)
        if tensor.device.type != "cpu" and tensor.dtype != want:
            tensor = tensor.to(want)
        views = self._row_views.setdefault((w.model, w.version), {})
        for node, ref in w.bufs.items():
            e = chunks[placement.chunk_of(node)].entries[name]
            a, b = max(row_start, e.rows[0]), min(row_start + n, e.rows[1])
            if a >= b:
                continue
            src = tensor[a - row_start:b - row_start]
            if node not in views:  # map each node buffer once per write, not once per tensor
                views[node] = self.transport.local_view(ref)
            view = views[node]
            if view is not None:
                chunk_view(view, e.offset, e.shape, ts.dtype)[a - e.rows[0]:b - e.rows[0]].copy_(src)
            else:
                box = ((a - e.rows[0], b - e.rows[0]),) + tuple((0, d) for d in ts.shape[1:])
                self.transport.write_remote(ref, [(e.offset, e.shape, ts.dtype, box)],
                                            [src.to(device="cpu", dtype=want).contiguous()])
        return n

    def commit_row_write(self, w: RowWrite, rows_written: Mapping[str, int]) -> int:
        """Publish `w`'s version if `rows_written` (rows per tensor, summed over every writer)
        covers every stored tensor exactly; else abort it and raise ShardMismatchError."""
        spec = self._model(w.model)[0]
        bad = [f"{t.name}: {rows_written.get(t.name, 0)} of {t.shape[0]} rows" for t in spec.tensors
               if rows_written.get(t.name, 0) != t.shape[0]]
        extra = sorted(set(rows_written) - set(spec.names))
        if bad or extra:
            self.abort_row_write(w)
            raise ShardMismatchError(f"row write to {w.model!r} incomplete: {bad[:5]}{'...' if len(bad) > 5 else ''}"
                                     f"{f', unknown tensors {extra[:5]}' if extra else ''}")
        self._row_views.pop((w.model, w.version), None)
        try:
            dead = self.table.commit(w.model, w.version, w.bufs)
        except BaseException:
            self.abort_row_write(w)
            raise
        self._write_locks[w.model].release()
        self._free(dead)
        return w.version

    def abort_row_write(self, w: RowWrite) -> None:
        """Drop `w`'s version and its buffers; the current version stays as it was."""
        self._row_views.pop((w.model, w.version), None)
        try:
            self.table.abort(w.model, w.version)
            self._free(list(w.bufs.values()))
        finally:
            lock = self._write_locks[w.model]
            if lock.locked():
                lock.release()

    # -- file manifests (readers in other processes of a node) -----------------------------------
    def file_manifest(self, model: str, node: int, version: int | None = None) -> FileManifest | None:
        """Lease one version (default: current) and describe node `node`'s buffer of it as a
        file: every stored tensor's byte offset, shape and dtype. None (nothing leased) when that
        buffer is not a whole copy (a sharded placement) or not a file another process can open
        (the single-process `shm` transport unlinks its files). `release()` ends the lease."""
        spec, placement, _, chunks = self._model(model)
        if not 0 <= node < self.num_nodes:
            raise ValueError(f"node {node} is not a GPS node (0..{self.num_nodes - 1})")
        layout = chunks[placement.chunk_of(node)]
        if any(layout.entries[t.name].rows != (0, t.shape[0]) for t in spec.tensors):
            return None
        v, bufs = self.table.acquire(model, version)
        ref = bufs[node]
        if not os.path.exists(ref.path):
            self._free(self.table.release(model, v))
            return None
        entries = tuple((t.name, layout.entries[t.name].offset, t.shape, t.dtype) for t in spec.tensors)
        man = FileManifest(model, v, ref.path, ref.nbytes, entries)
        man.hold_lease(_release, self.table, self.transport, model, v)
        return man

    # -- memory -------------------------------------------------------------------------------
    def resident_bytes(self) -> int:
        """Bytes of node buffers held by this process's transport (all nodes for `shm`)."""
        return self.transport.resident_bytes()

    def _free(self, refs: list[BufferRef]) -> None:
        for r in refs:
            self.transport.free(r)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        for m in self.table.models():
            try:
                self._free(self.table.remove_model(m))
            except RuntimeError:
                pass
        self.transport.close()
        if hasattr(type(self.table), "kill"):  # a table living in its own actor (make_ray_store)
            self.table.kill()


def _release(table: VersionTable, transport: Transport, model: str, v: int) -> None:
    for r in table.release(model, v):
        transport.free(r)


__all__ = ["GlobalParameterStore"]
