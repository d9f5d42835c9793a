"""Atomic, one-builder-at-a-time cache entries (`pivotrl.models.sft.cached_entry`)."""
from __future__ import annotations

import threading
import time

from pivotrl.models.sft import cached_entry


def test_a_second_builder_of_the_same_entry_waits_and_reuses_the_first_ones_build(tmp_path):
    entry, builds, started = tmp_path / "boot" / "k", [], threading.Event()

    def build(tmp):
        builds.append(tmp)
        started.set()
        time.sleep(0.3)  # the second caller arrives while this build runs
        (tmp / "report.json").write_text("{}")

    cached: list[bool] = []
    first = threading.Thread(target=lambda: cached.append(cached_entry(entry, build)))
    first.start()
    started.wait(5)
    cached.append(cached_entry(entry, build))  # blocks on the lock, then finds the entry
    first.join()
    assert len(builds) == 1 and sorted(cached) == [False, True]
    assert (entry / "report.json").is_file() and not [p for p in entry.parent.iterdir() if ".tmp-" in p.name]
