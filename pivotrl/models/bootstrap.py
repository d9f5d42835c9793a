"""SFT bootstrap of the tiny policy and GenRM, cached in the user cache folder.

Owns: making the SFT examples (policy: problem -> equation + `#### answer`, with near-miss label
noise so the policy is only partly right; GenRM: problem + response -> `check: <equation> vs
<response's answer>` + `score: 0|1`, initialised from the SFT policy), the SFT loop, the held-out
measurements (policy accuracy, GenRM agreement and AUC), and the cache (`$PIVOTRL_CACHE` or `~/.cache/pivotrl`, keyed by a hash of the config).

Public API:
    bootstrap(cfg=BootstrapConfig(), cache_dir=None, force=False, progress=True) -> BootstrapResult
        .policy_path, .genrm_path, .train_path, .val_path (Path), .report (dict), .cached (bool)
    evaluate_policy(model, tok, examples, temperature, max_new_tokens, seed) -> (accuracy, responses)
    evaluate_genrm(model, tok, examples, responses, max_new_tokens) -> dict (agreement, auc, ...)
    cached_entry(entry, build, force=False) -> bool   (the atomic cache write; also the derived stages')
    CLI: python -m pivotrl.models.bootstrap [--policy-steps N] [--genrm-steps N] [--genrm-arch A]
         [--moe-steps N] [--dtype D] [--force] ...

The Qwen3-MoE GenRM (`genrm_arch=qwen3_moe`) and folders in bf16 (`dtype=bfloat16`) are derived
stages of this cache entry, built from it without changing its key (`bootstrap_derived.py`).

Cache writes are atomic: everything is built in a tmp folder next to the entry and renamed into
place, so an interrupted bootstrap never leaves an entry a later run would trust.

Why label noise: RL needs a policy that is sometimes right and sometimes wrong on the same prompt
(GRPO learns nothing from a group of equal rewards). Near-miss answers (off by 1 or 2) are the
mistakes a real model makes on arithmetic, and they keep the correct answer the most likely one, so
RL has something to sharpen.

Measured (default config, 2026-11-30, this 2-core machine shared with other jobs at load 5-15):
policy val accuracy 0.28 sampled at T=1 / 0.625 greedy; GenRM on the policy's own samples:
agreement 0.865, AUC 0.91, 0 parse failures (identical on a rebuild: the recipe is seeded); wall
744 s and 519 s in two builds, 270 s process CPU (one thread) each.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from pivotrl.config.rl import SYNTHETIC_VAL_ROWS, BootstrapConfig, DataConfig, TinyModelConfig, default_cache_dir
from pivotrl.models.tiny import load_tiny_model, qwen2_config, save_model_folder
from pivotrl.rl.data import Example, generate_rows, load_examples, make_problem, write_parquet
from pivotrl.rl.genrm import judge_messages, parse_score, reference_judgement, ParseStats
from pivotrl.rl.rewards import extract_answer, verifiable_score

# Bump when the SFT recipe changes in a way the config does not capture, to invalidate caches.
BOOTSTRAP_VERSION = 3


@dataclass
class BootstrapResult:
    policy_path: Path
    genrm_path: Path
    train_path: Path
    val_path: Path
    report: dict
    cached: bool


#: Most held-out prompts the bootstrap's own report evaluates (the first min(this, data.val_size) of
#: the synthetic pool, in the run that built the cache entry; the report is not part of the key).
REPORT_VAL_ROWS = 200


def cache_key(cfg: BootstrapConfig, data: DataConfig) -> str:
    """Hash of what the bootstrap builds from: its own fields and the synthetic task's."""
    blob = json.dumps({"v": BOOTSTRAP_VERSION, "cfg": cfg.key_fields(), "data": data.synthetic(),
                       "lengths": [data.max_prompt_length, data.max_response_length]},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- SFT examples

def _near_miss(rng: random.Random, c: int) -> int:
    wrong = c + rng.choice((-2, -1, 1, 2))
    return wrong if wrong >= 0 else c + rng.choice((1, 2))


def _response(a: int, op: str, b: int, c: int) -> str:
    return f"{a}{op}{b}={c}\n#### {c}"


def policy_example(rng: random.Random, data: DataConfig, label_noise: float) -> tuple[list[dict], str]:
    p = make_problem(rng, data.min_operand, data.max_operand, data.ops)
    c = p["answer"] if rng.random() >= label_noise else _near_miss(rng, p["answer"])
    return [{"role": "user", "content": p["text"]}], _response(p["a"], p["op"], p["b"], c)


def genrm_example(rng: random.Random, data: DataConfig, wrong_fraction: float) -> tuple[list[dict], str]:
    """A judged response: the correct one, or a corruption like the policy's mistakes."""
    p = make_problem(rng, data.min_operand, data.max_operand, data.ops)
    a, op, b, c = p["a"], p["op"], p["b"], p["answer"]
    prompt = [{"role": "user", "content": p["text"]}]
    if rng.random() >= wrong_fraction:
        response = _response(a, op, b, c)
    else:
        kind = rng.random()
        w = _near_miss(rng, c)
        if kind < 0.6:  # consistent slip: wrong result carried to the final answer
            response = _response(a, op, b, w)
        elif kind < 0.8:  # right equation, wrong final answer
            response = f"{a}{op}{b}={c}\n#### {w}"
        else:  # malformed: no final answer line, or a truncated one
            response = f"{a}{op}{b}={c}" if rng.random() < 0.5 else f"{a}{op}{b}="
    score = verifiable_score(response, str(c))
    return judge_messages(prompt, response), reference_judgement(f"{a}{op}{b}={c}", score,
                                                                 extract_answer(response))


def _encode(tok, prompt: list[dict], response: str) -> tuple[list[int], int]:
    ids = tok.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True, return_dict=False)
    return list(ids) + tok.encode(response, add_special_tokens=False) + [tok.eos_token_id], len(ids)


