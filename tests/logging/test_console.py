"""`console_mode`: quiet keeps INFO lines and Ray's worker output off the console; verbose and
leaving the mode restore everything."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from pivotrl.logging.console import console_mode, prepare_ray_init

ROOT = str(Path(__file__).resolve().parents[2])  # the repository, for subprocesses


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


RAY_NOISE = """
import sys, time, warnings
import ray
from pivotrl.logging.console import console_mode, prepare_ray_init


with console_mode(bool(int(sys.argv[1]))):
    ray.init(address="local", num_cpus=1, include_dashboard=False, configure_logging=False, **prepare_ray_init())

    @ray.remote(num_cpus=0)
    class Noisy:
        def act(self):
            warnings.warn("a stand-in third-party FutureWarning", FutureWarning)
            print("the same worker line", flush=True)
            return 1

    actors = [Noisy.remote() for _ in range(3)]
    for _ in range(3):
        ray.get([a.act.remote() for a in actors])
    time.sleep(6)  # the driver's log monitor prints dedup summaries within its 5 s window
    ray.shutdown()
print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [True, False])
def test_ray_worker_noise_reaches_the_console_only_when_verbose(verbose):
    """Real Ray (a private `address="local"` instance): actors repeat a warning and a print.
    Verbose: both reach the driver's console, with Ray's "[repeated Nx across cluster]" lines and
    its token-auth notice. Quiet: none of them (the run's own output is unaffected)."""
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", RAY_NOISE, str(int(verbose))], capture_output=True, text=True,
                       timeout=240, env={**os.environ, "PYTHONPATH": ROOT, "RAY_DEDUP_LOGS": "1"})
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "done" in out, out[-2000:]
    noise = ["the same worker line", "stand-in third-party FutureWarning", "across cluster"]
    if verbose:
        assert all(n in out for n in noise), out[-2000:]
    else:
        assert not any(n in out for n in noise), out[-2000:]
        assert "Token authentication is enabled" not in out
