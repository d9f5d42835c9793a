"""Derived stages of the tiny bootstrap: the upcycled Qwen3-MoE GenRM, and the folders in another dtype.

Owns building, from a cached dense bootstrap entry (`pivotrl.models.bootstrap`) and without
changing it or its key:
- the MoE stage (`models.bootstrap.genrm_arch=qwen3_moe`): the dense GenRM upcycled to Qwen3-MoE
  (`tiny_families.upcycle_to_qwen3_moe`: every expert a copy of the dense MLP, router at zero), then
  `moe_steps` SFT steps in float32 on the bootstrap's own GenRM examples (`bootstrap.sft`,
  `bootstrap.genrm_example`), saved with the dense GenRM's tokenizer (the same chat template);
- the dtype stage (`models.bootstrap.dtype` other than the folders' own): the policy and the GenRM
  the run gets, cast to that dtype and saved (config.json and safetensors in it).
Each stage judges the dense policy's sampled validation responses (the ones the dense report
judged: same policy, seed and prompts) with its own GenRM as loaded from the saved folder
(`bootstrap.evaluate_genrm`), so `report["genrm_on_policy_samples"]` is always the served GenRM's;
the dense GenRM's figures stay under `report["dense_genrm_on_policy_samples"]`, each stage's report
under `report["stages"]`.

Cache layout, inside the dense entry (a rebuilt dense entry drops the stages made from it):
    <dense>/moe-<key>/genrm, report.json           key: dense key + MoE fields + DERIVED_VERSION
    <dense>/<dtype>-<key>/policy, genrm, report.json   key: dense key + source stage + dtype
Writes are atomic like the dense entry's (`bootstrap.cached_entry`).

Public API:
    derive(dense: BootstrapResult, cfg, data, force=False, progress=True) -> BootstrapResult
    stage_key(blob) -> str
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

import torch

from pivotrl.config.rl import BootstrapConfig, DataConfig
from pivotrl.models.sft import (REPORT_VAL_ROWS, BootstrapResult, cached_entry, evaluate_genrm, evaluate_policy,
                                genrm_example, sft)
from pivotrl.models.tiny import load_tiny_model, save_model_folder
from pivotrl.rl.data import load_examples

# Bump when a derived recipe changes in a way the config does not capture.
DERIVED_VERSION = 1


def stage_key(blob: dict) -> str:
    """The 16-hex key of a derived stage from what it is built from (with `DERIVED_VERSION`)."""
    return hashlib.sha256(json.dumps({"v": DERIVED_VERSION, **blob}, sort_keys=True).encode()).hexdigest()[:16]


def policy_samples(dense: BootstrapResult, cfg: BootstrapConfig, data: DataConfig):
    """The held-out prompts and the dense policy's sampled (T=1) responses the dense report judged."""
    policy, tok = load_tiny_model(dense.policy_path, "float32")
    val = load_examples(dense.val_path, limit=min(REPORT_VAL_ROWS, data.val_size))
    acc, responses = evaluate_policy(policy.eval(), tok, val, 1.0, data.max_response_length, cfg.seed)
    return val, responses, acc


def _build_moe(dense: BootstrapResult, cfg: BootstrapConfig, data: DataConfig, out: Path, progress: bool) -> dict:
    from pivotrl.models.tiny_families import upcycle_to_qwen3_moe

    torch.set_num_threads(cfg.num_threads)
    t0 = time.perf_counter()
    model, tok = load_tiny_model(dense.genrm_path, "float32")
    moe = upcycle_to_qwen3_moe(model, cfg.moe_num_experts, cfg.moe_experts_per_token)
    losses = sft(moe, tok, lambda r: genrm_example(r, data, cfg.genrm_wrong_fraction), cfg.moe_steps, cfg,
                 random.Random(f"upcycle:{cfg.seed}"), "bootstrap genrm (qwen3_moe)", progress,
                 "score:", cfg.genrm_score_weight)
    sft_s = time.perf_counter() - t0
    save_model_folder(moe, out / "genrm", "float32", tokenizer=tok)
    val, responses, acc = policy_samples(dense, cfg, data)
    served, stok = load_tiny_model(out / "genrm", "float32")
    report = {"stage": "qwen3_moe", **cfg.moe_key_fields(), "sft_seconds": sft_s,
              "final_loss": sum(losses[-10:]) / max(1, len(losses[-10:])),
              "policy_samples_accuracy": acc,
              "genrm_on_policy_samples": evaluate_genrm(served.eval(), stok, val, responses),
              "seconds": time.perf_counter() - t0}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


