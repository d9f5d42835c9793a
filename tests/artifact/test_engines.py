"""`artifact.calibrate.engines`: the simulator's own engine model on calibration §7's serving rows
V1-V7. Every row must come within 0.8-1.25x of its published measurement (calibration §7's rule),
and each form feature of the model must matter to some row (else it would be untested)."""
from __future__ import annotations

import json

import pytest

from artifact.calibrate import engines


@pytest.fixture(scope="module")
def rows():
    return {r["id"]: r for r in engines.run()}


def test_every_published_row_is_matched_within_the_band(rows):
    assert set(rows) == {r.id for r in engines.ROWS}
    lo, hi = engines.TOLERANCE
    for r in rows.values():
        assert lo <= r["ratio"] <= hi, f"{r['id']} ({r['source']}): sim/measured {r['ratio']}"


def test_the_rows_run_the_simulators_own_engine(rows, monkeypatch):
    """A change to the simulator's decode model moves the rows: the script re-implements nothing."""
    from pivotrl.sim import timemodel

    real = timemodel.decode_model
    monkeypatch.setattr(timemodel, "decode_model", lambda *a, **k: real(*a, **{**k, "cudagraph": "off"}))
    slower = {r["id"]: r for r in engines.run()}
    assert all(slower[i]["ratio"] < rows[i]["ratio"] for i in ("V1", "V4", "V5"))


def test_each_form_feature_is_needed_by_some_row():
    lo, hi = engines.TOLERANCE
    for name in engines.ABLATIONS:
        ratios = {r["id"]: r["ratio"] for r in engines.run(name)}
        assert any(not lo <= v <= hi for v in ratios.values()), f"no row needs '{name}'"


def test_hybrid_model_holds_fewer_sequences_than_its_kv_alone_would(rows):
    """V7: SGLang splits Qwen3.5's cache between fp32 Gated DeltaNet states and KV."""
    v7 = rows["V7"]
    assert v7["hardware"] == "H200" and v7["max_sequences"] > 0
    assert v7["kv_capacity_tokens"] / (8192 + 1024) < 1024  # fewer than the clients: a queue forms


def test_main_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "engines.json"
    assert engines.main(["--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["id"] for r in data["rows"]] == [r.id for r in engines.ROWS]
    assert "V7" in capsys.readouterr().out
