"""Shared output for benchmarks: a printed table and an optional JSON file with machine info."""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
from pathlib import Path
from typing import Any


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", type=Path, default=None, help="write results as JSON to this path")
    return p


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def print_table(rows: list[dict[str, Any]], title: str = "") -> None:
    if title:
        print(title)
    if not rows:
        print("(no rows)")
        return
    cols = list(rows[0].keys())
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    widths = {c: max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    print("  ".join("-" * widths[c] for c in cols))
    for r in rows:
        print("  ".join(fmt(r.get(c, "")).ljust(widths[c]) for c in cols))


def write_json(path: Path | None, name: str, rows: list[dict[str, Any]], **extra: Any) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), "rows": rows, **extra}, indent=2))
    print(f"wrote {path}")
