"""SFT primitives shared by the bootstrap's stages (`bootstrap.py`: the dense policy and GenRM;
`bootstrap_derived.py`: the MoE GenRM and dtype casts): the SFT examples, the weighted SFT loop,
sampling and the held-out measurements (policy accuracy, GenRM agreement and AUC), and atomic
cache entries (built in a tmp folder next to the entry and renamed into place).
"""
from __future__ import annotations

import math
import fcntl
import os
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from pivotrl.config.rl import BootstrapConfig, DataConfig
from pivotrl.orphans import remove_orphans
from pivotrl.rl.data import Example, make_problem
from pivotrl.rl.genrm import judge_messages, parse_score, reference_judgement, ParseStats
from pivotrl.rl.rewards import extract_answer, verifiable_score



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


def cached_entry(entry: Path, build, force: bool = False, seed: Path | None = None) -> bool:
    """Make the cache entry folder `entry` with `build(tmp_folder)` unless it holds a `report.json`
    already (or `force`); return whether it was cached. A `seed` folder holding a `report.json`
    (the entry as shipped with the package, `pivotrl.models.shipped`) is copied instead of
    building, and counts as cached. Atomic: built (or copied) in a tmp folder next to the entry and
    renamed into place; tmp folders of killed builds are removed first. One builder at a time: a
    second process asking for the same entry waits for the first (a lock file beside it) and then
    reuses what it built."""
    if (entry / "report.json").is_file() and not force:
        return True
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f".{entry.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (also if this process dies)
        if (entry / "report.json").is_file() and not force:
            return True
        if seed is not None and (seed / "report.json").is_file() and not force:
            _build_entry(entry, lambda tmp: shutil.copytree(seed, tmp, dirs_exist_ok=True), force)
            return True
        return _build_entry(entry, build, force)


#: A cache entry is built in `.{entry}{TMP_MARKER}{pid}-{random}` next to it, then renamed into place.
TMP_MARKER = ".tmp-"


def remove_orphan_builds(root: Path) -> list[Path]:
    """Delete the tmp folders in `root` of builds whose process is gone (killed mid-build).
    Returns the folders removed."""
    return remove_orphans(root, f".*{TMP_MARKER}*", TMP_MARKER)


def _build_entry(entry: Path, build, force: bool) -> bool:
    remove_orphan_builds(entry.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}{TMP_MARKER}{os.getpid()}-", dir=entry.parent))
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
