"""`close_all`: the run's own error stays the one raised; teardown errors are logged after it."""
from __future__ import annotations

import logging

import pytest

from pivotrl.logging.teardown import close_all


def boom(msg):
    def f():
        raise OSError(msg)
    return f


def test_run_error_is_kept_and_teardown_errors_logged(caplog):
    ran = []
    err = RuntimeError("the real error")
    with caplog.at_level(logging.ERROR, logger="pivotrl.teardown"):
        close_all(err, [("tracker", boom("read-only folder")), ("lock", lambda: ran.append("lock"))])
    assert ran == ["lock"], "every step runs"
    assert err.__notes__ == ["teardown: tracker also failed: OSError: read-only folder"]
    assert "tracker failed after an earlier error (RuntimeError: the real error)" in caplog.text


def test_without_a_run_error_the_first_teardown_error_is_raised_after_all_steps(caplog):
    ran = []
    with pytest.raises(OSError, match="first") as ei:
        close_all(None, [("a", boom("first")), ("b", boom("second")), ("c", lambda: ran.append("c"))])
    assert ran == ["c"]
    assert ei.value.__notes__ == ["teardown: b also failed: OSError: second"]


def test_nothing_fails_nothing_raised():
    close_all(None, [("a", lambda: None)])
