"""What the paper's own numbers imply about training speed, group by group (issue 11's 7b question).

`python -m artifact.calibrate.bounds [--groups ...] [--run]`

Training runs on the same home devices in disaggregated (Table 4's TR) and in pivot (Table 4: 0 or
TR), one step at a time, so in steady state a step takes at least one training step on TR devices:
`tokens_per_step / throughput >= train_time(TR)`. With the simulator's workload (the group's fitted
lengths: tokens per step, policy tokens trained per step) and calibration §5's training model
`k*6*P*policy_tokens/(TR*peak*MFU) + T_fixed`, each paper figure gives the smallest MFU it allows.

If pivot's figure needs a higher MFU than the baselines' fit found, the baselines' model is
wrong somewhere else: at 12/12/8 disaggregated must then be bound by rollout or reward, not by
training. `--run` also simulates disaggregated and pivot at Table 4 with the current constants and
prints each stage's seconds per step (rollout, reward, training), which shows what binds.
"""
from __future__ import annotations

import argparse
import json
import sys

from artifact.common import ROOT

EXPECTED = ROOT / "artifact" / "expected" / "fig9.json"


def implied_mfu(group: str, paper_tokens_per_s: float, overrides: list[str] | None = None) -> dict[str, float]:
    from pivotrl.config import compose_config
    from pivotrl.sim.workload import Workload

    cfg = compose_config(["experiment=fig9", f"models={group}", "deploy=disaggregated", *(overrides or [])])
    m, hw, sim = cfg.models, cfg.cluster.hardware, cfg.models.sim
    wl = Workload(m.workload, cfg.seed, cfg.train.prompts_per_step, cfg.train.group_size, sim.step_offset)
    steps = range(1, cfg.train.steps)
    tok = pol = 0.0
    for b in steps:  # the measured window's batches, counted as the sim's StepDone does
        for row in wl.batch_lengths(b):
            for x in row:
                pol += x.prompt + x.response
                tok += 2 * (x.prompt + x.response) + x.genrm
    n = len(steps)
    tok, pol = tok / n, pol / n
    tr = int(m.sim.paper_allocation.pivot_train)
    budget = tok / paper_tokens_per_s - sim.train_fixed_s  # seconds a training step may take
    need = sim.train_recompute_factor * 6.0 * m.policy.params_total * pol / (tr * hw.peak_flops)
    return {"tokens_per_step": tok, "policy_tokens_per_step": pol, "train_devices": tr,
            "step_s_at_paper": tok / paper_tokens_per_s,
            "min_mfu": need / budget if budget > 0 else float("inf")}


def stage_seconds(group: str, mode: str) -> dict[str, float]:
    """Mean per-step rollout, reward, training and step seconds over the measured steps."""
    from pivotrl.config import compose_config
    from pivotrl.sim.runtime import SimDriver, SimSetup
    from pivotrl.sim.sweep import paper_allocation

    cfg = compose_config(["experiment=fig9", f"models={group}", f"deploy={mode}", "logging.wandb_mode=disabled",
                          "logging.progress=false"])
    rt = SimDriver(SimSetup.from_config(cfg, paper_allocation(cfg)))
    s = rt.run()
    rows = [r for r in rt.rec.rows if r["step"] > cfg.train.warmup_steps]
    mean = lambda k: sum(float(r[k]) for r in rows) / max(len(rows), 1)  # noqa: E731
    return {"tokens_per_s": s["throughput_tokens_per_s"], "step_s": mean("step_time_s"),
            "rollout_s": mean("rollout_s"), "reward_s": mean("reward_s"), "train_s": mean("train_s")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", nargs="*", default=["qwen7b_qwen30b", "qwen1.5b_glm9b"])
    p.add_argument("--run", action="store_true", help="also simulate disaggregated and pivot at Table 4")
    args = p.parse_args(argv)
    paper = json.loads(EXPECTED.read_text())["tokens_per_s"]
    for g in args.groups:
        for mode in ("disaggregated", "pivot"):
            b = implied_mfu(g, float(paper[g][mode]))
            print(f"{g:18s} {mode:14s} paper {paper[g][mode]:>7,} tok/s -> step <= {b['step_s_at_paper']:.0f} s "
                  f"({b['tokens_per_step']:,.0f} tokens, {b['policy_tokens_per_step']:,.0f} trained on "
                  f"{b['train_devices']} devices): MFU >= {b['min_mfu']:.3f}")
        if args.run:
            for mode in ("disaggregated", "pivot"):
                st = stage_seconds(g, mode)
                print(f"{g:18s} {mode:14s} sim {st['tokens_per_s']:>8,.0f} tok/s; per step: step {st['step_s']:.0f} s, "
                      f"rollout {st['rollout_s']:.0f} s, reward {st['reward_s']:.0f} s, train {st['train_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
