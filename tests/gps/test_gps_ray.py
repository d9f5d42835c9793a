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


    def write_rows(self, store, w, rows):
        torch.set_num_threads(1)
        return store.write_rows_many(w, rows)


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


@pytest.fixture(scope="module")
def procs(cluster):
    """One stand-in device process per node, shared by the tests below (each costs a worker start)."""
    return {0: _proc(0), 1: _proc(1)}


def _served(store, key):
    return [s[key] for s in store.transport.node_stats()]


@pytest.mark.parametrize("budget", [0, "half"], ids=["replicated", "sharded"])
def test_start_up_import_fills_each_node_from_its_own_folder(cluster, procs, tmp_path, budget):
    """`import_hf`: every node's store actor reads the folder itself (nothing is written through
    this process), a node of a sharded placement only its chunk; each node's budget is the one
    its own actor measured."""
    from pivotrl.gps.checkpoint import checkpoint_spec
    from pivotrl.gps.hf_io import import_hf
    from pivotrl.gps.node_import import read_safetensors_dir
    from pivotrl.gps.ray_transport import make_ray_store
    from pivotrl.models.tiny_families import make_tiny_checkpoint

    path = make_tiny_checkpoint("qwen3", tmp_path / "q", dtype="bfloat16")
    spec = checkpoint_spec(path)
    cfg = GPSConfig(transport="ray", ray_node_resource="gps_node_{}",
                    node_memory_budget_bytes=0 if budget == 0 else 2 * node_bytes(spec, 2, 64))
    store = make_ray_store(cfg, 2)
    try:
        assert store.table.budgets() == ray.get([a.budget.remote(cfg) for a in store.transport.actors])
        assert import_hf(store, "policy", path) == 0
        k = store.placement("policy").k
        assert k == (1 if budget == 0 else 2)
        assert _served(store, "write_bytes") == [0, 0] and _served(store, "write_calls") == [0, 0]
        imported = _served(store, "import_bytes")
        assert sum(imported) == spec.nbytes * (2 // k) and all(0 < b <= spec.nbytes for b in imported)
        _, shards, *_ = ray.get(procs[1].read.remote(store, "policy", [Device(1, 0)], Layout()))
        want = {n: t for n, t in read_safetensors_dir(path).items() if n in spec}
        assert digest(shards[Device(1, 0)]) == digest(want)
    finally:
        store.close()


def test_a_writer_sends_another_node_its_rows_in_one_call(cluster, procs):
    """A row write from a process on node 0: node 0's buffer is copied in place (no call), node 1
    gets every tensor's rows in one call (or one per `remote_write_bucket_bytes`)."""
    from pivotrl.gps.ray_transport import make_ray_store

    store = make_ray_store(GPSConfig(transport="ray", ray_node_resource="gps_node_{}"), 2)
    try:
        store.register("policy", TINY, state_dict=SD)
        halves = [(n, a, t[a:b]) for n, t in SD.items() for a, b in ((0, len(t) // 2), (len(t) // 2, len(t)))]
        for version, (bucket, calls) in enumerate(((256 << 20, 1), (SPEC.nbytes // 3, 3)), start=1):
            store.config.remote_write_bucket_bytes = bucket  # travels with the pickled store
            before = _served(store, "write_calls")
            w = store.begin_row_write("policy")
            rows = ray.get(procs[0].write_rows.remote(store, w, halves))
            assert rows == {n: t.shape[0] for n, t in SD.items()}
            made = [a - b for a, b in zip(_served(store, "write_calls"), before)]
            assert made[0] == 0 and calls <= made[1] <= calls + 1, made  # a bucket closes past its size
            assert store.commit_row_write(w, rows) == version
            _, shards, *_ = ray.get(procs[1].read.remote(store, "policy", [Device(1, 0)], Layout()))
            assert digest(shards[Device(1, 0)]) == digest(SD)
    finally:
        store.close()


def test_host_copy_of_a_judge_is_on_every_node_and_reserved(cluster, tmp_path):
    """A frozen judge kept beside GPS: its folder copied into every node's shared memory (one path
    for all), its bytes taken from every node's budget, and gone when the store closes."""
    from pivotrl.gps.errors import BudgetError
    from pivotrl.gps.node_import import folder_bytes
    from pivotrl.gps.ray_transport import make_ray_store
    from pivotrl.models.tiny_families import make_tiny_checkpoint

    src = make_tiny_checkpoint("qwen3_moe", tmp_path / "judge", dtype="bfloat16")
    need = folder_bytes(src)
    store = make_ray_store(GPSConfig(transport="ray", ray_node_resource="gps_node_{}",
                                     node_memory_budget_bytes=need + 1000), 2)
    try:
        path = store.host_copy("genrm", str(src))
        assert Path(path).parent == Path(GPSConfig().shm_dir)
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            assert (Path(path) / f).read_bytes() == (src / f).read_bytes(), f
        assert store.table.free_bytes() == 1000
        with pytest.raises(BudgetError, match=r"host copy of again needs \d+ bytes .* only 1000 bytes"):
            store.host_copy("again", str(src))
    finally:
        store.close()
    assert not Path(path).exists()
