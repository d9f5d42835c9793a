"""GPS error types: each names the model, version, tensor or field at fault.

They subclass the built-in error a caller would expect (KeyError for unknown names, ValueError
for bad shapes or budgets, PermissionError for a write to a frozen model), so plain `except
ValueError` keeps working. Every GPS operation validates before it mutates, so after any of these
the store is unchanged.
"""
from __future__ import annotations


class GPSError(Exception):
    """Base of all GPS errors."""

    def __str__(self) -> str:  # KeyError would otherwise print the message in quotes
        return str(self.args[0]) if self.args else ""


class UnknownModelError(GPSError, KeyError):
    """No model of that name is registered."""


class UnknownVersionError(GPSError, KeyError):
    """The model has no live version of that number (or no version at all yet)."""


class FrozenModelError(GPSError, PermissionError):
    """A write to a frozen model (the GenRM)."""


class ShardMismatchError(GPSError, ValueError):
    """Written tensors do not match the layout: missing/extra names or devices, wrong shape or dtype."""


class BudgetError(GPSError, ValueError):
    """The per-node memory budget cannot hold the model even fully sharded."""


class WriteConflictError(GPSError, RuntimeError):
    """A second write to the same model started while one was in flight."""
