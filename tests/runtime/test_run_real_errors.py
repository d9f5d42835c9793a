"""`run_real` keeps the run's first error when tearing the devices down fails too (issue 12)."""
from __future__ import annotations

import logging

import pytest

from tests.e2e.conftest import make_local_cfg


class FailingLaunch:
    closed = 0

    def __init__(self, *a, **k):
        pass

    def start(self):
        raise RuntimeError("device 2 (a training rank) died")

    def close(self):
        FailingLaunch.closed += 1
        raise PermissionError("cannot remove the run folder's .pg_init file")


def test_start_error_is_raised_and_the_teardown_error_logged(monkeypatch, tiny_assets, tmp_path, caplog):
    import pivotrl.runtime.launch as launch
    from pivotrl.runtime.real import run_real

    monkeypatch.setattr(launch, "Launch", FailingLaunch)
    cfg = make_local_cfg(tiny_assets, "pivot")
    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError, match="training rank") as ei:
        run_real(cfg, tmp_path, None)
    assert FailingLaunch.closed == 1
    assert ei.value.__notes__ == ["teardown: shutting down the devices and Ray also failed: PermissionError: "
                                  "cannot remove the run folder's .pg_init file"]
    assert "shutting down the devices and Ray failed after an earlier error" in caplog.text
