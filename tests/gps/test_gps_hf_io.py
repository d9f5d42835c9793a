"""Hugging Face interchange: import a safetensors dir, read it sharded, write, export, load back."""
from __future__ import annotations

import json

import pytest
import torch

from pivotrl.gps import Device, Layout, export_hf, import_hf
from pivotrl.gps.layout import device_shards
from tests.gps.gps_helpers import TINY


@pytest.fixture(scope="module", params=["bfloat16", "float16", "float32"])
def hf_dir(request, tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(**{**TINY, "torch_dtype": request.param, "tie_word_embeddings": request.param == "float16"})
    model = Qwen2ForCausalLM(cfg).to(getattr(torch, request.param))
    path = tmp_path_factory.mktemp(f"qwen2_{request.param}")
    model.save_pretrained(path, safe_serialization=True)
    return path, request.param, model


def test_round_trip_through_gps(hf_dir, make_store, tmp_path):
    from transformers import Qwen2ForCausalLM

    path, dtype, model = hf_dir
    store = make_store(2)
    assert import_hf(store, "policy", path) == 0
    assert export_hf(store, "policy", tmp_path / "v0") == 0  # before v1 exists (v0 is then freed)
    assert {t.dtype for t in store.spec("policy").tensors} == {dtype}
    # a TP=2 read, one training-like update, a write under another layout
    lay, devs = Layout(tp=2, fused_qkv=True), [Device(0, 0), Device(1, 0)]
    v, shards = store.read("policy", devs, lay)
    assert v == 0 and shards[devs[0]]["model.layers.0.self_attn.qkv_proj.weight"].dtype == getattr(torch, dtype)
    sd = {k: t.clone() for k, t in model.state_dict().items() if k in store.spec("policy")}
    sd["model.norm.weight"] += 1
    wl, wdev = Layout(pp=3), [Device(0, i) for i in range(3)]
    parts = {d: {lt.name: sd[lt.name].clone() for lt in device_shards(store.spec("policy"), wl)[r]}
             for r, d in enumerate(wdev)}
    assert store.write("policy", wdev, wl, parts) == 1

    assert export_hf(store, "policy", tmp_path / "v1", version=1) == 1
    assert json.loads((tmp_path / "v1" / "config.json").read_text())["vocab_size"] == TINY["vocab_size"]
    back0 = Qwen2ForCausalLM.from_pretrained(tmp_path / "v0", dtype=getattr(torch, dtype))
    back1 = Qwen2ForCausalLM.from_pretrained(tmp_path / "v1", dtype=getattr(torch, dtype))
    for k, t in model.state_dict().items():
        assert back0.state_dict()[k].dtype == t.dtype and torch.equal(back0.state_dict()[k], t), k
        want = t + 1 if k == "model.norm.weight" else t
        assert torch.equal(back1.state_dict()[k], want), k
    ids = torch.arange(10).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(back0(ids).logits, model(ids).logits)


def test_import_errors(tmp_path, make_store):
    store = make_store(1)
    with pytest.raises(FileNotFoundError, match="config.json"):
        import_hf(store, "x", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        import_hf(store, "x", tmp_path)
    assert store.models() == []
    with pytest.raises(ValueError, match="needs config="):
        export_hf(store, "x", tmp_path / "out")
