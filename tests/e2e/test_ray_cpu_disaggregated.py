"""The whole `cluster=ray` path on CPU in disaggregated mode (`test_ray_cpu.py` says what it runs
and checks; a file of its own so that the two test workers can run the two modes at once)."""
from __future__ import annotations

import pytest

from tests.e2e.test_ray_cpu import check_run

pytestmark = pytest.mark.slow


def test_train_py_on_a_ray_head_of_cpu_devices_disaggregated(tmp_path):
    check_run("disaggregated", tmp_path)
