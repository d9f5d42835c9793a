"""`repack_after_reload`: `repack_cpu_moe` imports vLLM's CPU-MoE module only on the CPU build: off
it (CUDA) nothing is imported, so a build that lacks the module still loads weights; on the CPU
build it repacks each CPU MoE layer, and a missing module there is an error naming it.
`repack_cpu_embeddings` processes every embedding and LM head again on the CPU build (a tied LM
head keeps the packed weights of the first load otherwise), nothing elsewhere. (On vLLM itself:
`tests/engines/test_vllm_engine.py`'s tied-model reload.)"""
from __future__ import annotations

import sys
import types

import pytest

pytest.importorskip("vllm")
from vllm.platforms import current_platform  # noqa: E402

from pivotrl.models import vllm_reload  # noqa: E402
from pivotrl.models.vllm_reload import CPU_MOE_MODULE, repack_after_reload, repack_cpu_moe  # noqa: E402


class _Experts:
    def __init__(self):
        self.repacked = []

    def process_weights_after_loading(self, module):
        self.repacked.append(module)


class _Model:
    """`model.modules()` with one MoE layer whose kernel holds `experts`, and one dense layer."""

    def __init__(self, experts):
        moe = types.SimpleNamespace(quant_method=types.SimpleNamespace(
            moe_kernel=types.SimpleNamespace(fused_experts=experts)))
        self._mods = [moe, types.SimpleNamespace(quant_method=None)]

    def modules(self):
        return iter(self._mods)


@pytest.fixture
def fake_cpu_moe(monkeypatch):
    """vLLM's CPU-MoE module replaced by one whose expert class is `_Experts`."""
    mod = types.ModuleType(CPU_MOE_MODULE)
    mod.CPUUnquantizedExperts = _Experts
    monkeypatch.setitem(sys.modules, CPU_MOE_MODULE, mod)
    return mod


def test_off_the_cpu_build_nothing_is_imported_and_a_load_goes_on(monkeypatch):
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    monkeypatch.setitem(sys.modules, CPU_MOE_MODULE, None)  # `import` of it now raises ImportError
    experts = _Experts()
    assert repack_cpu_moe(_Model(experts)) == 0
    assert experts.repacked == []


def test_on_the_cpu_build_every_cpu_moe_layer_is_repacked(monkeypatch, fake_cpu_moe):
    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)
    experts = _Experts()
    model = _Model(experts)
    assert repack_cpu_moe(model) == 1
    assert experts.repacked == [model._mods[0]]


def test_on_the_cpu_build_a_missing_module_is_an_error_naming_it(monkeypatch):
    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)
    monkeypatch.setitem(sys.modules, CPU_MOE_MODULE, None)
    with pytest.raises(ImportError, match=CPU_MOE_MODULE.replace(".", r"\.")):
        repack_cpu_moe(_Model(_Experts()))


def test_the_platform_check_is_vllms_own():
    assert vllm_reload._on_cpu_platform() is bool(current_platform.is_cpu())


def _embedding_model(monkeypatch):
    """A model with an embedding, a tied LM head (both CPU-packed) and a linear; records which
    modules were processed again."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    seen = []
    monkeypatch.setattr(UnquantizedEmbeddingMethod, "process_weights_after_loading", lambda self, m: seen.append(m))
    method = UnquantizedEmbeddingMethod()
    embed = types.SimpleNamespace(quant_method=method, cpu_linear=object())
    lm_head = types.SimpleNamespace(quant_method=method, cpu_linear=object())
    linear = types.SimpleNamespace(quant_method=object(), cpu_linear=object())
    model = types.SimpleNamespace(modules=lambda: iter([embed, lm_head, linear]))
    return model, seen, [embed, lm_head]


def test_on_the_cpu_build_every_embedding_and_lm_head_is_packed_again(monkeypatch, fake_cpu_moe):
    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)
    model, seen, packed = _embedding_model(monkeypatch)
    assert repack_after_reload(model) == {"moe_layers": 0, "embeddings": 2}
    assert seen == packed


def test_off_the_cpu_build_no_embedding_is_touched(monkeypatch):
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    model, seen, _ = _embedding_model(monkeypatch)
    assert repack_after_reload(model) == {"moe_layers": 0, "embeddings": 0} and seen == []


@pytest.mark.slow
@pytest.mark.vllm
def test_a_tied_model_reloaded_in_place_decodes_the_new_weights(tmp_path):
    """On vLLM's CPU build itself (one engine start): an engine started on tied tiny model A takes
    B's weights through the worker extension and then scores tokens as transformers does on B (a
    stale LM head would keep A's). The models are the bootstrap's shape: `tie_word_embeddings`."""
    import torch
    from transformers import AutoModelForCausalLM

    from pivotrl.config.engine import EngineConfig
    from pivotrl.engines.protocol import GenerationRequest, SamplingParams
    from pivotrl.engines.vllm_engine import VLLMEngine
    from pivotrl.models.tiny import TinyModelConfig, create_tiny_model

    cfg = TinyModelConfig(tie_word_embeddings=True)
    a, b = (create_tiny_model(tmp_path / n, cfg, seed=s) for n, s in (("a", 1), ("b", 2)))
    eng = VLLMEngine(a, EngineConfig(name="vllm", dtype="float32", max_num_seqs=8, num_threads=1, vllm_kv_cache_gib=1))
    try:
        prompts = [eng.tokenizer.encode(t) for t in ("7+8=", "hello there", "Tom has 3 apples")]
        eng.load_weights(AutoModelForCausalLM.from_pretrained(str(b)).state_dict(), 1)
        out = eng.generate([GenerationRequest(i, p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
                            for i, p in enumerate(prompts)])
    finally:
        eng.shutdown()
    worst = {}
    for name, path in (("a", a), ("b", b)):
        m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        gaps = []
        for p, c in zip(prompts, out):
            with torch.no_grad():
                logits = m(torch.tensor([p + c.token_ids])).logits[0, len(p) - 1:-1]
            lp = torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
            gaps.append(float((lp - torch.tensor(c.logprobs, dtype=torch.float64)).abs().max()))
        worst[name] = max(gaps)
    assert worst["b"] < 2e-3 < worst["a"], worst  # fp32 on both sides: the loaded weights', not A's
