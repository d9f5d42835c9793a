"""`pivotrl.orphans.remove_orphans` through both of its callers: a folder named after a dead owner's
pid goes; one of a live owner, one whose name carries no pid, and other files stay. A bootstrap
cache entry's tmp folder (`models/sft.py` `remove_orphan_builds`) and a vLLM engine's socket folder
(`engines/vllm_client.py` `remove_orphan_ipc_dirs`; its real restart: tests/engines/test_vllm_engine.py)."""
from __future__ import annotations

import os
import subprocess

import pytest

from pivotrl.engines.vllm_client import IPC_PREFIX, remove_orphan_ipc_dirs
from pivotrl.models.sft import TMP_MARKER, remove_orphan_builds


@pytest.mark.parametrize("remove, name", [
    (remove_orphan_builds, ".k3y" + TMP_MARKER + "{}-ab12"),
    (remove_orphan_ipc_dirs, IPC_PREFIX + "{}-ab12"),
], ids=["bootstrap-tmp", "vllm-ipc"])
def test_only_the_folders_of_dead_owners_are_removed(tmp_path, remove, name):
    dead = subprocess.Popen(["true"])
    dead.wait()
    names = [name.format(dead.pid), name.format(os.getpid()), name.format("nopid").replace("-ab12", ""), "other-1-2"]
    for n in names:
        (tmp_path / n).mkdir()
        (tmp_path / n / "sock").write_text("")
    assert remove(tmp_path) == [tmp_path / names[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])
