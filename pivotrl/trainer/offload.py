"""The trainer's offload of device memory to host memory, and back.

Owns `StorageOffload` (copies the device storages of a rank's state into host buffers, frees them,
and on reload reallocates and copies them back bit for bit), `HostStash` (one host buffer per named device storage, pinned on CUDA, allocated on the first
offload and reused by every later one: a pinned allocation of 15 GB per rank for a 7B policy costs
seconds, and pinning it again each shift also fragments host memory) and
`release_cached_device_memory` (after the storages are freed, hand the caching allocator's
now-empty blocks back to the driver, so the vLLM engine shifting up onto this GPU sees them as free:
vLLM sizes its KV cache from the free memory it measures at wake/start).
"""
from __future__ import annotations

import time
from typing import Hashable, Iterable

import torch

__all__ = ["HostStash", "StorageOffload", "release_cached_device_memory"]


class HostStash:
    """Named host buffers, reused while the size matches. `allocations` counts real allocations."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._bufs: dict[Hashable, torch.Tensor] = {}
        self.allocations = 0

    def buffer(self, key: Hashable, nbytes: int) -> torch.Tensor:
        """A uint8 host tensor of `nbytes` for `key`: the one from the last offload if its size
        still matches (the usual case: shard sizes never change), else a new one."""
        buf = self._bufs.get(key)
        if buf is None or buf.numel() != nbytes:
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
            self._bufs[key] = buf
            self.allocations += 1
        return buf

    def nbytes(self) -> int:
        """Host bytes held by the stash now."""
        return sum(b.numel() for b in self._bufs.values())

    def clear(self) -> None:
        self._bufs.clear()


def release_cached_device_memory(device: torch.device) -> bool:
    """Return the CUDA caching allocator's free blocks to the driver (`torch.cuda.empty_cache`);
    True if it did (only on a CUDA device; CPU memory goes back when the storage is freed)."""
    if device.type != "cuda":
        return False
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return True


class StorageOffload:
    """The device storages of one rank's state while they sit in host memory (`active`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Host copies, allocated (pinned on CUDA) on the first offload and reused.
        self.stash = HostStash(pin=device.type == "cuda")
        self._saved: list[tuple[torch.UntypedStorage, torch.Tensor]] | None = None

    @property
    def active(self) -> bool:
        return self._saved is not None

    def offload(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """Copy the storage of every named tensor (views share their base's fate; the names key the
        reused host buffers) to host memory, free the device storages (resize to 0 bytes) and empty
        the CUDA allocator's cache. Metrics: bytes, seconds, host buffers newly allocated, cache
        emptied (0/1)."""
        t0 = time.perf_counter()
        pin = self.stash.pin
        allocs0 = self.stash.allocations
        saved: list[tuple[torch.UntypedStorage, torch.Tensor]] = []
        seen: set[int] = set()
        for key, t in tensors:
            s = t.untyped_storage()
            if s.nbytes() == 0 or s.data_ptr() in seen:
                continue
            seen.add(s.data_ptr())
            raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(s)  # the whole storage as bytes
            host = self.stash.buffer(key, s.nbytes())
            host.copy_(raw, non_blocking=pin)
            saved.append((s, host))
        if pin:
            torch.cuda.synchronize(self.device)
        for s, _ in saved:
            s.resize_(0)
        self._saved = saved
        emptied = release_cached_device_memory(self.device)
        return {"offloaded_bytes": float(sum(h.numel() for _, h in saved)), "offload_s": time.perf_counter() - t0,
                "host_allocations": float(self.stash.allocations - allocs0), "cache_emptied": float(emptied)}

    def reload(self) -> dict[str, float]:
        """Reallocate the freed device storages and copy the host copies back, bit for bit. The
        host buffers stay allocated for the next offload."""
        if self._saved is None:
            return {"reloaded_bytes": 0.0, "reload_s": 0.0}
        t0 = time.perf_counter()
        total = 0
        for s, host in self._saved:
            s.resize_(host.numel())
            raw = torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)
            raw.copy_(host, non_blocking=host.is_pinned())
            total += host.numel()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._saved = None
        return {"reloaded_bytes": float(total), "reload_s": time.perf_counter() - t0}