def _batch(tok, pairs: list[tuple[list[dict], str]], emphasis: str | None = None, weight: float = 1.0
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask, labels (-100 on prompt and padding) and per-token
    loss weights: 1, or `weight` on the response characters after `emphasis` (char-level tokenizer,
    so characters are tokens)."""
    enc = [_encode(tok, p, r) for p, r in pairs]
    width = max(len(ids) for ids, _ in enc)
    ids = torch.full((len(enc), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(enc), width), dtype=torch.long)
    labels = torch.full((len(enc), width), -100, dtype=torch.long)
    weights = torch.zeros((len(enc), width))
    for i, ((seq, n_prompt), (_, response)) in enumerate(zip(enc, pairs)):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, n_prompt: len(seq)] = torch.tensor(seq[n_prompt:])
        weights[i, n_prompt: len(seq)] = 1.0
        if emphasis is not None and emphasis in response:
            weights[i, n_prompt + response.index(emphasis) + len(emphasis): len(seq)] = weight
    return ids, mask, labels, weights


def _weighted_loss(model, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
                   weights: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    tgt, w = labels[:, 1:], weights[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                           ignore_index=-100, reduction="none")
    return (ce * w.reshape(-1)).sum() / w.sum().clamp_min(1e-8)


def sft(model, tok, make_pair, steps: int, cfg: BootstrapConfig, rng: random.Random, desc: str,
        progress: bool = True, emphasis: str | None = None, weight: float = 1.0) -> list[float]:
    """Plain SFT: AdamW, linear warm-up then cosine decay, loss on response tokens only."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, steps - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    losses = []
    bar = tqdm(range(steps), desc=desc, disable=not progress, file=sys.stderr)
    for step in bar:
        ids, mask, labels, weights = _batch(tok, [make_pair(rng) for _ in range(cfg.batch_size)], emphasis, weight)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = _weighted_loss(model, ids, mask, labels, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}")
    model.eval()
    return losses


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def generate(model, tok, prompts: list[list[dict]], max_new_tokens: int, temperature: float,
             seed: int = 0, batch_size: int = 256) -> list[str]:
    """Batched `transformers` generation (left padding); temperature 0 is greedy."""
    torch.manual_seed(seed)
    out = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i: i + batch_size]
        texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        kwargs = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if temperature > 0 \
            else dict(do_sample=False)
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id, **kwargs)
        out += tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


