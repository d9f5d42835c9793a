"""Shared parts of the benchmarks: a printed table, an optional JSON file with machine info, and
spawned rank processes that report through a JSON file."""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
from pathlib import Path
from typing import Any, Callable


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


def run_ranks(target: Callable[..., None], world: int, args: Callable[[int], tuple], out: Path, what: str,
              timeout_s: float = 1800.0) -> Any:
    """Run `target(*args(rank))` in `world` processes (one per rank, forked from the trainer's
    fork server: `pivotrl.trainer.dist.rank_process`) and return the JSON they leave in `out`; a
    RuntimeError naming `what` and the exit codes if any rank failed or `out` was not written."""
    from pivotrl.trainer.dist import rank_process

    out.unlink(missing_ok=True)
    procs = [rank_process(target, args(r)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout_s)
    if any(p.exitcode != 0 for p in procs) or not out.is_file():
        for p in procs:
            if p.is_alive():
                p.kill()
        raise RuntimeError(f"{what} failed (exit codes {[p.exitcode for p in procs]})")
    return json.loads(out.read_text())
