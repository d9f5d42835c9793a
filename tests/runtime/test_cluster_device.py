"""Cluster start/teardown, the too-few-resources error, and device actors hosting real CPU engines.

One Ray session for the whole module (Ray start is slow on 2 loaded cores); 1 thread per actor.
"""
from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from pivotrl.config.engine import EngineSpec  # noqa: E402
from pivotrl.core.types import Role  # noqa: E402
from pivotrl.runtime.cluster import ClusterResourceError, ClusterSpec, cores_for_device, start_cluster  # noqa: E402
from pivotrl.runtime.device import spawn_device  # noqa: E402
from pivotrl.runtime.roles import Category, InferenceHost, RoleSpec, TrainHost  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(ClusterSpec(kind="local", num_devices=3, node_size=4, threads_per_device=1))
    try:
        yield c
    finally:
        c.shutdown()
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from pivotrl.models.tiny import create_tiny_model

    return str(create_tiny_model(tmp_path_factory.mktemp("tiny") / "policy"))


def _engine_cfg():
    from pivotrl.config.engine import EngineConfig

    return EngineConfig(name="cpu", num_threads=1, max_num_seqs=8, kv_capacity_tokens=4096)


def _requests(ids, max_tokens, generated=None):
    from pivotrl.engines.protocol import GenerationRequest, SamplingParams

    p = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [GenerationRequest(seq_id=i, prompt_ids=[5, 6, 7 + i], params=p,
                              generated=list((generated or {}).get(i, []))) for i in ids]


def _collect(actor, n, timeout=120.0):
    done, progress = {}, {}
    deadline = time.monotonic() + timeout
    while len(done) < n and time.monotonic() < deadline:
        res = ray.get(actor.poll.remote(0.5))
        assert res.error is None, res.error
        for sid, toks in res.progress.items():
            progress.setdefault(sid, []).extend(toks)
        for c in res.completions:
            assert c.seq_id not in done, "a completion was reported twice"
            done[c.seq_id] = c
    assert len(done) == n, f"only {len(done)}/{n} finished"
    return done, progress


def test_more_devices_than_resources_names_both_numbers(cluster):
    with pytest.raises(ClusterResourceError, match=r"num_devices=5.*only 3 'pivot_device'"):
        start_cluster(ClusterSpec(kind="local", num_devices=5, node_size=8))
    with pytest.raises(ClusterResourceError, match=r"num_devices=2.*only 0 'GPU'"):
        start_cluster(ClusterSpec(kind="ray", num_devices=2, node_size=8, address=None))
    assert ray.is_initialized(), "a failed attach must not shut down the session it attached to"


def test_devices_sharing_a_gpu_take_a_fraction_of_it_each():
    from pivotrl.config import compose_config
    from pivotrl.config.base import ConfigError

    spec = ClusterSpec(kind="ray", num_devices=3, node_size=8, devices_per_gpu=3)
    assert spec.per_device == pytest.approx(1 / 3) and spec.resources_needed == 1.0
    assert ClusterSpec(kind="ray", num_devices=4, devices_per_gpu=3).resources_needed == 2.0
    with pytest.raises(ValueError, match=r"cluster.devices_per_gpu=2: allowed 1, or > 1 with cluster=ray"):
        ClusterSpec(kind="local", num_devices=2, devices_per_gpu=2)
    with pytest.raises(ConfigError, match=r"cluster.devices_per_gpu=2 is invalid"):
        compose_config(["cluster=local", "cluster.devices_per_gpu=2"])
    assert ClusterSpec.from_config(compose_config(["cluster=ray", "cluster.devices_per_gpu=3"]).cluster, 3).per_device < 1


def test_cores_for_device_pins_only_when_enough_cores():
    assert cores_for_device(1, 2, available=[0, 1, 2, 3]) == [2, 3]
    assert cores_for_device(2, 1, available=[0, 1]) is None


def test_actor_thread_budget_and_placement(cluster):
    actors = [spawn_device(cluster, d) for d in range(3)]
    try:
        infos = ray.get([a.info.remote() for a in actors])
        assert [i["device"] for i in infos] == [0, 1, 2]
        assert all(i["threads"] == 1 for i in infos)
        assert len({i["pid"] for i in infos}) == 3, "one process per device"
        assert all(i["role"] is None for i in infos)
    finally:
        for a in actors:
            ray.kill(a)


def test_role_context_declarations_cover_four_categories():
    for host in (InferenceHost, TrainHost):
        decl = host.CONTEXT.as_dict()
        assert set(decl) == {c.value for c in Category}
    assert "process_group" in TrainHost.CONTEXT.preserved
    assert "weights" in InferenceHost.CONTEXT.parameters and "kv_cache" in InferenceHost.CONTEXT.temporary


