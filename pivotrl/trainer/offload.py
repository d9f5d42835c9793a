"""Host memory for the trainer's offload: buffers kept across offloads, and the allocator flush.

Owns `HostStash` (one host buffer per named device storage, pinned on CUDA, allocated on the first
offload and reused by every later one: a pinned allocation of 15 GB per rank for a 7B policy costs
seconds, and pinning it again each shift also fragments host memory) and
`release_cached_device_memory` (after the storages are freed, hand the caching allocator's
now-empty blocks back to the driver, so the vLLM engine shifting up onto this GPU sees them as free:
vLLM sizes its KV cache from the free memory it measures at wake/start).
"""
from __future__ import annotations

from typing import Hashable

import torch

__all__ = ["HostStash", "release_cached_device_memory"]


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
