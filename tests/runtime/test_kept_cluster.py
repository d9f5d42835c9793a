"""`cluster.keep_devices`: a run's cluster and device actors are kept for the process's next run of
the same cluster settings (the same actor processes, their roles closed, a replaced one's
generation carried on), and released by another spec's start or `release_kept_clusters`."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from pivotrl.config.engine import EngineConfig, EngineSpec  # noqa: E402
from pivotrl.core.types import Role  # noqa: E402
from pivotrl.runtime.cluster import ClusterSpec, release_kept_clusters, start_cluster  # noqa: E402
from pivotrl.runtime.executor import Executor  # noqa: E402
from pivotrl.runtime.faults import kill_device  # noqa: E402
from pivotrl.runtime.roles import RoleSpec  # noqa: E402

KEPT = ClusterSpec(kind="local", num_devices=2, node_size=2, keep_devices=True)


@pytest.fixture(scope="module")
def session():
    ray.init(address="local", num_cpus=1, resources={"pivot_device": 2}, include_dashboard=False,
             configure_logging=False)
    try:
        yield
    finally:
        release_kept_clusters()
        ray.shutdown()


def _executor(cluster):
    return Executor(cluster, lambda slot, i: None, None, {})


def _info(ex):
    return {i["device"]: i for i in ex.wait_ready()}


def test_the_next_run_gets_the_same_actors_back_without_their_roles(session, tmp_path):
    from pivotrl.models.tiny import create_tiny_model

    policy = str(create_tiny_model(tmp_path / "policy"))
    cluster = start_cluster(KEPT)
    ex = _executor(cluster)
    first = _info(ex)
    spec = RoleSpec(Role.ROLLOUT, "policy", policy,
                    engine=EngineSpec.for_role(EngineConfig(name="cpu", num_threads=1, kv_capacity_tokens=1024),
                                               "rollout"))
    assert ray.get(ex.actors[0].shift_up.remote(spec, None, 0)).cold
    kill_device(ex.actors[1])
    assert ex.respawn(1, "killed by the test")
    replaced = _info(ex)[1]["pid"]
    ex.close()
    cluster.shutdown()  # kept: the next start of the same spec returns it
    assert cluster.placement_groups and set(cluster.devices) == {0, 1}

    again = start_cluster(KEPT)
    assert again is cluster
    ex2 = _executor(again)
    info = _info(ex2)
    assert info[0]["pid"] == first[0]["pid"] and info[1]["pid"] == replaced, "no device process started"
    assert ex2.generation == {0: 0, 1: 1}, "the replaced device's generation goes on"
    assert info[0]["role"] is None and info[0]["dormant"] == [], "its roles were closed between the runs"
    # a role shifts up again on the kept actor (its engine is built anew: a cold start)
    assert ray.get(ex2.actors[0].shift_up.remote(spec, None, 0)).cold
    ex2.close()
    again.shutdown()

    # a start with other settings releases the kept cluster first (it holds the devices)
    other = start_cluster(ClusterSpec(kind="local", num_devices=2, node_size=2))
    try:
        assert cluster.devices == {} and cluster.placement_groups == []
        with pytest.raises(ValueError):
            ray.get_actor("pivotrl-device0-gen0")
    finally:
        other.shutdown()


def test_release_ends_the_kept_cluster(session):
    cluster = start_cluster(KEPT)
    ex = _executor(cluster)
    pid = _info(ex)[0]["pid"]
    kill_device(ex.actors[1])  # dead at close: not handed back, the next run spawns it anew
    ex.close()
    cluster.shutdown()
    assert cluster.devices[0][0] is not None and cluster.devices[1] == (None, 0)
    assert start_cluster(KEPT) is cluster
    ex = _executor(cluster)
    assert ex.generation == {0: 0, 1: 1} and _info(ex)[0]["pid"] == pid
    ex.close()
    release_kept_clusters()
    assert cluster.devices == {} and cluster.placement_groups == []
    fresh = start_cluster(KEPT)
    try:
        assert fresh is not cluster
        ex = _executor(fresh)
        assert _info(ex)[0]["pid"] != pid
        ex.close()
    finally:
        release_kept_clusters()
    assert ray.is_initialized(), "the kept cluster did not start this Ray session: it is not its to stop"


def test_a_kept_private_head_goes_with_its_process():
    """A run that keeps its cluster and then ends its process (a single `python train.py
    cluster.keep_devices=true`): the private head's temp dir goes at exit, as after any run."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("from pivotrl.runtime.cluster import ClusterSpec, start_cluster\n"
            "c = start_cluster(ClusterSpec(kind='local', num_devices=1, keep_devices=True))\n"
            "c.shutdown()\n"
            "print('TEMP', c.temp_dir)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    temp = [line.split(" ", 1)[1] for line in p.stdout.splitlines() if line.startswith("TEMP ")]
    assert p.returncode == 0 and temp and "pivotrl-ray-" in temp[0], p.stderr[-2000:]
    assert not Path(temp[0]).exists(), "the kept cluster was released at exit"
