"""Every artifact item runs in its --quick variant on small data and writes its CSV and PNG."""
from __future__ import annotations

import csv
import importlib

import pytest

ITEMS = {
    "fig9": ["models", "deploy", "throughput_tokens_per_s", "pivot_speedup", "ideal_efficiency"],
    "fig11": ["models", "variant", "throughput_tokens_per_s"],
    "fig14": ["horizon_s", "throughput_tokens_per_s", "shifts_per_step"],
    "table2": ["scenario", "devices", "total_ms_median", "dp_ms", "evaluate_ms"],
}


@pytest.mark.parametrize("item", sorted(ITEMS))
def test_quick_item_writes_csv_and_png(item, tmp_path):
    mod = importlib.import_module(f"artifact.{item}.run")
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / f"{item}.csv").open()))
    assert rows, f"{item}.csv is empty"
    for col in ITEMS[item]:
        assert col in rows[0], f"{item}.csv lacks {col}"
    for r in rows:
        if "throughput_tokens_per_s" in r:
            assert float(r["throughput_tokens_per_s"]) > 0
    png = (tmp_path / f"{item}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # re-plot from the CSV alone (what a reader does after a long run)
    (tmp_path / f"{item}.png").unlink()
    assert mod.main(["--plot-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / f"{item}.png").exists()


def test_fig9_speedup_column_is_pivot_over_mode(tmp_path):
    mod = importlib.import_module("artifact.fig9.run")
    mod.main(["--quick", "--out", str(tmp_path)])
    rows = {r["deploy"]: r for r in csv.DictReader((tmp_path / "fig9.csv").open())}
    piv = float(rows["pivot"]["throughput_tokens_per_s"])
    for mode, r in rows.items():
        assert float(r["pivot_speedup"]) == pytest.approx(piv / float(r["throughput_tokens_per_s"]))