def evaluate_policy(model, tok, examples: list[Example], temperature: float, max_new_tokens: int = 24,
                    seed: int = 0) -> tuple[float, list[str]]:
    """Fraction of `examples` whose generated response has the right final answer."""
    responses = generate(model, tok, [e.prompt for e in examples], max_new_tokens, temperature, seed)
    acc = sum(verifiable_score(r, e.ground_truth) for r, e in zip(responses, examples)) / max(1, len(examples))
    return acc, responses


def _auc(scores: list[float], labels: list[int]) -> float:
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def evaluate_genrm(model, tok, examples: list[Example], responses: list[str], max_new_tokens: int = 32) -> dict:
    """Judge each (example, response) greedily; compare the parsed score with verifiable correctness."""
    stats = ParseStats()
    judged = generate(model, tok, [judge_messages(e.prompt, r) for e, r in zip(examples, responses)],
                      max_new_tokens, temperature=0.0)
    scores = [parse_score(j, stats=stats).score for j in judged]
    labels = [int(verifiable_score(r, e.ground_truth)) for r, e in zip(responses, examples)]
    agree = sum((s >= 0.5) == bool(y) for s, y in zip(scores, labels)) / max(1, len(labels))
    return {"agreement": agree, "auc": _auc(scores, labels), "positive_rate": sum(labels) / max(1, len(labels)),
            "parse_failures": stats.failures, "n": len(labels), "example": judged[0] if judged else ""}


# ---------------------------------------------------------------- bootstrap + cache

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


def _remove_stale_tmp(folder: Path) -> None:
    """Delete tmp folders left by bootstraps that were killed (their pid is gone)."""
    for tmp in folder.glob(".*.tmp-*"):
        try:
            pid = int(tmp.name.rsplit(".tmp-", 1)[1].split("-", 1)[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, IndexError, PermissionError):
            continue


def cached_entry(entry: Path, build, force: bool = False) -> bool:
    """Make the cache entry folder `entry` with `build(tmp_folder)` unless it holds a `report.json`
    already (or `force`); return whether it was cached. Atomic: built in a tmp folder next to the
    entry and renamed into place; tmp folders of killed builds are removed first."""
    if (entry / "report.json").is_file() and not force:
        return True
    entry.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(entry.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-{os.getpid()}-", dir=entry.parent))
    try:
        build(tmp)
        if entry.exists() and not force:
            pass  # another process finished the same entry first: keep theirs, drop ours
        else:
            if entry.exists():
                old = entry.with_name(f".{entry.name}.old-{os.getpid()}")
                os.replace(entry, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return False


def bootstrap(cfg: BootstrapConfig | None = None, data: DataConfig | None = None, force: bool = False,
              progress: bool = True) -> BootstrapResult:
    """Return the cached bootstrap for `cfg` on the synthetic task of `data`, building it first if
    absent (or if `force`). The cache is `cfg.cache_dir` (null: `$PIVOTRL_CACHE` or
    `~/.cache/pivotrl`). With `cfg.genrm_arch=qwen3_moe` or another `cfg.dtype`, the folders
    returned are derived stages of the dense entry (`pivotrl.models.bootstrap_derived`); `cached`
    is then whether every stage was."""
    cfg = cfg or BootstrapConfig()
    data = data or DataConfig()
    root = Path(cfg.cache_dir) if cfg.cache_dir is not None else default_cache_dir()
    entry = root / "bootstrap" / cache_key(cfg, data)
    cached = cached_entry(entry, lambda tmp: _build(cfg, data, tmp, progress), force)
    report = json.loads((entry / "report.json").read_text())
    res = BootstrapResult(entry / "policy", entry / "genrm", entry / "data" / "train.parquet",
                          entry / "data" / "val.parquet", report, cached)
    from pivotrl.models.bootstrap_derived import derive  # the MoE GenRM and dtype stages

    return derive(res, cfg, data, force=force, progress=progress)


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
    a = p.parse_args(argv)
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
