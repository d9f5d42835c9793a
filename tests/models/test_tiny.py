"""Tiny Qwen2 factory: folders load with transformers, dims are validated, writes are atomic."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pivotrl.models.tiny import TinyModelConfig, create_tiny_model, load_tiny_model

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def test_create_and_load_with_auto_classes(tmp_path) -> None:
    path = create_tiny_model(tmp_path / "m", SMALL, seed=3)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["head_dim"] == 16
    assert (path / "model.safetensors").is_file() and (path / "generation_config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(str(path))
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.eos_token_id == tok.eos_token_id and model.config.pad_token_id == tok.pad_token_id
    ids = tok.apply_chat_template([{"role": "user", "content": "1+1?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] <= ids["input_ids"].shape[1] + 5
    assert not list(tmp_path.glob(".*"))  # no tmp folder left behind


def test_seed_determines_weights(tmp_path) -> None:
    a, _ = load_tiny_model(create_tiny_model(tmp_path / "a", SMALL, seed=1))
    b, _ = load_tiny_model(create_tiny_model(tmp_path / "b", SMALL, seed=1))
    c, _ = load_tiny_model(create_tiny_model(tmp_path / "c", SMALL, seed=2))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_overwrite_replaces_folder(tmp_path) -> None:
    create_tiny_model(tmp_path / "m", SMALL, seed=1)
    create_tiny_model(tmp_path / "m", SMALL, seed=2)
    m, _ = load_tiny_model(tmp_path / "m")
    ref, _ = load_tiny_model(create_tiny_model(tmp_path / "r", SMALL, seed=2))
    assert torch.equal(m.model.embed_tokens.weight, ref.model.embed_tokens.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "r"]


@pytest.mark.parametrize("kwargs,match", [
    ({"hidden_size": 100, "num_heads": 4}, "head_dim"),
    ({"hidden_size": 130, "num_heads": 4}, "divisible by num_heads"),
    ({"num_heads": 4, "num_kv_heads": 3}, "num_kv_heads"),
    ({"dtype": "float8"}, "dtype 'float8'"),
    ({"num_layers": 0}, "num_layers"),
])
def test_bad_dims(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TinyModelConfig(**kwargs)


def test_vocab_too_small(tmp_path) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        create_tiny_model(tmp_path / "m", TinyModelConfig(vocab_size=50))


def test_load_bad_folder(tmp_path) -> None:
    with pytest.raises(ValueError, match="no config.json"):
        load_tiny_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="does not load"):
        load_tiny_model(tmp_path)
