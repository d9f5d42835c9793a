"""NIXL transport (paper App. B.2 runs the GPS all-to-all over NIXL); usable only where `nixl` imports.

Owns `NixlTransport`: node buffers are the `shm` transport's `/dev/shm` mappings, registered with
a GPS-side NIXL agent as DRAM. A device-side agent registers the device tensors (DRAM or VRAM by
their device) for the duration of a copy and issues one NIXL READ (read) or WRITE (write) per
batch of contiguous pairs against the GPS agent. Non-contiguous pairs (row-parallel TP slices) are
copied by torch, since a NIXL descriptor is one contiguous byte range.
Not done here: NIXL between nodes (one agent per node plus metadata exchange); nodes other than
this process's are not reachable with this transport, use `ray` for them.
Tested on CPU (UCX, DRAM to DRAM) with the `nixl` 1.5.1 wheel; its tests skip without nixl.
"""
from __future__ import annotations

import os
import uuid

import torch

from pivotrl.config.gps import GPSConfig
from pivotrl.gps.transports import BufferRef, ShmTransport, copy_into


def nixl_available() -> bool:
    try:
        import nixl._api  # noqa: F401
    except ImportError:
        return False
    return True


class NixlTransport(ShmTransport):
    """`shm` buffers, copies issued through a NIXL agent."""

    name = "nixl"

    def __init__(self, config: GPSConfig, num_nodes: int, backends: tuple[str, ...] = ("UCX",)) -> None:
        try:
            from nixl._api import nixl_agent, nixl_agent_config
        except ImportError as e:
            raise ImportError("gps.transport='nixl' needs the `nixl` package (pip install nixl); "
                              "use 'shm' or 'ray' without it") from e
        super().__init__(config, num_nodes)
        tag = f"pivotrl-gps-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.agent_name = tag + "-host"
        self.agent = nixl_agent(self.agent_name, nixl_agent_config(backends=list(backends)))
        self.device_agent = nixl_agent(tag + "-dev", nixl_agent_config(backends=list(backends)))
        self._reg: dict[str, object] = {}

    def allocate(self, node: int, key: str, nbytes: int) -> BufferRef:
        ref = super().allocate(node, key, nbytes)
        descs = self.agent.register_memory(self._bufs[ref.path])
        if descs is None:
            super().free(ref)
            raise RuntimeError(f"NIXL could not register GPS buffer {key} ({nbytes} bytes)")
        self._reg[ref.path] = descs
        # the device side must see every registration of the host side
        self.device_agent.add_remote_agent(self.agent.get_agent_metadata())
        return ref

    def free(self, ref: BufferRef) -> None:
        descs = self._reg.pop(ref.path, None)
        if descs is not None:
            self.agent.deregister_memory(descs)
        super().free(ref)

    def _in_gps(self, t: torch.Tensor) -> bool:
        p = t.data_ptr()
        return any(b.data_ptr() <= p < b.data_ptr() + b.numel() for b in self._bufs.values())

    def copy_local(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        batches: dict[str, tuple[list, list]] = {"READ": ([], []), "WRITE": ([], [])}
        for s, d in pairs:
            if not (s.is_contiguous() and d.is_contiguous() and s.numel()):
                copy_into(d, s)
            elif self._in_gps(s):  # read: device tensor d pulls from GPS memory s
                batches["READ"][0].append(d)
                batches["READ"][1].append(s)
            else:  # write: device tensor s pushes into GPS memory d
                batches["WRITE"][0].append(s)
                batches["WRITE"][1].append(d)
        for op, (local, remote) in batches.items():
            if local:
                self._transfer(op, local, remote)

    def _transfer(self, op: str, local: list[torch.Tensor], remote: list[torch.Tensor]) -> None:
        # NIXL registrations must not overlap (registering one region twice crashes deregistration):
        # register each distinct device region once; a region overlapping another is copied by torch
        regions: dict[tuple[int, int], torch.Tensor] = {}
        for t in local:
            regions.setdefault((t.data_ptr(), t.numel() * t.element_size()), t)
        keep, end = set(), -1
        for ptr, n in sorted(regions):
            if ptr >= end:
                keep.add((ptr, n))
                end = ptr + n
        idx = [i for i, t in enumerate(local) if (t.data_ptr(), t.numel() * t.element_size()) in keep]
        for i in set(range(len(local))) - set(idx):
            copy_into(remote[i], local[i]) if op == "WRITE" else copy_into(local[i], remote[i])
        if not idx:
            return
        dev = self.device_agent
        reg = dev.register_memory([regions[k] for k in sorted(keep)])
        if reg is None:
            raise RuntimeError("NIXL could not register the device tensors")
        try:
            handle = dev.initialize_xfer(op, dev.get_xfer_descs([local[i] for i in idx]),
                                         self.agent.get_xfer_descs([remote[i] for i in idx]), self.agent_name, b"gps")
            state = dev.transfer(handle)
            while state not in ("DONE", "ERR"):
                state = dev.check_xfer_state(handle)
            dev.release_xfer_handle(handle)
            if state == "ERR":
                raise RuntimeError(f"NIXL {op} of {len(idx)} regions failed")
        finally:
            dev.deregister_memory(reg)

    def close(self) -> None:
        for path in list(self._reg):
            self.agent.deregister_memory(self._reg.pop(path))
        super().close()
