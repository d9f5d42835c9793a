"""`cluster` group checks: the Ray address (`auto` refused), connection and crash-loop bounds; and
an unknown planner strategy refused at config load, before any Ray starts (issue 12 items 4, 6)."""
from __future__ import annotations

import pytest

from pivotrl.config import compose_config
from pivotrl.config.base import ConfigError


@pytest.mark.parametrize("override, path, allowed", [
    ("cluster.address=auto", "cluster.address", "`local`"),
    ("cluster.address=''", "cluster.address", "host:port"),
    ("cluster.connect_timeout_s=0", "cluster.connect_timeout_s", "> 0"),
    ("cluster.connect_timeout_s=inf", "cluster.connect_timeout_s", None),
    ("cluster.max_respawns=-1", "cluster.max_respawns", ">= 0"),
    ("cluster.respawn_window_s=0", "cluster.respawn_window_s", "> 0"),
])
def test_bad_value_is_refused_naming_its_path(override, path, allowed):
    with pytest.raises(ConfigError) as ei:
        compose_config(["deploy=pivot", "cluster=local", override])
    assert str(ei.value).startswith(f"{path}=")  # the full path, once
    if allowed is not None:
        assert allowed in str(ei.value)


def test_the_allowed_addresses_and_strategies_load():
    for o in ("cluster.address=local", "cluster.address=10.0.0.1:6379", "deploy/planner=rule"):
        cfg = compose_config(["deploy=pivot", "cluster=ray", o])
        assert cfg.cluster.max_respawns == 3 and cfg.cluster.respawn_window_s == 600.0


def test_every_registered_strategy_is_accepted():
    from pivotrl.core.strategies import STRATEGIES

    for name in STRATEGIES:
        assert compose_config(["deploy=pivot", f"deploy/planner={name}"]).deploy.planner.strategy == name
