"""Checkpoint resolution: a local folder or a Hub id in the local HF cache, never a download; every
failure names the config key, the path tried and the download command; no tiny-model fallback."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pivotrl.models.resolve import CheckpointError, resolve_checkpoint
from pivotrl.models.tiny_families import make_tiny_checkpoint

CONF = Path(__file__).resolve().parents[2] / "conf" / "models"


def _cache_with(tmp_path: Path, repo_id: str, family: str = "qwen3") -> tuple[Path, Path]:
    cache = tmp_path / "hub"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = make_tiny_checkpoint(family, repo / "snapshots" / "abc123", dtype="bfloat16")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    return cache, snap


def test_local_folder(tmp_path):
    path = make_tiny_checkpoint("glm4", tmp_path / "glm", dtype="bfloat16")
    r = resolve_checkpoint(str(path), "models.genrm.hf_path")
    assert r.path == path and r.spec.family == "glm4" and r.config["architectures"] == ["Glm4ForCausalLM"]
    assert r.nbytes == sum(t.nbytes for t in r.spec.tensors) and {t.dtype for t in r.spec.tensors} == {"bfloat16"}


def test_hub_id_found_in_the_cache(tmp_path, monkeypatch):
    cache, snap = _cache_with(tmp_path, "Qwen/Qwen3-30B-A3B", "qwen3_moe")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    r = resolve_checkpoint("Qwen/Qwen3-30B-A3B", "models.genrm.hf_path")
    assert r.path == snap and r.spec.family == "qwen3_moe"


def test_hub_id_not_cached_names_path_and_command(tmp_path):
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint("Qwen/Qwen2.5-7B-Instruct", "models.policy.hf_path", cache_dir=tmp_path / "hub")
    msg = str(e.value)
    assert "models.policy.hf_path='Qwen/Qwen2.5-7B-Instruct'" in msg
    assert str(tmp_path / "hub" / "models--Qwen--Qwen2.5-7B-Instruct") in msg
    assert "hf download Qwen/Qwen2.5-7B-Instruct" in msg and "huggingface-cli download" in msg


def test_partial_download_names_the_missing_file(tmp_path):
    cache, snap = _cache_with(tmp_path, "Qwen/Qwen3-8B")
    (snap / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match=r"missing or partial: .*model-00002-of-00002.*hf download Qwen/Qwen3-8B"):
        resolve_checkpoint("Qwen/Qwen3-8B", "models.policy.hf_path", cache_dir=cache)


def test_missing_local_folder(tmp_path):
    with pytest.raises(CheckpointError, match=r"models.policy.hf_path='.*nope': no such folder"):
        resolve_checkpoint(str(tmp_path / "nope"), "models.policy.hf_path")


def test_unsupported_architecture_names_itself(tmp_path):
    path = make_tiny_checkpoint("qwen3", tmp_path / "q", dtype="bfloat16")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "architectures": ["Qwen3_5MoeForConditionalGeneration"]}))
    with pytest.raises(CheckpointError, match="Qwen3_5MoeForConditionalGeneration' is not supported yet"):
        resolve_checkpoint(str(path), "models.genrm.hf_path")


def test_tokenizer_without_chat_template(tmp_path):
    path = make_tiny_checkpoint("qwen2", tmp_path / "q", dtype="bfloat16")
    for f in ("chat_template.jinja", "chat_template.json"):
        (path / f).unlink(missing_ok=True)
    tc = json.loads((path / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(CheckpointError, match="has no chat template"):
        resolve_checkpoint(str(path), "models.policy.hf_path")
    assert resolve_checkpoint(str(path), need_chat_template=False).spec.family == "qwen2"


@pytest.mark.parametrize("group", ["qwen1.5b_glm9b", "qwen7b_qwen30b", "qwen32b_qwen30b", "qwen72b_qwen122b"])
def test_paper_groups_name_hub_checkpoints_and_stop_fast_without_them(group, tmp_path):
    cfg = OmegaConf.load(CONF / f"{group}.yaml")
    for role in ("policy", "genrm"):
        hf = cfg[role].hf_path
        assert isinstance(hf, str) and "/" in hf, (group, role)
        with pytest.raises(CheckpointError, match=rf"models.{role}.hf_path='{hf}'.*hf download {hf}"):
            resolve_checkpoint(hf, f"models.{role}.hf_path", cache_dir=tmp_path)


def _cut(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _random(f: Path) -> None:
    import random

    f.write_bytes(random.Random(0).randbytes(f.stat().st_size))


def _longer(f: Path) -> None:
    f.write_bytes(f.read_bytes() + b"\0" * 16)


def _header_only(f: Path) -> None:
    raw = f.read_bytes()
    f.write_bytes(raw[: 8 + int.from_bytes(raw[:8], "little")])


@pytest.mark.parametrize("damage,what", [(_cut, "cut short: its header's tensors need"),
                                         (_header_only, "cut short: its header's tensors need"),
                                         (_random, "not a safetensors file"),
                                         (_longer, "longer than its header says")])
def test_a_damaged_weight_file_names_itself_and_the_key(tmp_path, damage, what):
    """Issue 22: the check at start reads headers, and now also holds each file's length to them: a
    file cut in half, or random bytes, stops the run naming the file and the hf_path key."""
    path = make_tiny_checkpoint("qwen3", tmp_path / "q", dtype="bfloat16")
    (f,) = sorted(path.glob("*.safetensors"))
    damage(f)
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(str(path), "models.genrm.hf_path")
    msg = str(e.value)
    assert f"models.genrm.hf_path='{path}'" in msg and f"{f}: " in msg and what in msg, msg


def test_a_qwen35_judge_resolves_without_gps_rules_and_the_72b_group_needs_only_its_files(tmp_path, monkeypatch):
    """The paper's 72b group: its Qwen3.5 judge resolves as a judge (no GPS rules: its engine
    loads it from a host copy), not as a policy; without the policy's files the run stops naming
    the policy's checkpoint and the download command, as every other group does."""
    from pivotrl.config import compose_config
    from pivotrl.runtime.assets import resolve_checkpoints

    judge_id = OmegaConf.load(CONF / "qwen72b_qwen122b.yaml").genrm.hf_path
    cache, snap = _cache_with(tmp_path, judge_id, "qwen3_5_moe")
    cfg = json.loads((snap / "config.json").read_text())  # the real checkpoint's architecture
    (snap / "config.json").write_text(json.dumps({**cfg, "architectures": ["Qwen3_5MoeForConditionalGeneration"]}))
    r = resolve_checkpoint(judge_id, "models.genrm.hf_path", cache_dir=cache, gps_rules=False)
    assert r.path == snap and r.spec is None and r.nbytes == (snap / "model.safetensors").stat().st_size
    with pytest.raises(CheckpointError, match="Qwen3_5MoeForConditionalGeneration' is not supported yet: .*policy"):
        resolve_checkpoint(judge_id, "models.policy.hf_path", cache_dir=cache)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    run_cfg = compose_config(["cluster=ray", "deploy=pivot", "models=qwen72b_qwen122b"])
    policy = run_cfg.models.policy.hf_path
    with pytest.raises(CheckpointError, match=rf"models.policy.hf_path='{policy}'.*hf download {policy}"):
        resolve_checkpoints(run_cfg)
    policy_cache, _ = _cache_with(tmp_path / "p", policy, "qwen2")
    for f in policy_cache.iterdir():  # both checkpoints in one cache: the group resolves
        f.rename(cache / f.name)
    ck = resolve_checkpoints(run_cfg)
    assert ck["genrm"].spec is None and ck["policy"].spec.family == "qwen2"


def test_a_judge_still_needs_all_its_files_and_an_architecture_transformers_knows(tmp_path):
    path = make_tiny_checkpoint("qwen3_5_moe", tmp_path / "j", dtype="bfloat16")
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-2.safetensors"}}))
    with pytest.raises(CheckpointError, match=r"models.genrm.hf_path=.*missing or partial: .*model-2.safetensors"):
        resolve_checkpoint(str(path), "models.genrm.hf_path", gps_rules=False)
    (path / "model.safetensors.index.json").unlink()
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "no_such_model"}))
    with pytest.raises(CheckpointError, match=r"model_type 'no_such_model' .* unknown to the installed transformers"):
        resolve_checkpoint(str(path), "models.genrm.hf_path", gps_rules=False)
