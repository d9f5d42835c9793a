"""The reaper of a private Ray head (`runtime/reaper.py`): after its driver is SIGKILLed, the
processes the head started, the ones no longer anyone's children included, end by their recorded
pids; a pid reused since is never touched; a normal close ends what is left.

The first tests stand a small process tree in for the head (a root that starts a grandchild and
dies with the driver, as Ray's raylet and its agents do); the last starts a real private head
(`cluster=local`) and kills its driver (slow: a Ray start)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pivotrl.runtime.reaper import _stat, children, reap

ROOT = str(Path(__file__).resolve().parents[2])

# A driver that starts a "head": a root process whose child (the "agent") sleeps on after the
# root is gone, then a Reaper for it; it prints the agent's pid and waits to be killed.
DRIVER = r'''
import os, subprocess, sys, time
from pathlib import Path
from pivotrl.runtime.reaper import Reaper, children
before = children(os.getpid())
root = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; a = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
    "print(a.pid, flush=True); time.sleep(300)"], stdout=subprocess.PIPE, text=True)
agent = int(root.stdout.readline())
r = Reaper.start(before, record=Path(sys.argv[1]))
while not Path(sys.argv[1]).exists() or str(agent) not in Path(sys.argv[1]).read_text():
    time.sleep(0.1)
print(root.pid, agent, flush=True)
if sys.argv[2] == "close":
    root.kill(); root.wait()
    r.close()
    print("closed", flush=True)
time.sleep(300)
'''


def _alive(pid: int) -> bool:
    return _stat(pid) is not None


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def _start_driver(tmp_path, mode: str) -> tuple[subprocess.Popen, int, int]:
    d = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "pids"), mode], stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": ROOT})
    root, agent = (int(x) for x in d.stdout.readline().split())
    return d, root, agent


def test_a_killed_drivers_orphans_are_ended_by_pid(tmp_path):
    d, root, agent = _start_driver(tmp_path, "kill")
    try:
        os.kill(d.pid, signal.SIGKILL)
        d.wait()
        os.kill(root, signal.SIGKILL)  # Ray's own fate sharing ends the raylet with its driver
        assert not _wait_gone([agent], 30), "the orphaned grandchild outlived the driver"
    finally:
        for p in (root, agent):
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_close_ends_what_is_left_after_a_normal_shutdown(tmp_path):
    d, root, agent = _start_driver(tmp_path, "close")
    try:
        assert d.stdout.readline().strip() == "closed"
        assert not _alive(agent)
        assert _alive(d.pid), "the driver itself is never the reaper's"
    finally:
        d.kill()
        d.wait()
        if _alive(agent):
            os.kill(agent, signal.SIGKILL)


def test_a_reused_pid_is_never_signalled():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = _stat(p.pid)[1]
        assert reap({(p.pid, start + 1)}, grace_s=0.1) == [] and p.poll() is None
        assert (p.pid, start) in children(os.getpid())
        assert reap({(p.pid, start)}, grace_s=5) == [p.pid]
        assert p.wait(timeout=10) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()


RAY_DRIVER = r'''
from pivotrl.runtime.cluster import ClusterSpec, start_cluster
import time
cl = start_cluster(ClusterSpec(kind="local", num_devices=2, node_size=2))
print(cl.temp_dir, flush=True)
time.sleep(600)
'''


@pytest.mark.slow
def test_ray_agents_end_with_a_sigkilled_driver(tmp_path):
    """Issue 22: `DashboardAgent` and `RuntimeEnvAgent` outlived a SIGKILLed driver by 60-120 s
    (about 210 MB; docs/benchmarks-history.md, issue 22); with the reaper every process of the private head ends,
    and its temp dir (Ray's session files) goes with them."""
    from pivotrl.runtime.cluster import REAPER_RECORD

    pytest.importorskip("ray")
    d = subprocess.Popen([sys.executable, "-c", RAY_DRIVER], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    record = Path(d.stdout.readline().strip()) / REAPER_RECORD
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the agents start after the raylet: wait for the record to settle
            now = [int(x.split()[0]) for x in record.read_text().splitlines()] if record.exists() else []
            if len(now) >= 4 and now == pids:
                break
            pids = now
            time.sleep(3)
        assert len(pids) >= 4, pids  # gcs, raylet, agents, workers...
        os.kill(d.pid, signal.SIGKILL)
        d.wait()
        left = _wait_gone(pids, 45)
        assert not left, f"still running after the driver's SIGKILL: {left}"
        deadline = time.monotonic() + 15
        while record.parent.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not record.parent.exists(), "the private head's temp dir outlived its driver"
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
