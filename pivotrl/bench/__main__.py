"""`python -m pivotrl.bench NAME [--json PATH] [...]`: run one benchmark by name.

Each benchmark is a module `pivotrl.bench.NAME` with `main(argv: list[str]) -> int`. It prints a
table and, with `--json PATH`, writes its figures as JSON. Figures go into BENCHMARKS.md.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys

import pivotrl.bench as _pkg


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(_pkg.__path__) if not m.name.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m pivotrl.bench {{{'|'.join(names)}}} [--json PATH] [options]")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"unknown benchmark {name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    return int(importlib.import_module(f"pivotrl.bench.{name}").main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
