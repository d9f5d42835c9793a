"""The synchronous proof loop: rollout (policy engine) -> GenRM reward (GenRM engine) -> GRPO step.

Owns: one plain, sequential RL loop over the project's own pieces, for the tiny models on CPU, and
its before/after validation accuracy. It exists to prove the pieces work together; the real
deployment modes (colocated, disaggregated, pivot) live in `pivotrl.deploy` / `pivotrl.runtime`.
It knows nothing about Ray or device shifting.

Per step: draw `prompts_per_step` training prompts; submit `group_size` sampled responses each to
the policy engine; build a judge prompt per response and run it greedily on the GenRM engine;
R = w_v * verifiable + w_g * parsed GenRM score (`pivotrl.rl.rewards.RewardFunction`); one GRPO
update (`pivotrl.engines.trainer.Trainer`), which publishes the new weights into the policy
engine (`load_weights`, version + 1). Validation accuracy is the fraction of sampled responses at
the rollout temperature (`eval_samples` per prompt) with the right final answer; greedy accuracy
is reported beside it.

Public API:
    run_sync_loop(cfg: SyncLoopConfig, out_dir=None, cache_dir=None, progress=True) -> dict
    CLI: python -m pivotrl.rl.sync_loop [--steps N] [--max-minutes M] [--engine cpu] [--out DIR] ...
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from pivotrl.config.engine import EngineConfig
from pivotrl.config.rl import RewardConfig, SyncLoopConfig, default_cache_dir
from pivotrl.config.trainer import TrainerConfig
from pivotrl.engines.protocol import GenerationRequest, InferenceEngine, SamplingParams
from pivotrl.engines.registry import create_engine
from pivotrl.engines.trainer import TrainBatch, Trainer
from pivotrl.models.bootstrap import bootstrap
from pivotrl.models.tokenizer import load_tokenizer
from pivotrl.rl.data import Example, load_examples, write_synthetic_dataset
from pivotrl.rl.genrm import ParseStats, judge_messages
from pivotrl.rl.rewards import RewardFunction, verifiable_score

_ids = itertools.count()


def encode_prompt(tok, messages: list[dict], max_len: int) -> list[int]:
    ids = list(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))
    if len(ids) > max_len:
        raise ValueError(f"prompt of {len(ids)} tokens exceeds data.max_prompt_length={max_len}: "
                         f"{messages[-1]['content'][:80]!r}")
    return ids


def sample(engine: InferenceEngine, prompts: list[list[int]], n: int, params: SamplingParams,
           seed: int) -> list[list[list[int]]]:
    """`n` responses (token ids, EOS included when sampled) per prompt, in prompt order."""
    reqs = []
    for i, p in enumerate(prompts):
        for j in range(n):
            sp = dataclasses.replace(params, seed=None if params.greedy else seed + i * n + j)
            reqs.append(GenerationRequest(seq_id=next(_ids), prompt_ids=p, params=sp))
    done = engine.generate(reqs)
    return [[c.token_ids for c in done[i * n:(i + 1) * n]] for i in range(len(prompts))]


def decode(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=True)


def judge(engine: InferenceEngine, tok, examples: list[Example], responses: list[str],
          reward: RewardConfig, max_prompt_len: int) -> list[str]:
    """The GenRM's judgement text for each (example, response), greedy unless configured."""
    prompts = [encode_prompt(tok, judge_messages(e.prompt, r), max_prompt_len) for e, r in zip(examples, responses)]
    params = SamplingParams(temperature=reward.genrm_temperature, max_tokens=reward.genrm_max_tokens)
    return [decode(tok, r[0]) for r in sample(engine, prompts, 1, params, seed=0)]


def evaluate(engine: InferenceEngine, tok, val: list[Example], cfg: SyncLoopConfig, max_prompt_len: int,
             max_tokens: int) -> dict:
    prompts = [encode_prompt(tok, e.prompt, max_prompt_len) for e in val]
    sampled = sample(engine, prompts, cfg.eval_samples, SamplingParams(temperature=cfg.temperature,
                     max_tokens=max_tokens), seed=10_000_000 + cfg.seed)
    greedy = sample(engine, prompts, 1, SamplingParams(temperature=0.0, max_tokens=max_tokens), seed=0)
    acc_s = sum(verifiable_score(decode(tok, r), e.ground_truth) for e, rs in zip(val, sampled) for r in rs)
    acc_g = sum(verifiable_score(decode(tok, rs[0]), e.ground_truth) for e, rs in zip(val, greedy))
    return {"val_acc_sampled": acc_s / (len(val) * cfg.eval_samples), "val_acc_greedy": acc_g / len(val)}


