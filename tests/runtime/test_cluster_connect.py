"""Joining Ray (issue 12 item 6, issue 14 item 9): no head to join is a bounded error saying how to
start one; `cluster.address=local` is a private head (own temp dir and port) stopped through our
own handle; the address in use is logged. Never `address=auto`."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from pivotrl.runtime.cluster import ClusterConnectError, ClusterSpec, start_cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_session():
    if ray.is_initialized():
        pytest.skip("needs a process without a Ray session")
    yield
    assert not ray.is_initialized(), "a failed join must leave no Ray session behind"


def test_ray_without_an_address_says_how_to_start_a_cluster(no_session):
    with pytest.raises(ClusterConnectError, match=r"cluster.address is null.*ray start --head.*cluster.address=local"):
        start_cluster(ClusterSpec(kind="ray", num_devices=2))


def test_nothing_listening_fails_fast_and_says_how_to_start(no_session):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ClusterConnectError, match=rf"127.0.0.1:{port}.*ray start --head"):
        start_cluster(ClusterSpec(kind="ray", num_devices=2, address=f"127.0.0.1:{port}", connect_timeout_s=5))
    assert time.monotonic() - t0 < 5


def test_auto_is_refused():
    with pytest.raises(ValueError, match="cluster.address=local"):
        ClusterSpec(kind="ray", num_devices=2, address="auto")


def test_a_head_that_never_answers_is_bounded_by_connect_timeout():
    """Something accepts TCP at the address but never speaks Ray: `ray.init` alone would retry for
    minutes. Run in a subprocess (the abandoned join thread keeps retrying in its process)."""
    code = textwrap.dedent("""
        import socket, sys, time
        from pivotrl.runtime.cluster import ClusterConnectError, ClusterSpec, start_cluster
        srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(16)
        addr = "127.0.0.1:%d" % srv.getsockname()[1]
        t0 = time.monotonic()
        try:
            start_cluster(ClusterSpec(kind="ray", num_devices=2, address=addr, connect_timeout_s=4))
        except ClusterConnectError as e:
            print("ELAPSED", time.monotonic() - t0); print("ERROR", e); sys.stdout.flush()
            import os; os._exit(0)
        print("NO ERROR"); sys.stdout.flush(); os._exit(1)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    elapsed = float(out.stdout.split("ELAPSED")[1].split()[0])
    assert 3.5 <= elapsed < 30, elapsed
    assert "did not answer within cluster.connect_timeout_s=4s" in out.stdout
    assert "ray start --head" in out.stdout


def test_local_is_a_private_head_with_its_own_temp_dir_stopped_by_our_handle(no_session, caplog):
    with caplog.at_level(logging.INFO, logger="pivotrl.runtime.cluster"):
        c = start_cluster(ClusterSpec(kind="local", num_devices=2, address="local"))
    try:
        temp = c.temp_dir
        assert temp and Path(temp).is_dir() and any(p.name.startswith("session_") for p in Path(temp).iterdir())
        assert ray.cluster_resources().get("pivot_device") == 2.0
        assert f"Ray at {c.address}" in caplog.text and "private head" in caplog.text
        host, port = c.address.rsplit(":", 1)
        assert int(port) > 0
    finally:
        c.shutdown()
    assert not ray.is_initialized() and not Path(temp).exists()
