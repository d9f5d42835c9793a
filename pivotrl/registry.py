"""`Registry`: the one registry type of the project. The config string is the key.

Every name a config may choose (runtime, deploy mode and its schema, shift strategy, planner
evaluation, inference engine, GPS transport, advantage estimator, policy loss, GenRM score parser)
is looked up in a `Registry`, so an unknown name fails the same way everywhere: a `ConfigError`
naming the config path and the registered names. Entries may be objects or lazy
`"module:attribute"` strings (imported on first use; `module:Class.method` names a classmethod),
so the config layer can hold the registry of heavy engines without importing torch or vLLM, and a
registry of names creates no import edge between layers. Pure: standard library only.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Names -> entries for the config key `config_key` (e.g. `deploy.planner.strategy`)."""

    def __init__(self, config_key: str, entries: Mapping[str, T | str] | None = None,
                 aliases: tuple[str, ...] = ()) -> None:
        self.config_key = config_key
        self.aliases = tuple(aliases)  # names the config accepts that resolve elsewhere (`auto`)
        self._entries: dict[str, T | str] = dict(entries or {})

    def register(self, key: str, obj: T | None = None) -> Any:
        """`register(key, obj)`, or `@register(key)` as a decorator. Keys are unique."""
        def add(o: T) -> T:
            if key in self._entries or key in self.aliases:
                raise ValueError(f"{self.config_key}: {key!r} is registered twice")
            self._entries[key] = o
            return o

        return add(obj) if obj is not None else add

    def names(self) -> list[str]:
        """Every name the config accepts (registered keys and aliases), sorted."""
        return sorted({*self._entries, *self.aliases})

    def check(self, name: Any) -> None:
        """Raise `ConfigError` unless the config may name `name`."""
        if name not in self._entries and name not in self.aliases:
            # imported here: the config package's modules hold registries, so importing it at the
            # top would run `pivotrl.config`'s __init__ while this module is half-built
            from pivotrl.config.base import ConfigError

            path, _, field = self.config_key.rpartition(".")
            raise ConfigError(field, " | ".join(self.names()), name, path, absolute=True)

    def __getitem__(self, name: str) -> T:
        self.check(name)
        if name not in self._entries:
            raise KeyError(f"{self.config_key}: {name!r} is an alias; resolve it to a registered name first")
        entry = self._entries[name]
        if isinstance(entry, str) and ":" in entry:
            module, attr = entry.split(":", 1)
            entry = importlib.import_module(module)
            for part in attr.split("."):  # `module:Class.factory` names a classmethod
                entry = getattr(entry, part)
            self._entries[name] = entry
        return entry  # type: ignore[return-value]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def build(self, name: str, *args: Any, **kw: Any) -> Any:
        """`self[name](*args, **kw)`."""
        factory: Callable[..., Any] = self[name]  # type: ignore[assignment]
        return factory(*args, **kw)
