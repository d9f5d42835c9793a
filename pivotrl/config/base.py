"""What every config dataclass shares: `MISSING` and `ConfigError`.

Owns no setting. Imports nothing but the standard library, so the pure control plane can import
the config dataclasses without pulling in omegaconf or Hydra (the entry, `pivotrl.config.load`,
is the only place that touches them).

A dataclass knows its own field names, not where it sits in the tree: it raises
`ConfigError(field, allowed, value)`, and the loader that converts the composed tree prefixes the
node's path, so the user reads `algo.lr=-1.0 is invalid; allowed: > 0`.
"""
from __future__ import annotations

from typing import Any

#: Omegaconf's marker of a required value (the same string, without importing omegaconf).
MISSING: Any = "???"


class ConfigError(ValueError):
    """A bad config value. `field` is relative to the dataclass that raised it; `path` is filled in
    by the loader (`pivotrl.config.load`) with the node's place in the tree."""

    def __init__(self, field: str, allowed: str, value: Any = None, path: str = "", absolute: bool = False) -> None:
        self.field, self.allowed, self.value, self.path = field, allowed, value, path
        self.absolute = absolute
        """`path` is already the full path (a `Registry` knows its config key): `at` keeps it."""
        super().__init__(self._text())

    def _text(self) -> str:
        key = f"{self.path}.{self.field}" if self.path else self.field
        return f"{key}={self.value!r} is invalid; allowed: {self.allowed}"

    def at(self, path: str) -> "ConfigError":
        """The same error, placed under `path` (outermost prefix last); an absolute one stays."""
        if self.absolute:
            return self
        full = f"{path}.{self.path}" if self.path else path
        return ConfigError(self.field, self.allowed, self.value, full)


def check(ok: bool, field: str, allowed: str, value: Any) -> None:
    """Raise `ConfigError(field, allowed, value)` unless `ok`."""
    if not ok:
        raise ConfigError(field, allowed, value)


def finite(x: Any) -> bool:
    """A real number that is neither NaN nor infinite (bools are not numbers here)."""
    import math

    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
