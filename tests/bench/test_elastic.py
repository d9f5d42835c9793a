"""`python -m pivotrl.bench elastic` runs its three cells per group and writes their figures."""
from __future__ import annotations

import json


def test_bench_writes_disaggregated_pivot_and_elastic_per_group(tmp_path):
    from pivotrl.bench.elastic import main

    out = tmp_path / "elastic.json"
    assert main(["--groups", "qwen7b_qwen30b", "--steps", "3", "--cache-dir", str(tmp_path / "sweep"),
                 "--override", "models.sim.sweep_units=4", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["group"] == "qwen7b_qwen30b" and row["disagg tok/s"] > 0 and row["pivot tok/s"] > 0
    assert row["elastic/pivot"] == row["elastic tok/s"] / row["pivot tok/s"]
    assert len(row["elastic worlds"]) == 3 and all(w >= 8 for w in row["elastic worlds"])
    assert {s["mode"] for s in data["summaries"]} == {"disaggregated", "pivot", "pivot+elastic"}
