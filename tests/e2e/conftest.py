"""Shared fixtures of the end-to-end runs: one Ray session per module, tiny random models + data."""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def ray_session(request):
    """The module's Ray session. The runs of a module attach to it and keep their devices for the
    module's next run (`local_overrides`: `cluster.keep_devices`), released here at the end; the
    files of `tests/shared_ray.py` hand it on to the next of them instead."""
    ray = pytest.importorskip("ray")
    from tests.shared_ray import end_ray_session, shares_ray

    if not ray.is_initialized():  # else the session a file of `SHARED_RAY_FILES` left running
        ray.init(address="local", num_cpus=2, resources={"pivot_device": 4}, include_dashboard=False,
                 configure_logging=False)
    try:
        yield ray
    finally:
        if not shares_ray(request.node.nodeid):
            end_ray_session()


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    """Random-init tiny policy/GenRM and a small synthetic dataset (no bootstrap: tests need the
    pipeline, not a trained model)."""
    from pivotrl.models.tiny import create_tiny_model
    from pivotrl.rl.data import write_synthetic_dataset

    root = tmp_path_factory.mktemp("assets")
    create_tiny_model(root / "policy", seed=0)
    create_tiny_model(root / "genrm", seed=1)
    train, val = write_synthetic_dataset(root / "data", 64, 16, 0)
    return {"policy": root / "policy", "genrm": root / "genrm", "train": train, "val": val}


def local_overrides(assets, mode: str, overrides: list[str] = ()) -> list[str]:
    """The overrides of a `cluster=local` run of 2 tiny steps on the given tiny checkpoints. In a
    Ray session of `ray_session` the run keeps its devices for the next run in it (a run's
    start-up is mostly its 4 device processes importing torch and transformers)."""
    import ray

    keep = [f"cluster.keep_devices={str(ray.is_initialized()).lower()}"]
    return [f"deploy={mode}", "cluster=local", *keep, f"models.policy.hf_path={assets['policy']}",
            f"models.genrm.hf_path={assets['genrm']}", f"data.train_path={assets['train']}",
            f"data.val_path={assets['val']}", "data.val_size=4", "data.max_response_length=12",
            "cluster.max_wall_s=600", "engine.max_num_seqs=32", "engine.kv_capacity_tokens=8192",
            "train.steps=2", "train.prompts_per_step=2", "train.group_size=4", "logging.wandb_mode=disabled",
            "logging.progress=false", *overrides]


def make_local_cfg(assets, mode: str, overrides: list[str] = ()):
    """A composed `cluster=local` PivotConfig for 2 tiny steps on the given tiny checkpoints."""
    from pivotrl.config import compose_config

    return compose_config(local_overrides(assets, mode, overrides))


@contextlib.contextmanager
def policy_executor(policy: Path, num_devices: int = 2):
    """A private cluster of `num_devices` CPU devices, GPS on it holding `policy`, and an executor
    whose rollout slots host `policy` on the CPU engine (ready); everything closed on exit."""
    from pivotrl.config.engine import EngineConfig, EngineSpec
    from pivotrl.config.gps import GPSConfig
    from pivotrl.core.types import Role
    from pivotrl.runtime.cluster import ClusterSpec, start_cluster
    from pivotrl.runtime.executor import Executor
    from pivotrl.runtime.params import ParamSource
    from pivotrl.runtime.roles import RoleSpec

    cl = start_cluster(ClusterSpec(kind="local", num_devices=num_devices, node_size=num_devices))
    params = ParamSource.create(GPSConfig(transport="ray"), cl.ray_node_ids())
    ex = None
    try:
        params.register_hf("policy", str(policy), frozen=False)
        eng = EngineConfig(name="cpu", num_threads=1, kv_capacity_tokens=4096)
        ex = Executor(cl, lambda slot, i: RoleSpec(slot.role, "policy", str(policy),
                                                   engine=EngineSpec.for_role(eng, slot.role.value)), params,
                      {Role.ROLLOUT: "policy"})
        ex.wait_ready()
        yield ex
    finally:
        if ex is not None:
            ex.close()
        params.close()
        cl.shutdown()
