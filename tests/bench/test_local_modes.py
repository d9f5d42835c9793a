"""The local-modes benchmark's accuracy-per-step figure (the runs themselves are slow e2e work)."""
from __future__ import annotations

from pivotrl.bench.local_modes import plot_accuracy


def test_accuracy_plot_has_one_curve_per_mode_with_data(tmp_path):
    rows = [
        {"mode": "pivot", "train_accuracy": [0.3, 0.35, 0.4], "val_acc_before": 0.32, "val_acc_after": 0.45},
        {"mode": "colocated", "train_accuracy": [0.31, 0.33, 0.41], "val_acc_before": 0.32, "val_acc_after": 0.44},
        {"mode": "disaggregated", "error": "boom"},  # a failed mode is left out, not fatal
    ]
    png = plot_accuracy(rows, tmp_path / "acc.png")
    assert png is not None and png.stat().st_size > 5000
    assert plot_accuracy([{"mode": "pivot", "error": "x"}], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
