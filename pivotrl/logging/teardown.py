"""Teardown that never hides the run's own error.

Owns `close_all(error, steps)`: run every teardown step in order, whatever happens. While the run's
own `error` is in flight, a step that fails is logged (with its traceback) and added to `error`'s
notes, so the first error stays the one raised and its traceback ends with what teardown also
hit. Without one, the first failing step's error is raised once every step has run; later
failures are logged and added to its notes. (A bare `try/finally` does the opposite: an error in
`finally` replaces the one that was propagating.)
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

log = logging.getLogger("pivotrl.teardown")

Step = tuple[str, Callable[[], Any]]


def close_all(error: BaseException | None, steps: Iterable[Step]) -> None:
    """Run `steps` ((what, fn), in order) after a run that raised `error` (None: it did not)."""
    first = error
    for what, fn in steps:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - teardown must reach every step
            if first is None:
                first = e
                continue
            log.error("teardown: %s failed after an earlier error (%s: %s), which is the one raised",
                      what, type(first).__name__, first, exc_info=e)
            first.add_note(f"teardown: {what} also failed: {type(e).__name__}: {e}")
    if first is not None and first is not error:
        raise first
