"""GPS across nodes with Ray's test cluster: two nodes on this machine told apart by custom
resources. Device processes read from their own process; reads prefer the node-local replica and
fetch other nodes' bytes through Ray. One cluster for the whole module (Ray starts slowly)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from pivotrl.config.gps import GPSConfig  # noqa: E402
from pivotrl.gps import Device, Layout, ModelSpec  # noqa: E402
from pivotrl.gps.placement import node_bytes  # noqa: E402
from tests.gps.gps_helpers import TINY, digest, random_state_dict  # noqa: E402

SPEC = ModelSpec.from_config(TINY)
SD = random_state_dict(SPEC, seed=3)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    root = str(Path(__file__).resolve().parents[2])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = root + os.pathsep + (old or "")  # Ray workers import pivotrl and tests
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"gps_node_0": 1}})
    c.add_node(num_cpus=1, resources={"gps_node_1": 1})
    ray.init(address=c.address, include_dashboard=False, logging_level="ERROR")
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@ray.remote(num_cpus=0)
class DeviceProc:
    """Stands in for a device actor of the later runtime: reads with its own copy of the store."""

    def read(self, store, model, devices, layout):
        torch.set_num_threads(1)
        res = store.read(model, devices, layout)
        node = store.transport.local_node
        return res.version, {d: {k: v.clone() for k, v in s.items()} for d, s in res.shards.items()}, \
            res.bytes_local, res.bytes_remote, node


def _proc(node: int):
    return DeviceProc.options(resources={f"gps_node_{node}": 0.01}).remote()


def _stats(store):
    return [s["read_bytes"] for s in store.transport.node_stats()]


def test_replicated_reads_are_node_local(cluster):
    from pivotrl.gps.ray_transport import make_ray_store

    store = make_ray_store(GPSConfig(transport="ray", ray_node_resource="gps_node_{}"), 2)
    try:
        store.register("policy", TINY, state_dict=SD)
        assert store.placement("policy").k == 1  # budget allows a full copy per node
        p1 = _proc(1)
        devs, lay = [Device(1, 0), Device(1, 1)], Layout(tp=2)
        v, shards, local, remote, node = ray.get(p1.read.remote(store, "policy", devs, lay))
        assert (v, node, remote) == (0, 1, 0) and local > 0
        assert _stats(store) == [0, 0]  # mapped straight from node 1's shared memory, no actor call
        # a process on node 1 reading for a device of node 0: the plan picks node 0's replica (local
        # to that device), and since this process cannot map node 0's memory, the bytes come
        # through node 0's store actor
        v, shards0, local, remote, _ = ray.get(p1.read.remote(store, "policy", [Device(0, 0)], Layout()))
        assert local == SPEC.nbytes and _stats(store) == [SPEC.nbytes, 0]
        assert digest(shards0[Device(0, 0)]) == digest(SD)
        full_from_tp = {}
        for name in SD:
            a, b = shards[devs[0]][name], shards[devs[1]][name]
            dim = 1 if ("o_proj" in name or "down_proj" in name) else 0
            full_from_tp[name] = a if "norm" in name else torch.cat([a, b], dim)
        assert digest(full_from_tp) == digest(SD)
        # a write from the driver is seen by the device process, as exactly one new version
        new = random_state_dict(SPEC, seed=9)
        assert store.write("policy", [Device(0, 0)], Layout(), {Device(0, 0): new}) == 1
        v, shards, *_ = ray.get(p1.read.remote(store, "policy", [Device(1, 0)], Layout()))
        assert v == 1 and digest(shards[Device(1, 0)]) == digest(new)
        assert store.live_versions("policy") == [1]
    finally:
        store.close()


def test_hybrid_placement_reads_half_locally(cluster):
    from pivotrl.gps.ray_transport import make_ray_store

    budget = 2 * node_bytes(SPEC, 2, 64)  # fits a half shard (x2 versions), not a full copy
    store = make_ray_store(GPSConfig(transport="ray", ray_node_resource="gps_node_{}",
                                     node_memory_budget_bytes=budget), 2)
    try:
        store.register("policy", TINY, state_dict=SD)
        assert store.placement("policy").k == 2
        stats = store.transport.node_stats()
        assert all(s["resident_bytes"] <= 0.55 * SPEC.nbytes for s in stats)
        v, shards, local, remote, _ = ray.get(_proc(1).read.remote(store, "policy", [Device(1, 0)], Layout()))
        assert digest(shards[Device(1, 0)]) == digest(SD)
        assert 0.4 < remote / (local + remote) < 0.6  # the other half comes from node 0 through Ray
    finally:
        store.close()
