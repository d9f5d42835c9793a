"""`python -m pivotrl.bench host [--json PATH] [--steps N]`: how fast this host is for the work the
test suite and the bootstrap do, so that wall times taken on different hosts (or hours of a shared
one) can be compared: CPU-seconds per step of the bootstrap's GenRM SFT (batches of 64 judged
examples of the default recipe, one torch thread), over `--steps` steps, beside the seconds per
step the shipped bootstrap's report gives for its own build (wall time of one thread on a quiet
machine); BENCHMARKS.md, "Test suite", gives each suite time with this figure beside it.
"""
from __future__ import annotations

import random
import time

from pivotrl.bench.common import parser, print_table, write_json


def sft_step_cpu_s(steps: int) -> float:
    """CPU-seconds per step of `steps` steps of the bootstrap's GenRM SFT (`pivotrl.models.sft.sft`:
    build the batch, forward, backward, AdamW), as its default recipe runs them."""
    import torch
    from transformers import Qwen2ForCausalLM

    from pivotrl.config.rl import BootstrapConfig, DataConfig
    from pivotrl.models.sft import genrm_example, sft
    from pivotrl.models.tiny import qwen2_config
    from pivotrl.models.tokenizer import build_tokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg, data, tok = BootstrapConfig(), DataConfig(), build_tokenizer()
        torch.manual_seed(cfg.seed)
        model = Qwen2ForCausalLM(qwen2_config(cfg.genrm))
        t = time.process_time()
        sft(model, tok, lambda r: genrm_example(r, data, cfg.genrm_wrong_fraction), steps, cfg,
            random.Random(f"sft-genrm:{cfg.seed}"), "host probe", False, "score:", cfg.genrm_score_weight)
        return (time.process_time() - t) / steps
    finally:
        torch.set_num_threads(threads)


def shipped_step_s() -> float:
    """Seconds per GenRM SFT step where the shipped bootstrap was built (its report)."""
    import json

    from pivotrl.config.rl import BootstrapConfig, DataConfig
    from pivotrl.models.bootstrap import cache_key
    from pivotrl.models.shipped import SHIPPED

    r = json.loads((SHIPPED / cache_key(BootstrapConfig(), DataConfig()) / "report.json").read_text())
    return r["genrm_sft_seconds"] / r["config"]["genrm_steps"]


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="SFT steps measured")
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error(f"--steps must be >= 1, got {a.steps}")
    rows = [{"probe": "GenRM SFT step, 1 thread", "cpu_s_per_step": sft_step_cpu_s(a.steps), "steps": a.steps,
             "shipped_build_s_per_step": shipped_step_s()}]
    print_table(rows, "host speed (lower is faster)")
    write_json(a.json, "host", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
