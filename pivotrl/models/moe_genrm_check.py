"""Measure the upcycled tiny Qwen3-MoE GenRM: `python -m pivotrl.models.moe_genrm_check [--steps N] [--json PATH]`.

A thin wrapper over the bootstrap's MoE stage (`models.bootstrap.genrm_arch=qwen3_moe`,
`pivotrl.models.bootstrap_derived`): builds (or reuses from the cache) the default bootstrap with a
Qwen3-MoE GenRM SFT-trained `--steps` steps after upcycling, and prints how the dense and the MoE
GenRM judge the bootstrapped policy's sampled validation responses (agreement, AUC, parse
failures), writing them as JSON with `--json`.
"""
from __future__ import annotations

import argparse
import json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150, help="SFT steps after upcycling (models.bootstrap.moe_steps)")
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args(argv)

    from pivotrl.config.rl import BootstrapConfig
    from pivotrl.models.bootstrap import bootstrap

    res = bootstrap(BootstrapConfig(genrm_arch="qwen3_moe", moe_steps=args.steps))
    stage = res.report["stages"]["qwen3_moe"]
    out = {"dense": res.report["dense_genrm_on_policy_samples"],
           "upcycled": {"steps": args.steps, "sft_seconds": stage["sft_seconds"], "path": str(res.genrm_path),
                        **stage["genrm_on_policy_samples"]}}
    for name, r in out.items():
        print(f"{name:9s} agreement {r['agreement']:.3f}  auc {r['auc']:.3f}  parse_failures {r['parse_failures']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
