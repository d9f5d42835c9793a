"""Read and write plans: the all-to-all between GPS node buffers and a device group (pure; App. B.2).

Owns: `Device`, `LinkProfile`, `Transfer`, `Plan`, `plan_read`, `plan_write`. A plan refines the
device layout (layout.py) and the store placement (placement.py) into atomic slices (the
intersection of one device piece with one stored chunk), then assigns each (slice, receiver)
demand to a sender greedily: the candidate whose accumulated estimated latency *after* taking the
transfer is least (`bytes / link bandwidth + overhead`; with equal links this is exactly "least
accumulated latency"). With `prefer_local`, node-local candidates are used whenever one exists.
Write is symmetric: demands are (slice, holder node), senders are the devices holding the slice.

Invariants the tests assert: a read plan covers every element of every device tensor exactly
once; a write plan delivers every element of every stored chunk to every holder exactly once; with
equal links no sender's load exceeds the fair share plus one transfer.
Knows nothing about torch, Ray or bytes.
"""
from __future__ import annotations

import functools
import gc
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from pivotrl.gps.layout import Box, Layout, LocalTensor, ModelSpec, device_shards
from pivotrl.gps.placement import Placement


@dataclass(frozen=True, order=True)
class Device:
    """A device (GPU or virtual device) by node index and index within the node."""

    node: int
    index: int = 0

    @classmethod
    def from_global(cls, device_id: int, devices_per_node: int) -> "Device":
        """Device `device_id` of a cluster numbered node by node (`devices_per_node` per node)."""
        return cls(device_id // devices_per_node, device_id % devices_per_node)


@dataclass(frozen=True)
class LinkProfile:
    """Estimated link costs: node-local and remote bandwidth (bytes/s) and per-transfer overhead (s)."""

    local_bw: float
    remote_bw: float
    overhead: float

    def cost(self, nbytes: int, local: bool) -> float:
        return nbytes / (self.local_bw if local else self.remote_bw) + self.overhead


class Transfer(NamedTuple):
    """Move `src_box` of stored tensor `src` (its `chunk`, on node `holder`) to/from `dst_box` of
    tensor `dst` on device number `device` (position in the plan's device list)."""

    device: int
    dst: str
    dst_box: Box
    src: str
    chunk: int
    src_box: Box
    holder: int
    nbytes: int


@dataclass
class Plan:
    """A cached read or write plan. `load` is the accumulated estimated latency per sender (holder
    node for reads, device number for writes); `est_time` the slowest sender's."""

    kind: str
    devices: tuple[Device, ...]
    layout: Layout
    tensors: list[tuple[LocalTensor, ...]]
    transfers: list[Transfer]
    load: dict[int, float]

    @property
    def est_time(self) -> float:
        return max(self.load.values(), default=0.0)

    def bytes_by_route(self) -> dict[str, int]:
        """Bytes moved over node-local vs remote links."""
        out = {"local": 0, "remote": 0}
        for t in self.transfers:
            out["local" if self.devices[t.device].node == t.holder else "remote"] += t.nbytes
        return out


def _check(spec: ModelSpec, devices: Sequence[Device], layout: Layout, placement: Placement) -> None:
    if len(devices) != layout.world_size:
        raise ValueError(f"got {len(devices)} devices for a layout of world size {layout.world_size} "
                         f"(dp={layout.dp} x tp={layout.tp} x pp={layout.pp})")
    if len(set(devices)) != len(devices):
        raise ValueError("devices must be distinct")
    for d in devices:
        if not 0 <= d.node < placement.num_nodes:
            raise ValueError(f"device {d} on node {d.node}; nodes are 0..{placement.num_nodes - 1}")


def _atoms(spec: ModelSpec, placement: Placement, lt: LocalTensor):
    """Atomic slices of one device tensor: (chunk, src name, src box, dst box, nbytes)."""
    k = placement.k
    for piece in lt.pieces:
        t = spec[piece.src]
        (r0, r1), rest = piece.src_box[0], piece.src_box[1:]
        per_row = t.itemsize  # bytes of one dim-0 row of this box
        for a, b in rest:
            per_row *= b - a
        if k == 1:
            yield 0, piece.src, piece.src_box, piece.dst_box, (r1 - r0) * per_row
            continue
        d0 = piece.dst_box[0][0]
        rows = t.shape[0]
        for j in range(k):
            c0, c1 = j * rows // k, (j + 1) * rows // k
            lo, hi = max(r0, c0), min(r1, c1)
            if lo >= hi:
                continue
            yield (j, piece.src, ((lo, hi),) + rest,
                   ((d0 + lo - r0, d0 + hi - r0),) + piece.dst_box[1:], (hi - lo) * per_row)


def _no_gc(fn):
    """Planning allocates ~10^5 small tuples for a 72B model; cyclic GC passes over them would cost
    more than the planning itself, and plans contain no reference cycles."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*a, **kw)
        finally:
            if was:
                gc.enable()

    return wrapper


@_no_gc
def plan_read(spec: ModelSpec, devices: Sequence[Device], layout: Layout, placement: Placement,
              links: LinkProfile, prefer_local: bool = True) -> Plan:
    """Plan moving each device's tensors from GPS holders to the devices."""
    devices = tuple(devices)
    _check(spec, devices, layout, placement)
    shards = device_shards(spec, layout)
    load: dict[int, float] = {n: 0.0 for n in range(placement.num_nodes)}
    transfers: list[Transfer] = []
    holders = [placement.holders(j) for j in range(placement.k)]
    lbw, rbw, ov = links.local_bw, links.remote_bw, links.overhead
    new = tuple.__new__  # skips NamedTuple's Python-level __new__: a third of a 72B plan's time
    # atoms depend only on the rank's tensors, shared by DP replicas: compute once per tuple
    atom_cache: dict[int, list] = {}
    k = placement.k
    split_cache: dict[tuple[int, int], tuple[list, list]] = {}
    for di, dev in enumerate(devices):
        tensors = shards[di]
        node = dev.node
        mine = node % k if prefer_local else -1
        split = split_cache.get((id(tensors), mine))
        if split is None:
            atoms = atom_cache.get(id(tensors))
            if atoms is None:
                atoms = [(lt.name, a) for lt in tensors for a in _atoms(spec, placement, lt)]
                atom_cache[id(tensors)] = atoms
            # forced: the chunk has one holder, or a node-local one is preferred; no choice to make
            forced = [(n, a) for n, a in atoms if a[0] == mine or len(holders[a[0]]) == 1]
            choice = [(n, a) for n, a in atoms if not (a[0] == mine or len(holders[a[0]]) == 1)]
            split = split_cache[(id(tensors), mine)] = (forced, choice)
        forced, choice = split
        if forced:
            hs = [node if a[0] == mine else holders[a[0]][0] for _, a in forced]
            for h, (_, a) in zip(hs, forced):
                load[h] += a[4] / (lbw if h == node else rbw) + ov
            transfers.extend([new(Transfer, (di, n, a[3], a[1], a[0], a[2], h, a[4]))
                              for h, (n, a) in zip(hs, forced)])
        for name, (j, src, sbox, dbox, nb) in choice:
            h, best = -1, float("inf")
            for c in holders[j]:
                f = load[c] + nb / (lbw if c == node else rbw) + ov
                if f < best:
                    h, best = c, f
            load[h] += nb / (lbw if h == node else rbw) + ov
            transfers.append(new(Transfer, (di, name, dbox, src, j, sbox, h, nb)))
    return Plan("read", devices, layout, shards, transfers, load)


@_no_gc
def plan_write(spec: ModelSpec, devices: Sequence[Device], layout: Layout, placement: Placement,
               links: LinkProfile, prefer_local: bool = True) -> Plan:
    """Plan moving the writing devices' tensors into every holder of every stored chunk. Each
    distinct atomic slice (DP replicas hold identical ones) goes to each of its chunk's holders
    from one sender device, chosen greedily by accumulated latency."""
    devices = tuple(devices)
    _check(spec, devices, layout, placement)
    shards = device_shards(spec, layout)
    # distinct atomic slice -> senders that hold it
    senders: dict[tuple, list[tuple[int, str, Box]]] = {}
    for di in range(len(devices)):
        for lt in shards[di]:
            for j, src, sbox, dbox, nb in _atoms(spec, placement, lt):
                senders.setdefault((j, src, sbox, nb), []).append((di, lt.name, dbox))
    load: dict[int, float] = {di: 0.0 for di in range(len(devices))}
    transfers: list[Transfer] = []
    for (j, src, sbox, nb), opts in senders.items():
        for h in placement.holders(j):
            cands = opts
            if prefer_local:
                near = [o for o in opts if devices[o[0]].node == h]
                cands = near or opts
            best, pick = float("inf"), cands[0]
            for o in cands:
                f = load[o[0]] + links.cost(nb, devices[o[0]].node == h)
                if f < best:
                    best, pick = f, o
            load[pick[0]] += links.cost(nb, devices[pick[0]].node == h)
            transfers.append(tuple.__new__(Transfer, (pick[0], pick[1], pick[2], src, j, sbox, h, nb)))
    return Plan("write", devices, layout, shards, transfers, load)
