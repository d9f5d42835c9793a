"""Model families in GPS: each tiny checkpoint imports, reads back exactly under every TP layout,
converts to and from transformers 5's in-memory names, and bad checkpoints stop at import."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from pivotrl.gps import Device, Layout, export_hf, import_hf
from pivotrl.gps.checkpoint import checkpoint_spec
from pivotrl.gps.families import CheckpointMismatchError, UnsupportedArchitectureError, family_of
from pivotrl.gps.layout import ModelSpec, device_shards, validate_layout
from pivotrl.gps.state_dict import to_module, to_store
from pivotrl.models.tiny_families import FAMILY_NAMES, make_tiny_checkpoint, tiny_config


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def ckpt(request, tmp_path_factory):
    path = make_tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param) / "m", dtype="bfloat16", seed=3)
    return request.param, path, load_file(str(path / "model.safetensors"))


def _slices(box):
    return tuple(slice(a, b) for a, b in box)


def _reconstruct(spec: ModelSpec, layout: Layout, shards: dict) -> dict[str, torch.Tensor]:
    """Stored tensors rebuilt from one DP replica's shards; asserts every element is covered and
    that ranks holding the same element agree."""
    out = {t.name: torch.full(t.shape, float("nan"), dtype=torch.float32) for t in spec.tensors}
    plan = device_shards(spec, layout)
    for rank in range(layout.tp * layout.pp):
        dev = list(shards)[rank]
        for lt in plan[rank]:
            local = shards[dev][lt.name]
            assert tuple(local.shape) == lt.shape and str(local.dtype) == f"torch.{lt.dtype}", lt.name
            for p in lt.pieces:
                got = local[_slices(p.dst_box)].float()
                prev = out[p.src][_slices(p.src_box)]
                assert torch.equal(prev[~prev.isnan()], got[~prev.isnan()]), p.src  # replicas agree
                out[p.src][_slices(p.src_box)] = got
    for name, t in out.items():
        assert not t.isnan().any(), f"{name} not covered"
    return out


def test_spec_is_the_checkpoint_and_keeps_its_dtype(ckpt):
    family, path, disk = ckpt
    spec = checkpoint_spec(path)
    assert spec.family == family
    assert {t.name: t.shape for t in spec.tensors} == {k: tuple(v.shape) for k, v in disk.items()}
    assert {t.dtype for t in spec.tensors} == {"bfloat16"}
    # the config alone implies the same tensors (what the store registers from a config)
    assert [t.name for t in ModelSpec.from_config(json.loads((path / "config.json").read_text())).tensors] == spec.names


@pytest.mark.parametrize("layout", [Layout(), Layout(tp=2), Layout(tp=4), Layout(tp=2, pp=2),
                                    Layout(tp=4, fused_qkv=True, fused_gate_up=True)], ids=str)
def test_read_back_exactly_under_every_tp_layout(ckpt, layout, make_store):
    family, path, disk = ckpt
    store = make_store(2)
    assert import_hf(store, "m", path) == 0
    devs = [Device(r % 2, r // 2) for r in range(layout.world_size)]
    v, shards = store.read("m", devs, layout)
    assert v == 0
    back = _reconstruct(store.spec("m"), layout, shards)
    for name, t in disk.items():
        assert torch.equal(back[name], t.float()), name


def test_export_loads_in_transformers_with_its_chat_template(ckpt, make_store, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    family, path, disk = ckpt
    store = make_store(1)
    import_hf(store, "m", path)
    assert export_hf(store, "m", tmp_path / "out") == 0
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.bfloat16)
    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16)
    for k, t in ref.state_dict().items():
        assert torch.equal(back.state_dict()[k], t), k
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_glm4_fused_gate_up_splits_per_block(make_store, tmp_path):
    path = make_tiny_checkpoint("glm4", tmp_path / "glm", dtype="float32", seed=1)
    disk = load_file(str(path / "model.safetensors"))
    store = make_store(1)
    import_hf(store, "g", path)
    devs = [Device(0, 0), Device(0, 1)]
    _, shards = store.read("g", devs, Layout(tp=2))
    full = disk["model.layers.0.mlp.gate_up_proj.weight"]
    inter = full.shape[0] // 2
    for r, d in enumerate(devs):  # rank r: [gate rows of r; up rows of r], what vLLM's TP rank holds
        want = torch.cat([full[r * inter // 2:(r + 1) * inter // 2], full[inter + r * inter // 2:inter + (r + 1) * inter // 2]])
        assert torch.equal(shards[d]["model.layers.0.mlp.gate_up_proj.weight"], want)


def test_qwen3_moe_expert_parallel_read_holds_whole_experts(make_store, tmp_path):
    path = make_tiny_checkpoint("qwen3_moe", tmp_path / "moe", dtype="bfloat16")
    disk = load_file(str(path / "model.safetensors"))
    store = make_store(1)
    import_hf(store, "moe", path)
    lay = Layout(tp=4, ep=4)
    devs = [Device(0, i) for i in range(4)]
    _, shards = store.read("moe", devs, lay)
    for r, d in enumerate(devs):
        experts = {int(n.split(".")[5]) for n in shards[d] if ".experts." in n}
        assert experts == {2 * r, 2 * r + 1}  # 8 experts over 4 EP ranks
        n = f"model.layers.1.mlp.experts.{2 * r}.down_proj.weight"
        assert torch.equal(shards[d][n], disk[n])
        assert torch.equal(shards[d]["model.layers.1.self_attn.q_norm.weight"], disk["model.layers.1.self_attn.q_norm.weight"])


def test_qwen3_moe_trainer_names_convert_both_ways(make_store, tmp_path):
    """transformers 5 fuses experts in memory; GPS and the checkpoint hold them per expert."""
    from transformers import AutoModelForCausalLM

    path = make_tiny_checkpoint("qwen3_moe", tmp_path / "moe", dtype="bfloat16", seed=5)
    disk = load_file(str(path / "model.safetensors"))
    module = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)  # an fp32 trainer
    msd = module.state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in msd  # fused in memory (transformers 5)
    store = make_store(1)
    import_hf(store, "moe", path)
    pub = to_store(msd, store.spec("moe"))
    assert set(pub) == set(disk) and all(pub[k].dtype == torch.bfloat16 for k in pub)
    for k, t in disk.items():
        assert torch.equal(pub[k], t), k  # bf16 -> fp32 -> bf16 is exact
    assert store.load_state_dict("moe", pub) == 1  # the store accepts what the trainer publishes
    dev = Device(0, 0)
    _, shards = store.read("moe", [dev], Layout())
    back = to_module(shards[dev], msd.keys())
    fresh = AutoModelForCausalLM.from_config(module.config, dtype=torch.bfloat16)
    fresh.load_state_dict(back, strict=True)  # fused names and shapes exactly as the module's
    for k, t in fresh.state_dict().items():
        assert torch.equal(t, msd[k].to(torch.bfloat16)), k


def test_dense_names_pass_through(tmp_path, make_store):
    from transformers import AutoModelForCausalLM

    path = make_tiny_checkpoint("glm4", tmp_path / "g", dtype="bfloat16")
    module = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    store = make_store(1)
    import_hf(store, "g", path)
    pub = to_store(module.state_dict(), store.spec("g"))
    assert {t.dtype for t in pub.values()} == {torch.bfloat16}
    assert to_module(pub, module.state_dict().keys()).keys() == pub.keys()
    with pytest.raises(ValueError, match="lacks 1 tensors GPS stores .*model.norm.weight"):
        to_store({k: v for k, v in module.state_dict().items() if k != "model.norm.weight"}, store.spec("g"))


def test_tp_must_divide_heads():
    spec = ModelSpec.from_config(tiny_config("qwen3").to_dict())
    with pytest.raises(ValueError, match=r"tp=8 does not divide dim 0 of model.layers.0.self_attn.k_proj.weight "
                                         r"\(size 128 = 4 heads of 32\)"):
        validate_layout(spec, Layout(tp=8))


@pytest.mark.parametrize("arch,match", [
    ("LlamaForCausalLM", r"'LlamaForCausalLM' .* has no GPS partition rules; supported: Glm4ForCausalLM"),
    ("Qwen3_5MoeForConditionalGeneration", r"'Qwen3_5MoeForConditionalGeneration' is not supported yet: .*gated-delta-net .*cannot be the policy"),
])
def test_architecture_without_rules_names_itself(arch, match):
    with pytest.raises(UnsupportedArchitectureError, match=match):
        family_of({"architectures": [arch], "model_type": "x"}, where="models.genrm.hf_path")


def test_bad_checkpoints_stop_at_import_naming_the_folder(tmp_path, make_store):
    store = make_store(1)
    path = make_tiny_checkpoint("qwen3", tmp_path / "q", dtype="bfloat16")
    sd = load_file(str(path / "model.safetensors"))
    # partial: one tensor missing
    part = {k: v for k, v in sd.items() if k != "model.layers.1.self_attn.k_norm.weight"}
    save_file(part, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointMismatchError, match=rf"{path}: partial checkpoint: 1 of 25 .*k_norm"):
        import_hf(store, "q", path)
    # a tensor the family has no rule for
    save_file({**sd, "model.layers.0.self_attn.rotary.inv_freq": torch.zeros(16)}, str(path / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match="1 tensors have no partition rule .*rotary.inv_freq"):
        import_hf(store, "q", path)
    # an index naming a weight file that is not there (an interrupted download)
    save_file(sd, str(path / "model.safetensors"))
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors", "x": "model.safetensors"}}))
    with pytest.raises(CheckpointMismatchError, match="1 of 2 weight files .* missing .*model-00002-of-00002"):
        import_hf(store, "q", path)
    assert store.models() == []  # nothing registered by any failed import


def test_check_tp_names_the_field_and_allowed_values():
    from pivotrl.gps.layout import allowed_tp, check_tp

    spec = ModelSpec.from_config(tiny_config("glm4").to_dict())
    assert allowed_tp(spec, 8) == [1, 2, 4]  # 4 KV heads
    check_tp(spec, 4, "models.genrm.tp")
    with pytest.raises(ValueError, match=r"models.genrm.tp=8: layout tp=8 does not divide .*k_proj.weight .*"
                                         r"allowed for this model: \[1, 2, 4\]"):
        check_tp(spec, 8, "models.genrm.tp")
