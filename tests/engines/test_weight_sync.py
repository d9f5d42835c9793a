"""Weight sync without the driver: a trainer's shards written into GPS row by row equal its full
state dict; engines load their node's GPS copy from the mapped file (or fall back to a read)."""
from __future__ import annotations

import json

import pytest
import torch

from pivotrl.config.engine import EngineConfig
from pivotrl.config.gps import GPSConfig
from pivotrl.config.trainer import TrainerSpec
from pivotrl.trainer.trainer import Trainer
from pivotrl.engines.weight_sync import fsdp_row_range, load_from_gps, publish_shards
from pivotrl.gps.layout import Layout, ModelSpec
from pivotrl.gps.planner import Device
from pivotrl.gps.store import GlobalParameterStore
from pivotrl.models.tiny import TinyModelConfig, create_tiny_model

TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=96,
                       max_position_embeddings=96, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return create_tiny_model(tmp_path_factory.mktemp("sync") / "m", TINY, seed=4)


def _spec(folder, dtype):
    return ModelSpec.from_config(json.loads((folder / "config.json").read_text()), dtype=dtype)


def test_fsdp_row_range_is_torch_chunk():
    for n in (1, 5, 7, 64):
        for w in (1, 2, 3, 4):
            got = [fsdp_row_range(n, w, r) for r in range(w)]
            want = []
            start = 0
            for piece in torch.arange(n).chunk(w):
                want.append((start, start + len(piece)))
                start += len(piece)
            want += [(n, n)] * (w - len(want))
            assert got == want, (n, w)


def _train_once(tr):
    from tests.trainer.test_trainer import _batch

    return tr.step(_batch(2))


@pytest.mark.parametrize("dtype,tied", [("float32", False), ("bfloat16", False), ("float32", True)])
def test_publish_shards_equals_the_full_state_dict(folder, tmp_path, dtype, tied):
    import dataclasses

    if tied:  # GPS keeps a tied head once (as the embedding); the trainer's lm_head is skipped
        folder = create_tiny_model(tmp_path / "tied", dataclasses.replace(TINY, tie_word_embeddings=True), seed=5)
    store = GlobalParameterStore(GPSConfig())
    try:
        store.register("policy", spec=_spec(folder, dtype))
        with Trainer(TrainerSpec(lr=1e-2, device="cpu", staleness=0), folder) as tr:
            _train_once(tr)
            v = publish_shards(tr.worker, store, "policy")
            full = tr.worker.full_state_dict(dtype)
        got = store.read("policy", [Device(0, 0)], Layout()).shards[Device(0, 0)]
        if tied:
            full.pop("lm_head.weight", None)
        assert v == 0 and set(got) == set(full)
        for k in got:
            assert torch.equal(got[k], full[k]), k
    finally:
        store.close()


def test_engines_load_their_nodes_gps_file_or_fall_back_to_a_read(folder, ray_store):
    from pivotrl.engines.cpu_engine import CPUEngine

    ray_store.register("policy", spec=_spec(folder, "float32"))
    with Trainer(TrainerSpec(lr=5e-2, device="cpu", staleness=0), folder) as tr:
        _train_once(tr)
        publish_shards(tr.worker, ray_store, "policy")  # the driver maps node 0's file: local row writes
        full = tr.worker.full_state_dict("float32")
    eng = CPUEngine(folder, EngineConfig(name="cpu", num_threads=1))
    ev = load_from_gps(eng, ray_store, "policy", node=0, engine_version=5)
    assert ev["path"] == "file" and ev["version"] == 0.0 and ev["bytes"] > 0 and ev["seconds"] > 0
    own = eng.model.state_dict()
    assert eng.version == 5 and all(torch.equal(own[k], full[k]) for k in full)
    assert ray_store.live_versions("policy") == [0]  # the lease ended with the load
    # the in-process transport has no file to map: the same call reads instead
    local = GlobalParameterStore(GPSConfig())
    try:
        local.register("policy", spec=_spec(folder, "float32"), state_dict=full)
        eng2 = CPUEngine(folder, EngineConfig(name="cpu", num_threads=1))
        ev2 = load_from_gps(eng2, local, "policy", node=0)
        assert ev2["path"] == "read" and all(torch.equal(eng2.model.state_dict()[k], full[k]) for k in full)
    finally:
        local.close()


def _rank_publish(rank: int, world: int, init: str, address: str, store_blob: bytes, folder: str, out: str) -> None:
    """One trainer rank in its own process: join Ray and the gloo group, build the FSDP2 worker,
    write its shards into the shared GPS (no gather), report the version."""
    import ray
    import torch.distributed as dist

    from pivotrl.trainer.trainer_worker import TrainerWorker
    from pivotrl.trainer.dist import init_process_group

    torch.set_num_threads(1)
    ray.init(address=address, logging_level="ERROR")
    store = ray.cloudpickle.loads(store_blob)
    init_process_group(rank, world, init, "gloo", 120.0)
    try:
        worker = TrainerWorker(TrainerSpec(device="cpu", world_size=world), folder)
        v = publish_shards(worker, store, "policy")
        full = worker.full_state_dict("float32")  # collective; rank 0 gets it
        if rank == 0:
            torch.save({"version": v, "full": full}, out)
    finally:
        dist.destroy_process_group()
        ray.shutdown()


