"""The bookkeeping benchmark at a tiny scale: it drives the real device poll and the driver's
bookkeeping, and the ledger it builds holds exactly the engines' tokens (through growth between
lengths, steady polls, completions and the fresh sequences that replace them)."""
from __future__ import annotations

from pivotrl.bench.bookkeeping import measure


def test_tiny_run_keeps_the_ledger_exact_and_reports_each_length():
    rows = measure(replicas=2, seqs=8, lengths=[40, 120], k=3, passes=4, check=True)
    assert [r["response_len"] for r in rows] == [40, 120]
    assert [r["judgement_len"] for r in rows] == [53, 160]
    assert sum(r["completions"] for r in rows) > 0, "a steady rate at 40 tokens finishes some"
    for r in rows:  # every live sequence's k tokens each pass (one fewer for a pass that finished it)
        assert 2 * (8 - 1) * 3 <= r["new_tokens_per_pass"] <= 2 * 8 * 3
        assert r["device_us_per_token"] > 0 and r["driver_us_per_token"] > 0
