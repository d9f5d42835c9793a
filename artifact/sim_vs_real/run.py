"""Sim against real (issue 5 item 6): replay real `cluster=local` runs in the simulator and compare
predicted with measured step times. `python -m artifact.sim_vs_real.run [--quick] [--run-dir DIR ...]`.

For each real run folder (`--run-dir`, repeatable; without it, runs `python train.py cluster=local
models=tiny deploy=MODE` for `--modes` first: `--quick` = pivot only, 4 steps), fits the simulator's
constants from the folder (`pivotrl.sim.replay.constants_from_run`: the monitor's last online
throughput fit per role, median training seconds per step, measured shift times), replays the same
mode, devices, batch shape, staleness, planner settings and steps on the run's recorded per-sample
lengths (older folders: per-step token totals), charging the measured weight refreshes, and writes:
- `sim_vs_real.csv`: one row per (run, training-time variant, step): measured and predicted step
  seconds and the error. Two variants per run: `median` (training time per step is one fitted
  constant: a prediction) and `trace` (each batch's measured training seconds: isolates the error of
  the inference, shift and control part); `calibrated` (an engine slowdown fitted on one run,
  `--calibrate-on`, so that its inference phases match; out of sample for the other runs) and
  `calibrated_cores` (the same with the shared-cores contention model, `--cores`);
- `sim_vs_real_summary.csv`: per run and variant, mean absolute % error (MAPE) over the measured
  steps (after warm-up), the MAPE of predicting every step by the mean measured step (the noise
  floor of the measurement: the steps do near-identical work), and measured vs predicted total
  time of those steps;
- `sim_vs_real.png`: measured vs predicted step times per run;
- `constants.json`: the fitted constants and the replay's stated approximations, per run.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from artifact.common import ROOT, item_parser, plt, read_csv, save_figure, write_csv
from pivotrl.config import compose_config


def VARIANTS(slowdown: float, slowdown_cores: float, cores: int) -> list[tuple[str, str, float, int | None]]:
    """(name, train_time, engine slowdown, shared cores) of the replays run for every real run."""
    return [("fitted_model", "median", 1.0, None), ("trace_train", "trace", 1.0, None),
            ("calibrated", "median", slowdown, None), ("calibrated_cores", "median", slowdown_cores, cores)]

MODES = ("pivot", "colocated", "disaggregated", "rr_colocated")


def run_config(run_dir: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())


def initial_allocation(rc: dict[str, Any], mode: str, n: int) -> dict:
    """The allocation the real run's controller started from: `deploy.allocation` or the local
    runtime's own default (imported, not copied)."""
    from pivotrl.config.resolve import default_allocation
    from pivotrl.core.types import Role

    a = rc["deploy"].get("allocation") or {}
    if any(v for v in a.values()):
        return {Role(k): int(v or 0) for k, v in a.items()}
    return {Role(k): v for k, v in default_allocation(mode, n).items()}


def prepare(run_dir: Path, train_time: str = "median") -> tuple[Any, Any, Any, dict[str, Any]]:
    """(records, fitted constants, composed sim config, run config) of one real run folder."""
    from pivotrl.report.records import RunRecords
    from pivotrl.sim.replay import constants_from_run

    rec = RunRecords.load(run_dir)
    rc = run_config(run_dir)
    mode = rc["deploy"]["mode"]
    n = int(rec.summary["devices"])
    # run folders from before the config redesign kept the engine under cluster.runtime
    engine = rc["engine"] if "engine" in rc else rc["cluster"]["runtime"]["engine"]
    kv = int(engine["kv_capacity_tokens"])
    consts = constants_from_run(rec, kv, initial_allocation(rc, mode, n), train_time)
    over = ["cluster=sim", "models=tiny", f"deploy={mode}", f"seed={rc['seed']}",
            f"deploy.staleness={rc['deploy']['staleness']}", "logging.wandb_mode=disabled",
            "logging.progress=false", f"train.prompts_per_step={rec.P}", f"train.group_size={rec.G}"]
    over += [f"deploy.planner.{k}={v}" for k, v in (rc["deploy"].get("planner") or {}).items() if v is not None]
    return rec, consts, compose_config(over), rc


