"""Protocol types, engine config and registry: validation errors and bad model folders."""
from __future__ import annotations

import json
import math

import pytest

from pivotrl.config.engine import EngineConfig
from pivotrl.engines import create_engine, engine_names, resolve_engine_name
from pivotrl.engines.protocol import EngineStats, GenerationRequest, InferenceEngine, SamplingParams
from pivotrl.engines.registry import ENGINES, engine_class


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature=math.inf), "temperature"),
    (dict(temperature="1"), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=-0.5), "top_p"),
    (dict(top_p=1.0001), "top_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=-3), "max_tokens"),
    (dict(max_tokens=2.5), "max_tokens"),
    (dict(seed=-1), "seed"),
    (dict(stop_token_ids=(3, -1)), "stop_token_ids"),
])
def test_sampling_params_out_of_range_names_field(kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**kwargs)


def test_sampling_params_edges_are_valid():
    sp = SamplingParams(temperature=0, top_p=1.0, max_tokens=1, seed=0, stop_token_ids=[5, 6])
    assert sp.greedy and sp.stop_token_ids == (5, 6)
    assert not SamplingParams(temperature=1e-6, top_p=1e-9).greedy


def test_sampling_params_error_states_allowed_range():
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        SamplingParams(top_p=2)
    with pytest.raises(ValueError, match=">= 0"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match=">= 1"):
        SamplingParams(max_tokens=0)


def test_generation_request():
    with pytest.raises(ValueError, match="prompt_ids"):
        GenerationRequest(3, [])
    fresh = GenerationRequest(1, [1, 2], SamplingParams(max_tokens=5))
    assert fresh.resumed is False and fresh.remaining == 5
    resumed = GenerationRequest(1, [1, 2], SamplingParams(max_tokens=5), generated=[7, 8])
    assert resumed.resumed is True and resumed.remaining == 3


def test_engine_stats_free_kv():
    assert EngineStats(running=2, waiting=0, kv_tokens=30, kv_capacity_tokens=100, version=0).free_kv_tokens == 70
    assert EngineStats(running=2, waiting=0, kv_tokens=130, kv_capacity_tokens=100, version=0).free_kv_tokens == 0


def test_unknown_engine_name_lists_allowed():
    for call in (lambda: resolve_engine_name("tgi"), lambda: create_engine("/nonexistent", "tgi"),
                 lambda: EngineConfig(name="tgi")):
        with pytest.raises(ValueError, match=r"^engine.name='tgi' is invalid; allowed: auto \| cpu \| vllm$"):
            call()


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_num_seqs=0), "max_num_seqs"), (dict(kv_capacity_tokens=0), "kv_capacity_tokens"),
    (dict(dtype="int8"), "dtype"), (dict(max_model_len=1), "max_model_len"),
    (dict(vllm_kv_cache_gib=0), "vllm_kv_cache_gib"), (dict(num_threads=0), "num_threads"),
    (dict(vllm_gpu_memory_utilization=1.5), "vllm_gpu_memory_utilization"),
])
def test_engine_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=f"engine.{field}"):
        EngineConfig(**kwargs)


def test_registry_contract():
    """Every registered engine class implements the protocol; auto resolves to a registered one."""
    assert set(engine_names()) == {"auto", *ENGINES}
    assert resolve_engine_name("auto") in ENGINES
    from pivotrl.engines.cpu_engine import CPUEngine

    assert engine_class("cpu") is CPUEngine
    for name in ENGINES:
        try:
            cls = engine_class(name)
        except ImportError:  # pragma: no cover - the class module imports lazily; vllm is optional
            continue
        for method in ("submit", "step", "has_unfinished", "snapshot", "new_tokens", "abort", "generate",
                       "load_weights", "stats", "release_memory", "reacquire_memory", "shutdown"):
            assert callable(getattr(cls, method)), (name, method)


def test_cpu_engine_satisfies_protocol(tiny_dir):
    eng = create_engine(tiny_dir, EngineConfig(name="cpu"))
    assert isinstance(eng, InferenceEngine) and eng.name == "cpu"


def test_bad_model_folders_name_the_folder(tmp_path, tiny_dir):
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match="missing"):
        create_engine(missing, "cpu")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"'.*empty'.*config.json"):
        create_engine(empty, "cpu")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": "wide"}))
    with pytest.raises(ValueError, match=r"model folder '.*broken' does not load"):
        create_engine(broken, "cpu")
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((tiny_dir / "config.json").read_text())
    with pytest.raises(ValueError, match=r"model folder '.*no_weights' does not load"):
        create_engine(no_weights, "cpu")
    bad_tok = tmp_path / "bad_tok"
    bad_tok.mkdir()
    with pytest.raises(ValueError, match=r"tokenizer folder '.*bad_tok'"):
        create_engine(tiny_dir, "cpu", tokenizer_path=bad_tok)


def test_token_deltas_are_flat_and_pickle_with_unknown_logprobs():
    import pickle

    from pivotrl.engines.protocol import TokenDeltas

    d = TokenDeltas()
    d.add(4, [1, 2], [-0.5, -0.25])
    d.add(9, [3], None)
    d.add(5, [], [])
    back = pickle.loads(pickle.dumps(d))
    assert (len(back), back.tokens) == (3, 3) and list(back.ends) == [2, 3, 3]
    got = dict(back.items())
    assert got[4] == [1, 2] and got[4].logprobs == [-0.5, -0.25]
    assert got[9] == [3] and got[9].logprobs is None and got[5] == []
    assert back.get(9) == [3] and back.get(7) is None
    assert list(back) == [4, 9, 5] and 9 in back and 7 not in back
    with pytest.raises(ValueError, match="seq 1 has 1 log-probs for 2 tokens"):
        TokenDeltas().add(1, [1, 2], [0.0])
