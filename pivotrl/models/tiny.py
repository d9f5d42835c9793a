"""Tiny Qwen2-architecture models made by the project (no pretrained weights on this machine).

Owns: the tiny model dimensions (`TinyModelConfig`) and writing a random-init
`transformers.Qwen2ForCausalLM` plus the character-level tokenizer to a Hugging Face folder
(`config.json`, `generation_config.json`, `model.safetensors`, tokenizer files). Knows nothing
about training: `pivotrl.models.bootstrap` SFT-trains these folders.

Public API (others rely on it):
    TinyModelConfig(   (defined in pivotrl.config.rl, re-exported here)
                    hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                    intermediate_size=512, max_position_embeddings=512, dtype="float32",
                    vocab_size=128, tie_word_embeddings=True, rope_theta=10000.0)
        .head_dim -> int;  .validate() raises ValueError naming the bad field
    qwen2_config(cfg) -> transformers.Qwen2Config
    create_tiny_model(path, cfg=TinyModelConfig(), seed=0) -> Path
        writes the folder (atomically: tmp folder then rename) and returns `path`;
        the folder loads with `AutoModelForCausalLM.from_pretrained(path)`,
        `AutoTokenizer.from_pretrained(path)` and vLLM (`LLM(model=str(path))`).
    load_tiny_model(path, dtype=None) -> (model, tokenizer)   (clear error if it does not load)

Sizes: vLLM's CPU attention wants head_dim a multiple of 16 and num_heads a multiple of
num_kv_heads, so `validate()` enforces both. The vocabulary is padded to `vocab_size` (128) so the
embedding is a round size; ids >= the tokenizer's length are never produced by the tokenizer.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from pivotrl.config.rl import TinyModelConfig
from pivotrl.models.tokenizer import VOCAB_SIZE, build_tokenizer, load_tokenizer

__all__ = ["TinyModelConfig", "qwen2_config", "create_tiny_model", "load_tiny_model", "save_model_folder"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def qwen2_config(cfg: TinyModelConfig) -> Qwen2Config:
    """The `transformers` config for `cfg`, with the tokenizer's special-token ids."""
    cfg.validate()
    if cfg.vocab_size < VOCAB_SIZE:
        raise ValueError(f"TinyModelConfig.vocab_size ({cfg.vocab_size}) must be >= the tokenizer's "
                         f"{VOCAB_SIZE} tokens")
    tok = build_tokenizer()
    return Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tie_word_embeddings,
        torch_dtype=cfg.dtype,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        use_sliding_window=False,
    )


def save_model_folder(model: PreTrainedModel, path: str | Path, dtype: str = "float32", tokenizer=None) -> Path:
    """Save `model` + tokenizer (`build_tokenizer()` unless given) + generation config to `path`
    atomically (tmp folder, then rename), so a crash never leaves a half-written folder that a later
    run mistakes for a good one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        model.to(_DTYPES[dtype]).save_pretrained(str(tmp), safe_serialization=True)
        tok = tokenizer if tokenizer is not None else build_tokenizer()
        tok.save_pretrained(str(tmp))
        GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.eos_token_id, do_sample=True, temperature=1.0,
                         top_p=1.0, top_k=0).save_pretrained(str(tmp))
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def create_tiny_model(path: str | Path, cfg: TinyModelConfig | None = None, seed: int = 0) -> Path:
    """Write a random-init tiny Qwen2 model and its tokenizer to `path`; return `path`."""
    cfg = cfg or TinyModelConfig()
    hf_cfg = qwen2_config(cfg)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(hf_cfg)
    return save_model_folder(model, path, cfg.dtype)


def load_tiny_model(path: str | Path, dtype: str | None = None) -> tuple[PreTrainedModel, object]:
    """Load a model folder and its tokenizer; raise ValueError naming the folder if it fails."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"model folder {str(path)!r} has no config.json (not a Hugging Face model folder)")
    try:
        kwargs = {"dtype": _DTYPES[dtype]} if dtype else {}
        model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    except Exception as e:  # noqa: BLE001 - re-raised with the folder named
        raise ValueError(f"model folder {str(path)!r} does not load: {type(e).__name__}: {e}") from e
    return model, load_tokenizer(path)
