"""`console_mode`: quiet keeps INFO lines and Ray's worker output off the console; verbose and
leaving the mode restore everything."""
from __future__ import annotations

import logging
import sys

from pivotrl.logging.console import console_mode, prepare_ray_init


def test_quiet_then_restored():
    h = logging.StreamHandler(sys.stderr)
    f = logging.FileHandler("/dev/null")
    root = logging.getLogger()
    root.addHandler(h)
    root.addHandler(f)
    ray_level = logging.getLogger("ray").level
    try:
        assert prepare_ray_init() == {"log_to_driver": True}  # library use: unchanged
        with console_mode(verbose=False):
            assert h.level == logging.WARNING and f.level == logging.NOTSET  # train.log keeps INFO
            assert logging.getLogger("transformers").level == logging.ERROR
            assert prepare_ray_init() == {"log_to_driver": False}
            assert logging.getLogger("ray").level == logging.ERROR
        assert h.level == logging.NOTSET and logging.getLogger("ray").level == ray_level
        assert prepare_ray_init() == {"log_to_driver": True}
        with console_mode(verbose=True):
            assert h.level == logging.NOTSET and prepare_ray_init() == {"log_to_driver": True}
    finally:
        root.removeHandler(h)
        root.removeHandler(f)
        f.close()
