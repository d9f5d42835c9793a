"""`cluster=ray` with CUDA (`gpu` marker): a short colocated run trains on the GPUs through the same
runtime. (Without GPUs, `test_cluster_device.py` checks that `run_real` on cluster=ray fails naming both numbers.)"""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from tests.e2e.conftest import make_local_cfg  # noqa: E402


def _ray_cfg(tiny_assets, mode, devices, overrides=()):
    cfg = make_local_cfg(tiny_assets, mode, [f"cluster.num_devices={devices}", *overrides])
    cfg.cluster.kind = type(cfg.cluster.kind)("ray")
    return cfg


@pytest.mark.gpu
def test_run_ray_trains_on_gpus(tiny_assets, tmp_path):
    import torch

    from pivotrl.runtime.real import run_real

    n = torch.cuda.device_count()
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_gpus=n, include_dashboard=False, configure_logging=False)
    try:
        cfg = _ray_cfg(tiny_assets, "colocated", n, ["engine.name=auto", "engine.max_num_seqs=64",
                                                     "engine.vllm_gpu_memory_utilization=0.3"])
        summary = run_real(cfg, tmp_path, None)
    finally:
        ray.shutdown()
    assert summary["cluster"] == "ray" and summary["policy_version"] == 2
    assert summary["samples_trained"] == summary["samples_trained_unique"] == 2 * 2 * 4
