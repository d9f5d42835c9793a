"""How GPS node buffers are allocated and how bytes reach them (registry by `GPSConfig.transport`).

Owns: `BufferRef` (a node buffer by node, key and path), the `Transport` interface and its
implementations:
- `shm`: every node buffer is a `/dev/shm` file mapped into this process (the file is unlinked at
  once, so nothing leaks if the process dies; the memory goes when the last view goes). Reads copy
  straight from the mapping into the destination (one copy, no staging), or hand out views.
- `ray` (`RayTransport`, in ray_transport.py): one `NodeStore` actor per node keeps that node's
  buffers as `/dev/shm` files; a process on the same node maps the file (zero extra copies), a
  process on another node gets the bytes through Ray object transfer.
- `nixl` (nixl_transport.py): registers the buffers with a NIXL agent; only where `nixl` imports.
The planner decides *which* holder serves a slice; the transport only moves bytes. The byte-level
helpers (typed views of a buffer, strided copies, file mappings) are `buffers.py`'s, re-exported
here.
"""
from __future__ import annotations

import abc
import os
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from pivotrl.config.gps import TRANSPORTS, GPSConfig
from pivotrl.gps.buffers import box_slices, chunk_view, copy_into, dtype_name, map_file, torch_dtype  # noqa: F401 - re-exported

# (byte offset of the chunk in the buffer, chunk shape, dtype name, box relative to the chunk)
SliceItem = tuple[int, tuple[int, ...], str, tuple[tuple[int, int], ...]]


@dataclass(frozen=True)
class BufferRef:
    """One node buffer: all chunks of one model version held by `node`."""

    node: int
    key: str
    nbytes: int
    path: str


def read_items(buf: torch.Tensor, items: list[SliceItem]) -> list[torch.Tensor]:
    """Views of the requested boxes (callers copy them where they need)."""
    return [chunk_view(buf, off, shape, dt)[box_slices(box)] for off, shape, dt, box in items]


def write_items(buf: torch.Tensor, items: list[SliceItem], tensors: list[torch.Tensor]) -> None:
    for (off, shape, dt, box), t in zip(items, tensors):
        copy_into(chunk_view(buf, off, shape, dt)[box_slices(box)], t)


