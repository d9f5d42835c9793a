"""Multi-node placement, the check of the cluster's nodes at start and the trainer's TCP rendezvous,
on one 2-node `ray.cluster_utils.Cluster` (both nodes on this machine, 2 devices each) where each
node has its own view: its own Hugging Face cache (`HF_HUB_CACHE`) and its own
`$PIVOTRL_TEST_SCRATCH`, as two machines without a shared filesystem would. The driver sees what
node A sees."""
from __future__ import annotations

import os
import shutil

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from pivotrl.runtime.cluster import ClusterResourceError, ClusterSpec, start_cluster  # noqa: E402
from pivotrl.runtime.device import spawn_device  # noqa: E402
from pivotrl.runtime.nodes import PROBE_PREFIX, ModelSource, NodeCheckError, check_nodes  # noqa: E402

HUB_ID = "tiny-org/tiny-policy"


def _hub_snapshot(cache, folder):
    """`folder` as the Hugging Face cache holds a download of HUB_ID."""
    repo = cache / ("models--" + HUB_ID.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    shutil.copytree(folder, repo / "snapshots" / "abc123")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """(ray node ids [A, B], folders): node A (the head, the driver's view) has the tiny model in its
    HF cache; node B's cache is empty and its scratch is another folder."""
    from pivotrl.models.tiny import create_tiny_model

    root = tmp_path_factory.mktemp("nodes")
    folder = create_tiny_model(root / "tiny", seed=0)
    views = {n: {"HF_HUB_CACHE": str(root / f"hf_{n}"), "PIVOTRL_TEST_SCRATCH": str(root / f"scratch_{n}")}
             for n in ("A", "B")}
    _hub_snapshot(root / "hf_A", folder)
    (root / "hf_B").mkdir()
    if ray.is_initialized():
        ray.shutdown()
    saved = {k: os.environ.get(k) for k in views["A"]}
    os.environ.update(views["A"])  # the driver and the head (started from here) see A's view
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"pivot_device": 2}})
    c.add_node(num_cpus=1, resources={"pivot_device": 2}, env_vars=views["B"])
    c.wait_for_nodes()
    ray.init(address=c.address, configure_logging=False)
    try:
        head = ray.get_runtime_context().get_node_id()
        other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head)
        yield {"ids": [head, other], "root": root, "folder": folder}
    finally:
        ray.shutdown()
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_devices_of_a_node_share_a_ray_node(nodes):
    cl = start_cluster(ClusterSpec(kind="local", num_devices=4, node_size=2))
    actors = []
    try:
        actors = [spawn_device(cl, d) for d in range(4)]
        ids = [i["node_id"] for i in ray.get([a.info.remote() for a in actors])]
        assert ids[0] == ids[1] and ids[2] == ids[3], ids
        assert ids[0] != ids[2], "the two cluster nodes must be on different Ray nodes"
        assert [cl.node_of(d) for d in range(4)] == [0, 0, 1, 1]
    finally:
        for a in actors:
            ray.kill(a)
        cl.shutdown()


def test_node_larger_than_any_ray_node_is_an_error(nodes):
    with pytest.raises(ClusterResourceError, match=r"node_size=4.*largest node has 2"):
        start_cluster(ClusterSpec(kind="local", num_devices=4, node_size=4, start_timeout_s=3))


def _probes(folder):
    return list(folder.glob(PROBE_PREFIX + "*")) if folder.exists() else []


def test_every_node_resolves_its_own_model_folder_and_shares_the_checkpoint_dir(nodes, tmp_path):
    a, b = nodes["ids"]
    view = check_nodes([a, b, a], str(tmp_path / "ckpts"),
                       [ModelSource("policy", "models.policy.hf_path", str(nodes["folder"]))], timeout_s=120)
    assert set(view.paths) == {a, b}, "each Ray node probed once"
    assert view.model_path(b, "policy") == str(nodes["folder"])
    assert _probes(tmp_path / "ckpts") == [], "the probe files are removed"


def test_a_checkpoint_dir_one_node_sees_elsewhere_stops_naming_that_node(nodes):
    a, b = nodes["ids"]
    with pytest.raises(NodeCheckError) as e:
        check_nodes([a, b], "$PIVOTRL_TEST_SCRATCH/ckpts",
                    [ModelSource("policy", "models.policy.hf_path", str(nodes["folder"]))], timeout_s=120)
    msg = str(e.value)
    assert f"Ray node {b[:12]}" in msg and f"Ray node {a[:12]}" not in msg, msg
    assert "train.checkpoint_dir='$PIVOTRL_TEST_SCRATCH/ckpts'" in msg
    assert str(nodes["root"] / "scratch_B" / "ckpts") in msg and "does not read it back" in msg
    assert "before any engine started" in msg
    for n in ("A", "B"):
        assert _probes(nodes["root"] / f"scratch_{n}" / "ckpts") == [], "each node removed its own probe"


