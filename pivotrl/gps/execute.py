"""Carrying out a GPS transfer plan over a transport, and checking what a caller hands in.

Owns: `execute_read` (one leased version's node buffers -> device tensors: straight copies into
given or fresh tensors, or views of node-local buffers where a device tensor is one whole slice
and `zero_copy` is asked), `execute_write` (device shards -> a fresh version's node buffers, local
copies and remote writes batched per holder), and the checks of state dicts, shards and `out`
tensors against the plan (names, shapes, dtypes), each raising `ShardMismatchError` naming the
tensor. Knows nothing about versions, leases or which plan to use: `store.py` decides; the plans
are `planner.py`'s, the bytes move through `transports.py`.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping

import torch

from pivotrl.gps.errors import ShardMismatchError
from pivotrl.gps.handles import ReadResult, StateDict
from pivotrl.gps.layout import ModelSpec
from pivotrl.gps.placement import ChunkLayout
from pivotrl.gps.planner import Device, Plan
from pivotrl.gps.transports import (BufferRef, SliceItem, Transport, box_slices, chunk_view, copy_into, dtype_name,
                                    torch_dtype)


def execute_read(transport: Transport, spec: ModelSpec, plan: Plan, bufs: dict[int, BufferRef],
                 chunks: list[ChunkLayout], v: int, zero_copy: bool,
                 out: Mapping[Device, StateDict] | None) -> ReadResult:
    """Fill the devices' tensors of version `v` (held in `bufs`, one per node) as `plan` says."""
    views = {h: transport.local_view(ref) for h, ref in bufs.items()}
    shards: dict[Device, StateDict] = {}
    single = defaultdict(int)  # (device, tensor) -> number of transfers
    if zero_copy:
        for t in plan.transfers:
            single[(t.device, t.dst)] += 1
    for di, dev in enumerate(plan.devices):
        given = out.get(dev, {}) if out is not None else {}
        sd: StateDict = {}
        for lt in plan.tensors[di]:
            if lt.name in given:
                sd[lt.name] = _check_out(given[lt.name], lt.name, lt.shape, lt.dtype)
            elif not (zero_copy and single[(di, lt.name)] == 1):
                sd[lt.name] = torch.empty(lt.shape, dtype=torch_dtype(lt.dtype))
        shards[dev] = sd
    res = ReadResult(v, shards)
    remote: dict[int, list] = defaultdict(list)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (source view, destination view)
    for t in plan.transfers:
        dev = plan.devices[t.device]
        e = chunks[t.chunk].entries[t.src]
        buf = views.get(t.holder)
        rel = ((t.src_box[0][0] - e.rows[0], t.src_box[0][1] - e.rows[0]),) + t.src_box[1:]
        if dev.node == t.holder:
            res.bytes_local += t.nbytes
        else:
            res.bytes_remote += t.nbytes
        if buf is None:
            remote[t.holder].append((t, (e.offset, e.shape, spec[t.src].dtype, rel)))
            continue
        src = chunk_view(buf, e.offset, e.shape, spec[t.src].dtype)[box_slices(rel)]
        sd = shards[dev]
        if t.dst not in sd:  # zero-copy: the device tensor is this one whole slice
            sd[t.dst] = src
        else:
            pairs.append((src, sd[t.dst][box_slices(t.dst_box)]))
    transport.copy_local(pairs)
    holders = list(remote)
    fetched = transport.read_remote_many([(bufs[h], [it for _, it in remote[h]]) for h in holders])
    for h, got in zip(holders, fetched):
        for (t, _), src in zip(remote[h], got):
            sd = shards[plan.devices[t.device]]
            if t.dst not in sd:  # zero-copy asked, but the bytes had to cross nodes
                sd[t.dst] = src
            else:
                copy_into(sd[t.dst][box_slices(t.dst_box)], src)
    return res


def execute_write(transport: Transport, spec: ModelSpec, plan: Plan, bufs: dict[int, BufferRef],
                  chunks: list[ChunkLayout], shards: Mapping[Device, Mapping[str, torch.Tensor]]) -> None:
    """Copy the devices' `shards` into a fresh version's node buffers `bufs` as `plan` says."""
    views = {n: transport.local_view(ref) for n, ref in bufs.items()}
    remote: dict[int, list] = defaultdict(list)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for t in plan.transfers:
        e = chunks[t.chunk].entries[t.src]
        rel = ((t.src_box[0][0] - e.rows[0], t.src_box[0][1] - e.rows[0]),) + t.src_box[1:]
        src = shards[plan.devices[t.device]][t.dst][box_slices(t.dst_box)]
        item: SliceItem = (e.offset, e.shape, spec[t.src].dtype, rel)
        if views[t.holder] is None:
            remote[t.holder].append((item, src))
        else:
            pairs.append((src, chunk_view(views[t.holder], e.offset, e.shape, item[2])[box_slices(rel)]))
    transport.copy_local(pairs)
    del pairs
    transport.write_remote_many([(bufs[h], [i for i, _ in ps], [s for _, s in ps]) for h, ps in remote.items()])


def check_state_dict(model: str, spec: ModelSpec, sd: Mapping[str, torch.Tensor]) -> None:
    """A whole state dict of `model` against its spec."""
    plan_tensors = [(t.name, t.shape, t.dtype) for t in spec.tensors]
    _match(f"{model} (device {Device(0, 0)})", plan_tensors, sd)


def check_shards(model: str, plan: Plan, shards: Mapping[Device, Mapping[str, torch.Tensor]]) -> None:
    """Every device of a write plan, and only those, with exactly its tensors."""
    want = set(plan.devices)
    if set(shards) != want:
        missing, extra = sorted(want - set(shards)), sorted(set(shards) - want)
        raise ShardMismatchError(f"write to {model!r}: devices missing {missing}, unexpected {extra}")
    for di, dev in enumerate(plan.devices):
        _match(f"{model} (device {dev})", [(lt.name, lt.shape, lt.dtype) for lt in plan.tensors[di]], shards[dev])


def _check_out(x: torch.Tensor, name: str, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    if tuple(x.shape) != shape or dtype_name(x.dtype) != dtype:
        raise ShardMismatchError(f"out tensor {name}: got {tuple(x.shape)} {dtype_name(x.dtype)}, want {shape} {dtype}")
    return x


def _match(where: str, expected: list[tuple[str, tuple[int, ...], str]], got: Mapping[str, torch.Tensor]) -> None:
    names = {n for n, _, _ in expected}
    if set(got) != names:
        missing, extra = sorted(names - set(got)), sorted(set(got) - names)
        raise ShardMismatchError(f"{where}: tensor names differ: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                                 f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}")
    for n, shape, dt in expected:
        x = got[n]
        if not isinstance(x, torch.Tensor):
            raise ShardMismatchError(f"{where}: {n} is a {type(x).__name__}, not a torch.Tensor")
        if tuple(x.shape) != shape:
            raise ShardMismatchError(f"{where}: {n} has shape {tuple(x.shape)}, expected {shape}")
        if dtype_name(x.dtype) != dt:
            raise ShardMismatchError(f"{where}: {n} has dtype {dtype_name(x.dtype)}, expected {dt}")
