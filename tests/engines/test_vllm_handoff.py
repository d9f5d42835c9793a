"""GPU memory hand-off of `VLLMEngine`, on a recording stand-in for vLLM's AsyncLLM: the call order
of sleep / wake / load, the sleep level per role, and what a failed wake or load leaves behind.

vLLM's CPU build has no sleep mode, so these branches cannot run on the real engine here; the
stand-in records what the engine asks vLLM to do (and checks the weights file it is handed), the
way the CUDA build would receive it. The real CPU engine's restart path is in test_vllm_engine.py;
the real GPU path in the device check (scripts/device_check.sh)."""
from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace

import pytest
import torch

from pivotrl.config.engine import EngineConfig, EngineSpec
from pivotrl.engines.errors import EngineFailedError, EngineLoadError, EngineWakeError
from pivotrl.engines.protocol import GenerationRequest, SamplingParams

pytest.importorskip("transformers")


class RecordingLLM:
    """Just enough of AsyncLLM: every call is appended to `calls`; `fail` names a call to break."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail = fail
        self.loaded: list[dict] = []
        self.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=64, block_size=16),
                                           parallel_config=SimpleNamespace(tensor_parallel_size=1))

    def _record(self, *call) -> None:
        self.calls.append(call)
        if self.fail is not None and call[0] == self.fail.split(":")[0] and (
                ":" not in self.fail or self.fail.split(":")[1] in map(str, call[1:])):
            raise RuntimeError(f"injected failure in {self.fail}")

    async def sleep(self, level: int = 1) -> None:
        self._record("sleep", level)

    async def wake_up(self, tags=None) -> None:
        self._record("wake_up", tuple(tags or ()))

    async def reset_prefix_cache(self) -> None:
        self._record("reset_prefix_cache")

    async def collective_rpc(self, method: str, args=(), **_):
        if method == "pivot_load_weights_from_file":
            from safetensors.torch import load_file

            got = {}
            for p in args[0]:
                assert os.path.exists(p), "the weights file must exist while the workers read it"
                got.update(load_file(p))
            self.loaded.append(got)
        self._record("collective_rpc", method)
        return [len(self.loaded)]

    async def generate(self, prompt, sp, request_id):
        self._record("generate", request_id)
        await asyncio.Event().wait()  # never finishes: the test aborts or fails it
        yield None

    async def abort(self, ids) -> None:
        self._record("abort", tuple(ids))

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))


@pytest.fixture
def make_engine(tiny_dir):
    made = []

    def make(fail: str | None = None):
        from pivotrl.engines.vllm_engine import VLLMEngine

        llm = RecordingLLM(fail)
        eng = VLLMEngine(tiny_dir, EngineConfig(name="vllm"), client_factory=lambda e: llm, sleep_mode=True)
        made.append(eng)
        return eng, llm

    yield make
    for e in made:
        e.shutdown()


def _sd(seed: float) -> dict[str, torch.Tensor]:
    return {"model.norm.weight": torch.full((64,), seed)}


def _kinds(llm):
    return [c for c in llm.calls if c[0] not in ("generate", "abort", "shutdown")]


def test_policy_sleeps_level2_then_wakes_weights_loads_then_wakes_kv(make_engine):
    eng, llm = make_engine()
    eng.release_memory(level=2)
    assert eng.stats().memory_released
    with pytest.raises(RuntimeError, match="released"):
        eng.submit(GenerationRequest(0, [1, 2, 3], SamplingParams(max_tokens=4)))
    times = eng.reacquire_memory(_sd(0.5), version=7)
    assert _kinds(llm) == [("sleep", 2), ("wake_up", ("weights",)), ("collective_rpc", "pivot_load_weights_from_file"),
                           ("wake_up", ("kv_cache",)), ("reset_prefix_cache",)]
    assert torch.equal(llm.loaded[-1]["model.norm.weight"], _sd(0.5)["model.norm.weight"])
    assert eng.version == 7 and not eng.stats().memory_released
    assert set(times) == {"wake_weights_s", "load_s", "wake_kv_s"} and eng.last_wake == times


def test_level2_without_weights_reloads_the_folder(make_engine, tiny_dir):
    eng, llm = make_engine()
    eng.load_weights(_sd(1.0), version=3)
    eng.release_memory()  # level 2 by default, as the protocol's
    eng.reacquire_memory()
    assert ("sleep", 2) in llm.calls and eng.version == 0  # the folder's weights: the initial version
    assert set(llm.loaded[-1]) >= {"model.norm.weight", "model.embed_tokens.weight"}


def test_frozen_genrm_sleeps_level1_and_wakes_in_place_without_a_load(make_engine):
    eng, llm = make_engine()
    eng.load_weights(_sd(2.0), version=4)
    n_loads = len(llm.loaded)
    eng.release_memory(level=1)
    eng.reacquire_memory()
    assert _kinds(llm)[-4:] == [("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",)),
                                ("reset_prefix_cache",)]
    assert len(llm.loaded) == n_loads and eng.version == 4  # weights back in place, same version


@pytest.mark.parametrize("fail,phase", [("wake_up:('weights',)", "wake_weights"),
                                        ("collective_rpc", "load_weights"),
                                        ("wake_up:('kv_cache',)", "wake_kv_cache")])
def test_a_failed_wake_shuts_the_engine_and_never_serves(make_engine, fail, phase):
    eng, llm = make_engine(fail)
    eng.release_memory(level=2)
    with pytest.raises(EngineWakeError) as e:
        eng.reacquire_memory(_sd(0.1), version=2)
    assert e.value.phase == phase and ("shutdown",) in llm.calls
    assert (("wake_up", ("kv_cache",)) in llm.calls) == (phase == "wake_kv_cache")  # no KV cache before the weights
    with pytest.raises(EngineFailedError, match="failed"):
        eng.submit(GenerationRequest(0, [1, 2], SamplingParams(max_tokens=4)))
    with pytest.raises(EngineWakeError, match="failed earlier"):
        eng.reacquire_memory(_sd(0.1), version=2)


def test_a_failed_load_while_serving_returns_the_live_sequences(make_engine):
    eng, llm = make_engine("collective_rpc")
    eng.submit(GenerationRequest(5, [1, 2, 3], SamplingParams(max_tokens=8), generated=[9, 9]))
    for _ in range(500):  # the request reaches the stand-in on the engine's loop thread
        if any(c[0] == "generate" for c in llm.calls):
            break
        time.sleep(0.01)
    with pytest.raises(EngineLoadError) as e:
        eng.load_weights(_sd(0.3), version=1)
    assert list(e.value.aborted) == [5] and list(e.value.aborted[5]) == [9, 9]
    assert ("shutdown",) in llm.calls and eng.version == 0
    with pytest.raises(EngineFailedError):
        eng.submit(GenerationRequest(6, [1], SamplingParams(max_tokens=2)))


def test_bad_sleep_level_is_rejected(make_engine):
    eng, _ = make_engine()
    with pytest.raises(ValueError, match="level must be 1 or 2"):
        eng.release_memory(level=3)
    with pytest.raises(ValueError, match="EngineSpec.sleep_level=0"):
        EngineSpec(EngineConfig(), sleep_level=0)
    with pytest.raises(ValueError, match="role must be one of"):
        EngineSpec.for_role(EngineConfig(), "train")


def test_engine_args_take_the_specs_platform_choices_and_skip_the_folder_for_gps_weights(tiny_dir):
    """What vLLM is asked for: a runtime spec's choices as made (CUDA graphs and expert
    parallelism for a GPU judge of 2 devices); bare settings get this platform's (the CPU build:
    eager, no EP); a cold engine that takes GPS weights next starts with `load_format="dummy"`; and
    CUDA graphs' memory is counted inside `gpu_memory_utilization`."""
    from pivotrl.engines.vllm_engine import VLLMEngine

    llm = RecordingLLM()
    judge = EngineSpec.for_role(EngineConfig(name="vllm"), "reward", 2, accelerator="cuda")
    eng = VLLMEngine(tiny_dir, judge.settings, client_factory=lambda e: llm, sleep_mode=True, tensor_parallel_size=2,
                     read_weights=False)
    try:
        a = eng.engine_args()
        assert (a.enforce_eager, a.enable_expert_parallel, a.tensor_parallel_size) == (False, True, 2)
        assert a.load_format == "dummy" and a.gpu_memory_utilization == 0.85
        assert os.environ["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] == "1"
    finally:
        eng.shutdown()
    eng = VLLMEngine(tiny_dir, EngineConfig(name="vllm"), client_factory=lambda e: RecordingLLM(), sleep_mode=True,
                     tensor_parallel_size=2)
    try:
        a = eng.engine_args()
        assert (a.enforce_eager, a.enable_expert_parallel, a.load_format) == (True, False, "auto")
    finally:
        eng.shutdown()


@pytest.mark.parametrize("before", [None, "1"])
def test_the_one_process_cpu_engine_flag_is_set_only_while_an_engine_starts(monkeypatch, before):
    """`vllm_client.one_process_cpu_engine`: the flag is "0" inside, and the caller's own value
    (or none) comes back after, so a synchronous vLLM engine built later is not run in-process."""
    from pivotrl.engines.vllm_client import one_process_cpu_engine

    key = "VLLM_ENABLE_V1_MULTIPROCESSING"
    if before is None:
        monkeypatch.delenv(key, raising=False)
    else:
        monkeypatch.setenv(key, before)
    with one_process_cpu_engine():
        assert os.environ[key] == "0"
    assert os.environ.get(key) == before

