"""Handles the store gives out: a read's result, an open row write, a leased file manifest.

Owns `ReadResult` (the weights of one version, leased while zero-copy views of GPS memory are in
use), `RowWrite` (picklable: trainer ranks in other processes receive it and write their rows with
`GlobalParameterStore.write_rows`) and `FileManifest` (a leased version's node buffer as a file,
for a reader in another process of that node, e.g. vLLM's workers). Both are made by
`pivotrl.gps.store.GlobalParameterStore`; this module only defines them.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from pivotrl.gps.planner import Device
from pivotrl.gps.transports import BufferRef

__all__ = ["FileManifest", "ReadResult", "RowWrite", "StateDict"]

StateDict = dict[str, torch.Tensor]


@dataclass
class ReadResult:
    """The weights of exactly one version: `shards[device][name]`. With `zero_copy`, tensors may be
    views of GPS memory: the version stays leased until `release()` (or garbage collection of this
    result). Views stay valid after that (each version has its own mapping, never reused, and the
    mapping lives as long as a view does), but their memory no longer counts as a live version.
    `bytes_local`/`bytes_remote`: bytes the plan moved over node-local vs remote routes (the
    device's node vs the holder's node)."""

    version: int
    shards: dict[Device, StateDict]
    bytes_local: int = 0
    bytes_remote: int = 0
    _finalizer: Any = field(default=None, repr=False)

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> "ReadResult":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __iter__(self):  # `version, shards = store.read(...)`
        return iter((self.version, self.shards))


@dataclass(frozen=True)
class RowWrite:
    """An open row write: the model, its new version and the node buffers (picklable: the
    writer ranks receive it from the process that began it)."""

    model: str
    version: int
    bufs: dict[int, BufferRef]


@dataclass
class FileManifest:
    """A leased version's node buffer as a file (`GlobalParameterStore.file_manifest`). `entries`:
    (name, byte offset, shape, dtype name) per stored tensor. `to_wire()` is the plain-data form
    vLLM's `collective_rpc` carries to its workers."""

    model: str
    version: int
    path: str
    nbytes: int
    entries: tuple[tuple[str, int, tuple[int, ...], str], ...]
    _finalizer: Any = field(default=None, repr=False)

    def hold_lease(self, release: Callable[..., Any], *args: Any) -> None:
        """Tie the store's lease of this version to the manifest: `release(*args)` runs once, on
        `release()` or when the manifest is garbage-collected (the store calls this)."""
        self._finalizer = weakref.finalize(self, release, *args)

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    def to_wire(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "path": self.path, "nbytes": self.nbytes,
                "entries": [[n, o, list(sh), d] for n, o, sh, d in self.entries]}

    def __enter__(self) -> "FileManifest":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
