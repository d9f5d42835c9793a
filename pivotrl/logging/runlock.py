"""One run per folder: a lock on `RUN_DIR/.pivotrl.lock`, which holds the running process's pid.

Owns `RunLock.acquire(run_dir, resume)` and `release()`. Two runs writing one folder would mix
their metrics, timeline and checkpoints (issue 12), so:
- the lock is an exclusive `flock` on the lock file, held for the whole run: the kernel drops it
  when the process ends in any way (SIGKILL included), so "is the holder alive" never depends on
  pids (which are reused);
- a folder locked by a live run: `RunFolderBusy`, naming the folder and the holder's pid, before
  anything in the folder is touched;
- a lock file that is not locked but still names a pid is a stale lock: that run died without
  releasing it (a run that ends normally or by an exception removes the file). A resume
  (`train.resume=true`) takes it over; a fresh run stops, saying to resume or to choose another
  folder, since it would append to the dead run's records;
- a folder that holds another run's records (`RECORDS`: a non-empty `metrics.jsonl`,
  `timeline.jsonl`, a `summary.json`, a `checkpoints/step_*` folder) but no lock, a run that
  finished (issue 22): a fresh run stops the same way, before it writes anything, since its
  records would be appended to the finished run's and its checkpoints would overwrite them.
  Hydra's own files (`.hydra/`, `train.log`) are not records.
The lock lives in the run folder, so it guards runs of one machine (a shared network folder needs
a filesystem whose `flock` spans hosts).
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK_NAME = ".pivotrl.lock"


#: the files (and the checkpoint folder) whose presence means a run wrote into the folder
RECORDS = ("metrics.jsonl", "timeline.jsonl", "summary.json")

WAYS_ON = "continue it with train.resume=true, or choose another folder (hydra.run.dir=...)"


class RunFolderBusy(RuntimeError):
    """The run folder is held by another run, or holds another run's records."""


def run_records(run_dir: Path) -> list[str]:
    """The records of a run already in `run_dir` (module docstring), as names relative to it."""
    found = [name for name in RECORDS if (run_dir / name).is_file() and (run_dir / name).stat().st_size > 0]
    ck = run_dir / "checkpoints"
    if ck.is_dir():
        found += sorted(f"checkpoints/{p.name}" for p in ck.iterdir() if p.is_dir() and p.name.startswith("step_"))[:3]
    return found


def _holder(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    if not raw.strip():
        return None
    try:
        got = json.loads(raw)
    except json.JSONDecodeError:
        return {"pid": "?"}  # cut mid-write by a killed process: still a stale lock
    return got if isinstance(got, dict) else {"pid": "?"}


class RunLock:
    def __init__(self, path: Path, fd: int, took_over: dict | None) -> None:
        self.path = path
        self._fd: int | None = fd
        self.took_over = took_over
        """The dead holder's record when this lock replaced a stale one (a resume), else None."""

    @classmethod
    def acquire(cls, run_dir: Path | str, resume: bool = False) -> "RunLock":
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_NAME
        for _ in range(5):  # bounded: each retry follows a release that removed the file under us
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd) or {}
                os.close(fd)
                raise RunFolderBusy(
                    f"run folder {run_dir} is in use by another run (pid {holder.get('pid', '?')} on "
                    f"{holder.get('host', '?')}, lock {path}); wait for it to end, or choose another folder "
                    f"(hydra.run.dir=...)") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder released (removed the file) between our open and flock
                os.close(fd)
                continue
            stale = _holder(fd)
            if stale is not None and not resume:
                os.close(fd)
                raise RunFolderBusy(
                    f"run folder {run_dir} holds the records of a run (pid {stale.get('pid', '?')}) that "
                    f"stopped without finishing (stale lock {path}); {WAYS_ON}")
            records = [] if resume else run_records(run_dir)
            if records:
                path.unlink(missing_ok=True)  # empty: ours, made just now (or a finished run's, removed)
                os.close(fd)
                raise RunFolderBusy(
                    f"run folder {run_dir} holds another run's records ({', '.join(records)}): a new run there "
                    f"would mix its records with them; {WAYS_ON}")
            me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(me).encode())
            os.fsync(fd)
            return cls(path, fd, stale)
        raise RunFolderBusy(f"run folder {run_dir}: could not take the lock {path} (another run keeps "
                            "taking and releasing it)")

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file, then drop the lock (a waiting opener retries on the new file)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None
