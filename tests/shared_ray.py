"""The test files whose runs share one Ray session and its kept cluster, one after another.

Each `cluster=local` run of `tests/e2e/conftest.py` keeps its 4 device actors for the next run in
the same Ray session (`cluster.keep_devices`), so only a session's first run starts them: measured
at 28 CPU-s for a session's first tiny run against 6 for the next, and 4 more for the session.
The files below hand that session on to each other instead of each starting its own:
- `tests/conftest.py` makes them one xdist work unit (`pytest_xdist_make_scheduler`), so one worker
  runs them back to back, in `LONG_FILES` order;
- `ray_session` leaves their session running at the end of each of them;
- `tests/conftest.py` ends it (kept cluster, then Ray) after the last test of the run of them.
Any other file's `ray_session` is its own, ended with the file.
"""
from __future__ import annotations

#: In the order they run in (`tests/conftest.py` LONG_FILES lists them so). The elastic run goes
#: first, on devices started for it (it once failed after the others, on warm devices and a loaded
#: host: its docstring says why, and how its step is now long enough to grow either way). A file
#: that releases the kept cluster (a run of another shape: local modes' 2-device executor) goes last.
SHARED_RAY_FILES = ("tests/e2e/test_elastic.py", "tests/bench/test_chaos.py", "tests/e2e/test_device_faults.py",
                    "tests/e2e/test_local_modes.py")

#: The xdist work unit of `SHARED_RAY_FILES`.
SHARED_SCOPE = "shared-ray-session"


def shares_ray(nodeid: str) -> bool:
    """Whether the test (or file) `nodeid`, relative to the rootdir, is in one of `SHARED_RAY_FILES`."""
    return nodeid.split("::", 1)[0] in SHARED_RAY_FILES


def end_ray_session() -> None:
    """End the Ray session of this process, if one runs: its kept cluster, then Ray."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    from pivotrl.runtime.cluster import release_kept_clusters

    release_kept_clusters()
    ray.shutdown()
