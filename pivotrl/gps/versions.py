"""The GPS version table: which models exist, where they live, which versions are live (pure).

Owns the metadata and its invariants, under one lock:
- a model's placement is fixed when it registers, and its memory is reserved from every node's
  budget then (registration that does not fit raises BudgetError and changes nothing). Each node
  has its own budget (measured on that node: `ray_transport.make_ray_store`); a placement fits
  the node with the least room left. Memory held beside GPS on every node (a frozen judge's
  host-memory copy, `reserve`) is taken from every node's budget the same way. Models
  are placed in registration order, each replicated if what is left fits it: register the model
  read most on the critical path (the policy) first;
- versions are published atomically: `begin_write` hands out `v+1` invisibly, `commit` makes it
  current in one step, so `acquire` only ever sees whole versions;
- a reader holds a lease on exactly one version; a version that is neither current nor leased is
  returned for freeing (by `release` or `commit`), never earlier;
- frozen models accept only their initial load; one write per model at a time.
Knows nothing about bytes: buffers are opaque references the transport understands. Kept free of
torch and Ray so it can run in-process or inside a Ray actor unchanged.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from pivotrl.gps.errors import BudgetError, FrozenModelError, UnknownModelError, UnknownVersionError, WriteConflictError
from pivotrl.gps.layout import ModelSpec
from pivotrl.gps.placement import Placement, choose_placement, node_bytes


@dataclass
class VersionRecord:
    version: int
    buffers: dict[int, Any]  # node -> transport buffer reference
    readers: int = 0


@dataclass
class ModelRecord:
    name: str
    spec: ModelSpec
    placement: Placement
    frozen: bool
    reserved_per_node: int
    current: int = -1
    writing: int | None = None
    versions: dict[int, VersionRecord] = field(default_factory=dict)


class VersionTable:
    """Metadata of every model in one GPS instance; thread-safe."""

    def __init__(self, num_nodes: int, budget_per_node: int | Sequence[int], headroom_versions: int,
                 alignment: int) -> None:
        """`budget_per_node`: one budget for every node, or one per node."""
        self.num_nodes = num_nodes
        budgets = [int(budget_per_node)] * num_nodes if isinstance(budget_per_node, int) else [int(b) for b in budget_per_node]
        if len(budgets) != num_nodes:
            raise ValueError(f"{len(budgets)} node budgets for {num_nodes} nodes")
        self.budget = budgets
        self.external: dict[str, int] = {}
        self.headroom = headroom_versions
        self.alignment = alignment
        self.reserved = [0] * num_nodes
        self._models: dict[str, ModelRecord] = {}
        self._lock = threading.Lock()

    # -- models -----------------------------------------------------------------------------
    def add_model(self, name: str, spec: ModelSpec, frozen: bool) -> tuple[Placement, ModelSpec]:
        with self._lock:
            if name in self._models:
                raise ValueError(f"model {name!r} is already registered")
            copies = 1 if frozen else 1 + self.headroom
            free = self.free_bytes()
            placement = choose_placement(spec, self.num_nodes, free, copies, self.alignment)
            per_node = node_bytes(spec, placement.k, self.alignment) * copies
            self._models[name] = ModelRecord(name, spec, placement, frozen, per_node)
            for n in range(self.num_nodes):
                self.reserved[n] += per_node
            return placement, spec

    def budgets(self) -> list[int]:
        """Each node's budget, bytes."""
        return list(self.budget)

    def free_bytes(self) -> int:
        """Room left on the fullest node (call with the lock held or for a snapshot)."""
        return min(b - r for b, r in zip(self.budget, self.reserved))

    def reserve(self, name: str, nbytes_per_node: int) -> None:
        """Take `nbytes_per_node` of every node's budget for memory kept beside GPS (`name`: what
        it is, for the error); BudgetError naming both numbers when a node lacks the room."""
        with self._lock:
            if name in self.external:
                raise ValueError(f"{name!r} is already reserved")
            free = self.free_bytes()
            if nbytes_per_node > free:
                raise BudgetError(f"{name} needs {nbytes_per_node} bytes ({nbytes_per_node / 2**30:.2f} GiB) of host "
                                  f"memory on every node, but only {free} bytes ({free / 2**30:.2f} GiB) of the GPS "
                                  "budget are left (cluster.gps.node_memory_budget_bytes / node_memory_fraction)")
            self.external[name] = int(nbytes_per_node)
            for n in range(self.num_nodes):
                self.reserved[n] += int(nbytes_per_node)

    def model(self, name: str) -> tuple[ModelSpec, Placement, bool]:
        with self._lock:
            r = self._get(name)
            return r.spec, r.placement, r.frozen

    def models(self) -> list[str]:
        with self._lock:
            return sorted(self._models)

    def remove_model(self, name: str) -> list[Any]:
        """Forget a model; returns every buffer to free. Refused while a reader holds it."""
        with self._lock:
            r = self._get(name)
            if any(v.readers for v in r.versions.values()) or r.writing is not None:
                raise RuntimeError(f"model {name!r} is in use (reader or writer active)")
            del self._models[name]
            for n in range(self.num_nodes):
                self.reserved[n] -= r.reserved_per_node
            return [b for v in r.versions.values() for b in v.buffers.values()]

    def _get(self, name: str) -> ModelRecord:
        r = self._models.get(name)
        if r is None:
            raise UnknownModelError(f"unknown model {name!r}; registered: {sorted(self._models)}")
        return r

    # -- reads ------------------------------------------------------------------------------
    def acquire(self, name: str, version: int | None = None) -> tuple[int, dict[int, Any]]:
        """Lease `version` (default: current) of `name`; returns (version, node -> buffer)."""
        with self._lock:
            r = self._get(name)
            v = r.current if version is None else version
            rec = r.versions.get(v)
            if rec is None:
                live = sorted(r.versions)
                what = "has no version yet" if not live else f"has no live version {version}; live: {live}"
                raise UnknownVersionError(f"model {name!r} {what}")
            rec.readers += 1
            return v, dict(rec.buffers)

    def release(self, name: str, version: int) -> list[Any]:
        with self._lock:
            r = self._get(name)
            rec = r.versions[version]
            if rec.readers <= 0:
                raise RuntimeError(f"release of {name!r} v{version} without a lease")
            rec.readers -= 1
            return self._collect(r)

    def live_versions(self, name: str) -> list[int]:
        with self._lock:
            return sorted(self._get(name).versions)

    def current(self, name: str) -> int:
        with self._lock:
            return self._get(name).current

    def readers(self, name: str) -> dict[int, int]:
        with self._lock:
            return {v: rec.readers for v, rec in self._get(name).versions.items()}

    # -- writes -----------------------------------------------------------------------------
    def begin_write(self, name: str, initial: bool = False) -> int:
        """Reserve the next version number of `name` (invisible until `commit`)."""
        with self._lock:
            r = self._get(name)
            if r.frozen and not (initial and r.current < 0):
                raise FrozenModelError(f"model {name!r} is frozen (GenRM); writes are refused")
            if r.writing is not None:
                raise WriteConflictError(f"a write to {name!r} (v{r.writing}) is already in progress")
            r.writing = r.current + 1
            return r.writing

    def commit(self, name: str, version: int, buffers: dict[int, Any]) -> list[Any]:
        """Publish `version` as current in one step; returns buffers of versions now unreachable."""
        with self._lock:
            r = self._get(name)
            if r.writing != version:
                raise RuntimeError(f"commit of {name!r} v{version} without begin_write")
            r.versions[version] = VersionRecord(version, dict(buffers))
            r.current = version
            r.writing = None
            return self._collect(r)

    def abort(self, name: str, version: int) -> None:
        with self._lock:
            r = self._models.get(name)
            if r is not None and r.writing == version:
                r.writing = None

    def _collect(self, r: ModelRecord) -> list[Any]:
        dead = [v for v, rec in r.versions.items() if v != r.current and rec.readers == 0]
        out = []
        for v in dead:
            out += list(r.versions.pop(v).buffers.values())
        return out
