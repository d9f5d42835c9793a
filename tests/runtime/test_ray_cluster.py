"""`cluster=ray`: the same runtime with GPU resources. Without GPUs a start is the resource error
naming both numbers; with CUDA (`gpu` marker) a short colocated run trains on the GPUs."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from pivotrl.runtime.cluster import ClusterResourceError  # noqa: E402
from tests.e2e.conftest import make_local_cfg  # noqa: E402


@pytest.fixture(scope="module")
def session():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _ray_cfg(tiny_assets, mode, devices):
    cfg = make_local_cfg(tiny_assets, mode, [f"cluster.num_devices={devices}"])
    cfg.cluster.kind = type(cfg.cluster.kind)("ray")
    return cfg


def test_run_ray_without_gpus_names_both_numbers(session, tiny_assets, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    from pivotrl.runtime.ray_cluster import run_ray

    with pytest.raises(ClusterResourceError, match=r"num_devices=4 devices requested.*only 0 'GPU'"):
        run_ray(_ray_cfg(tiny_assets, "pivot", 4), tmp_path, None)
    assert ray.is_initialized()


@pytest.mark.gpu
def test_run_ray_trains_on_gpus(tiny_assets, tmp_path):
    import torch

    from pivotrl.config.engine import EngineConfig
    from pivotrl.runtime.ray_cluster import run_ray

    n = torch.cuda.device_count()
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_gpus=n, include_dashboard=False, configure_logging=False)
    try:
        cfg = _ray_cfg(tiny_assets, "colocated", n)
        cfg.runtime.engine = EngineConfig(name="auto", max_num_seqs=64, vllm_gpu_memory_utilization=0.3)
        summary = run_ray(cfg, tmp_path, None)
    finally:
        ray.shutdown()
    assert summary["cluster"] == "ray" and summary["policy_version"] == 2
    assert summary["samples_trained"] == summary["samples_trained_unique"] == 2 * 2 * 4
