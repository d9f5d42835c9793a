"""Where GPS keeps each model's bytes across nodes (pure: stdlib only; paper App. B.1).

Owns: `Placement` (replication groups of `k` nodes; within a group node `j` holds chunk `j`, the
`j`-th of `k` near-equal row ranges of every tensor), `choose_placement` (replicate first, else the
smallest `k` that fits the per-node budget) and `ChunkLayout` (the byte offset of each tensor chunk
inside a node's buffer). Knows nothing about devices, plans or how buffers are allocated.

Decision: `k` is the smallest divisor of the node count that fits, so every group is whole and
every chunk has exactly `num_nodes / k` replicas.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass

from pivotrl.gps.errors import BudgetError
from pivotrl.gps.layout import ModelSpec

if TYPE_CHECKING:
    from pivotrl.config.gps import GPSConfig


@dataclass(frozen=True)
class Placement:
    """`num_nodes / k` replication groups of `k` consecutive nodes; node `n` holds chunk `n % k`."""

    num_nodes: int
    k: int

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.k < 1 or self.num_nodes % self.k:
            raise ValueError(f"placement k={self.k} must divide num_nodes={self.num_nodes}")

    @property
    def num_groups(self) -> int:
        return self.num_nodes // self.k

    def holders(self, chunk: int) -> tuple[int, ...]:
        """Nodes holding `chunk`: member `chunk` of every group."""
        return tuple(g * self.k + chunk for g in range(self.num_groups))

    def chunk_of(self, node: int) -> int:
        return node % self.k

    def row_range(self, rows: int, chunk: int) -> tuple[int, int]:
        """Rows of a tensor with `rows` rows (dim 0) kept in `chunk`; small tensors may have empty
        chunks."""
        return chunk * rows // self.k, (chunk + 1) * rows // self.k


@dataclass(frozen=True)
class ChunkEntry:
    offset: int  # bytes from the buffer start
    rows: tuple[int, int]  # dim-0 range of the stored tensor
    shape: tuple[int, ...]  # shape of the chunk


class ChunkLayout:
    """Byte layout of one node buffer: every tensor's chunk `chunk`, each aligned."""

    def __init__(self, spec: ModelSpec, placement: Placement, chunk: int, alignment: int) -> None:
        self.entries: dict[str, ChunkEntry] = {}
        off = 0
        for t in spec.tensors:
            r0, r1 = placement.row_range(t.shape[0], chunk)
            shape = (r1 - r0, *t.shape[1:])
            self.entries[t.name] = ChunkEntry(off, (r0, r1), shape)
            n = (r1 - r0) * (t.nbytes // t.shape[0])
            off += -(-n // alignment) * alignment if n else 0
        self.nbytes = max(off, alignment)


def node_bytes(spec: ModelSpec, k: int, alignment: int) -> int:
    """Largest per-node buffer of `spec` sharded `k` ways (chunk 0 is never smaller than others
    by more than one row per tensor, so take the max over chunks)."""
    p = Placement(k, k)
    return max(ChunkLayout(spec, p, j, alignment).nbytes for j in range(k))


def choose_placement(spec: ModelSpec, num_nodes: int, free_bytes_per_node: int, copies: int,
                     alignment: int) -> Placement:
    """Replicate first: the smallest divisor `k` of `num_nodes` whose per-node footprint
    (`copies` versions of a `1/k` shard) fits `free_bytes_per_node`. Raises BudgetError (a ValueError) when not
    even `k = num_nodes` fits."""
    need_full = spec.nbytes * copies
    for k in range(1, num_nodes + 1):
        if num_nodes % k:
            continue
        if need_full / k > free_bytes_per_node:  # cheap reject before the exact layout
            continue
        if node_bytes(spec, k, alignment) * copies <= free_bytes_per_node:
            return Placement(num_nodes, k)
    need = node_bytes(spec, num_nodes, alignment) * copies
    raise BudgetError(
        f"gps.node_memory_budget_bytes too small: the model needs {need} bytes per node even fully "
        f"sharded over {num_nodes} nodes ({copies} version(s)), but only {free_bytes_per_node} are free")


def node_memory_bytes(shm_dir: str | None = None) -> tuple[int, str]:
    """(bytes, how it was found) of memory one GPS node can hold: the smallest of the machine's
    `MemTotal`, its cgroup memory limit, and the size of `shm_dir` (GPS buffers are files there,
    and a container's `/dev/shm` is often far smaller than its RAM)."""
    import os

    found: list[tuple[int, str]] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    found.append((int(line.split()[1]) * 1024, "MemTotal in /proc/meminfo"))
    except OSError:
        pass
    for cg in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = open(cg).read().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 1 << 60:
            found.append((int(raw), f"cgroup limit {cg}"))
    if shm_dir:
        try:
            st = os.statvfs(shm_dir)
            found.append((st.f_blocks * st.f_frsize, f"size of {shm_dir}"))
        except OSError:
            pass
    if not found:
        raise BudgetError("cannot tell this node's memory (no /proc/meminfo): set gps.node_memory_budget_bytes")
    return min(found)


def budget_bytes(config: GPSConfig) -> int:
    """The per-node GPS budget of a `GPSConfig`: `node_memory_budget_bytes`, or when 0 its
    `node_memory_fraction` of this node's memory (`node_memory_bytes`)."""
    if config.node_memory_budget_bytes:
        return int(config.node_memory_budget_bytes)
    total, _ = node_memory_bytes(config.shm_dir if config.transport in ("shm", "ray") else None)
    return int(total * config.node_memory_fraction)


def models_need_bytes(models: list[tuple[str, ModelSpec, bool]], num_nodes: int, headroom_versions: int,
                      alignment: int) -> tuple[int, int]:
    """(bytes per node fully replicated, bytes per node fully sharded over `num_nodes`) that GPS
    needs for `models` = [(name, spec, frozen)]: frozen models one version, writable ones
    `1 + headroom_versions` (the version being written while readers hold the old one)."""
    full = sharded = 0
    for _, spec, frozen in models:
        copies = 1 if frozen else 1 + headroom_versions
        full += node_bytes(spec, 1, alignment) * copies
        sharded += node_bytes(spec, num_nodes, alignment) * copies
    return full, sharded


def check_budget(budget_per_node: int, models: list[tuple[str, ModelSpec, bool]], num_nodes: int,
                 headroom_versions: int, alignment: int, where: str = "gps.node_memory_budget_bytes") -> int:
    """Raise BudgetError naming both numbers when `models` cannot fit `budget_per_node` even fully
    sharded; return the per-node bytes they will take (replicated where the budget allows)."""
    full, sharded = models_need_bytes(models, num_nodes, headroom_versions, alignment)
    if sharded > budget_per_node:
        what = ", ".join(f"{n} {s.nbytes / 2**30:.2f} GiB ({'frozen' if f else f'{1 + headroom_versions} versions'})"
                         for n, s, f in models)
        raise BudgetError(
            f"{where}: GPS needs {sharded} bytes ({sharded / 2**30:.2f} GiB) per node for {what} even sharded "
            f"over {num_nodes} node(s), but the budget is {budget_per_node} bytes ({budget_per_node / 2**30:.2f} GiB); "
            f"add nodes or memory, or lower gps.write_headroom_versions")
    return full if full <= budget_per_node else sharded
