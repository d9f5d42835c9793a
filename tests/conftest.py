"""Suite-wide test setup: quiet wandb, skip `gpu` tests without CUDA, keep threads low on 2 cores."""
import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


#: Test files of a minute or more (clean-clone suite, 2 cores), handed to the two workers first
#: (`scripts/test.sh` runs xdist with `--no-loadscope-reorder`, so files go out in this order):
#: xdist's default order, most tests first, put these files of one or few tests last, and one
#: worker ran alone on the last of them for minutes. The bootstrap rebuild (one thread of SFT,
#: light on memory) goes beside the `cluster=ray` run (vLLM processes, most of the memory).
LONG_FILES = ("tests/models/test_shipped.py", "tests/e2e/test_ray_cpu.py", "tests/e2e/test_device_faults.py",
              "tests/e2e/test_local_modes.py", "tests/bench/test_device_check.py")


def _long_first(config, items) -> None:
    """Sort `items` (stably) so that those of `LONG_FILES` come first, in its order; a listed file
    that is gone is an error (the list would silently stop doing its work)."""
    missing = [f for f in LONG_FILES if not (config.rootpath / f).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONG_FILES names files that do not exist: {missing}")
    rank = {f: i for i, f in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONG_FILES)))


def pytest_collection_modifyitems(config, items):
    _long_first(config, items)
    # the marker itself, not `"gpu" in item.keywords`: keywords also hold the names of the folders
    # above a test, so a checkout in a folder named `gpu` would skip the whole suite
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu and not _has_cuda():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in gpu:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def no_ray_left_running(request):
    """Each test module stops the Ray it started: a session left running would make the next
    module's `ray.init` fail (and, under `-n`, which module comes next depends on the worker)."""
    yield
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(f"{request.module.__name__} left a Ray session running (stopped now)", pytrace=False)


@pytest.fixture(scope="module")
def ray_store():
    """A private Ray session with one GPS node (`gps_node_0`) and a Ray GPS store on it, shared by
    the processes a test spawns (they join with the session's address and the pickled store)."""
    import ray

    from pivotrl.config.gps import GPSConfig
    from pivotrl.gps.ray_transport import make_ray_store

    ray.init(address="local", num_cpus=1, resources={"gps_node_0": 1}, include_dashboard=False,
             logging_level="ERROR")
    store = make_ray_store(GPSConfig(transport="ray", ray_node_resource="gps_node_{}"), 1)
    yield store
    store.close()
    ray.shutdown()
