"""Ends a private Ray head's processes when the driver that started it dies, by their recorded pids.

Owns `Reaper` (started by `runtime/cluster.py` right after `ray.init` starts a private head) and
the watcher process it runs (`python -m pivotrl.runtime.reaper`). Why: Ray ties its head's
`gcs_server` and `raylet` to the driver, but the raylet's own children, `DashboardAgent` and
`RuntimeEnvAgent`, outlive a SIGKILLed driver by one to two minutes, holding about 210 MB
(measured on `cluster=local`, docs/benchmarks-history.md, issue 22, "Ray processes after a SIGKILLed driver").

How, with no process ever chosen by its name:
- the head's roots are the driver's children that `ray.init` started (the driver's children after
  it, minus those before it), each recorded as (pid, start time);
- the watcher (a child of the driver, reading a pipe from it) records the roots' descendants
  every `SNAPSHOT_S` seconds: the agents and workers appear after the raylet, and once the driver
  is gone they are no one's children any more, so the record is what finds them;
- the pipe closes when the driver dies, however it dies (the kernel closes it on SIGKILL too), or
  when `Reaper.close()` closes it after `ray.shutdown()`; then the watcher sends SIGTERM to every
  recorded process still running with the same start time (so a pid reused since is never
  touched), SIGKILL after `GRACE_S`, removes the head's temp dir (`remove`: Ray's session files,
  which a SIGKILLed driver would leave behind), and exits.
Linux only (`/proc`); elsewhere `Reaper.start` returns None and Ray's own cleanup is all there is.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

SNAPSHOT_S = 1.0
GRACE_S = 3.0

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot: /proc/<pid>/stat field 22)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, None if it is gone (or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) ": comm may hold spaces
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19])


def _table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every live process."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            got = _stat(int(name))
            if got is not None:
                out[int(name)] = got
    return out


def children(pid: int) -> set[Proc]:
    """The live direct children of `pid`."""
    return {(p, st) for p, (pp, st) in _table().items() if pp == pid}


def descendants(roots: set[Proc], exclude: int) -> set[Proc]:
    """`roots` still running (same start time) and all their live descendants, but `exclude`."""
    table = _table()
    kids: dict[int, list[int]] = {}
    for p, (pp, _) in table.items():
        kids.setdefault(pp, []).append(p)
    out: set[Proc] = set()
    todo = [p for p, st in roots if table.get(p, (0, -1))[1] == st]
    while todo:
        p = todo.pop()
        if p == exclude or (p, table[p][1]) in out:
            continue
        out.add((p, table[p][1]))
        todo += kids.get(p, [])
    return out


def reap(procs: set[Proc], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM every process of `procs` still running with its recorded start time, SIGKILL those
    left after `grace_s`; returns the pids signalled."""
    def alive() -> list[int]:
        return [p for p, st in procs if (_stat(p) or (0, -1))[1] == st]

    hit = alive()
    for p in hit:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in alive():
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return hit


def watch(roots: set[Proc], record: Path | None = None, remove: Path | None = None) -> None:
    """The watcher's loop (module docstring): snapshot until stdin closes, then reap and remove
    the folder `remove`."""
    seen: set[Proc] = set()
    me = os.getpid()
    while True:
        now = descendants(roots, exclude=me)
        if record is not None and not now <= seen:
            tmp = record.with_suffix(".tmp")
            tmp.write_text("\n".join(f"{p} {st}" for p, st in sorted(seen | now)))
            os.replace(tmp, record)
        seen |= now
        ready, _, _ = select.select([sys.stdin], [], [], SNAPSHOT_S)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break  # EOF: the driver closed the pipe or died
    reap(seen)
    if remove is not None:
        import shutil

        shutil.rmtree(remove, ignore_errors=True)


class Reaper:
    """The watcher process of one private Ray head (module docstring)."""

    def __init__(self, proc: subprocess.Popen, roots: set[Proc], record: Path | None) -> None:
        self.proc, self.roots, self.record = proc, roots, record

    @classmethod
    def start(cls, before: set[Proc], record: Path | None = None, remove: Path | None = None) -> "Reaper | None":
        """Watch the driver's children started since `before` (its children before `ray.init`).
        `record` (optional): a file the watcher keeps the recorded processes in, one `pid start`
        per line (tests read it); `remove` (optional): a folder it deletes once they are ended.
        None off Linux or when there is nothing to watch."""
        if not Path("/proc/self/stat").exists():
            return None
        roots = children(os.getpid()) - before
        if not roots:
            return None
        args = [sys.executable, "-m", "pivotrl.runtime.reaper", *(f"{p}:{st}" for p, st in sorted(roots))]
        for flag, path in (("--record", record), ("--remove", remove)):
            if path is not None:
                args += [flag, str(path)]
        # its own session: a Ctrl-C to the driver's process group must not end the watcher first
        root = str(Path(__file__).resolve().parents[2])  # this checkout's pivotrl, not another install
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, start_new_session=True, env=env)
        return cls(proc, roots, record)

    def close(self, timeout_s: float = 30.0) -> None:
        """After `ray.shutdown()`: end what is left of the head and wait for the watcher."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main(argv: list[str]) -> int:
    paths: dict[str, Path] = {}
    for flag in ("--record", "--remove"):
        if flag in argv:
            i = argv.index(flag)
            paths[flag], argv = Path(argv[i + 1]), argv[:i] + argv[i + 2:]
    roots = {(int(p), int(st)) for p, st in (a.split(":") for a in argv)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(roots, paths.get("--record"), paths.get("--remove"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
