"""The NIXL transport behind the same interface; skipped where `nixl` does not import."""
from __future__ import annotations

import pytest
import torch

from pivotrl.config.gps import GPSConfig
from pivotrl.gps import Device, Layout, ModelSpec
from pivotrl.gps.nixl_transport import nixl_available
from tests.gps.gps_helpers import TINY, digest, random_state_dict


def test_nixl_missing_is_a_clear_error():
    if nixl_available():
        pytest.skip("nixl is installed")
    from pivotrl.gps.store import GlobalParameterStore

    with pytest.raises(ImportError, match="gps.transport='nixl' needs the `nixl` package"):
        GlobalParameterStore(GPSConfig(transport="nixl"))


@pytest.mark.skipif(not nixl_available(), reason="nixl not installed")
@pytest.mark.parametrize("nodes", [1, 2])
def test_nixl_round_trip(nodes):
    from pivotrl.gps.store import GlobalParameterStore

    spec = ModelSpec.from_config(TINY)
    sd = random_state_dict(spec, seed=11)
    store = GlobalParameterStore(GPSConfig(transport="nixl"), num_nodes=nodes)
    try:
        store.register("policy", TINY, state_dict=sd)
        devs = [Device(0, 0), Device(0, 1)]
        v, shards = store.read("policy", devs, Layout(tp=2, fused_qkv=True))
        assert v == 0
        assert store.write("policy", devs, Layout(tp=2, fused_qkv=True), shards) == 1
        full = store.read("policy", [Device(0)], Layout()).shards[Device(0)]
        assert digest(full) == digest(sd)
        assert isinstance(full["model.norm.weight"], torch.Tensor)
        # DP replicas: each slice goes to every holder from one sender
        dp = [Device(n % nodes, i) for n, i in ((0, 0), (1, 1))]
        new = random_state_dict(spec, seed=12)
        assert store.write("policy", dp, Layout(dp=2), {d: new for d in dp}) == 2
        assert digest(store.read("policy", [Device(nodes - 1)], Layout()).shards[Device(nodes - 1)]) == digest(new)
    finally:
        store.close()
