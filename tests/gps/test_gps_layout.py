"""Layouts: shapes from a config match transformers, partition rules, validation errors."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.gps.gps_helpers import TINY, TINY_MOE

from pivotrl.gps.layout import Layout, ModelSpec, box_numel, device_shards, validate_layout


def test_spec_matches_transformers_qwen2_state_dict():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    for tie in (False, True):
        cfg = Qwen2Config(**{**TINY, "tie_word_embeddings": tie})
        model = Qwen2ForCausalLM(cfg)
        # HF leaves the tied head out of the saved state dict; so does the spec
        hf = {k: tuple(v.shape) for k, v in model.state_dict().items() if not (tie and k == "lm_head.weight")}
        spec = ModelSpec.from_config(cfg)
        assert {t.name: t.shape for t in spec.tensors} == hf
        assert spec.nbytes == sum(v.numel() * 4 for k, v in model.state_dict().items() if k in hf)


def test_72b_spec_is_shapes_only():
    spec = ModelSpec.from_config(dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568,
                                      num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8))
    assert len(spec.tensors) == 963
    assert 145e9 < spec.nbytes < 146e9  # ~72.7B params in bf16


def _coverage(spec: ModelSpec, layout: Layout) -> dict[str, int]:
    """Elements of each stored tensor held per DP replica."""
    shards = device_shards(spec, layout)
    per = {t.name: 0 for t in spec.tensors}
    tp_pp = layout.tp * layout.pp
    for rank in range(tp_pp):  # one DP replica
        for lt in shards[rank]:
            for p in lt.pieces:
                per[p.src] += box_numel(p.src_box)
    return per


@pytest.mark.parametrize("layout", [Layout(tp=2), Layout(tp=4, pp=3), Layout(dp=2, tp=2, pp=2, fused_qkv=True)])
def test_partition_rules(layout):
    spec = ModelSpec.from_config(TINY)
    cov = _coverage(spec, layout)
    for t in spec.tensors:
        n = box_numel(tuple((0, s) for s in t.shape))
        replicated = "norm" in t.name
        assert cov[t.name] == (n * layout.tp if replicated else n), t.name
    r1 = device_shards(spec, layout)[1]  # tp rank 1 of stage 0
    names = {lt.name: lt for lt in r1}
    if layout.fused_qkv:
        qkv = names["model.layers.0.self_attn.qkv_proj.weight"]
        assert [p.src.split(".")[-2] for p in qkv.pieces] == ["q_proj", "k_proj", "v_proj"]
        assert qkv.shape == ((8 + 4 + 4) * 4 // layout.tp, 32)
    else:
        q = names["model.layers.0.self_attn.q_proj.weight"]
        assert q.pieces[0].src_box == ((32 // layout.tp, 2 * 32 // layout.tp), (0, 32))
    o = names["model.layers.0.self_attn.o_proj.weight"]
    assert o.pieces[0].src_box[1] == (32 // layout.tp, 2 * 32 // layout.tp)  # row-parallel: dim 1
    assert names["model.embed_tokens.weight"].shape == (64 // layout.tp, 32)  # vocab-parallel
    if layout.pp > 1:
        assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names


def test_pp_stages_split_layers_and_place_head_last():
    spec = ModelSpec.from_config(TINY)
    shards = device_shards(spec, Layout(pp=3))
    layers = [{lt.name.split(".")[2] for lt in s if lt.name.startswith("model.layers.")} for s in shards]
    assert layers == [{"0"}, {"1"}, {"2"}]
    assert "lm_head.weight" in {lt.name for lt in shards[2]} and "model.norm.weight" in {lt.name for lt in shards[2]}


def test_expert_parallel_assigns_whole_experts():
    spec = ModelSpec.from_config(TINY_MOE)
    shards = device_shards(spec, Layout(dp=2, tp=2, ep=4))
    for rank, s in enumerate(shards):
        experts = {lt.name.split(".")[5] for lt in s if ".experts." in lt.name}
        assert experts == {str(rank)}  # 4 experts over 4 EP ranks
        e = next(lt for lt in s if ".experts." in lt.name and lt.name.endswith("gate_proj.weight"))
        assert e.shape == (16, 32)  # whole expert, not TP-split
        router = next(lt for lt in s if lt.name.endswith("mlp.gate.weight"))
        assert router.shape == (4, 32)  # replicated
    dense = device_shards(spec, Layout(tp=2))[0]
    e = next(lt for lt in dense if lt.name.endswith("experts.0.down_proj.weight"))
    assert e.shape == (32, 8)  # ep=1: experts TP-split like a dense MLP


@pytest.mark.parametrize("layout,match", [
    (Layout(tp=3), "tp=3 does not divide dim 0 of model.embed_tokens.weight"),
    (Layout(tp=8), r"tp=8 does not divide dim 0 of model.layers.0.self_attn.k_proj.weight \(size 16 = 4 heads"),
    (Layout(pp=4), "pp=4 exceeds num_hidden_layers=3"),
    (Layout(ep=2, dp=2), "no MoE experts"),
])
def test_bad_layouts_name_the_problem(layout, match):
    with pytest.raises(ValueError, match=match):
        validate_layout(ModelSpec.from_config(TINY), layout)


def test_layout_field_errors():
    with pytest.raises(ValueError, match="layout.tp"):
        Layout(tp=0)
    with pytest.raises(ValueError, match="layout.ep=3 must divide"):
        Layout(dp=2, ep=3)


def test_pure_modules_import_no_torch_or_ray():
    code = ("import sys, pivotrl.gps, pivotrl.gps.planner, pivotrl.gps.placement, pivotrl.gps.versions; "
            "bad = [m for m in ('torch', 'ray', 'vllm') if m in sys.modules]; assert not bad, bad")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env=env)
    assert torch  # the test process itself may use torch
