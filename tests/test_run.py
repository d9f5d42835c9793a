"""`pivotrl.run`: one run per folder, the resume check, pictures for finished and partial runs, the
closing table, and the first error staying the one raised."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pivotrl.run as run_mod
from pivotrl.logging.runlock import LOCK_NAME, RunFolderBusy
from pivotrl.logging.tracker import REQUIRED_SUMMARY_KEYS, Tracker
from tests.config.test_compose import make
from tests.report.conftest import sim_cfg

ROOT = str(Path(__file__).resolve().parents[1])  # the repository, for subprocesses


def fake_runtime(monkeypatch, body):
    from pivotrl.registry import Registry

    monkeypatch.setattr(run_mod, "RUNTIMES", Registry("cluster.kind", {k: body for k in run_mod.RUNTIMES}))


def summary_of(**kw):
    return {**{k: 0 for k in REQUIRED_SUMMARY_KEYS}, **kw}


def test_sim_run_writes_pictures_and_prints_the_closing_table(tmp_path, capsys):
    s = run_mod.run(sim_cfg(["logging.progress=true"]), tmp_path)
    out = capsys.readouterr().out
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    assert not (tmp_path / "accuracy.png").exists(), "the simulator records no accuracy"
    assert "device time per state" in out and f"{s['throughput_tokens_per_s']:.1f}" in out
    assert not (tmp_path / LOCK_NAME).exists(), "the lock is released"


def test_a_partial_run_gets_its_timeline_and_its_own_error(tmp_path, monkeypatch):
    def runtime(cfg, run_dir, tracker):
        tracker.log_event("shift", now=0.0, role_up="rollout", up=["rollout@0x1"], down=[], penalty=0.0)
        tracker.log_event("allocation", now=2.0, allocation={"rollout": 1}, shift_seconds=[0.0, 2.0])
        tracker.log_step({"step": 1, "time_s": 5.0, "train_start": 4.0, "train_end": 5.0, "train_accuracy": 0.5})
        raise KeyboardInterrupt

    fake_runtime(monkeypatch, runtime)
    with pytest.raises(KeyboardInterrupt):
        run_mod.run(sim_cfg(), tmp_path)
    assert (tmp_path / "timeline.png").exists() and (tmp_path / "accuracy.png").exists()
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / LOCK_NAME).exists()


def test_first_error_is_raised_and_teardown_errors_logged_after_it(tmp_path, monkeypatch, caplog):
    """The run folder turned read-only mid-run: the runtime's error is what the user sees, not the
    tracker's failure to close (issue 12, "Errors that tell the truth")."""
    def runtime(cfg, run_dir, tracker):
        raise PermissionError(f"[Errno 13] Permission denied: '{run_dir}/checkpoints/step_00000003'")

    def close_fails(self):
        raise OSError("wandb: cannot write to the run folder")

    fake_runtime(monkeypatch, runtime)
    monkeypatch.setattr(Tracker, "close", close_fails)
    with caplog.at_level(logging.ERROR), pytest.raises(PermissionError, match="step_00000003") as ei:
        run_mod.run(sim_cfg(), tmp_path)
    assert ei.value.__notes__ == ["teardown: closing the tracker also failed: OSError: wandb: cannot write "
                                  "to the run folder"]
    assert "closing the tracker failed after an earlier error (PermissionError" in caplog.text
    assert not (tmp_path / LOCK_NAME).exists(), "the lock is released after a failed close too"


