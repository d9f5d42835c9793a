"""Folders named after the process that made them, removed once that process is gone: what a killed
process leaves behind (a half-built bootstrap cache entry, a vLLM engine's socket folder).

Owns `remove_orphans(root, pattern, marker)`: a folder's owner is the pid right after `marker` in
its name, up to the next "-" (`.KEY.tmp-1234-x7`, `pivotrl-vllm-ipc-1234-x7`). One whose name
carries no pid there, or whose pid is alive (even if reused since), is left as it is.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def remove_orphans(root: Path, pattern: str, marker: str) -> list[Path]:
    """Delete the folders of `root` matching `pattern` whose owner (the pid after `marker` in the
    name) is gone; return them."""
    removed = []
    for d in Path(root).glob(pattern):
        try:
            os.kill(int(d.name.rsplit(marker, 1)[1].split("-", 1)[0]), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
        except (ValueError, IndexError, PermissionError):
            continue
    return removed
