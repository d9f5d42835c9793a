"""Every family GPS serves on the CPU engine (issue 22 item 3): its checkpoint-format weights (one
tensor per MoE expert, as GPS and vLLM hold them) load into the engine's transformers module, and
greedy output then equals transformers' own generate on that checkpoint; a checkpoint the module
cannot take is found at start, from the config and the tensor index alone (`unloadable_tensors`).
(The same families on vLLM: tests/models/test_tiny_families_vllm.py.)"""
from __future__ import annotations

import pytest
import torch

from pivotrl.config.engine import EngineConfig
from pivotrl.engines.cpu_engine import CPUEngine
from pivotrl.engines.hf_model import unloadable_tensors
from pivotrl.engines.protocol import GenerationRequest, SamplingParams
from pivotrl.gps.checkpoint import tensor_index
from pivotrl.models.tiny_families import FAMILY_NAMES, make_tiny_checkpoint

PROMPTS = [[5, 17, 30, 41, 8], [60, 61, 62]]


def _greedy(path, prompt: list[int], n: int) -> list[int]:
    """The reference: transformers' own module of the checkpoint, argmax n times, no cache, no EOS."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_checkpoint_weights_load_into_the_cpu_engine(family, tmp_path):
    """Issue 22: a Qwen3-MoE judge on cluster=local died with `load_weights: 24 unknown parameter
    names ...experts.0.gate_proj.weight`; GLM-4 did not decode on the CPU engine at all."""
    from safetensors.torch import load_file

    a = make_tiny_checkpoint(family, tmp_path / "a", dtype="bfloat16", seed=1)
    b = make_tiny_checkpoint(family, tmp_path / "b", dtype="bfloat16", seed=2)
    weights = {}
    for f in sorted(b.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    if family == "qwen3_moe":
        assert any(".mlp.experts.0.gate_proj.weight" in k for k in weights), "per-expert tensors, as in GPS"
    eng = CPUEngine(a, EngineConfig(name="cpu", num_threads=1, dtype="bfloat16"))
    eng.load_weights(weights, 1)
    got = eng.generate([GenerationRequest(i, p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
                        for i, p in enumerate(PROMPTS)])
    want = [_greedy(b, p, 8) for p in PROMPTS]
    assert [c.token_ids[:8] for c in got] == want
    assert unloadable_tensors(a, tensor_index(a)) == []


def test_a_checkpoint_the_module_cannot_take_is_named(tmp_path):
    a = make_tiny_checkpoint("qwen3_moe", tmp_path / "a")
    index = tensor_index(a)
    renamed = {k.replace("experts.1.", "experts.one."): v for k, v in index.items()}
    reshaped = {k: ((v[0][0] + 1, *v[0][1:]), v[1]) if k.endswith("embed_tokens.weight") else v for k, v in index.items()}
    (why,) = unloadable_tensors(a, renamed)
    assert "experts of gate_proj are [0, 2, 3" in why
    assert unloadable_tensors(a, reshaped) == ["model.embed_tokens.weight"]


def test_inference_models_attend_without_copying_kv_heads_and_give_sdpas_numbers(tiny_dir):
    """`load_hf_model` loads with `SDPA_GQA` (grouped key/value heads left to SDPA, not repeated):
    on a left-padded masked batch its logits are exactly transformers' `sdpa` module's."""
    from transformers import AutoModelForCausalLM

    from pivotrl.engines.hf_model import SDPA_GQA, load_hf_model

    model = load_hf_model(tiny_dir)
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_dir), attn_implementation="sdpa").eval()
    assert model.config._attn_implementation == SDPA_GQA
    assert model.config.num_attention_heads > model.config.num_key_value_heads  # the grouped case
    valid = torch.tensor([[False, False, True, True, True], [True, True, True, True, True]])
    mask = (torch.ones(5, 5, dtype=torch.bool).tril()[None] & valid[:, None, :]) | (
        torch.eye(5, dtype=torch.bool)[None] & ~valid[:, :, None])
    ids = torch.tensor([[0, 0, 7, 8, 9], [3, 4, 5, 6, 7]])
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask[:, None], position_ids=pos).logits
        want = ref(input_ids=ids, attention_mask=mask[:, None], position_ids=pos).logits
    assert torch.equal(got[valid], want[valid])
