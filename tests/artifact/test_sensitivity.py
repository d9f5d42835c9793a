"""Sensitivity artifact: the --quick run covers the default point and one-at-a-time variations with
all three modes and consistent ratios; the plot alone works on a tiny hand-made CSV."""
from __future__ import annotations

import csv

import pytest

from artifact.common import write_csv
from artifact.sensitivity import run as sens



def test_points_vary_one_constant_at_a_time():
    pts = sens.points(False)
    assert pts[0] == ("default", 0.0, [])
    single = [p for p in pts[1:] if not p[0].startswith("corner")]
    assert {p[0] for p in single} == {"train_mfu", "genrm_median", "response_sigma", "step_offset", "staleness"}
    assert all(len(ov) == 1 for _, _, ov in single)
    assert [p[0] for p in pts if p[0].startswith("corner")] == [c[0] for c in sens.CORNERS]
    assert ("train_mfu", 0.25, ["cluster.hardware.mfu=0.25"]) in pts
    assert ("step_offset", 300, ["models.sim.step_offset=300"]) in pts


def test_plot_on_a_tiny_csv(tmp_path):
    rows = [{"models": "g", "parameter": "default", "value": "", "colocated_tokens_per_s": 10.0,
             "disaggregated_tokens_per_s": 15.0, "pivot_tokens_per_s": 20.0,
             "pivot_over_colocated": 2.0, "pivot_over_disaggregated": 1.33}]
    for v, piv in ((0.25, 15.0), (0.5, 25.0)):
        rows.append({"models": "g", "parameter": "train_mfu", "value": v, "colocated_tokens_per_s": 10.0,
                     "disaggregated_tokens_per_s": 15.0, "pivot_tokens_per_s": piv,
                     "pivot_over_colocated": piv / 10, "pivot_over_disaggregated": piv / 15})
    path = write_csv(rows, tmp_path / "sensitivity.csv")
    sens.plot(path, tmp_path / "sensitivity.png")
    from tests.artifact.plotted import shows

    assert shows(tmp_path / "sensitivity.png", [1.5, 2.5], scales=(1.0,))  # pivot/colocated at the two MFUs


def test_quick_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PIVOTRL_CACHE", str(tmp_path / "cache"))
    assert sens.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "sensitivity.csv").open()))
    assert [r["parameter"] for r in rows] == [p[0] for p in sens.points(True)]
    for r in rows:
        for m in sens.MODES:
            assert float(r[f"{m}_tokens_per_s"]) > 0
        assert float(r["pivot_over_disaggregated"]) == pytest.approx(
            float(r["pivot_tokens_per_s"]) / float(r["disaggregated_tokens_per_s"]))
        assert r["disaggregated_allocation"].count("/") == 2
    # the knobs are live: staleness 1 is slower than 2 for the asynchronous modes
    by = {r["parameter"]: r for r in rows}
    assert float(by["staleness"]["pivot_tokens_per_s"]) < float(by["default"]["pivot_tokens_per_s"])
    from tests.artifact.plotted import shows

    assert shows(tmp_path / "sensitivity.png", [float(r["pivot_over_colocated"]) for r in rows
                                                if r["parameter"] != "default"], scales=(1.0,))
