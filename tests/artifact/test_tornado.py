"""Tornado artifact: every E constant at both ends of its declared range moves pivot's held-out
error, and the chart is drawn from the CSV."""
from __future__ import annotations

from artifact.common import read_csv
from artifact.sensitivity import tornado


def test_quick_tornado_writes_both_ends_of_each_constant(tmp_path):
    assert tornado.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = read_csv(tmp_path / "tornado.csv")
    labels = [c[0] for c in tornado.QUICK["constants"]]
    assert [r["constant"] for r in rows] == [lab for lab in labels for _ in (0, 1)]
    for lab, key, lo, hi in tornado.QUICK["constants"]:
        mine = [r for r in rows if r["constant"] == lab]
        assert [float(r["value"]) for r in mine] == [lo, hi]
    mfu = {float(r["value"]): float(r["pivot_tokens_per_s"]) for r in rows if r["constant"] == "training MFU"}
    assert mfu[0.5] >= mfu[0.2]  # faster training never slows pivot
    assert (tmp_path / "tornado.png").exists()


def test_every_constant_names_a_config_key_and_an_ordered_range():
    for label, key, lo, hi in tornado.CONSTANTS:
        assert key.startswith(("cluster.hardware.", "models.")) and lo < hi and "pivot" not in key
