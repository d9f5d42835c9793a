"""`run_real` keeps the run's first error when tearing the devices down fails too (issue 12)."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

import pivotrl.runtime.local as local


class FailingSetup:
    closed = 0

    def __init__(self, *a, **k):
        pass

    def start(self):
        raise RuntimeError("device 2 (a training rank) died")

    def close(self):
        FailingSetup.closed += 1
        raise PermissionError("cannot remove the run folder's .pg_init file")


def test_start_error_is_raised_and_the_teardown_error_logged(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(local, "LocalSetup", FailingSetup)
    cfg = SimpleNamespace(cluster=SimpleNamespace(runtime=None))
    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError, match="training rank") as ei:
        local.run_real(cfg, tmp_path, None)
    assert FailingSetup.closed == 1
    assert ei.value.__notes__ == ["teardown: shutting down the devices and Ray also failed: PermissionError: "
                                  "cannot remove the run folder's .pg_init file"]
    assert "shutting down the devices and Ray failed after an earlier error" in caplog.text
