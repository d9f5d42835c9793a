"""`pivotrl.trainer.dist.rank_process`: ranks forked from the fork server run in the caller's
environment as it is when each starts (not the server's, which dates from its own start), with
the server's preloaded modules already imported."""
from __future__ import annotations

import json
import os
import sys

from pivotrl.trainer.dist import RANK_MODULES, rank_process


def _report(path: str) -> None:
    with open(path, "w") as f:
        json.dump({"var": os.environ.get("PIVOTRL_RANK_PROCESS_TEST"),
                   "preloaded": [m for m in RANK_MODULES if m in sys.modules], "pid": os.getpid()}, f)


def _run(path) -> dict:
    p = rank_process(_report, (str(path),))
    p.start()
    p.join(timeout=120)
    assert p.exitcode == 0
    return json.loads(path.read_text())


def test_a_rank_takes_the_callers_environment_of_its_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PIVOTRL_RANK_PROCESS_TEST", "first")
    first = _run(tmp_path / "first.json")  # starts the fork server (if no test did) with "first"
    monkeypatch.setenv("PIVOTRL_RANK_PROCESS_TEST", "second")
    second = _run(tmp_path / "second.json")
    monkeypatch.delenv("PIVOTRL_RANK_PROCESS_TEST")
    third = _run(tmp_path / "third.json")
    assert (first["var"], second["var"], third["var"]) == ("first", "second", None)
    assert first["preloaded"] == second["preloaded"] == list(RANK_MODULES)
    assert len({first["pid"], second["pid"], third["pid"], os.getpid()}) == 4