def _build_cast(dense: BootstrapResult, genrm_src: Path, cfg: BootstrapConfig, data: DataConfig, out: Path) -> dict:
    torch.set_num_threads(cfg.num_threads)
    t0 = time.perf_counter()
    for role, src in (("policy", dense.policy_path), ("genrm", genrm_src)):
        model, tok = load_tiny_model(src)
        save_model_folder(model, out / role, cfg.dtype, tokenizer=tok)
    val, responses, acc = policy_samples(dense, cfg, data)
    served, stok = load_tiny_model(out / "genrm", cfg.dtype)
    report = {"stage": cfg.dtype, "dtype": cfg.dtype, "source_genrm": str(genrm_src),
              "policy_samples_accuracy": acc,
              "genrm_on_policy_samples": evaluate_genrm(served.eval(), stok, val, responses),
              "seconds": time.perf_counter() - t0}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


def derive(dense: BootstrapResult, cfg: BootstrapConfig, data: DataConfig, force: bool = False,
           progress: bool = True, seed=lambda entry: None) -> BootstrapResult:
    """The folders `cfg` asks for, made from the dense entry `dense` by the stages `cfg` needs
    (none: `dense` itself). `force` rebuilds the stages. `seed(entry)` is the shipped twin of a
    stage's cache entry, or None (`pivotrl.models.shipped`): a twin is copied instead of built,
    and a stage that only feeds a later one that is cached or shipped is not made at all."""
    root, dense_key = dense.policy_path.parent, dense.policy_path.parent.name
    genrm, genrm_dtype, source = dense.genrm_path, cfg.genrm.dtype, "dense"
    policy = dense.policy_path
    report = dict(dense.report, genrm_arch=cfg.genrm_arch, dtype=cfg.dtype, stages={},
                  dense_genrm_on_policy_samples=dense.report["genrm_on_policy_samples"])
    cached = dense.cached
    stages = []
    if cfg.genrm_arch == "qwen3_moe":
        entry = root / f"moe-{stage_key({'dense': dense_key, 'moe': cfg.moe_key_fields()})}"
        stages.append(("qwen3_moe", entry, lambda tmp: _build_moe(dense, cfg, data, tmp, progress)))
        genrm, genrm_dtype, source = entry / "genrm", "float32", entry.name
    if cfg.dtype != cfg.policy.dtype or cfg.dtype != genrm_dtype:
        entry = root / f"{cfg.dtype}-{stage_key({'dense': dense_key, 'source': source, 'dtype': cfg.dtype})}"
        src = genrm
        stages.append((cfg.dtype, entry, lambda tmp: _build_cast(dense, src, cfg, data, tmp)))
        policy, genrm = entry / "policy", entry / "genrm"
    if not force:  # the last stage already there (or shipped): the ones feeding it are not needed
        have = [i for i, (_, e, _) in enumerate(stages) if (e / "report.json").is_file() or seed(e) is not None]
        stages = stages[have[-1]:] if have and have[-1] == len(stages) - 1 else stages
    for name, entry, build in stages:
        cached = cached_entry(entry, build, force, seed=seed(entry)) and cached
        stage = json.loads((entry / "report.json").read_text())
        report["stages"][name] = {**stage, "path": str(entry)}
        report["genrm_on_policy_samples"] = stage["genrm_on_policy_samples"]
    return BootstrapResult(policy, genrm, dense.train_path, dense.val_path, report, cached)