def test_teardown_error_of_a_finished_run_is_raised(tmp_path, monkeypatch):
    fake_runtime(monkeypatch, lambda cfg, d, t: summary_of())
    monkeypatch.setattr(Tracker, "close", lambda self: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        run_mod.run(sim_cfg(), tmp_path)
    assert (tmp_path / "summary.json").exists()


def test_a_picture_that_cannot_be_drawn_is_logged_not_fatal(tmp_path, monkeypatch, caplog):
    import pivotrl.report as report

    def runtime(cfg, run_dir, tracker):
        tracker.log_event("shift", now=0.0, role_up="rollout", up=["rollout@0x1"], down=[], penalty=0.0)
        return summary_of()

    fake_runtime(monkeypatch, runtime)
    monkeypatch.setattr(report, "write_timeline", lambda d: (_ for _ in ()).throw(ValueError("bad record")))
    with caplog.at_level(logging.ERROR):
        assert run_mod.run(sim_cfg(), tmp_path)["steps"] == 0
    assert "python -m pivotrl.report" in caplog.text and "bad record" in caplog.text


def test_second_run_into_a_busy_folder_stops_before_touching_it(tmp_path, monkeypatch):
    code = ("import sys, time; from pivotrl.logging.runlock import RunLock; RunLock.acquire(sys.argv[1]); "
            "print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert p.stdout.readline().strip() == "held"
        fake_runtime(monkeypatch, lambda *a: pytest.fail("the runtime must not start"))
        with pytest.raises(RunFolderBusy, match=rf"{tmp_path}.*pid {p.pid}"):
            run_mod.run(sim_cfg(), tmp_path)
        assert not (tmp_path / "config.yaml").exists() and not (tmp_path / "metrics.jsonl").exists()
    finally:
        p.kill()
        p.wait(timeout=30)


def local_cfg(extra):
    return make(["cluster=local", "models=tiny", "logging.wandb_mode=disabled", "logging.progress=false", *extra])


def test_resume_without_a_checkpoint_is_an_error(tmp_path, monkeypatch):
    fake_runtime(monkeypatch, lambda *a: pytest.fail("the runtime must not start"))
    with pytest.raises(ValueError, match=r"train.resume=true but the run folder .* holds no complete checkpoint"
                                         r".*hydra.run.dir.*train.allow_fresh_start=true"):
        run_mod.run(local_cfg(["train.resume=true"]), tmp_path)
    with pytest.raises(ValueError, match=r"cluster=sim does not resume"):
        run_mod.run(sim_cfg(["train.resume=true"]), tmp_path / "sim")


def test_resume_with_fresh_start_allowed_runs(tmp_path, monkeypatch):
    seen = []
    fake_runtime(monkeypatch, lambda cfg, d, t: seen.append(cfg.train.resume) or summary_of())
    run_mod.run(local_cfg(["train.resume=true", "train.allow_fresh_start=true"]), tmp_path)
    assert seen == [True]


def test_resume_of_a_killed_run_takes_its_stale_lock_over(tmp_path, monkeypatch, caplog):
    code = ("import sys, os; from pivotrl.logging.runlock import RunLock; RunLock.acquire(sys.argv[1]); "
            "print(os.getpid(), flush=True); os._exit(1)")  # dies without releasing
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
    dead = int(out.stdout.strip())
    ck = tmp_path / "checkpoints" / "step_00000001"  # what the dead run wrote before it died
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text(json.dumps({"version": 1}))
    monkeypatch.setattr("pivotrl.trainer.trainer_checkpoint.verify_checkpoint", lambda p: None)  # shards: not here
    fake_runtime(monkeypatch, lambda cfg, d, t: summary_of())
    with pytest.raises(RunFolderBusy, match=f"pid {dead}"):
        run_mod.run(local_cfg([]), tmp_path)  # a fresh run would append to the dead run's records
    with caplog.at_level(logging.WARNING):
        run_mod.run(local_cfg(["train.resume=true"]), tmp_path)
    assert f"stale lock of pid {dead}" in caplog.text
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_second_fresh_run_into_a_finished_runs_folder_is_refused(tmp_path, monkeypatch):
    """Issue 22: the first run finished (its lock released); the second stops at start, naming the
    folder and both ways on, and the first run's records stay as they were."""
    def one_step(cfg, d, tracker):
        tracker.log_step({"step": 1})
        tracker.log_event("allocation", now=0.0)
        return summary_of()

    fake_runtime(monkeypatch, one_step)
    run_mod.run(sim_cfg(), tmp_path)
    before = {f: (tmp_path / f).read_text() for f in ("metrics.jsonl", "timeline.jsonl", "summary.json")}
    fake_runtime(monkeypatch, lambda *a: pytest.fail("the runtime must not start"))
    with pytest.raises(RunFolderBusy, match=rf"{tmp_path} holds another run's records \(metrics.jsonl, "
                                            r"timeline.jsonl, summary.json\).*train.resume=true.*hydra.run.dir"):
        run_mod.run(sim_cfg(), tmp_path)
    assert {f: (tmp_path / f).read_text() for f in before} == before


def test_a_resume_keeps_metrics_one_row_per_step(tmp_path, monkeypatch, caplog):
    """A run killed at step 3 after its step-1 checkpoint; the resume trains steps 2, 3 again: the
    dead run's rows 2, 3 move aside, the folder's metrics read 1, 2, 3 and the report takes it."""
    ck = tmp_path / "checkpoints" / "step_00000001"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text(json.dumps({"version": 1}))
    monkeypatch.setattr("pivotrl.trainer.trainer_checkpoint.latest_checkpoint", lambda root: ck)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))

    def steps_2_3(cfg, d, tracker):
        for s in (2, 3):
            tracker.log_step({"step": s})
        return summary_of()

    fake_runtime(monkeypatch, steps_2_3)
    with caplog.at_level(logging.WARNING):
        run_mod.run(local_cfg(["train.resume=true"]), tmp_path)
    assert "resuming at step 1, the 2 metrics row(s) written after it moved to metrics.superseded.jsonl" in caplog.text
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert len((tmp_path / "metrics.superseded.jsonl").read_text().splitlines()) == 2