class Transport(abc.ABC):
    """Allocates node buffers and moves boxes of them. `local_view` gives zero-copy access to a
    buffer reachable from this process's node; otherwise `read_remote`/`write_remote` move the
    bytes."""

    name: str = ""

    @abc.abstractmethod
    def allocate(self, node: int, key: str, nbytes: int) -> BufferRef: ...

    @abc.abstractmethod
    def free(self, ref: BufferRef) -> None: ...

    @abc.abstractmethod
    def local_view(self, ref: BufferRef) -> torch.Tensor | None: ...

    @property
    def local_node(self) -> int | None:
        """The GPS node whose buffers this process reaches directly (None: none of them). A
        single-process transport holds every node's buffers here, so node 0 is as near as any."""
        return 0

    def copy_local(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy each (source, destination) pair of same-shape tensors, both reachable from this
        process; a transport with its own engine (NIXL) batches them."""
        for src, dst in pairs:
            copy_into(dst, src)

    def read_remote(self, ref: BufferRef, items: list[SliceItem]) -> list[torch.Tensor]:
        raise NotImplementedError(f"transport {self.name!r} cannot reach node {ref.node}")

    def read_remote_many(self, requests: list[tuple[BufferRef, list[SliceItem]]]) -> list[list[torch.Tensor]]:
        """`read_remote` for several holders; transports that can overlap them do."""
        return [self.read_remote(ref, items) for ref, items in requests]

    def write_remote_many(self, requests: list[tuple[BufferRef, list[SliceItem], list[torch.Tensor]]]) -> None:
        for ref, items, tensors in requests:
            self.write_remote(ref, items, tensors)

    def write_remote(self, ref: BufferRef, items: list[SliceItem], tensors: list[torch.Tensor]) -> None:
        raise NotImplementedError(f"transport {self.name!r} cannot reach node {ref.node}")

    def fill_many(self, requests: list[tuple[BufferRef, list[Any], str]]) -> None:
        """Fill each buffer from a checkpoint folder (`node_import.fill_from_folder` entries):
        here, through this process's mapping of it; a transport whose nodes are other processes
        has each node fill its own from the folder that node sees."""
        from pivotrl.gps.node_import import fill_from_folder

        for ref, entries, folder in requests:
            view = self.local_view(ref)
            if view is None:
                raise NotImplementedError(f"transport {self.name!r} cannot reach node {ref.node}")
            fill_from_folder(view, entries, folder)

    def host_copy(self, folder: str, name: str) -> str:
        """`folder` copied into every node's shared memory under `name` (`node_import.host_copy`),
        removed at `close()`; returns the path, the same on every node."""
        raise NotImplementedError(f"transport {self.name!r} keeps no host copies")

    def resident_bytes(self) -> int:
        """Bytes of node buffers this transport currently keeps allocated."""
        return 0

    def close(self) -> None:
        """Free everything this transport allocated."""


class ShmTransport(Transport):
    """All nodes' buffers in this process, each a `/dev/shm`-backed mapping (the `local` runtime,
    and any single process that hosts GPS). Freed buffers that nothing else references go to a
    small pool and back the next write of the same size, which then skips faulting in fresh
    shared-memory pages (about 30 % slower than anonymous memory to fault in on this machine)."""

    name = "shm"

    def __init__(self, config: GPSConfig, num_nodes: int) -> None:
        self.dir = config.shm_dir
        self.num_nodes = num_nodes
        self.pool_limit = config.pool_freed_buffers
        self._bufs: dict[str, torch.Tensor] = {}
        self._pool: dict[int, list[torch.Tensor]] = {}
        self._copies: set[str] = set()
        self._tag = f"pivotrl-gps-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def __getstate__(self) -> dict:
        raise TypeError("the 'shm' GPS transport lives in one process and cannot be pickled (it would "
                        "copy every buffer); share a store across processes with "
                        "pivotrl.gps.ray_transport.make_ray_store")

    def allocate(self, node: int, key: str, nbytes: int) -> BufferRef:
        path = os.path.join(self.dir, f"{self._tag}-{key}")
        pooled = self._pool.get(nbytes)
        if pooled:
            buf = pooled.pop()
        else:
            buf = map_file(path, nbytes)
            os.unlink(path)  # the mapping keeps the pages; nothing is left behind on a crash
        self._bufs[path] = buf
        return BufferRef(node, key, nbytes, path)

    def free(self, ref: BufferRef) -> None:
        buf = self._bufs.pop(ref.path, None)
        if buf is None:
            return
        # a zero-copy view still alive keeps the mapping (and its pages) until it dies; such a
        # buffer is never reused, so the view can never see another version's bytes
        pooled = self._pool.setdefault(ref.nbytes, [])
        if len(pooled) < self.pool_limit and _sole_owner(buf):
            pooled.append(buf)

    def local_view(self, ref: BufferRef) -> torch.Tensor | None:
        return self._bufs.get(ref.path)

    def host_copy(self, folder: str, name: str) -> str:
        from pivotrl.gps.node_import import host_copy

        dst = os.path.join(self.dir, name)
        self._copies.add(dst)
        return str(host_copy(folder, dst))

    def resident_bytes(self) -> int:
        return sum(b.numel() for b in self._bufs.values())

    def pooled_bytes(self) -> int:
        """Bytes of freed buffers kept for the next write (inside the budget's write headroom)."""
        return sum(b.numel() for bs in self._pool.values() for b in bs)

    def close(self) -> None:
        import shutil

        self._bufs.clear()
        self._pool.clear()
        for d in self._copies:
            shutil.rmtree(d, ignore_errors=True)
        self._copies.clear()


def _sole_owner(buf: torch.Tensor) -> bool:
    """True when no tensor but `buf` uses its memory (counts: `buf` and the storage handle here)."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return False
    return use_count(buf.untyped_storage()._cdata) <= 2


def make_transport(config: GPSConfig, num_nodes: int, **kw: Any) -> Transport:
    """The transport `config.transport` names (`pivotrl.config.gps.TRANSPORTS`)."""
    return TRANSPORTS.build(config.transport, config, num_nodes, **kw)
