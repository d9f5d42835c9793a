"""`ParamSource`: the real runtimes' GPS, a Ray store on the cluster's nodes. Devices read it from
their own processes (`GPSWeights`), the driver only names versions; a resume's fp32 checkpoint
lands in a bf16 store in the store's dtype; a single-process transport is refused by name."""
from __future__ import annotations

import pytest
import torch

from pivotrl.config.gps import GPSConfig
from pivotrl.config.rl import TinyModelConfig


@pytest.fixture(scope="module")
def ray_node():
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    yield ray.get_runtime_context().get_node_id()
    ray.shutdown()


def _read_in_another_process(weights):
    """What a device actor does with the `GPSWeights` the executor sends it."""
    from pivotrl.engines.weight_sync import opened

    with opened(weights, weights.version) as (w, _, facts):
        sd = dict(w) if isinstance(w, dict) else None
        if sd is None:
            from pivotrl.engines.weight_sync import iter_manifest_tensors

            sd = dict(iter_manifest_tensors(w.to_wire()))
        return facts, {k: t.clone() for k, t in sd.items()}


def test_devices_read_the_version_the_driver_names_from_their_own_process(tmp_path, ray_node):
    import ray

    from pivotrl.engines.weight_sync import GPSWeights
    from pivotrl.gps.state_dict import to_store
    from pivotrl.models.tiny import create_tiny_model, load_tiny_model
    from pivotrl.runtime.params import ParamSource

    path = create_tiny_model(tmp_path / "bf16", TinyModelConfig(dtype="bfloat16"))
    params = ParamSource.create(GPSConfig(transport="ray"), [ray_node])
    try:
        assert params.register_hf("policy", str(path), frozen=False) == 0
        spec = params.store.spec("policy")
        assert {t.dtype for t in spec.tensors} == {"bfloat16"}
        model, _ = load_tiny_model(path, dtype="float32")  # a trainer's fp32 weights, lm_head tied
        sd = {k: v + 1.0 for k, v in model.state_dict().items()}
        params.restore("policy", sd, version=7)  # a resume at policy version 7: GPS version 1
        assert params.version("policy") == 7 and params.store.current_version("policy") == 1
        weights, v = params.weights("policy")
        assert isinstance(weights, GPSWeights) and (weights.gps_version, weights.version, v) == (1, 7, 7)
        facts, got = ray.get(ray.remote(num_cpus=0)(_read_in_another_process).remote(weights))
        assert facts == {"gps_version": 1, "bytes": spec.nbytes, "path": "file"}  # mapped its node's file
        want = to_store(sd, spec)
        assert set(got) == set(want) and "lm_head.weight" not in got  # tied: stored once
        for k in want:
            assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], sd[k].to(torch.bfloat16)), k
        assert params.store.live_versions("policy") == [1]  # the device's lease ended with its read
    finally:
        params.close()


def test_a_single_process_transport_is_refused_with_its_config_path(ray_node):
    from pivotrl.runtime.params import ParamSource

    with pytest.raises(ValueError, match=r"cluster\.gps\.transport='shm'.*allowed: ray"):
        ParamSource.create(GPSConfig(transport="shm"), [ray_node])


def test_a_version_superseded_before_the_device_reads_it_gives_the_newest(tmp_path, ray_node):
    """Nothing is leased while `GPSWeights` travel: if the trainer committed a newer version (and
    the named one was freed) first, the device reads the newest, tagged by the same offset."""
    from pivotrl.engines.weight_sync import opened
    from pivotrl.gps.errors import UnknownVersionError
    from pivotrl.models.tiny import create_tiny_model, load_tiny_model
    from pivotrl.runtime.params import ParamSource

    path = create_tiny_model(tmp_path / "p", TinyModelConfig())
    params = ParamSource.create(GPSConfig(transport="ray"), [ray_node])
    try:
        params.register_hf("policy", str(path), frozen=False)
        params.restore("policy", load_tiny_model(path, dtype="float32")[0].state_dict(), version=10)
        named, v = params.weights("policy")  # GPS version 1 = policy version 10
        sd = {k: t + 1.0 for k, t in load_tiny_model(path, dtype="float32")[0].state_dict().items()}
        params.store.load_state_dict("policy", {k: t for k, t in sd.items() if k in params.store.spec("policy")})
        assert params.store.live_versions("policy") == [2], "the named version is gone"
        with opened(named, v) as (w, loaded, facts):
            assert (loaded, facts["gps_version"], facts["path"]) == (11, 2, "file")
        with pytest.raises(UnknownVersionError):  # never an older version than the one named
            with opened(type(named)(named.store, "policy", 3, 12), 12):
                pass
    finally:
        params.close()
