"""The local-modes benchmark's accuracy-per-step figure (the runs themselves are slow e2e work)."""
from __future__ import annotations

from pivotrl.bench.local_modes import accuracy_series, plot_accuracy

ROWS = [
    {"mode": "pivot", "train_accuracy": [0.3, 0.35, 0.4], "val_acc_before": 0.32, "val_acc_after": 0.45},
    {"mode": "colocated", "train_accuracy": [0.31, 0.33, 0.41], "val_acc_before": 0.32, "val_acc_after": None},
    {"mode": "disaggregated", "error": "boom"},  # a failed mode is left out, not fatal
]


def test_accuracy_series_per_mode():
    got = accuracy_series(ROWS)
    assert [(label, xs, ys, style) for label, xs, ys, style in got] == [
        ("pivot (batch accuracy)", [1, 2, 3], [0.3, 0.35, 0.4], "batch"),
        ("pivot (held-out before/after)", [0, 3], [0.32, 0.45], "held-out"),
        ("colocated (batch accuracy)", [1, 2, 3], [0.31, 0.33, 0.41], "batch"),  # no held-out after
    ]


def test_accuracy_plot_is_written_only_when_a_mode_ran(tmp_path):
    assert plot_accuracy(ROWS, tmp_path / "acc.png").is_file()
    assert plot_accuracy([{"mode": "pivot", "error": "x"}], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
