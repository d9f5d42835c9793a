"""Measure the upcycled tiny Qwen3-MoE GenRM: `python -m pivotrl.models.moe_genrm_check [--steps N] [--json PATH]`.

Owns one measurement: take the bootstrapped (cached) dense GenRM, `upcycle_to_qwen3_moe` it, SFT it
with the bootstrap's own GenRM examples for `--steps` steps, and judge the bootstrapped policy's
sampled validation responses (`bootstrap.evaluate_genrm`): agreement, AUC, parse failures. Prints
one line per measured point and writes JSON. Builds the bootstrap first if it is not cached.
"""
from __future__ import annotations

import argparse
import json
import random
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150, help="SFT steps after upcycling")
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from pivotrl.config.rl import BootstrapConfig
    from pivotrl.models import bootstrap as B
    from pivotrl.models.tiny_families import upcycle_to_qwen3_moe
    from pivotrl.models.tokenizer import build_tokenizer
    from pivotrl.rl.data import load_examples

    cfg = BootstrapConfig()
    torch.set_num_threads(cfg.num_threads)
    boot = B.bootstrap(cfg)
    tok = build_tokenizer()
    val = load_examples(boot.val_path, limit=cfg.eval_size)
    policy = AutoModelForCausalLM.from_pretrained(str(boot.policy_path))
    _, responses = B.evaluate_policy(policy, tok, val, 1.0, cfg.data.max_response_length, cfg.seed)
    moe = upcycle_to_qwen3_moe(AutoModelForCausalLM.from_pretrained(str(boot.genrm_path)))
    out = {"dense": B.evaluate_genrm(AutoModelForCausalLM.from_pretrained(str(boot.genrm_path)), tok, val, responses)}
    t = time.perf_counter()
    B.sft(moe, tok, lambda r: B.genrm_example(r, cfg.data, cfg.genrm_wrong_fraction), args.steps, cfg,
          random.Random(f"upcycle:{cfg.seed}"), "upcycled genrm", True, "score:", cfg.genrm_score_weight)
    out["upcycled"] = {"steps": args.steps, "sft_seconds": time.perf_counter() - t,
                       **B.evaluate_genrm(moe, tok, val, responses)}
    for name, r in out.items():
        print(f"{name:9s} agreement {r['agreement']:.3f}  auc {r['auc']:.3f}  parse_failures {r['parse_failures']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
