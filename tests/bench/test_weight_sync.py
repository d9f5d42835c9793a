"""`python -m pivotrl.bench weight_sync` runs end to end at a tiny size: every path it reports,
the runtime's own through device actors included, moved the model's bytes once by the code's
count and left a positive time; the loads mapped the node's GPS file."""
from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_weight_sync_benchmark_reports_every_path(tmp_path):
    from pivotrl.bench.weight_sync import main

    out = tmp_path / "ws.json"
    assert main(["--json", str(out), "--hidden", "128", "--layers", "2", "--vocab", "512", "--repeats", "1"]) == 0
    rows = {r["path"]: r for r in json.loads(out.read_text())["rows"]}
    runtime = [p for p in rows if p.startswith("runtime ")]
    assert len(runtime) == 2 and all(rows[p]["copies"] == 1 and 0 < rows[p]["in_actor_s"] <= rows[p]["seconds"]
                                     for p in runtime)
    assert len(rows) == 8 and all(r["seconds"] > 0 and r["model_gb"] > 0 for r in rows.values())
