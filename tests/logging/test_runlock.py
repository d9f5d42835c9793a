"""One run per folder: a live holder stops a second run, naming the folder and its pid; a dead
holder's stale lock is taken over by a resume and refused to a fresh run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pivotrl.logging.runlock import LOCK_NAME, RunFolderBusy, RunLock

ROOT = str(Path(__file__).resolve().parents[2])  # the repository, for subprocesses

HOLD = """
import sys, time
from pivotrl.logging.runlock import RunLock
lock = RunLock.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture()
def holder(tmp_path):
    """A live process holding the lock of tmp_path/run."""
    d = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert p.stdout.readline().strip() == "held"
    yield d, p
    if p.poll() is None:
        p.kill()
    p.wait(timeout=30)


def test_acquire_writes_pid_and_release_removes(tmp_path):
    lock = RunLock.acquire(tmp_path / "a")
    rec = json.loads((tmp_path / "a" / LOCK_NAME).read_text())
    assert rec["pid"] == os.getpid() and lock.took_over is None and lock.held
    lock.release()
    assert not (tmp_path / "a" / LOCK_NAME).exists() and not lock.held
    RunLock.acquire(tmp_path / "a").release()  # free again


def test_second_run_into_a_locked_folder_names_folder_and_pid(holder):
    d, p = holder
    for resume in (False, True):  # a resume cannot take a live run's folder either
        with pytest.raises(RunFolderBusy, match=rf"{d}.*in use by another run \(pid {p.pid}\b"):
            RunLock.acquire(d, resume=resume)
    assert json.loads((d / LOCK_NAME).read_text())["pid"] == p.pid  # untouched


def test_stale_lock_of_a_killed_run(holder):
    d, p = holder
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert (d / LOCK_NAME).exists(), "SIGKILL leaves the file (only the kernel lock goes)"
    with pytest.raises(RunFolderBusy, match=rf"pid {p.pid}\) that stopped without finishing.*train.resume=true"):
        RunLock.acquire(d, resume=False)
    lock = RunLock.acquire(d, resume=True)
    assert lock.took_over["pid"] == p.pid
    assert json.loads((d / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_two_locks_in_one_process_conflict(tmp_path):
    lock = RunLock.acquire(tmp_path)
    with pytest.raises(RunFolderBusy, match=f"pid {os.getpid()}"):
        RunLock.acquire(tmp_path)
    lock.release()
    t0 = time.time()
    RunLock.acquire(tmp_path).release()
    assert time.time() - t0 < 30  # bounded, never waits on a lock


@pytest.mark.parametrize("record", ["metrics.jsonl", "timeline.jsonl", "summary.json", "checkpoints/step_00000002"])
def test_a_fresh_run_into_a_finished_runs_folder_is_refused(tmp_path, record):
    """Issue 22: a finished run released its lock; its records alone stop a fresh run, naming the
    folder, the records and both ways on. A resume may continue there."""
    d = tmp_path / "run"
    p = d / record
    if record.startswith("checkpoints"):
        p.mkdir(parents=True)
    else:
        d.mkdir()
        p.write_text('{"step": 1}\n')
    with pytest.raises(RunFolderBusy, match=rf"{d} holds another run's records \({record}\).*"
                                            r"train.resume=true.*another folder \(hydra.run.dir"):
        RunLock.acquire(d)
    assert not (d / LOCK_NAME).exists(), "a refused run leaves no lock file behind"
    RunLock.acquire(d, resume=True).release()


def test_hydra_files_and_empty_records_are_not_a_run(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / "train.log").write_text("INFO starting\n")
    (tmp_path / "metrics.jsonl").write_text("")  # opened, nothing written: no step was recorded
    (tmp_path / "checkpoints").mkdir()
    RunLock.acquire(tmp_path).release()
