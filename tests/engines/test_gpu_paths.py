"""The GPU-only branches of issue 10, for a machine with CUDA (skipped without it; the device
check `scripts/device_check.sh` runs the same paths and records their figures): the trainer's bf16
path, offload that empties the allocator cache and reuses pinned buffers, vLLM's real sleep levels
and three-step wake, and the GPS file load into vLLM's GPU workers."""
from __future__ import annotations

import json
import random

import pytest
import torch

from pivotrl.config.engine import EngineConfig
from pivotrl.config.trainer import TrainerSpec
from pivotrl.engines.protocol import GenerationRequest, SamplingParams

pytestmark = pytest.mark.gpu


def _batch(n, vocab, version=0):
    from pivotrl.trainer.train_batch import TrainBatch

    rng = random.Random(0)
    return TrainBatch(prompt_ids=[[rng.randrange(4, vocab) for _ in range(16)] for _ in range(n)],
                      response_ids=[[rng.randrange(4, vocab) for _ in range(48)] for _ in range(n)],
                      versions=[version] * n, rewards=[rng.random() for _ in range(n)], group_ids=[i // 4 for i in range(n)])


def test_bf16_trainer_offload_empties_the_cache_and_reuses_pinned_buffers(tiny_dir):
    from pivotrl.trainer.trainer import Trainer

    cfg = TrainerSpec(device="cuda", param_dtype="bfloat16", gradient_checkpointing=True, logprob_chunk_tokens=32,
                        micro_batch_tokens=256, publish_dtype="bfloat16")
    with Trainer(cfg, tiny_dir) as tr:
        tr.step(_batch(8, 128))
        info = tr.offload()
        assert info["cache_emptied"] == 1.0 and torch.cuda.memory_reserved() < 64 << 20
        tr.reload()
        again = tr.offload()
        assert again["host_allocations"] == 0.0
        tr.reload()
        assert all(v.dtype == torch.bfloat16 for v in tr.state_dict().values())


@pytest.fixture(scope="module")
def gpu_engine(tiny_dir):
    from pivotrl.engines.vllm_engine import VLLMEngine

    eng = VLLMEngine(tiny_dir, EngineConfig(name="vllm", vllm_gpu_memory_utilization=0.2, max_num_seqs=16))
    assert eng.sleep_mode
    yield eng
    eng.shutdown()


def _greedy(eng, base):
    reqs = [GenerationRequest(base + i, [5 + i, 6, 7], SamplingParams(temperature=0, max_tokens=12)) for i in range(4)]
    return [c.token_ids for c in eng.generate(reqs)]


def test_vllm_sleep_levels_free_memory_and_wake_in_three_steps(gpu_engine, tiny_dir):
    from transformers import AutoModelForCausalLM

    ref = _greedy(gpu_engine, 0)
    free0 = torch.cuda.mem_get_info()[0]
    gpu_engine.release_memory(level=1)
    assert torch.cuda.mem_get_info()[0] > free0
    t = gpu_engine.reacquire_memory()
    assert set(t) == {"wake_weights_s", "load_s", "wake_kv_s"} and _greedy(gpu_engine, 100) == ref
    gpu_engine.release_memory(level=2)
    sd = AutoModelForCausalLM.from_pretrained(str(tiny_dir)).state_dict()
    gpu_engine.reacquire_memory(sd, version=3)
    assert gpu_engine.version == 3 and _greedy(gpu_engine, 200) == ref


def test_vllm_gpu_workers_load_the_gps_file(gpu_engine, tiny_dir):
    import ray

    from pivotrl.config.gps import GPSConfig
    from pivotrl.engines.weight_sync import load_from_gps
    from pivotrl.gps.ray_transport import make_ray_store
    from transformers import AutoModelForCausalLM

    ref = _greedy(gpu_engine, 300)
    ray.init(address="local", num_cpus=1, resources={"gps_node_0": 1}, include_dashboard=False)
    store = make_ray_store(GPSConfig(transport="ray", ray_node_resource="gps_node_{}"), 1)
    try:
        store.register("policy", json.loads((tiny_dir / "config.json").read_text()),
                       state_dict=AutoModelForCausalLM.from_pretrained(str(tiny_dir)).state_dict())
        ev = load_from_gps(gpu_engine, store, "policy", node=0, engine_version=4)
        assert ev["path"] == "file" and gpu_engine.version == 4 and _greedy(gpu_engine, 400) == ref
    finally:
        store.close()
        ray.shutdown()
