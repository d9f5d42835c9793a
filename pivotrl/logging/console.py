"""What a run prints: step lines, progress bars and the closing table; the rest only with
`logging.verbose=true`.

Owns `console_mode(verbose)`, the context `pivotrl.run` runs a job in, and `prepare_ray_init()`,
which `pivotrl/runtime/cluster.py` calls just before `ray.init` (importing Ray resets its logger,
so its level is set there) and whose options it passes to `ray.init`. Quiet (the default) means:
- Ray's worker output does not reach the console (`log_to_driver=False`: the device actors' log
  lines, and with them Ray's "[repeated Nx across cluster]" dedup summaries; they stay in Ray's
  session logs, and a worker's error still reaches the driver as the exception it raised), and
  Ray's own driver-side notices below ERROR (the token-auth notice at `ray.init`) are dropped;
- the project's INFO lines stay in the run folder's `train.log` but leave the console (console
  handlers go to WARNING: warnings about the run's data, such as GenRM parse failures, stay);
- transformers' logger is set to errors only (its deprecation notices).
Progress bars (tqdm) are not logging and are untouched. Outside `console_mode` (library use,
tests) nothing changes.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any, Iterator

_state: dict[str, Any] = {"verbose": True, "restore": []}


def prepare_ray_init() -> dict[str, Any]:
    """Quiet: Ray's driver logger to ERROR (restored when the run's `console_mode` ends). Returns
    the keyword arguments for `ray.init` under the current console mode."""
    if not _state["verbose"]:
        lg = logging.getLogger("ray")
        _state["restore"].append((lg, lg.level))
        lg.setLevel(logging.ERROR)
    return {"log_to_driver": bool(_state["verbose"])}


def _console_handlers() -> list[logging.Handler]:
    out = []
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) \
                and getattr(h, "stream", None) in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            out.append(h)
    return out


@contextlib.contextmanager
def console_mode(verbose: bool) -> Iterator[None]:
    """Quiet the console for the duration of one run unless `verbose` (module docstring); every
    level it changes is restored on exit."""
    saved_state = dict(_state)
    restore: list[tuple[Any, int]] = []
    try:
        _state["verbose"], _state["restore"] = bool(verbose), restore
        if not verbose:
            for h in _console_handlers():
                restore.append((h, h.level))
                h.setLevel(max(h.level, logging.WARNING))
            for name in ("ray", "transformers"):
                lg = logging.getLogger(name)
                restore.append((lg, lg.level))
                lg.setLevel(logging.ERROR)
        yield
    finally:
        for obj, level in reversed(restore):
            obj.setLevel(level)
        _state.update(saved_state)
