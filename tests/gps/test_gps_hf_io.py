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


def test_moe_round_trip_with_expert_parallel_read(make_store, tmp_path):
    from safetensors.torch import load_file
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    from tests.gps.gps_helpers import TINY_MOE

    torch.manual_seed(1)
    model = Qwen2MoeForCausalLM(Qwen2MoeConfig(**TINY_MOE, num_experts_per_tok=2)).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "in")
    # on disk experts are per-expert tensors (transformers fuses them only in memory)
    disk = load_file(str(tmp_path / "in" / "model.safetensors"))
    store = make_store(2)
    import_hf(store, "genrm", tmp_path / "in", frozen=True)
    devs = [Device(n, i) for n in range(2) for i in range(2)]
    v, shards = store.read("genrm", devs, Layout(dp=2, tp=2, ep=4))
    for r, d in enumerate(devs):  # EP rank r holds whole expert r of every layer
        name = f"model.layers.1.mlp.experts.{r}.down_proj.weight"
        assert torch.equal(shards[d][name], disk[name])
        assert not any(f"experts.{(r + 1) % 4}." in k for k in shards[d])
    export_hf(store, "genrm", tmp_path / "out")
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert out.keys() == disk.keys() and all(torch.equal(out[k], disk[k]) for k in disk)
    back = Qwen2MoeForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.bfloat16)
    ids = torch.arange(12).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)


def test_a_node_whose_folder_differs_fails_the_import_and_nothing_stays(make_store, tmp_path):
    """`import_folder`: every node fills its buffer from the folder it sees; a tensor that folder
    lacks (or of another shape) fails the import naming the folder and the tensor, and the model
    is not left registered (a second import of the right folder then works)."""
    from safetensors.torch import load_file, save_file

    from pivotrl.gps.checkpoint import checkpoint_spec
    from pivotrl.models.tiny_families import make_tiny_checkpoint

    good = make_tiny_checkpoint("qwen3", tmp_path / "good", dtype="bfloat16")
    spec = checkpoint_spec(good)
    bad = tmp_path / "bad"
    bad.mkdir()
    sd = load_file(good / "model.safetensors")
    sd.pop("model.norm.weight")
    save_file(sd, bad / "model.safetensors")
    store = make_store(2)
    with pytest.raises(ValueError, match=rf"{bad}: tensor model.norm.weight is missing here"):
        store.import_folder("m", str(bad), spec)
    assert store.models() == [] and store.resident_bytes() == 0
    assert store.import_folder("m", str(good), spec) == 0
    with store.read("m", [Device(1, 0)], Layout()) as res:
        assert torch.equal(res.shards[Device(1, 0)]["model.norm.weight"], load_file(good / "model.safetensors")["model.norm.weight"])
