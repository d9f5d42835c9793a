"""Typed engine failures the runtime catches: a failed wake or weight load.

Owns `EngineFailedError` and its two kinds. An engine that raises one has already made itself
unusable (it serves nothing until rebuilt: no half-loaded weights ever answer a request), and
hands back the tokens of every sequence it was running (`aborted`, seq_id -> `TokensSoFar`, the
same as `abort()` returns) so the runtime can put them back in the queue, mark the device failed
and rebuild or retire it. Importing this module imports nothing heavy.
"""
from __future__ import annotations

from typing import Any

__all__ = ["EngineFailedError", "EngineWakeError", "EngineLoadError"]


class EngineFailedError(RuntimeError):
    """The engine can no longer serve (see the module docstring)."""

    def __init__(self, message: str, *, aborted: dict[int, Any] | None = None, phase: str = "") -> None:
        super().__init__(message)
        self.aborted: dict[int, Any] = dict(aborted or {})
        """seq_id -> tokens so far of the sequences that were live when it failed."""
        self.phase = phase
        """Where it failed: wake_weights, load_weights, wake_kv_cache, restart, load (serving)."""


class EngineWakeError(EngineFailedError):
    """`reacquire_memory` failed (waking the weights, loading them, or waking the KV cache)."""


class EngineLoadError(EngineFailedError):
    """`load_weights` failed on a serving engine; its live sequences were aborted first."""
