"""`python -m pivotrl.bench local_modes --json PATH [--steps N]`: the four deployment modes for real,
side by side, on `cluster=local models=tiny` (issue 5 item 5).

Runs `python train.py cluster=local models=tiny deploy=MODE` for every mode, one after the other, in
one invocation, with the same seed and data (each mode in its own process, so a crash or Ray
teardown in one mode cannot poison the next, and every mode starts from the same cached bootstrap).
Each run keeps its own run folder (`--out`, default `outputs/local_modes/<time>/<mode>`), which
`artifact/sim_vs_real/run.py` can replay in the simulator. Prints one row per mode: throughput
(tokens/s over the measured steps), mean step time after warm-up, shifts, device-seconds held per
role, training busy device-seconds, and held-out accuracy before and after.

What these numbers can and cannot show (read before quoting them):
- The 4 "devices" are Ray actors with one thread each, but this machine has 2 CPU cores shared
  with other users. The devices are NOT independent: when all four compute at once they split 2
  cores, so a mode that keeps more devices busy at the same time does not get proportionally more
  work done. Concurrency gains (the reason pivot and disaggregated exist) are capped at about 2x
  and are blurred by other load on the machine; throughput ratios between modes are therefore a
  measurement of this machine, not of the design, and repeat runs vary.
- What IS real: shift costs (weights read from GPS, engine start/stop, offload), staleness and
  weight refresh, aborts and migrations, and the control plane's decisions. Time spent shifting or
  idling while one role waits for another shows up in the step times exactly as it happens.
- "device-seconds by role" is time a device HELD a role (from the runtime's records), not compute
  it did: on shared cores a held device may be waiting for a core.
- Accuracy over so few steps moves by a few points at most; same seed does not make the modes'
  samples identical (sampling depends on batch composition and thread timing).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pivotrl.bench.common import parser, print_table, write_json

MODES = ("pivot", "colocated", "disaggregated", "rr_colocated")
REPO = Path(__file__).resolve().parents[2]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def run_mode(mode: str, run_dir: Path, steps: int | None, extra: list[str], timeout_s: float) -> dict[str, Any]:
    """One `train.py` run of `mode` into `run_dir`; returns its row (or the error)."""
    cmd = [sys.executable, str(REPO / "train.py"), "cluster=local", "models=tiny", f"deploy={mode}",
           f"hydra.run.dir={run_dir}"]
    if steps is not None:
        cmd.append(f"train.steps={steps}")
    cmd += extra
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(run_dir / "bench_stdout.log", "w") as log:
        proc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - t0
    row: dict[str, Any] = {"mode": mode, "rc": proc.returncode, "wall_s": wall, "run_dir": str(run_dir)}
    summ = run_dir / "summary.json"
    if proc.returncode != 0 or not summ.exists():
        tail = (run_dir / "bench_stdout.log").read_text()[-2000:]
        row["error"] = tail
        return row
    s = json.loads(summ.read_text())
    warm = int(s.get("warmup_steps", 1))
    steps_t = s.get("step_time_s", [])
    held = s.get("device_seconds_by_role", {})
    row.update({
        "throughput_tok_s": s.get("throughput_tokens_per_s"),
        "step_s_mean": _mean(steps_t[warm:]),
        "step_s_first": steps_t[0] if steps_t else None,
        "steps": s.get("steps"),
        "shifts": s.get("num_shifts"),
        "held_rollout_dev_s": held.get("rollout"), "held_reward_dev_s": held.get("reward"),
        "held_train_dev_s": held.get("train"), "held_free_dev_s": held.get("free"),
        "train_busy_dev_s": s.get("train_busy_device_s"),
        "val_acc_before": s.get("val_accuracy_before"), "val_acc_after": s.get("val_accuracy_after"),
        "run_loop_s": s.get("wall_s"), "aborts": s.get("aborts"),
        "step_time_s": steps_t,
        "train_accuracy": s.get("train_accuracy", []),
    })
    return row


def accuracy_series(rows: list[dict[str, Any]]) -> list[tuple[str, list[int], list[float], str]]:
    """(label, steps, accuracies, style) per curve of the accuracy figure: each mode's batch
    accuracy per step ("batch", steps 1..n), and its held-out accuracy before and after ("held-out",
    steps 0 and n) when both are known. Modes that failed (no per-step accuracy) are left out."""
    out = []
    for r in rows:
        acc = r.get("train_accuracy") or []
        if not acc:
            continue
        out.append((f"{r['mode']} (batch accuracy)", list(range(1, len(acc) + 1)), list(acc), "batch"))
        if r.get("val_acc_before") is not None and r.get("val_acc_after") is not None:
            out.append((f"{r['mode']} (held-out before/after)", [0, len(acc)],
                        [r["val_acc_before"], r["val_acc_after"]], "held-out"))
    return out


def plot_accuracy(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Accuracy per step of every mode on one figure (`accuracy_series`: batch accuracy solid,
    held-out before/after as dashed markers in the mode's colour). Same seed and data, so the
    curves should agree within sampling noise (one batch: 64 prompts). None when no mode ran."""
    series = accuracy_series(rows)
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    color = None
    for label, xs, ys, style in series:
        if style == "batch":
            color = ax.plot(xs, ys, label=label, lw=1.4)[0].get_color()
        else:
            ax.plot(xs, ys, "o--", color=color, alpha=0.6, lw=0.8, label=label)
    ax.set_xlabel("step (policy version trained)")
    ax.set_ylabel("accuracy (sampled, T = rollout temperature)")
    ax.set_title("accuracy per step, same seed, cluster=local models=tiny", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    p = parser("the four deployment modes for real on cluster=local models=tiny, side by side")
    p.add_argument("--steps", type=int, default=None, help="train.steps per mode (default: the config's)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list, from {','.join(MODES)}")
    p.add_argument("--out", type=Path, default=None, help="parent folder of the per-mode run folders")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per mode")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every mode (e.g. seed=1)")
    a = p.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"--modes: unknown {bad}; allowed: {list(MODES)}")
    if a.steps is not None and a.steps < 2:
        p.error(f"--steps must be >= 2 (one warm-up step + one measured), got {a.steps}")
    out = a.out or REPO / "outputs" / "local_modes" / _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    rows = []
    for mode in modes:
        print(f"[local_modes] {mode} ...", flush=True)
        row = run_mode(mode, out / mode, a.steps, list(a.overrides), a.timeout)
        if "error" in row:
            print(f"[local_modes] {mode} FAILED (rc={row['rc']}):\n{row['error']}", flush=True)
        rows.append(row)
    cols = ("mode", "throughput_tok_s", "step_s_mean", "step_s_first", "shifts", "held_rollout_dev_s",
            "held_reward_dev_s", "held_train_dev_s", "held_free_dev_s", "train_busy_dev_s",
            "val_acc_before", "val_acc_after", "wall_s")
    print_table([{c: r.get(c, "FAILED" if c != "mode" else r["mode"]) for c in cols} for r in rows],
                title=f"four deployment modes, cluster=local models=tiny, {os.cpu_count()} cores "
                      f"(shared: see the module docstring)")
    png = plot_accuracy(rows, out / "accuracy_per_step.png")
    if png is not None:
        print(f"[local_modes] accuracy per step: {png}", flush=True)
    write_json(a.json, "local_modes", rows, note=(__doc__ or "").split("What these numbers")[1].strip()
               if __doc__ else "", out=str(out))
    return 0 if all("error" not in r for r in rows) else 1
