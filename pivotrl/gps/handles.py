"""Handles the store gives out for work done elsewhere: an open row write, a leased file manifest.

Owns `RowWrite` (picklable: trainer ranks in other processes receive it and write their rows with
`GlobalParameterStore.write_rows`) and `FileManifest` (a leased version's node buffer as a file,
for a reader in another process of that node, e.g. vLLM's workers). Both are made by
`pivotrl.gps.store.GlobalParameterStore`; this module only defines them.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from pivotrl.gps.transports import BufferRef

__all__ = ["RowWrite", "FileManifest"]


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
