"""SFT bootstrap of the tiny policy and GenRM, cached in the user cache folder.

Owns: the dense bootstrap recipe (policy: problem -> equation + `#### answer`, with near-miss
label noise so the policy is only partly right; GenRM: problem + response -> `check: <equation>
vs <response's answer>` + `score: 0|1`, initialised from the SFT policy) and its cache entry
(`$PIVOTRL_CACHE` or `~/.cache/pivotrl`, keyed by a hash of the config). The SFT primitives it
uses (examples, the SFT loop, the held-out measurements, atomic entries) are `sft.py`'s.

Public API:
    bootstrap(cfg=BootstrapConfig(), cache_dir=None, force=False, progress=True) -> BootstrapResult
        .policy_path, .genrm_path, .train_path, .val_path (Path), .report (dict), .cached (bool)
    evaluate_policy(model, tok, examples, temperature, max_new_tokens, seed) -> (accuracy, responses)
    evaluate_genrm(model, tok, examples, responses, max_new_tokens) -> dict (agreement, auc, ...)
    cached_entry(entry, build, force=False) -> bool   (the atomic cache write; also the derived stages')
    CLI: python -m pivotrl.models.bootstrap [--policy-steps N] [--genrm-steps N] [--genrm-arch A]
         [--moe-steps N] [--dtype D] [--force] ...
         python -m pivotrl.models.bootstrap --ship   (rebuild the copy that ships, `shipped.py`)

The default recipe's entry (and the stages in `shipped.SHIPPED_STAGES`) ships with the package: a
fresh cache copies it instead of training it (`shipped.py` says why and how it is rebuilt).

The Qwen3-MoE GenRM (`genrm_arch=qwen3_moe`) and folders in bf16 (`dtype=bfloat16`) are derived
stages of this cache entry, built from it without changing its key (`bootstrap_derived.py`).

Cache writes are atomic: everything is built in a tmp folder next to the entry and renamed into
place, so an interrupted bootstrap never leaves an entry a later run would trust.

Why label noise: RL needs a policy that is sometimes right and sometimes wrong on the same prompt
(GRPO learns nothing from a group of equal rewards). Near-miss answers (off by 1 or 2) are the
mistakes a real model makes on arithmetic, and they keep the correct answer the most likely one, so
RL has something to sharpen.

Measured (the default config as shipped on 2026-12-04, `--ship` on the 2-core machine): policy val
accuracy 0.28 sampled at T=1 / 0.625 greedy; GenRM on the policy's own samples: agreement 1.0,
AUC 1.0, 0 parse failures; 340 s process CPU (one thread). Its GenRM figures across seeds are in
BENCHMARKS.md ('Tiny bootstrap').
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import time
from pathlib import Path

import torch

from pivotrl.config.rl import SYNTHETIC_VAL_ROWS, BootstrapConfig, DataConfig, default_cache_dir
from pivotrl.models.tiny import qwen2_config, save_model_folder
from pivotrl.rl.data import generate_rows, load_examples, write_parquet
# re-exported: the bootstrap's public API (docstring) includes the SFT primitives' measurements
from pivotrl.models.sft import (REPORT_VAL_ROWS, BootstrapResult, cached_entry, evaluate_genrm, evaluate_policy,  # noqa: F401
                                genrm_example, policy_example, sft)

# Bump when the SFT recipe changes in a way the config does not capture, to invalidate caches.
BOOTSTRAP_VERSION = 3


def cache_key(cfg: BootstrapConfig, data: DataConfig) -> str:
    """Hash of what the bootstrap builds from: its own fields and the synthetic task's."""
    blob = json.dumps({"v": BOOTSTRAP_VERSION, "cfg": cfg.key_fields(), "data": data.synthetic(),
                       "lengths": [data.max_prompt_length, data.max_response_length]},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- SFT examples

def _build(cfg: BootstrapConfig, d: DataConfig, out: Path, progress: bool) -> dict:
    torch.set_num_threads(cfg.num_threads)
    t0, cpu0 = time.perf_counter(), time.process_time()
    train = write_parquet(generate_rows(d.num_train, "train", d.seed, d.min_operand, d.max_operand, d.ops),
                          out / "data" / "train.parquet")
    val = write_parquet(generate_rows(SYNTHETIC_VAL_ROWS, "val", d.seed, d.min_operand, d.max_operand, d.ops),
                        out / "data" / "val.parquet")
    from transformers import Qwen2ForCausalLM  # deferred: keeps `--help` fast
    from pivotrl.models.tokenizer import build_tokenizer

    tok = build_tokenizer()
    report: dict = {"config": dataclasses.asdict(cfg), "data": d.synthetic(), "cache_key": cache_key(cfg, d)}
    models = {}
    for role, arch, steps, make in (
        ("policy", cfg.policy, cfg.policy_steps, lambda r: policy_example(r, d, cfg.policy_label_noise)),
        ("genrm", cfg.genrm, cfg.genrm_steps, lambda r: genrm_example(r, d, cfg.genrm_wrong_fraction)),
    ):
        t = time.perf_counter()
        torch.manual_seed(cfg.seed + (role == "genrm"))
        model = Qwen2ForCausalLM(qwen2_config(arch))
        if role == "genrm" and cfg.genrm_init_from_policy and arch == cfg.policy:
            model.load_state_dict(models["policy"].state_dict())
            report["genrm_init"] = "policy"
        # SFT examples come from their own stream, disjoint in seed from the train/val parquet.
        # The GenRM's score token carries the verdict but is one token of ~25: weight it up.
        losses = sft(model, tok, make, steps, cfg, random.Random(f"sft-{role}:{cfg.seed}"),
                     f"bootstrap {role}", progress, *(("score:", cfg.genrm_score_weight) if role == "genrm" else ()))
        save_model_folder(model, out / role, arch.dtype)
        models[role] = model
        report[f"{role}_sft_seconds"] = time.perf_counter() - t
        report[f"{role}_final_loss"] = sum(losses[-10:]) / max(1, len(losses[-10:]))

    t = time.perf_counter()
    val_ex = load_examples(val, limit=min(REPORT_VAL_ROWS, d.val_size))
    acc_sampled, responses = evaluate_policy(models["policy"], tok, val_ex, 1.0, d.max_response_length, cfg.seed)
    acc_greedy, _ = evaluate_policy(models["policy"], tok, val_ex, 0.0, d.max_response_length)
    report["policy_val_accuracy_sampled_t1"] = acc_sampled
    report["policy_val_accuracy_greedy"] = acc_greedy
    report["policy_example"] = responses[0] if responses else ""
    report["genrm_on_policy_samples"] = evaluate_genrm(models["genrm"], tok, val_ex, responses)
    report["eval_seconds"] = time.perf_counter() - t
    report["total_seconds"] = time.perf_counter() - t0
    # CPU seconds of this process: on a shared machine wall time depends on the neighbours.
    report["total_cpu_seconds"] = time.process_time() - cpu0
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


def bootstrap(cfg: BootstrapConfig | None = None, data: DataConfig | None = None, force: bool = False,
              progress: bool = True, shipped: bool = True) -> BootstrapResult:
    """Return the cached bootstrap for `cfg` on the synthetic task of `data`, building it first if
    absent (or if `force`). The cache is `cfg.cache_dir` (null: `$PIVOTRL_CACHE` or
    `~/.cache/pivotrl`). An absent entry that ships with the package (`pivotrl.models.shipped`:
    the default recipe) is copied from there instead of built, unless `shipped=False` or `force`.
    With `cfg.genrm_arch=qwen3_moe` or another `cfg.dtype`, the folders returned are derived
    stages of the dense entry (`pivotrl.models.bootstrap_derived`); `cached` is then whether every
    stage was."""
    from pivotrl.models.shipped import twin

    cfg = cfg or BootstrapConfig()
    data = data or DataConfig()
    root = Path(cfg.cache_dir) if cfg.cache_dir is not None else default_cache_dir()
    entry = root / "bootstrap" / cache_key(cfg, data)
    seed = (lambda e: twin(e, root)) if shipped else (lambda e: None)
    cached = cached_entry(entry, lambda tmp: _build(cfg, data, tmp, progress), force, seed=seed(entry))
    report = json.loads((entry / "report.json").read_text())
    res = BootstrapResult(entry / "policy", entry / "genrm", entry / "data" / "train.parquet",
                          entry / "data" / "val.parquet", report, cached)
    from pivotrl.models.bootstrap_derived import derive  # the MoE GenRM and dtype stages

    return derive(res, cfg, data, force=force, progress=progress, seed=seed)


def ship(progress: bool = True) -> dict:
    """Rebuild the default bootstrap and `shipped.SHIPPED_STAGES` in a temporary cache (trained,
    never copied from the shipped folder) and make the package's shipped folder hold exactly them;
    returns the dense report."""
    import tempfile

    from pivotrl.models.shipped import SHIPPED_STAGES, write_shipped

    with tempfile.TemporaryDirectory(prefix="pivotrl-ship-") as tmp:
        dense = bootstrap(BootstrapConfig(cache_dir=tmp), DataConfig(), progress=progress, shipped=False)
        stages = [bootstrap(BootstrapConfig(cache_dir=tmp, **over), DataConfig(), progress=progress,
                            shipped=False).genrm_path.parent for over in SHIPPED_STAGES]
        write_shipped(dense.policy_path.parent, stages)
        return dense.report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="SFT-bootstrap the tiny policy and GenRM into the user cache")
    p.add_argument("--cache-dir", type=Path, default=None, help="default: $PIVOTRL_CACHE or ~/.cache/pivotrl")
    p.add_argument("--force", action="store_true", help="rebuild even if the cache has this config")
    p.add_argument("--policy-steps", type=int, default=None)
    p.add_argument("--genrm-steps", type=int, default=None)
    p.add_argument("--label-noise", type=float, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--genrm-arch", default=None, help="qwen2 (default) or qwen3_moe (upcycled from the dense GenRM)")
    p.add_argument("--moe-steps", type=int, default=None, help="SFT steps of the upcycled MoE GenRM")
    p.add_argument("--dtype", default=None, help="float32 (default) or bfloat16: dtype of the folders")
    p.add_argument("--json", type=Path, default=None, help="also write the report here")
    p.add_argument("--ship", action="store_true",
                   help="rebuild the bootstrap that ships with the package (pivotrl/models/bootstrap_shipped/: "
                        "the default recipe and its shipped stages, built afresh) and replace it; other options "
                        "are refused with it")
    a = p.parse_args(argv)
    if a.ship:
        if any(v not in (None, False) for k, v in vars(a).items() if k not in ("ship", "json")):
            p.error("--ship rebuilds the default recipe: it takes no other option but --json")
        from pivotrl.models.shipped import SHIPPED

        r = ship(progress=True)
        print(f"shipped bootstrap rebuilt into {SHIPPED}: policy val accuracy sampled(T=1) "
              f"{r['policy_val_accuracy_sampled_t1']:.3f}, greedy {r['policy_val_accuracy_greedy']:.3f}; "
              f"GenRM AUC {r['genrm_on_policy_samples']['auc']:.3f}")
        if a.json:
            a.json.write_text(json.dumps(r, indent=2))
        return 0
    over = {k: v for k, v in {"policy_steps": a.policy_steps, "genrm_steps": a.genrm_steps,
                              "policy_label_noise": a.label_noise, "lr": a.lr, "batch_size": a.batch_size,
                              "seed": a.seed, "num_threads": a.threads, "genrm_arch": a.genrm_arch,
                              "moe_steps": a.moe_steps, "dtype": a.dtype}.items() if v is not None}
    if a.cache_dir is not None:
        over["cache_dir"] = str(a.cache_dir)
    cfg = BootstrapConfig(**over)
    res = bootstrap(cfg, DataConfig(), a.force)
    r = res.report
    g = r["genrm_on_policy_samples"]
    print(f"cache entry: {res.policy_path.parent} ({'reused' if res.cached else 'built, or a stage of it'})")
    print(f"bootstrap seconds: {r['total_seconds']:.1f} (policy SFT {r['policy_sft_seconds']:.1f}, "
          f"GenRM SFT {r['genrm_sft_seconds']:.1f}, eval {r['eval_seconds']:.1f}); "
          f"process CPU seconds {r.get('total_cpu_seconds', float('nan')):.1f}")
    print(f"policy val accuracy: sampled(T=1) {r['policy_val_accuracy_sampled_t1']:.3f}, "
          f"greedy {r['policy_val_accuracy_greedy']:.3f}")
    for name, st in r.get("stages", {}).items():
        print(f"derived stage {name}: {st['path']} ({st['seconds']:.1f} s"
              + (f", SFT {st['sft_seconds']:.1f} s" if "sft_seconds" in st else "") + ")")
    print(f"GenRM ({res.genrm_path}) on policy samples: agreement {g['agreement']:.3f}, AUC {g['auc']:.3f}, "
          f"positives {g['positive_rate']:.3f}, parse failures {g['parse_failures']}/{g['n']}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
