"""The GPS memory budget: derived from the node's memory, checked against the models' bytes, with an
error naming both numbers when they do not fit."""
from __future__ import annotations

import pytest

from pivotrl.config.gps import GPSConfig
from pivotrl.gps.errors import BudgetError
from pivotrl.gps.layout import ModelSpec
from pivotrl.gps.placement import check_budget, models_need_bytes, node_memory_bytes

# Shapes of the paper's qwen7b_qwen30b group (the checkpoints' config.json fields), bf16.
QWEN25_7B = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=152064, hidden_size=3584,
                 intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                 tie_word_embeddings=False, torch_dtype="bfloat16")
QWEN3_30B_A3B = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=151936,
                     hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
                     num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                     num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
                     torch_dtype="bfloat16")


def _models():
    return [("policy", ModelSpec.from_config(QWEN25_7B), False), ("genrm", ModelSpec.from_config(QWEN3_30B_A3B), True)]


def test_paper_spec_sizes():
    pol, rm = (m[1] for m in _models())
    assert 15.0e9 < pol.nbytes < 15.5e9      # Qwen2.5-7B: 7.6B params in bf16
    assert 60.5e9 < rm.nbytes < 61.5e9       # Qwen3-30B-A3B: 30.5B params in bf16 ("a 61 GB GenRM")


def test_old_64gib_default_cannot_hold_the_group_and_says_both_numbers():
    with pytest.raises(BudgetError) as e:
        check_budget(64 * 2**30, _models(), num_nodes=1, headroom_versions=1, alignment=64)
    full, _ = models_need_bytes(_models(), 1, 1, 64)
    msg = str(e.value)
    assert f"needs {full} bytes" in msg and f"budget is {64 * 2**30} bytes" in msg and "genrm 56." in msg


def test_budget_fits_replicated_or_sharded():
    full, sharded4 = models_need_bytes(_models(), 4, 1, 64)
    assert check_budget(full, _models(), 1, 1, 64) == full                 # one node, enough memory
    assert check_budget(full - 1, _models(), 4, 1, 64) == sharded4         # four nodes share it
    assert 0.24 < sharded4 / full < 0.26


def test_node_memory_and_derived_default():
    total, how = node_memory_bytes("/dev/shm")
    with open("/proc/meminfo") as f:
        mem = int(next(ln for ln in f if ln.startswith("MemTotal:")).split()[1]) * 1024
    assert 0 < total <= mem and how
    from pivotrl.gps.placement import budget_bytes

    assert GPSConfig().node_memory_budget_bytes == 0  # the config keeps what the user said ...
    assert budget_bytes(GPSConfig()) == int(node_memory_bytes("/dev/shm")[0] * 0.8)  # ... GPS derives it
    assert budget_bytes(GPSConfig(node_memory_fraction=0.5)) == int(total * 0.5)
    assert budget_bytes(GPSConfig(node_memory_budget_bytes=123)) == 123  # explicit wins


@pytest.mark.parametrize("kw,match", [({"node_memory_fraction": 0}, "gps.node_memory_fraction"),
                                      ({"node_memory_fraction": 1.5}, "gps.node_memory_fraction"),
                                      ({"node_memory_budget_bytes": -1}, "gps.node_memory_budget_bytes")])
def test_bad_budget_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        GPSConfig(**kw)


def test_each_node_has_its_own_budget_and_the_fullest_decides():
    """Budgets measured per node: a model is replicated only if the node with the least room
    holds a copy; memory kept beside GPS (a judge's host copy) comes off every node first."""
    from pivotrl.gps.versions import VersionTable

    spec = ModelSpec.from_config(QWEN25_7B)
    full = node_bytes_of(spec, 1)
    roomy = VersionTable(2, [3 * full, 3 * full], headroom_versions=1, alignment=64)
    assert roomy.add_model("policy", spec, frozen=False)[0].k == 1
    tight = VersionTable(2, [3 * full, full], headroom_versions=1, alignment=64)  # node 1: half of 2 versions
    assert tight.add_model("policy", spec, frozen=False)[0].k == 2
    t = VersionTable(2, [3 * full, 3 * full], headroom_versions=1, alignment=64)
    t.reserve("host copy of genrm", 2 * full)
    assert t.free_bytes() == full and t.add_model("policy", spec, frozen=False)[0].k == 2
    with pytest.raises(BudgetError, match=r"host copy of x needs 7 bytes .* only \d+ bytes"):
        VersionTable(1, [6], 1, 64).reserve("host copy of x", 7)
    with pytest.raises(ValueError, match="3 node budgets for 2 nodes"):
        VersionTable(2, [1, 2, 3], 1, 64)


def node_bytes_of(spec, k):
    from pivotrl.gps.placement import node_bytes

    return node_bytes(spec, k, 64)
