"""The main-job benchmark's rows and per-seed summary, and its command line end to end with the
runs' processes replaced: each "run" leaves the summary.json of a real 4-step pivot run
(tests/report/data/local_pivot_4steps), so the figures are read from a real run's file. (The
runs themselves are `python train.py`, which the e2e tests run.)"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pivotrl.bench import host, local_modes, main_job

REAL_RUN = Path(__file__).resolve().parents[1] / "report" / "data" / "local_pivot_4steps"


def _row(seed, run, before, after, loop=140.0, error=False):
    raw = {"val_acc_before": before, "val_acc_after": after, "run_loop_s": loop}
    if error:
        raw = {"error": "boom", "rc": 1}
    return main_job.run_row(seed, run, raw)


def test_a_run_row_gives_its_gain_in_points_and_a_failed_run_none():
    assert _row(1, 2, 0.2875, 0.57) == {"seed": 1, "run": 2, "run_loop_s": 140.0, "acc_before": 0.2875,
                                        "acc_after": 0.57, "gain_points": 28.25, "ok": True}
    failed = _row(0, 1, None, None, error=True)
    assert failed["gain_points"] is None and not failed["ok"]


def test_the_summary_gives_each_seed_and_all_runs_against_the_targets():
    rows = [_row(0, 1, 0.278, 0.585, 160.0), _row(0, 2, 0.278, 0.493, 150.0), _row(0, 3, 0, 0, error=True),
            _row(1, 1, 0.2875, 0.53, 150.0), _row(1, 2, 0.2875, 0.57, 130.0)]
    s0, s1, both = main_job.summary_rows(rows)
    assert (s0["runs"], s0["ok"], s1["runs"], s1["ok"], both["runs"], both["ok"]) == (
        "seed 0", "2/3", "seed 1", "2/2", "all", "4/5")
    assert s0["gain_mean"] == pytest.approx((30.7 + 21.5) / 2) and s0["gain_min"] == pytest.approx(21.5)
    assert s0["gain_sd"] == pytest.approx(abs(30.7 - 21.5) / 2 ** 0.5)
    assert s0["gain_target_met"] and not s0["run_loop_target_met"]  # a mean run loop of 155 s
    assert s1["gain_mean"] == pytest.approx((24.25 + 28.25) / 2) and s1["gain_target_met"]
    assert s1["run_loop_s_mean"] == 140.0 and s1["run_loop_target_met"]
    assert both["gain_mean"] == pytest.approx((30.7 + 21.5 + 24.25 + 28.25) / 4)
    (one,) = main_job.summary_rows([_row(1, 1, 0.3, 0.5)])  # one seed: no "all" row
    assert one["runs"] == "seed 1" and one["gain_sd"] is None and not one["gain_target_met"]


def test_the_command_runs_each_seed_and_writes_its_figures(tmp_path, monkeypatch, capsys):
    calls, real_run = [], subprocess.run

    def fake_train_py(cmd, **kw):
        if not str(cmd[1]).endswith("train.py"):  # anything else the process runs
            return real_run(cmd, **kw)
        calls.append(cmd)
        run_dir = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        if "seed=1" in cmd and len([c for c in calls if "seed=1" in c]) == 2:
            return subprocess.CompletedProcess(cmd, 1)  # the second seed-1 run fails
        shutil.copy(REAL_RUN / "summary.json", run_dir / "summary.json")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(local_modes.subprocess, "run", fake_train_py)
    monkeypatch.setattr(host, "sft_step_cpu_s", lambda steps: 0.5)
    out = tmp_path / "runs"
    rc = main_job.main(["--seeds", "0", "1", "--runs", "2", "--out", str(out), "--json", str(tmp_path / "m.json"),
                        "train.steps=4"])
    assert rc == 1, "a failed run fails the benchmark"
    assert [(c[c.index("deploy=pivot") + 2:]) for c in calls] == [
        [f"seed={s}", f"engine.seed={s}", "train.steps=4"] for s in (0, 0, 1, 1)]
    assert all(Path(c[1]).name == "train.py" for c in calls)
    got = json.loads((tmp_path / "m.json").read_text())
    real = json.loads((REAL_RUN / "summary.json").read_text())
    gain = round(100 * (real["val_accuracy_after"] - real["val_accuracy_before"]), 2)
    assert [(r["seed"], r["run"], r["ok"]) for r in got["rows"]] == [(0, 1, True), (0, 2, True), (1, 1, True),
                                                                        (1, 2, False)]
    assert got["rows"][0]["gain_points"] == gain and got["rows"][0]["run_loop_s"] == real["wall_s"]
    assert [s["ok"] for s in got["summary"]] == ["2/2", "1/2", "3/4"] and got["host_sft_step_cpu_s"] == 0.5
    assert (out / "seed1_run2").is_dir() and "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [(["--runs", "0"], "--runs must be >= 1"),
                                        (["--seeds", "0", "0"], "must not repeat a seed")])
def test_bad_arguments_are_refused_naming_them(args, says, capsys):
    with pytest.raises(SystemExit):
        main_job.main(args)
    assert says in capsys.readouterr().err
