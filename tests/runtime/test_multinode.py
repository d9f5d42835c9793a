"""Multi-node placement on a 2-node `ray.cluster_utils.Cluster` (both nodes on this machine): the
devices of one cluster node land on one Ray node, and a node size no Ray node can hold is an error
naming the numbers."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from pivotrl.runtime.cluster import ClusterResourceError, ClusterSpec, start_cluster  # noqa: E402
from pivotrl.runtime.device import spawn_device  # noqa: E402


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"pivot_device": 2}})
    c.add_node(num_cpus=1, resources={"pivot_device": 2})
    c.wait_for_nodes()
    ray.init(address=c.address, configure_logging=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def test_devices_of_a_node_share_a_ray_node(two_nodes):
    cl = start_cluster(ClusterSpec(kind="local", num_devices=4, node_size=2))
    actors = []
    try:
        actors = [spawn_device(cl, d) for d in range(4)]
        nodes = [i["node_id"] for i in ray.get([a.info.remote() for a in actors])]
        assert nodes[0] == nodes[1] and nodes[2] == nodes[3], nodes
        assert nodes[0] != nodes[2], "the two cluster nodes must be on different Ray nodes"
        assert [cl.node_of(d) for d in range(4)] == [0, 0, 1, 1]
    finally:
        for a in actors:
            ray.kill(a)
        cl.shutdown()


def test_node_larger_than_any_ray_node_is_an_error(two_nodes):
    with pytest.raises(ClusterResourceError, match=r"node_size=4.*largest node has 2"):
        start_cluster(ClusterSpec(kind="local", num_devices=4, node_size=4, start_timeout_s=3))
