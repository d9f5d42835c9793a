"""Tiny, architecture-true, random-weight checkpoints of every model family GPS supports.

Owns: one small `transformers` config per family (`TINY_FAMILIES`: Qwen2, Qwen3, Qwen3-MoE,
GLM-4), writing it as a Hugging Face folder (safetensors in the checkpoint's own layout, e.g. one
tensor per MoE expert) with the project's character tokenizer and a family-style chat template
(system turn, and Qwen3's `enable_thinking=False` empty think block), and nothing else. Used by the
GPS/vLLM family tests and usable by the bootstrap (`make_tiny_checkpoint(family, path)`).

Sizes: head_dim 32 (vLLM's CPU attention rejects 16); 8 query / 4 KV heads where the family allows,
so TP 1, 2 and 4 all divide the heads; vocabulary 128 (the tokenizer's ids and TP 4 both fit);
`max_position_embeddings` 512 so vLLM sizes a small KV cache. `initializer_range` 0.1 (transformers'
default is 0.02): random logits then have clear maxima, so greedy decoding is not decided by
rounding between two engines.

Public API:
    FAMILY_NAMES: tuple of family names (keys of pivotrl.gps.families.FAMILIES used here)
    JUDGE_FAMILIES: families only a frozen judge uses, without GPS rules (Qwen3.5-MoE)
    tiny_config(family, dtype="float32") -> transformers.PretrainedConfig
    family_config(family, dims: TinyModelConfig) -> transformers.PretrainedConfig
        the family's config at the bootstrap's model dimensions (for a bootstrap that builds a
        GenRM of another family: `AutoModelForCausalLM.from_config(family_config(...))`)
    family_tokenizer() -> PreTrainedTokenizerFast   (char tokenizer + FAMILY_CHAT_TEMPLATE)
    make_tiny_checkpoint(family, path, dtype="float32", seed=0) -> Path
    upcycle_to_qwen3_moe(dense, num_experts=8, experts_per_token=2) -> Qwen3MoeForCausalLM
        (the bootstrap's MoE GenRM stage starts from it: `bootstrap_derived.py`)
        a Qwen3-MoE model started from a trained dense Qwen2 model (see its docstring)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pivotrl.models.tiny import save_model_folder
from pivotrl.models.tokenizer import build_tokenizer

#: Rendered like the char tokenizer's template, plus what real chat templates of these families
#: do at the generation prompt: Qwen3's `enable_thinking=False` pre-fills an empty think block.
FAMILY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|eos|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)

_COMMON = dict(vocab_size=128, num_hidden_layers=2, max_position_embeddings=512, tie_word_embeddings=False,
               initializer_range=0.1, rope_theta=10000.0)

TINY_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    # family -> (transformers config class name, fields); Qwen2 derives head_dim from hidden/heads
    "qwen2": ("Qwen2Config", dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=4,
                                  intermediate_size=256, use_sliding_window=False)),
    "qwen3": ("Qwen3Config", dict(hidden_size=128, head_dim=32, num_attention_heads=8, num_key_value_heads=4,
                                  intermediate_size=256, attention_bias=False)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(hidden_size=128, head_dim=32, num_attention_heads=8, num_key_value_heads=4,
                                         intermediate_size=256, moe_intermediate_size=64, num_experts=8,
                                         num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                                         norm_topk_prob=True)),
    "glm4": ("Glm4Config", dict(hidden_size=128, head_dim=32, num_attention_heads=8, num_key_value_heads=4,
                                intermediate_size=256, attention_bias=True, partial_rotary_factor=0.5)),
}
FAMILY_NAMES = tuple(TINY_FAMILIES)

#: Families that serve only as frozen judges: no GPS partition rules (the judge's engine loads its
#: checkpoint folder itself, from a host-memory copy: `gps.node_import.host_copy`). Qwen3.5-MoE
#: (the paper's 122B-A10B judge): gated-delta-net linear attention in 3 of every 4 layers, gated
#: full attention in the 4th, routed experts plus a shared expert. The text-only model
#: (`Qwen3_5MoeForCausalLM`); the real checkpoint adds a vision tower its judge role never uses.
JUDGE_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", dict(
        hidden_size=128, head_dim=32, num_attention_heads=8, num_key_value_heads=4, linear_conv_kernel_dim=4,
        linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=4, linear_num_value_heads=8,
        moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
        layer_types=["linear_attention", "full_attention"])),
}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check(family: str, judges: bool = False) -> None:
    known = (*FAMILY_NAMES, *JUDGE_FAMILIES) if judges else FAMILY_NAMES
    if family not in known:
        raise ValueError(f"unknown tiny model family {family!r}; allowed: {', '.join(known)}")


def family_tokenizer():
    """The character tokenizer with the family chat template."""
    tok = build_tokenizer()
    tok.chat_template = FAMILY_CHAT_TEMPLATE
    return tok


def tiny_config(family: str, dtype: str = "float32"):
    """The transformers config of the tiny `family` model, with the tokenizer's special ids."""
    import transformers

    _check(family, judges=True)
    cls_name, fields = TINY_FAMILIES.get(family) or JUDGE_FAMILIES[family]
    tok = build_tokenizer()
    ids = dict(bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return getattr(transformers, cls_name)(**_COMMON, **fields, **ids, dtype=dtype)


def family_config(family: str, dims: Any, num_experts: int = 8, experts_per_token: int = 2):
    """The transformers config of `family` with the sizes of a `TinyModelConfig` (`dims`): hidden,
    layers, heads, KV heads, head_dim, MLP width (MoE: each of `num_experts` experts gets a quarter
    of it, `experts_per_token` of them active), vocabulary, tying, RoPE base and dtype."""
    import transformers

    _check(family)
    dims.validate()
    cls_name, fields = TINY_FAMILIES[family]
    tok = build_tokenizer()
    kw: dict[str, Any] = dict(
        vocab_size=dims.vocab_size, hidden_size=dims.hidden_size, num_hidden_layers=dims.num_layers,
        num_attention_heads=dims.num_heads, num_key_value_heads=dims.num_kv_heads, head_dim=dims.head_dim,
        intermediate_size=dims.intermediate_size, max_position_embeddings=dims.max_position_embeddings,
        tie_word_embeddings=dims.tie_word_embeddings, rope_theta=dims.rope_theta, dtype=dims.dtype,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    for k in ("use_sliding_window", "attention_bias", "partial_rotary_factor", "decoder_sparse_step",
              "mlp_only_layers", "norm_topk_prob"):
        if k in fields:
            kw[k] = fields[k]
    if "num_experts" in fields:
        kw.update(num_experts=num_experts, num_experts_per_tok=experts_per_token,
                  moe_intermediate_size=max(1, dims.intermediate_size // 4))
    return getattr(transformers, cls_name)(**kw)


def make_tiny_checkpoint(family: str, path: str | Path, dtype: str = "float32", seed: int = 0) -> Path:
    """Write a random-weight tiny `family` checkpoint (model, tokenizer, chat template, generation
    config) to `path` atomically; return `path`. `family`: one of `FAMILY_NAMES` or
    `JUDGE_FAMILIES`."""
    from transformers import AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {list(_DTYPES)}")
    cfg = tiny_config(family, dtype)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return save_model_folder(model, path, dtype, tokenizer=family_tokenizer())


def upcycle_to_qwen3_moe(dense: Any, num_experts: int = 8, experts_per_token: int = 2) -> Any:
    """A Qwen3-MoE model initialised from a dense Qwen2 `ForCausalLM` (e.g. the bootstrapped GenRM).

    Every expert is a copy of the dense MLP (expert width = the dense width) and the router starts at
    zero, with `norm_topk_prob`, so each MoE block computes exactly the dense MLP until training moves
    the router. Embeddings, norms and q/k/v/o weights are copied; Qwen3 has no q/k/v biases (dropped)
    and adds per-head `q_norm`/`k_norm` (ones), so the attention is not the dense model's: a short SFT
    restores the judge. Measured (BENCHMARKS.md, issue 14 h14): the upcycled tiny GenRM after 150 SFT
    steps judges the bootstrapped policy's samples better than the dense GenRM it came from, while a
    random-init Qwen3-MoE after 400 SFT steps (the GenRM's count then) does not judge at all (AUC 0.55)."""
    import transformers

    from pivotrl.gps.state_dict import to_module

    d = dense.config
    if d.model_type != "qwen2":
        raise ValueError(f"upcycle_to_qwen3_moe needs a dense Qwen2 model, got model_type {d.model_type!r}")
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=d.vocab_size, hidden_size=d.hidden_size, num_hidden_layers=d.num_hidden_layers,
        num_attention_heads=d.num_attention_heads, num_key_value_heads=d.num_key_value_heads,
        head_dim=getattr(d, "head_dim", None) or d.hidden_size // d.num_attention_heads,
        intermediate_size=d.intermediate_size, moe_intermediate_size=d.intermediate_size,
        num_experts=num_experts, num_experts_per_tok=experts_per_token, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False,
        max_position_embeddings=d.max_position_embeddings, tie_word_embeddings=d.tie_word_embeddings,
        rope_parameters=getattr(d, "rope_parameters", None), rms_norm_eps=d.rms_norm_eps,
        bos_token_id=d.bos_token_id, eos_token_id=d.eos_token_id, pad_token_id=d.pad_token_id, dtype=str(dense.dtype).replace("torch.", ""))
    moe = transformers.Qwen3MoeForCausalLM(cfg).to(dense.dtype)
    target = moe.state_dict()
    per_expert: dict[str, torch.Tensor] = {}
    for k, v in dense.state_dict().items():
        if ".mlp." in k:
            prefix, w = k.split(".mlp.")
            for e in range(num_experts):
                per_expert[f"{prefix}.mlp.experts.{e}.{w}"] = v
        elif k in target:
            per_expert[k] = v
    for k, v in target.items():
        if k.endswith("mlp.gate.weight"):
            per_expert[k] = torch.zeros_like(v)  # the router: uniform until trained
        elif k.endswith(("q_norm.weight", "k_norm.weight")):
            per_expert[k] = torch.ones_like(v)
    moe.load_state_dict(to_module(per_expert, target.keys()), strict=True)
    return moe