def test_two_ranks_publish_their_own_rows_into_a_shared_gps(folder, ray_store, tmp_path):
    """Two spawned FSDP2 ranks (gloo), each holding the Ray GPS handle, write only their own dim-0
    rows; the committed version equals the gathered state dict, tensor for tensor."""
    import ray

    from pivotrl.trainer.dist import rank_process

    if "policy" not in ray_store.models():
        ray_store.register("policy", spec=_spec(folder, "float32"))
    before = ray_store.current_version("policy")
    blob = ray.cloudpickle.dumps(ray_store)
    address = ray.get_runtime_context().gcs_address
    out = str(tmp_path / "rank0.pt")
    procs = [rank_process(_rank_publish, (r, 2, f"file://{tmp_path}/pg", address, blob, str(folder), out))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    res = torch.load(out)
    assert res["version"] == before + 1 == ray_store.current_version("policy")
    got = ray_store.read("policy", [Device(0, 0)], Layout()).shards[Device(0, 0)]
    assert set(got) == set(res["full"])
    for k in got:
        assert torch.equal(got[k], res["full"][k]), k


def test_manifest_tensors_are_views_of_the_file(tmp_path):
    from pivotrl.engines.weight_sync import iter_manifest_tensors

    a = torch.arange(12, dtype=torch.float32).view(3, 4)
    b = torch.arange(6, dtype=torch.bfloat16)
    raw = bytes(a.view(torch.uint8).flatten().tolist()) + bytes(16) + bytes(b.view(torch.uint8).tolist())
    path = tmp_path / "buf"
    path.write_bytes(raw)
    wire = {"path": str(path), "nbytes": len(raw), "version": 1,
            "entries": [["a", 0, [3, 4], "float32"], ["b", 64, [6], "bfloat16"]]}
    got = dict(iter_manifest_tensors(wire))
    assert torch.equal(got["a"], a) and torch.equal(got["b"], b) and got["b"].dtype == torch.bfloat16
    assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()  # one mapping


class _Shard0:
    """What `rows_in_store` sees of an FSDP2 parameter: the global shape, `Shard(0)`, the local rows."""

    def __init__(self, full: torch.Tensor, world: int, rank: int) -> None:
        from torch.distributed.tensor import Shard

        self.shape, self.placements = full.shape, (Shard(0),)
        a, b = fsdp_row_range(full.shape[0], world, rank)
        self._local = full[a:b]

    def to_local(self) -> torch.Tensor:
        return self._local


def test_fused_moe_experts_are_written_as_whole_per_expert_tensors_by_the_rank_holding_them():
    """transformers 5 fuses a layer's experts into (E, 2I, H) and (E, H, I); GPS stores one tensor
    per expert. Each FSDP2 rank holds whole experts, so it writes each of them whole; over the ranks
    every per-expert tensor is written once, equal to the split of the full parameter."""
    from pivotrl.engines.weight_sync import rows_in_store
    from pivotrl.gps.layout import TensorSpec
    from pivotrl.gps.state_dict import split_fused_experts

    E, I, H, world = 5, 3, 4, 2
    gate_up = torch.randn(E, 2 * I, H)
    down = torch.randn(E, H, I)
    fused = {"model.layers.0.mlp.experts.gate_up_proj": gate_up, "model.layers.0.mlp.experts.down_proj": down}
    want = split_fused_experts(fused)
    spec = ModelSpec(tuple(TensorSpec(n, tuple(t.shape), "float32") for n, t in want.items()), num_layers=1, head_dim=4)
    written: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for rank in range(world):
        for name, full in fused.items():
            for sname, start, rows in rows_in_store(name, _Shard0(full, world, rank), spec, world, rank):
                written.setdefault(sname, []).append((start, rows))
    assert set(written) == set(want) and len(want) == 3 * E
    for sname, parts in written.items():
        assert len(parts) == 1 and parts[0][0] == 0 and torch.equal(parts[0][1], want[sname]), sname
    assert rows_in_store("lm_head.weight", torch.zeros(2, 4), spec, 1, 0) == []  # not stored: skipped


@pytest.mark.slow
@pytest.mark.vllm
def test_a_cold_vllm_engine_of_two_ranks_skips_its_folder_and_takes_its_shards_from_gps(ray_store, tmp_path):
    """A policy engine of TP=2 on vLLM's CPU build, started with `load_format="dummy"` (its
    folder's weights never read), loads another checkpoint from its node's GPS file, each rank
    narrowing views of the file to its own shard: greedy then equals transformers on that
    checkpoint. (The CUDA build runs the same worker code: `weight_sync` module docstring.)"""
    from pivotrl.engines.vllm_engine import VLLMEngine, vllm_available
    from pivotrl.gps.hf_io import import_hf
    from pivotrl.models.tiny_families import make_tiny_checkpoint
    from tests.engines.conftest import hf_greedy

    if not vllm_available():
        pytest.skip("vLLM is not installed")
    a = make_tiny_checkpoint("qwen2", tmp_path / "a", seed=1)
    b = make_tiny_checkpoint("qwen2", tmp_path / "b", seed=2)
    import_hf(ray_store, "tp2", b)
    eng = VLLMEngine(a, EngineConfig(name="vllm", max_num_seqs=8, num_threads=1, vllm_kv_cache_gib=1),
                     tensor_parallel_size=2, read_weights=False)
    try:
        assert eng.tensor_parallel_size == 2 and eng.engine_args().load_format == "dummy"
        ev = load_from_gps(eng, ray_store, "tp2", node=0, engine_version=5)
        assert ev["path"] == "file"
        prompts = [eng.tokenizer.encode(t) for t in ("7+8=", "hello there", "Tom has 3 apples")]
        from pivotrl.engines.protocol import GenerationRequest, SamplingParams

        out = eng.generate([GenerationRequest(i, p, SamplingParams(temperature=0, max_tokens=12))
                            for i, p in enumerate(prompts)])
        assert all(c.version == 5 for c in out)
        for c, p in zip(out, prompts):
            assert c.token_ids == hf_greedy(b, p, 12), c.seq_id
    finally:
        eng.shutdown()
        ray_store.unregister("tp2")
