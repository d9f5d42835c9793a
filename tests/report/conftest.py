"""A small real `cluster=sim` pivot run (seconds), shared by the report tests."""
from __future__ import annotations

import pytest

from tests.config.test_compose import make

QUICK = ["experiment=quick", "deploy=pivot", "train.prompts_per_step=16", "train.group_size=4",
         "models.sim.throughput_sample_s=5", "train.steps=4", "logging.wandb_mode=disabled",
         "logging.progress=false"]


def sim_cfg(extra: list[str] = ()):
    return make([*QUICK, *extra])


@pytest.fixture(scope="session")
def sim_run(tmp_path_factory):
    from pivotrl.run import run

    d = tmp_path_factory.mktemp("sim_pivot")
    run(sim_cfg(), d)
    return d