def _synthetic_data(cfg: SyncLoopConfig, cache_dir: str | Path | None) -> tuple[Path, Path]:
    """The synthetic train/val parquet of `cfg.bootstrap.data`, cached by its settings."""
    d = cfg.bootstrap.data
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = hashlib.sha256(json.dumps(dataclasses.asdict(d), sort_keys=True, default=str).encode()).hexdigest()[:16]
    folder = root / "data" / key
    if not (folder / "val.parquet").is_file():
        write_synthetic_dataset(folder, d.num_train, d.num_val, d.seed, d.min_operand, d.max_operand, d.ops)
    return folder / "train.parquet", folder / "val.parquet"


def run_sync_loop(cfg: SyncLoopConfig, out_dir: str | Path | None = None, cache_dir: str | Path | None = None,
                  progress: bool = True) -> dict:
    """Run the loop; return a summary (accuracy before/after, steps, seconds, per-step metrics)."""
    torch.set_num_threads(cfg.num_threads)
    t_boot = time.perf_counter()
    data = cfg.bootstrap.data
    if cfg.policy_path is not None and cfg.genrm_path is not None:
        policy_path, genrm_path, cached = Path(cfg.policy_path), Path(cfg.genrm_path), True
        train_path, val_path = _synthetic_data(cfg, cache_dir)
    else:
        boot = bootstrap(cfg.bootstrap, cache_dir=cache_dir, progress=progress)
        policy_path = Path(cfg.policy_path) if cfg.policy_path else boot.policy_path
        genrm_path = Path(cfg.genrm_path) if cfg.genrm_path else boot.genrm_path
        train_path, val_path, cached = boot.train_path, boot.val_path, boot.cached
    # The user's parquet replaces the synthetic task.
    train_path = Path(data.train_path) if data.train_path else train_path
    val_path = Path(data.val_path) if data.val_path else val_path
    boot_s = time.perf_counter() - t_boot
    tok = load_tokenizer(policy_path)
    train = load_examples(train_path)
    val = load_examples(val_path, limit=cfg.eval_size)
    reward_fn = RewardFunction(cfg.reward, ParseStats())
    rng = random.Random(f"sync-loop:{cfg.seed}")
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
    records: list[dict] = []

    def emit(rec: dict) -> None:
        records.append(rec)
        if out is not None:
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")

    ecfg = EngineConfig(name=cfg.engine, seed=cfg.seed, num_threads=cfg.num_threads)
    policy = create_engine(policy_path, ecfg)
    genrm = create_engine(genrm_path, ecfg) if reward_fn.uses_genrm else None
    tcfg = TrainerConfig(lr=cfg.lr, world_size=cfg.world_size, micro_batch_size=cfg.micro_batch_size,
                         kl_coef=cfg.kl_coef, staleness=0, logprob_temperature=cfg.temperature,
                         num_threads=cfg.num_threads, seed=cfg.seed)
    trainer = Trainer(tcfg, policy_path, publish=lambda v, sd: policy.load_weights(sd, v))
    max_prompt = max(data.max_prompt_length, 512)  # judge prompts embed the response
    try:
        t0 = time.perf_counter()
        before = evaluate(policy, tok, val, cfg, data.max_prompt_length, data.max_response_length)
        emit({"step": 0, "version": trainer.version, **before, "eval_s": time.perf_counter() - t0})
        t_start = time.perf_counter()
        last_eval = before
        bar = tqdm(range(1, cfg.steps + 1), desc="sync loop", disable=not progress, file=sys.stderr)
        for step in bar:
            batch = rng.sample(train, min(cfg.prompts_per_step, len(train)))
            prompts = [encode_prompt(tok, e.prompt, data.max_prompt_length) for e in batch]
            t = time.perf_counter()
            groups = sample(policy, prompts, cfg.group_size,
                            SamplingParams(temperature=cfg.temperature, max_tokens=data.max_response_length),
                            seed=cfg.seed * 1_000_003 + step * 100_000)
            rollout_s = time.perf_counter() - t
            flat_ex = [e for e in batch for _ in range(cfg.group_size)]
            flat_ids = [r for g in groups for r in g]
            texts = [decode(tok, r) for r in flat_ids]
            t = time.perf_counter()
            judged = judge(genrm, tok, flat_ex, texts, cfg.reward, max_prompt) if genrm is not None else [None] * len(texts)
            fails_before = reward_fn.stats.failures
            rewards = [reward_fn(e.data_source, s, e.ground_truth, e.extra_info, j)
                       for e, s, j in zip(flat_ex, texts, judged)]
            reward_s = time.perf_counter() - t
            t = time.perf_counter()
            metrics = trainer.step(TrainBatch(
                prompt_ids=[p for p in prompts for _ in range(cfg.group_size)], response_ids=flat_ids,
                versions=[trainer.version] * len(flat_ids), rewards=[r.total for r in rewards],
                group_ids=[i for i in range(len(batch)) for _ in range(cfg.group_size)]))
            train_s = time.perf_counter() - t
            rv = [r.verifiable for r in rewards]
            rec = {"step": step, "version": trainer.version, "reward_mean": sum(r.total for r in rewards) / len(rewards),
                   "train_acc": sum(rv) / len(rv), "genrm_score_mean": sum(r.genrm for r in rewards) / len(rewards),
                   "genrm_agreement": sum((r.genrm >= 0.5) == (r.verifiable > 0) for r in rewards) / len(rewards),
                   "genrm_parse_failures": reward_fn.stats.failures - fails_before,
                   "loss": float(metrics.get("loss", float("nan"))), "rollout_s": rollout_s,
                   "reward_s": reward_s, "train_s": train_s}
            over_budget = time.perf_counter() - t_start > cfg.max_minutes * 60
            if step % cfg.eval_every == 0 or step == cfg.steps or over_budget:
                t = time.perf_counter()
                last_eval = evaluate(policy, tok, val, cfg, data.max_prompt_length, data.max_response_length)
                rec.update(last_eval, eval_s=time.perf_counter() - t)
            rec["elapsed_s"] = time.perf_counter() - t_start
            emit(rec)
            bar.set_postfix(acc=f"{rec['train_acc']:.2f}", val=f"{last_eval['val_acc_sampled']:.2f}")
            if over_budget:
                break
        summary = {"before": before, "after": last_eval, "steps": records[-1]["step"],
                   "policy_version": trainer.version, "loop_seconds": time.perf_counter() - t_start,
                   "bootstrap_seconds": boot_s, "bootstrap_cached": cached,
                   "genrm_parse": reward_fn.stats.as_dict(), "engine": policy.name, "records": records}
    finally:
        trainer.close()
        policy.shutdown()
        if genrm is not None:
            genrm.shutdown()
    if out is not None:
        (out / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "records"}, indent=2))
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Synchronous GRPO loop on the tiny policy + GenRM (CPU)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--max-minutes", type=float, default=None)
    p.add_argument("--engine", default=None, help="cpu | vllm | auto")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--prompts-per-step", type=int, default=None)
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--eval-size", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--genrm-weight", type=float, default=None, help="0 disables the GenRM reward")
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--cache-dir", type=Path, default=None)
    p.add_argument("--policy-path", default=None, help="start from this policy folder (default: bootstrap)")
    p.add_argument("--genrm-path", default=None, help="GenRM folder (default: bootstrap)")
    p.add_argument("--out", type=Path, default=None, help="folder for config.json, metrics.jsonl, summary.json")
    p.add_argument("--json", type=Path, default=None, help="write the summary here too")
    a = p.parse_args(argv)
    over = {k: v for k, v in {"steps": a.steps, "max_minutes": a.max_minutes, "engine": a.engine, "lr": a.lr,
                              "prompts_per_step": a.prompts_per_step, "group_size": a.group_size,
                              "eval_size": a.eval_size, "eval_every": a.eval_every, "world_size": a.world_size,
                              "seed": a.seed, "policy_path": a.policy_path,
                              "genrm_path": a.genrm_path}.items() if v is not None}
    if a.genrm_weight is not None:
        over["reward"] = RewardConfig(genrm_weight=a.genrm_weight)
    s = run_sync_loop(SyncLoopConfig(**over), a.out, a.cache_dir)
    print(f"{'step':>4} {'reward':>7} {'train_acc':>9} {'genrm_agree':>11} {'val_acc(T)':>10} {'val_greedy':>10} {'elapsed_s':>9}")
    for r in s["records"]:
        print(f"{r['step']:>4} {r.get('reward_mean', float('nan')):>7.3f} {r.get('train_acc', float('nan')):>9.3f} "
              f"{r.get('genrm_agreement', float('nan')):>11.3f} {r.get('val_acc_sampled', float('nan')):>10.3f} "
              f"{r.get('val_acc_greedy', float('nan')):>10.3f} {r.get('elapsed_s', 0.0):>9.1f}")
    b, e = s["before"], s["after"]
    print(f"validation accuracy (sampled, T=rollout): {b['val_acc_sampled']:.3f} -> {e['val_acc_sampled']:.3f} "
          f"({100 * (e['val_acc_sampled'] - b['val_acc_sampled']):+.1f} points); greedy "
          f"{b['val_acc_greedy']:.3f} -> {e['val_acc_greedy']:.3f}; {s['steps']} steps in {s['loop_seconds']:.0f}s "
          f"(engine {s['engine']}, policy version {s['policy_version']})")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({k: v for k, v in s.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