def test_abort_with_tokens_resume_elsewhere_and_shift(cluster, model_path):
    """A sequence aborted mid-generation on device 0 resumes on device 1 from its tokens; under
    greedy decoding the result equals an uninterrupted run. Then device 0 shifts rollout -> reward
    -> rollout, reusing its preserved engine the second time; a policy load that reaches it while it
    serves reward is refused."""
    import torch

    from pivotrl.engines.hf_model import load_hf_model

    d0, d1 = spawn_device(cluster, 0), spawn_device(cluster, 1)
    try:
        spec = RoleSpec(Role.ROLLOUT, "policy", model_path, engine=EngineSpec.for_role(_engine_cfg(), "rollout"))
        sd = {k: v.clone() for k, v in load_hf_model(model_path).state_dict().items()}
        ups = ray.get([d0.shift_up.remote(spec, sd, 3), d1.shift_up.remote(spec, sd, 3)])
        assert all(u.cold and u.version == 3 for u in ups)

        # reference: uninterrupted on d1
        ray.get(d1.submit.remote(_requests([0], 400)))
        ref, _ = _collect(d1, 1)

        ray.get(d0.submit.remote(_requests([0], 400)))
        seen: list[int] = []
        while len(seen) < 3:  # let it make some progress first
            res = ray.get(d0.poll.remote(0.01))
            seen.extend(res.progress.get(0, []))
            assert not res.completions
        ab = ray.get(d0.abort.remote([0]))
        assert not ab.finished and 0 in ab.aborted
        toks = ab.aborted[0]
        assert toks[:len(seen)] == seen and 3 <= len(toks) < 400

        ray.get(d1.submit.remote(_requests([0], 400, generated={0: toks})))
        got, _ = _collect(d1, 1)
        assert got[0].token_ids == ref[0].token_ids
        assert got[0].reprefill_tokens == 3 + len(toks)

        down = ray.get(d0.shift_down.remote())
        assert down.direction == "down" and down.aborted == {}
        info = ray.get(d0.info.remote())
        assert info["role"] is None and info["dormant"] == ["rollout"]
        rspec = RoleSpec(Role.REWARD, "genrm", model_path, engine=EngineSpec.for_role(_engine_cfg(), "reward"))
        assert ray.get(d0.shift_up.remote(rspec, None, 0)).cold
        # a policy publish that raced this shift (sent while device 0 served rollout) lands on the
        # judge's engine: refused, the judge keeps its own weights (found by the chaos soak)
        assert ray.get(d0.load_weights.remote(sd, 9, Role.ROLLOUT)) is None
        assert ray.get(d0.poll.remote(0.0)).stats.version == 0
        with pytest.raises(ray.exceptions.RayTaskError, match="shift it down first"):
            ray.get(d0.shift_up.remote(spec, sd, 4))
        ray.get(d0.shift_down.remote())
        sd2 = {k: torch.zeros_like(v) if "norm" in k else v for k, v in sd.items()}
        warm = ray.get(d0.shift_up.remote(spec, sd2, 4))
        assert not warm.cold and warm.version == 4, "preserved engine reused, weights at the new version"
    finally:
        ray.kill(d0)
        ray.kill(d1)


def test_run_ray_without_gpus_names_both_numbers(cluster, tiny_assets, tmp_path):
    """`cluster=ray` goes through the whole setup and stops at the GPU check (attached session)."""
    import torch

    from pivotrl.runtime.real import run_real
    from tests.runtime.test_ray_cluster import _ray_cfg

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    with pytest.raises(ClusterResourceError, match=r"num_devices=4 devices requested.*only 0 'GPU'"):
        run_real(_ray_cfg(tiny_assets, "pivot", 4), tmp_path, None)
    assert ray.is_initialized()


def test_an_engine_started_in_a_placement_spans_the_slot_and_the_actor_gets_its_own_back(monkeypatch):
    """`placed` widens this process to the slot's cores and accelerators while the engine starts
    (its rank processes inherit them), then restores the actor's own."""
    import os

    from pivotrl.runtime.device import placed
    from pivotrl.runtime.roles import EnginePlacement

    own = os.sched_getaffinity(0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    slot_cores = (min(own),)  # a subset this machine has, so setting it can be observed
    with placed(EnginePlacement((2, 3), cores=slot_cores, accelerator_ids=("2", "3"))):
        assert os.sched_getaffinity(0) == set(slot_cores)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert os.sched_getaffinity(0) == own and os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    with placed(None):
        assert os.sched_getaffinity(0) == own