def test_a_hub_id_missing_from_one_nodes_cache_stops_naming_node_path_and_key(nodes, tmp_path):
    a, b = nodes["ids"]
    with pytest.raises(NodeCheckError) as e:
        check_nodes([a, b], str(tmp_path), [ModelSource("policy", "models.policy.hf_path", HUB_ID)], timeout_s=120)
    msg = str(e.value)
    assert f"Ray node {b[:12]}" in msg and f"Ray node {a[:12]}" not in msg, msg
    assert f"models.policy.hf_path={HUB_ID!r}" in msg and str(nodes["root"] / "hf_B") in msg
    # where it is cached, the node opens its own snapshot folder
    view = check_nodes([a], str(tmp_path), [ModelSource("policy", "models.policy.hf_path", HUB_ID)], timeout_s=120)
    assert view.model_path(a, "policy").startswith(str(nodes["root"] / "hf_A"))


def test_a_run_whose_node_lacks_a_model_stops_before_any_device_starts(nodes, tmp_path):
    from pivotrl.config import compose_config
    from pivotrl.config.resolve import resolve
    from pivotrl.runtime.launch import Launch

    cfg = compose_config(["cluster=local", "cluster.num_devices=4", "cluster.node_size=2",
                          f"models.policy.hf_path={HUB_ID}", f"models.genrm.hf_path={nodes['folder']}",
                          "models.policy.chat.chat_template=plain", "models.genrm.chat.chat_template=plain"])
    launch = Launch(cfg, resolve(cfg), nodes["folder"], nodes["folder"], tmp_path)
    try:
        with pytest.raises(NodeCheckError, match=f"Ray node {nodes['ids'][1][:12]}.*models.policy.hf_path"):
            launch.start()
        assert launch.executor is None and launch.params is None, "no device, no GPS: nothing started"
    finally:
        launch.close()


def test_the_trainer_meets_over_tcp_at_rank_0s_node(nodes):
    """Rank 0's device actor names its node's address and a free port; ranks on two nodes form a
    gloo group there and all-reduce (no file anywhere)."""
    cl = start_cluster(ClusterSpec(kind="local", num_devices=4, node_size=2))
    actor = spawn_device(cl, 0)
    try:
        addr = ray.get(actor.rendezvous.remote(), timeout=120)
        assert addr.startswith(f"tcp://{ray.util.get_node_ip_address()}:")

        @ray.remote(num_cpus=0)
        def rank(r, init):
            import torch
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=init, rank=r, world_size=2)
            t = torch.tensor([r + 1.0])
            dist.all_reduce(t)
            dist.destroy_process_group()
            return ray.get_runtime_context().get_node_id(), float(t.item())

        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        out = ray.get([rank.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(i, addr)
                       for i, n in enumerate(nodes["ids"])], timeout=180)
        assert [v for _, v in out] == [3.0, 3.0]
        assert out[0][0] != out[1][0], "the two ranks ran on different nodes"
    finally:
        ray.kill(actor)
        cl.shutdown()


@pytest.mark.parametrize("value, driver, ranks", [
    (None, "{run}/checkpoints", "{run}/checkpoints"),
    ("/shared/ck", "/shared/ck", "/shared/ck"),
    ("ck", "ck", "{cwd}/ck"),  # a relative folder is the driver's: never each worker's own cwd
    ('"~/ck"', "{home}/ck", "~/ck"),  # expanded by each node itself
])
def test_checkpoint_paths_as_the_driver_and_the_ranks_see_them(tmp_path, value, driver, ranks):
    import os
    from pathlib import Path

    from pivotrl.config import compose_config
    from pivotrl.config.resolve import resolve
    from pivotrl.runtime.launch import Launch

    cfg = compose_config(["cluster=local"] + ([f"train.checkpoint_dir={value}"] if value else []))
    la = Launch(cfg, resolve(cfg), tmp_path / "p", tmp_path / "g", tmp_path)
    fill = {"run": str(tmp_path.resolve()), "cwd": os.getcwd(), "home": os.path.expanduser("~")}
    assert str(la.checkpoint_dir).replace(str(tmp_path), str(tmp_path.resolve())) == driver.format(**fill)
    assert la.rank_checkpoint_dir == ranks.format(**fill)
    assert la.for_ranks(la.checkpoint_dir / "step_00000003") == str(Path(ranks.format(**fill)) / "step_00000003")
