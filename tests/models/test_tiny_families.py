"""Tiny family checkpoints (no vLLM): each is architecture-true (transformers loads it as its own
architecture, GPS derives the same tensors from its config), has a chat template, and the
bootstrap-sized configs build."""
from __future__ import annotations

import json

import pytest
import torch

from pivotrl.config.rl import TinyModelConfig
from pivotrl.gps.checkpoint import checkpoint_spec
from pivotrl.models.tiny_families import FAMILY_NAMES, family_config, make_tiny_checkpoint

ARCH = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
        "glm4": "Glm4ForCausalLM"}


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_checkpoint_is_architecture_true(family, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = make_tiny_checkpoint(family, tmp_path / family, dtype="bfloat16", seed=0)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [ARCH[family]] and cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]) >= 32
    model = AutoModelForCausalLM.from_pretrained(str(path))
    assert type(model).__name__ == ARCH[family] and model.dtype == torch.bfloat16
    tok = AutoTokenizer.from_pretrained(str(path))
    assert tok.chat_template and tok.encode("7+8=") == [13, 78, 14, 86]
    assert checkpoint_spec(path).family == family


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_family_config_at_bootstrap_sizes(family, tmp_path):
    from transformers import AutoModelForCausalLM

    dims = TinyModelConfig(tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(family_config(family, dims))
    assert type(model).__name__ == ARCH[family]
    assert model.config.hidden_size == dims.hidden_size and model.config.num_hidden_layers == dims.num_layers
    model.save_pretrained(tmp_path / "m")
    assert checkpoint_spec(tmp_path / "m").family == family  # GPS reads what the bootstrap would save


def test_unknown_family():
    with pytest.raises(ValueError, match="unknown tiny model family 'llama'; allowed: qwen2, qwen3, qwen3_moe, glm4"):
        make_tiny_checkpoint("llama", "/tmp/never")


def test_upcycle_copies_the_dense_model_and_keeps_its_mlp():
    from transformers import Qwen2ForCausalLM

    from pivotrl.models.tiny import qwen2_config
    from pivotrl.models.tiny_families import upcycle_to_qwen3_moe

    torch.manual_seed(0)
    dense = Qwen2ForCausalLM(qwen2_config(TinyModelConfig(hidden_size=64, num_heads=2, num_kv_heads=1,
                                                          intermediate_size=96))).eval()
    moe = upcycle_to_qwen3_moe(dense, num_experts=4, experts_per_token=2).eval()
    assert type(moe).__name__ == "Qwen3MoeForCausalLM" and moe.config.num_experts == 4
    dsd, msd = dense.state_dict(), moe.state_dict()
    for k in ("model.embed_tokens.weight", "model.layers.1.self_attn.q_proj.weight", "model.layers.0.input_layernorm.weight"):
        assert torch.equal(dsd[k], msd[k]), k
    gate_up = torch.cat([dsd["model.layers.1.mlp.gate_proj.weight"], dsd["model.layers.1.mlp.up_proj.weight"]])
    assert all(torch.equal(msd["model.layers.1.mlp.experts.gate_up_proj"][e], gate_up) for e in range(4))
    x = torch.randn(1, 5, 64)
    with torch.no_grad():  # each MoE block computes the dense MLP at the start
        got = moe.model.layers[0].mlp(x)
        got = got[0] if isinstance(got, tuple) else got
        assert torch.allclose(got, dense.model.layers[0].mlp(x), atol=1e-6)
    with pytest.raises(ValueError, match="needs a dense Qwen2 model"):
        upcycle_to_qwen3_moe(moe)
