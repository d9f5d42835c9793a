"""Suite-wide test setup: quiet wandb, skip `gpu` tests without CUDA, keep threads low on 2 cores."""
import os

import pytest

from tests.shared_ray import SHARED_RAY_FILES, SHARED_SCOPE, end_ray_session, shares_ray

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
#: light on memory) goes beside the `cluster=ray` run (vLLM processes, most of the memory); the
#: files sharing a Ray session (`tests/shared_ray.py`) are one work unit, in this order.
LONG_FILES = ("tests/models/test_shipped.py", "tests/e2e/test_ray_cpu.py", *SHARED_RAY_FILES,
              "tests/bench/test_device_check.py")


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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the files of `SHARED_RAY_FILES` one work unit (`tests/shared_ray.py`)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedRayFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SHARED_SCOPE if shares_ray(nodeid) else super()._split_scope(nodeid)

    return SharedRayFiles(config, log)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of a run of `SHARED_RAY_FILES` (its fixtures torn down): end their
    shared Ray session."""
    if shares_ray(item.nodeid) and (nextitem is None or not shares_ray(nextitem.nodeid)):
        end_ray_session()


@pytest.fixture(scope="module", autouse=True)
def no_ray_left_running(request):
    """Each test module stops the Ray it started: a session left running would make the next
    module's `ray.init` fail (and, under `-n`, which module comes next depends on the worker).
    The files sharing one (`tests/shared_ray.py`) leave it to `pytest_runtest_teardown`."""
    yield
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and not shares_ray(request.node.nodeid):
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
