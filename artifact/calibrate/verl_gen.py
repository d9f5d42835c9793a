"""The simulator's engine against verl's own measured generation times on H20 (a check, never a fit).

`python -m artifact.calibrate.verl_gen [--json out.json] [--means 600 1000 1400] [--quick]`

verl measured its colocated ("colocate sync") DAPO run of Qwen2.5-Math-7B on H20 (verl
`docs/advance/fully_async.md`, table "Asynchronous Training on 7B Model"; calibration.md §5 M row):
512 prompts x 16 responses = 8,192 samples per step, responses up to 28K tokens, vLLM engines of TP 4
(`gen_tp=4`), `gpu_memory_utilization=0.80`, verl's then `max_num_seqs` 1024, no dynamic sampling
(verl `recipe/fully_async_policy/exp/qwen2-7B-math{,_64,_128}/fsdp2_colocate/*.sh`), generation ("gen") per step averaged over 400 steps: **357 s on 32 GPUs, 151 s on 64,
178 s on 128**. Quadrupling the GPUs only halves generation: at 32 GPUs (256 samples per GPU) the bulk
of the batch dominates, at 64-128 the batch's longest responses do (the tail bound, about 150-180 s).

This script runs the same batch through the simulator's own engine (`SimReplica`, the decode model of
`pivotrl/sim/timemodel.py` with the constants in `conf/`), split into contiguous equal chunks per GPU as
verl's `DataProto.chunk` does, each engine at verl's `max_num_seqs` and memory share, and prints the
batch's generation time at 32/64/128 GPUs over a grid of what the measurement does not state or the
simulator only estimates:
- the mean response length (verl's table does not give it; its training time bounds it: 8,192 samples'
  `update_actor` of 314 s on 32 H20 at MFU 0.25-0.5 is 0.6K-1.3K tokens per sample, the `--means`);
- the response sigma (calibration §4: 1.0, sweep 0.8-1.2);
- `cluster.hardware.flops_dense` (the fit's 110 TFLOPS, and the declared range's low end, 40) and
  `cluster.hardware.bw_weights` (calibration §3: 1.4 TB/s "measured-H20" default, 2.8 "spec-scaled").

It fits nothing and writes nothing into `conf/`: it shows whether any point of the declared ranges
reproduces both halves of verl's measurement. With the issue-11 engine model only `flops_dense` at
40 TFLOPS came close; with issue 21's validated model (KV at 3.0 TB/s, prefill at 120 TFLOPS) 30
TFLOPS matches best (322 / 187 s against 357 / 178 s at mean 1,400, sigma 1.0), and
`conf/cluster/sim.yaml` takes that value from here (docs/calibration_sources.md §5).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path

MEASURED = {32: 357.41, 64: 150.72, 128: 177.85}  # verl fully_async.md, colocate sync, gen seconds
PROMPTS, GROUP, MAX_RESPONSE = 512, 16, 28 * 1024  # the same table's setup (28K max response)
TP, MEM_UTIL, MAX_NUM_SEQS = 4, 0.80, 1024  # its scripts: gen_tp=4, gpu_memory_utilization=0.80; verl's max_num_seqs then


def gen_seconds(cfg, gpus: int, mean: float, sigma: float, seed: int = 0) -> dict:
    """Seconds for one colocated verl batch (8,192 samples) on `gpus // TP` engines of TP `TP`."""
    from pivotrl.sim.engine import SimReplica
    from pivotrl.sim.timemodel import decode_model, kv_capacity
    from pivotrl.sim.workload import Workload

    wl = cfg.models.workload
    wl = dataclasses.replace(
        wl, response=dataclasses.replace(wl.response, sigma=sigma, max_len=MAX_RESPONSE),
        response_prompt_sigma=min(wl.response_prompt_sigma, sigma), response_mean_curve=[[0.0, mean]])
    work = Workload(wl, seed, PROMPTS, GROUP)
    samples = [s for row in work.batch_lengths(0) for s in row]
    spec, hw = cfg.models.policy, cfg.cluster.hardware
    model = decode_model(spec, hw, tp=TP)
    kv = kv_capacity(spec, hw, MEM_UTIL, tp=TP)
    engines = gpus // TP
    reps = [SimReplica(f"engine{e}", model, TP, 0.0, kv_capacity=kv, max_num_seqs=MAX_NUM_SEQS)
            for e in range(engines)]
    per = len(samples) // engines
    for i, s in enumerate(samples):  # contiguous chunks, like verl's DataProto.chunk
        reps[min(i // per, engines - 1)].add(i, s.prompt, 0, s.response, model.prefill_time(s.prompt))
    t = 0.0
    while True:
        nxt = [(r.next_finish(), j) for j, r in enumerate(reps) if not r.empty]
        nxt = [(a, j) for a, j in nxt if a is not None]
        if not nxt:
            break
        t, j = min(nxt)
        r = reps[j]
        r.advance(t)
        while r.pop_finished() is not None:
            pass
        r.relieve()
        r.resume()
    lens = [s.response for s in samples]
    return {"gen_s": round(t, 1), "mean_len": round(sum(lens) / len(lens)), "max_len": max(lens),
            "preemptions": sum(r.preemptions for r in reps)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--means", nargs="*", type=float, default=[600.0, 1000.0, 1400.0])
    p.add_argument("--sigmas", nargs="*", type=float, default=[0.8, 1.0, 1.2])
    p.add_argument("--flops-dense", nargs="*", type=float, default=[40e12, 30e12, 20e12])
    p.add_argument("--bw-weights", nargs="*", type=float, default=[1.42e12])
    p.add_argument("--gpus", nargs="*", type=int, default=sorted(MEASURED))
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="one mean, one sigma (a smoke run)")
    args = p.parse_args(argv)
    from pivotrl.config import compose_config

    if args.quick:
        args.means, args.sigmas, args.flops_dense, args.bw_weights = [1000.0], [1.0], [30e12], [1.42e12]
    rows = []
    print(f"verl measured gen s: {MEASURED}  (32/128 ratio {MEASURED[32] / MEASURED[128]:.2f})")
    for fd, bw in itertools.product(args.flops_dense, args.bw_weights):
        cfg = compose_config(["cluster=sim", "models=qwen7b_qwen30b", f"cluster.hardware.flops_dense={fd}",
                              f"cluster.hardware.bw_weights={bw}"])
        for sigma, mean in itertools.product(args.sigmas, args.means):
            res = {g: gen_seconds(cfg, g, mean, sigma) for g in args.gpus}
            row = {"flops_dense": fd, "bw_weights": bw, "sigma": sigma, "mean": mean,
                   "gen_s": {g: r["gen_s"] for g, r in res.items()},
                   "max_len": res[args.gpus[0]]["max_len"],
                   "preemptions": {g: r["preemptions"] for g, r in res.items()}}
            if 32 in res and 128 in res:
                row["ratio_32_128"] = round(res[32]["gen_s"] / res[128]["gen_s"], 2)
            rows.append(row)
            print(f"F {fd / 1e12:5.0f}T BW_w {bw / 1e12:.1f}T sigma {sigma:.1f} mean {mean:5.0f} (max {row['max_len']:>6})  "
                  + "  ".join(f"{g}: {r['gen_s']:6.0f}s" for g, r in res.items())
                  + (f"  32/128 {row['ratio_32_128']:.2f}" if "ratio_32_128" in row else ""), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"measured": MEASURED, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
