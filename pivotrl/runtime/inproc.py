"""`cluster=inproc`: the synchronous proof loop in one process, over the same config tree.

Per step: draw `train.prompts_per_step` training prompts; sample `train.group_size` responses each
on the policy engine; judge each on the GenRM engine; R = w_v * verifiable + w_g * GenRM score;
one GRPO update (`algo`, the same trainer settings every runtime uses), which publishes the new
weights into the policy engine. No Ray, no device shifting, no deployment controller: it proves
the pieces work together and is the simplest baseline. Held-out accuracy before and after as in
every real runtime (`runtime.evaluation`); `cluster.max_wall_s` ends the run after the step that
crosses it.
"""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from pivotrl.config.resolve import resolve
from pivotrl.runtime.assets import load_assets, load_val_examples
from pivotrl.runtime.evaluation import decode, encode_prompt, evaluate, sample


def run_inproc(cfg: Any, run_dir: Path, tracker: Any) -> dict[str, Any]:
    """Run the loop; return the summary (the tracker writes `metrics.jsonl` rows as it goes)."""
    import torch

    from pivotrl.engines.protocol import SamplingParams
    from pivotrl.engines.registry import create_engine
    from pivotrl.trainer.train_batch import TrainBatch
    from pivotrl.trainer.trainer import Trainer
    from pivotrl.rl.data import load_examples
    from pivotrl.rl.genrm import ParseStats, judge_prompt
    from pivotrl.rl.rewards import RewardFunction

    r = resolve(cfg)
    progress = bool(cfg.logging.progress)
    torch.set_num_threads(int(cfg.cluster.threads_per_device))
    assets = load_assets(cfg, progress=progress)
    tok, genrm_tok = assets.tokenizers(cfg)
    train = load_examples(assets.train_path)
    val = load_val_examples(assets.val_path, cfg.data.val_size)
    judge = cfg.models.genrm.judge
    reward_fn = RewardFunction(cfg.reward, ParseStats(), judge=judge)
    rng = random.Random(f"sync-loop:{cfg.seed}")
    d, temp, P, G = cfg.data, float(cfg.algo.rollout_temperature), r.prompts_per_step, r.group_size
    chat = cfg.models.policy.chat
    eval_kw = dict(temperature=temp, samples=d.val_samples, seed=int(cfg.seed), max_prompt_len=d.max_prompt_length,
                   max_tokens=r.max_response, chat=chat)
    policy = create_engine(assets.policy_path, cfg.engine.for_role("rollout"))
    genrm = create_engine(assets.genrm_path, cfg.engine.for_role("reward")) if reward_fn.uses_genrm else None
    trainer = Trainer(r.trainer(cfg, 1), assets.policy_path, publish=lambda v, sd: policy.load_weights(sd, v))
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    try:
        before = evaluate(policy, tok, val, **eval_kw)
        for step in range(1, r.steps + 1):
            batch = rng.sample(train, min(P, len(train)))
            prompts = [encode_prompt(tok, e.prompt, d.max_prompt_length, chat) for e in batch]
            t = time.perf_counter()
            groups = sample(policy, prompts, G, SamplingParams(temperature=temp, max_tokens=r.max_response),
                            seed=int(cfg.seed) * 1_000_003 + step * 100_000)
            rollout_s = time.perf_counter() - t
            flat_ex = [e for e in batch for _ in range(G)]
            flat_ids = [x for g in groups for x in g]
            texts = [decode(tok, x) for x in flat_ids]
            t = time.perf_counter()
            judged: list[str | None] = [None] * len(texts)
            if genrm is not None:
                jp = [judge_prompt(genrm_tok, e.prompt, s, judge, cfg.models.genrm.chat) for e, s in zip(flat_ex, texts)]
                params = SamplingParams(temperature=judge.temperature, top_p=judge.top_p, max_tokens=judge.max_tokens)
                judged = [decode(genrm_tok, x[0]) for x in sample(genrm, jp, 1, params, seed=0)]
            fails = reward_fn.stats.failures
            rewards = [reward_fn(e.data_source, s, e.ground_truth, e.extra_info, j) for e, s, j in zip(flat_ex, texts, judged)]
            reward_s = time.perf_counter() - t
            t = time.perf_counter()
            metrics = trainer.step(TrainBatch(
                prompt_ids=[p for p in prompts for _ in range(G)], response_ids=flat_ids,
                versions=[trainer.version] * len(flat_ids), rewards=[x.total for x in rewards],
                group_ids=[i for i in range(len(batch)) for _ in range(G)]))
            train_s = time.perf_counter() - t
            n = len(rewards)
            tokens = sum(len(p) for p in prompts) * G + sum(len(x) for x in flat_ids)
            row = {"step": step, "version": trainer.version, "time_s": time.perf_counter() - t_start,
                   "step_time_s": rollout_s + reward_s + train_s,
                   "throughput_tokens_per_s": tokens / max(rollout_s + reward_s + train_s, 1e-9), "tokens": tokens,
                   "reward_mean": sum(x.total for x in rewards) / n, "train_accuracy": sum(x.verifiable for x in rewards) / n,
                   "genrm_score_mean": sum(x.genrm for x in rewards) / n,
                   "genrm_parse_failures": reward_fn.stats.failures - fails,
                   "loss": float(metrics.get("loss", float("nan"))), "rollout_s": rollout_s, "reward_s": reward_s,
                   "train_s": train_s}
            rows.append(row)
            if tracker is not None:
                tracker.log_step(row)
            if progress:
                print(f"[pivotrl inproc] step {step}/{r.steps} {row['step_time_s']:.1f}s reward={row['reward_mean']:.3f} "
                      f"acc={row['train_accuracy']:.3f}", flush=True)
            if cfg.cluster.max_wall_s is not None and time.perf_counter() - t_start > cfg.cluster.max_wall_s:
                break
        after = evaluate(policy, tok, val, **eval_kw)
    finally:
        trainer.close()
        policy.shutdown()
        if genrm is not None:
            genrm.shutdown()
    measured = rows[r.warmup:] or rows
    span = sum(x["step_time_s"] for x in measured)
    return {"deploy": "inproc", "models": cfg.models.name, "cluster": "inproc", "devices": 1, "steps": len(rows),
            "warmup_steps": r.warmup, "measured_steps": len(measured), "prompts_per_step": P, "group_size": G,
            "throughput_tokens_per_s": sum(x["tokens"] for x in measured) / span if span > 0 else 0.0,
            "val_accuracy_before": before["sampled"], "val_accuracy_greedy_before": before["greedy"],
            "val_accuracy_after": after["sampled"], "val_accuracy_greedy_after": after["greedy"],
            "policy_version": trainer.version, "genrm_parse": reward_fn.stats.as_dict(), "num_shifts": 0,
            "ideal_efficiency": None,  # one process, no per-device peak
            "wall_s": time.perf_counter() - t_start, "bootstrap": assets.bootstrap_info,
            "reward_mean": [x["reward_mean"] for x in rows], "train_accuracy": [x["train_accuracy"] for x in rows]}
