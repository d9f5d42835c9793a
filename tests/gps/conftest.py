"""Shared fixtures for GPS tests: stores that clean up after themselves."""
from __future__ import annotations

import pytest
import torch

from pivotrl.config.gps import GPSConfig

torch.set_num_threads(1)


@pytest.fixture
def make_store():
    """make_store(num_nodes=1, **config) -> GlobalParameterStore, closed after the test."""
    from pivotrl.gps.store import GlobalParameterStore

    made = []

    def make(num_nodes: int = 1, **cfg) -> GlobalParameterStore:
        cfg.setdefault("node_memory_budget_bytes", 1 << 30)
        s = GlobalParameterStore(GPSConfig(**cfg), num_nodes=num_nodes)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
