"""The shared waiting queue of one inference role's scheduler.

Owns: the priority heap (lower key first, then lower seq_id; the key is `priority(seq)`, or the
seq_id without one), the queued sequences by id, and an index of their lengths so the dispatch scan
can stop once the shortest queued sequence fits nowhere. Entries of sequences that left the queue
stay in the heaps and are skipped as they surface (removal is O(1)). It knows nothing about
replicas, throughput or where a sequence goes next: `pivotrl/core/dispatch.py` does.
"""
from __future__ import annotations

import heapq
from typing import Any, Callable

from pivotrl.core.types import Sequence


class WaitingQueue:
    """Queued sequences in dispatch order, with lazily pruned heaps of keys and lengths."""

    def __init__(self, priority: Callable[[Sequence], Any] | None = None) -> None:
        self.priority = priority
        self.heap: list[tuple[Any, int]] = []
        self.seqs: dict[int, Sequence] = {}
        self.lens: list[tuple[int, int]] = []  # (length, seq id) of queued sequences, lazily pruned

    def __len__(self) -> int:
        return len(self.seqs)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.seqs

    def push(self, seq: Sequence) -> None:
        key = seq.seq_id if self.priority is None else self.priority(seq)
        heapq.heappush(self.heap, (key, seq.seq_id))
        self.seqs[seq.seq_id] = seq
        self.note_length(seq)

    def remove(self, seq_id: int) -> None:
        """Take a sequence out; its heap entries go stale and are skipped."""
        del self.seqs[seq_id]

    def note_length(self, seq: Sequence) -> None:
        """Record a queued sequence's (new) length; entries of sequences that left the queue are
        mostly never at the top, so the heap is rebuilt from the queue when they outnumber it."""
        if len(self.lens) > 2 * len(self.seqs) + 64:
            self.lens = [(s.length, sid) for sid, s in self.seqs.items() if sid != seq.seq_id]
            heapq.heapify(self.lens)
        heapq.heappush(self.lens, (seq.length, seq.seq_id))

    def shortest_length(self) -> int | None:
        """Length of the shortest queued sequence (None: empty queue). Entries of sequences that
        left the queue, or grew while queued (`progress`), are dropped as they surface."""
        lens, queued = self.lens, self.seqs
        while lens:
            length, sid = lens[0]
            seq = queued.get(sid)
            if seq is not None and seq.length == length:
                return length
            heapq.heappop(lens)
        return None

    def in_order(self) -> list[Sequence]:
        """Queued sequences in dispatch order."""
        return [self.seqs[sid] for _, sid in sorted(self.heap) if sid in self.seqs]

    def copy(self) -> WaitingQueue:
        """Own heaps and index, shared Sequence objects (for a scheduler clone)."""
        c = WaitingQueue(self.priority)
        c.heap, c.seqs, c.lens = list(self.heap), dict(self.seqs), list(self.lens)
        return c

    def check(self) -> None:
        """Raise AssertionError if a queued sequence is missing from the heap or the length index."""
        live = {sid for _, sid in self.heap}
        assert set(self.seqs) <= live, "queued sequence missing from the heap"
        lens = set(self.lens)
        assert all((s.length, sid) in lens for sid, s in self.seqs.items()), "queued length missing"