def calibrate(run_dir: Path, cores: int | None = None) -> float:
    """The engine slowdown fitted on one run (see `pivotrl.sim.replay.fit_engine_slowdown`), with
    the shared-cores contention model on (`cores`) or off (None)."""
    import dataclasses

    from pivotrl.sim.replay import fit_engine_slowdown, recorded_workload

    rec, consts, cfg, _ = prepare(run_dir)
    return fit_engine_slowdown(cfg, dataclasses.replace(consts, cores=cores), recorded_workload(rec), rec)


def replay_run(run_dir: Path, variant: str, train_time: str = "median", slowdown: float = 1.0,
               cores: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Replay one real run; returns (per-step rows, summary row, constants). `train_time`: see
    `constants_from_run` ("median": a fitted constant; "trace": the measured seconds per batch);
    `slowdown`: the engine slowdown (1 = the monitor's fitted iteration model as is)."""
    import dataclasses

    from pivotrl.sim.replay import engine_duty, recorded_workload, replay

    rec, consts, cfg, rc = prepare(run_dir, train_time)
    duty = engine_duty(rec, consts.models)
    consts = dataclasses.replace(consts, engine_slowdown=slowdown, cores=cores)
    mode, n = rc["deploy"]["mode"], int(rec.summary["devices"])
    steps, warm = len(rec.steps), int(rec.summary["warmup_steps"])
    sim = replay(cfg, consts, recorded_workload(rec), steps, warm, n)
    meas = [float(s["step_time_s"]) for s in rec.steps]
    pred = [float(x) for x in sim["step_time_s"]]
    rows = []
    for i, (m, p) in enumerate(zip(meas, pred)):
        real, simr = rec.steps[i], sim["step_rows"][i]
        rows.append({"run": run_dir.name, "deploy": mode, "variant": variant, "step": i + 1,
                     "measured_s": m, "predicted_s": p,
                     "error_pct": 100.0 * (p - m) / m if m > 0 else "", "warmup": i + 1 <= warm,
                     # phase times of the step's batch (diagnostics: where the two clocks part)
                     **{f"{k}_{src}": _phase(r, k) for k in PHASES for src, r in (("real", real), ("sim", simr))}})
    after = [r for r in rows if not r["warmup"] and r["error_pct"] != ""]
    mape = sum(abs(r["error_pct"]) for r in after) / len(after) if after else float("nan")
    tm, tp = sum(r["measured_s"] for r in after), sum(r["predicted_s"] for r in after)
    # the measurement's own spread: MAPE of predicting every measured step by their mean (the steps
    # do near-identical work, so this is mostly timing noise of the shared machine)
    mean_m = tm / len(after) if after else float("nan")
    noise = sum(abs(mean_m - r["measured_s"]) / r["measured_s"] for r in after) * 100.0 / len(after) \
        if after else float("nan")
    summary = {"run": run_dir.name, "deploy": mode, "variant": variant, "train_time": train_time,
               "engine_slowdown": slowdown, "devices": n, "steps": steps, "warmup": warm,
               "P": rec.P, "G": rec.G, "mape_pct": mape, "mean_predictor_mape_pct": noise, "measured_total_s": tm, "predicted_total_s": tp,
               "total_error_pct": 100.0 * (tp - tm) / tm if tm > 0 else float("nan"),
               "measured_shifts": rec.summary.get("num_shifts"), "predicted_shifts": sim.get("num_shifts"),
               "per_sample_lengths": rec.per_sample,
               **{f"engine_duty_{r.value}": v for r, v in duty.items()}}
    return rows, summary, {"run_dir": str(run_dir), **consts.as_dict()}


PHASES = ("rollout_s", "reward_s", "train_s")


def _phase(row: dict[str, Any], name: str) -> float | str:
    """Seconds of one phase of a step's batch: rollout (release to last response), reward (to last
    judgement), train (training call)."""
    try:
        if name == "rollout_s":
            return float(row["rollout_done_at"]) - float(row["released_at"])
        if name == "reward_s":
            return float(row["reward_done_at"]) - float(row["rollout_done_at"])
        return float(row["train_end"]) - float(row["train_start"])
    except (KeyError, TypeError):
        return ""


def real_run(mode: str, out: Path, steps: int) -> Path:
    d = out / "real" / mode
    if not (d / "summary.json").exists():
        cmd = [sys.executable, str(ROOT / "train.py"), "cluster=local", "models=tiny", f"deploy={mode}",
               f"train.steps={steps}", f"hydra.run.dir={d}", "logging.wandb_mode=disabled"]
        print(f"[sim_vs_real] real run: {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
    return d


def plot(csv_path: Path, png_path: Path) -> None:
    rows = read_csv(csv_path)
    runs = list(dict.fromkeys(r["run"] for r in rows))
    p = plt()
    fig, axes = p.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.4), squeeze=False)
    for ax, run in zip(axes[0], runs):
        rr = [r for r in rows if r["run"] == run]
        first = [r for r in rr if r["variant"] == rr[0]["variant"]]
        xs = [int(r["step"]) for r in first]
        ax.plot(xs, [float(r["measured_s"]) for r in first], "o-", label="measured (real)")
        for v in dict.fromkeys(r["variant"] for r in rr):
            sub = [r for r in rr if r["variant"] == v]
            ax.plot([int(r["step"]) for r in sub], [float(r["predicted_s"]) for r in sub], "s--",
                    label=f"sim: {v}", lw=1)
        ax.set_title(f"{rr[0]['deploy']} ({run})", fontsize=9)
        ax.set_xlabel("step (1 = warm-up)")
        ax.set_ylabel("step time, s")
        ax.legend(fontsize=7)
    fig.suptitle("Simulator replay vs real cluster=local run: step times", fontsize=10)
    save_figure(fig, png_path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = item_parser("sim_vs_real", __doc__)
    ap.add_argument("--run-dir", type=Path, action="append", default=[], help="a real run folder (repeatable)")
    ap.add_argument("--modes", default="pivot", help=f"modes to run for real when no --run-dir: from {MODES}")
    ap.add_argument("--calibrate-on", type=Path, default=None,
                    help="run folder to fit the engine slowdown on (default: the first run)")
    ap.add_argument("--cores", type=int, default=2, help="cores the real run's devices shared (calibrated_cores)")
    ap.add_argument("--steps", type=int, default=None, help="steps of those real runs (default 6, --quick 4)")
    a = ap.parse_args(argv)
    csv_path, png_path = a.out / "sim_vs_real.csv", a.out / "sim_vs_real.png"
    if not a.plot_only:
        dirs = list(a.run_dir)
        if not dirs:
            modes = ["pivot"] if a.quick else [m for m in a.modes.split(",") if m]
            bad = [m for m in modes if m not in MODES]
            if bad:
                ap.error(f"--modes: unknown {bad}; allowed: {list(MODES)}")
            dirs = [real_run(m, a.out, a.steps or (4 if a.quick else 6)) for m in modes]
        rows, sums, consts = [], [], []
        cal_dir = a.calibrate_on or Path(dirs[0])
        slow, slow_c = calibrate(cal_dir), calibrate(cal_dir, a.cores)
        print(f"[sim_vs_real] engine slowdown fitted on {cal_dir}: {slow:.2f}x the fitted iteration model; "
              f"{slow_c:.2f}x with {a.cores} shared cores", flush=True)
        for d in dirs:
            for variant, tt, f, cores in VARIANTS(slow, slow_c, a.cores):
                r, s, c = replay_run(Path(d), variant, tt, f, cores)
                cal = variant.startswith("calibrated")
                s["calibrated_on"] = str(cal_dir) if cal else ""
                s["in_sample"] = cal and Path(d).resolve() == Path(cal_dir).resolve()
                rows += r
                sums.append(s)
                consts.append({"variant": variant, **c})
                print(f"[sim_vs_real] {s['deploy']} {s['run']} {variant}: MAPE {s['mape_pct']:.1f}% over steps "
                  f"{s['warmup'] + 1}..{s['steps']} (mean-of-measured predictor: {s['mean_predictor_mape_pct']:.1f}%); total measured {s['measured_total_s']:.1f}s "
                  f"predicted {s['predicted_total_s']:.1f}s ({s['total_error_pct']:+.1f}%)", flush=True)
        write_csv(rows, csv_path)
        write_csv(sums, a.out / "sim_vs_real_summary.csv")
        (a.out / "constants.json").write_text(json.dumps(consts, indent=2))
    plot(csv_path, png_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
