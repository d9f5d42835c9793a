"""Fig. 10 artifact: the --quick run writes a time-series CSV (both modes, throughput records from the
simulator's timeline) and a PNG; the plot alone works on a tiny hand-made CSV."""
from __future__ import annotations

import csv

import pytest

from artifact.common import write_csv
from artifact.fig10 import run as fig10



def test_plot_on_a_tiny_csv(tmp_path):
    rows = []
    for m in fig10.MODES:
        for i in range(6):
            train = int(m == "pivot" and i in (3, 4))
            rows.append({"deploy": m, "time_s": 5.0 * i, "step": i // 3, "model_rollout": 100.0 * (6 - i),
                         "model_reward": 50.0 * i, "model_overall": 60.0, "n_rollout": 6 - i, "n_reward": i,
                         "actual_rollout": 90.0 * (6 - i), "actual_reward": 45.0 * i, "actual_total": 300.0,
                         "alloc_rollout": 4 - 2 * train if m == "pivot" else 2,
                         "alloc_reward": 4 if m == "pivot" else 4, "alloc_train": 2 * train if m == "pivot" else 2,
                         "alloc_free": 0, "training": train})
    path = write_csv(rows, tmp_path / "fig10.csv")
    fig10.plot(path, tmp_path / "fig10.png")
    from tests.artifact.plotted import shows

    assert shows(tmp_path / "fig10.png", [90.0 * (6 - i) for i in range(6)])  # rollout's actual throughput
    assert fig10._intervals([0, 5, 10, 15, 20], [False, True, True, False, True]) == [(5, 15), (20, 20)]


def test_quick_run_writes_both_modes(tmp_path, monkeypatch):
    monkeypatch.setenv("PIVOTRL_CACHE", str(tmp_path / "cache"))  # a fresh allocation sweep
    assert fig10.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "fig10.csv").open()))
    by = {m: [r for r in rows if r["deploy"] == m] for m in fig10.MODES}
    for m, rs in by.items():
        assert len(rs) > 10, m
        ts = [float(r["time_s"]) for r in rs]
        assert ts == sorted(ts) and ts[0] == 0.0
        assert any(float(r["actual_rollout"]) > 0 for r in rs) and any(float(r["actual_reward"]) > 0 for r in rs)
        for r in rs:
            n = sum(int(r[f"alloc_{k}"]) for k in ("rollout", "reward", "train", "free"))
            assert n == 8
    # disaggregated is static after start-up; pivot shifts and trains in intervals
    assert len({(r["alloc_rollout"], r["alloc_reward"]) for r in by["disaggregated"][1:]}) == 1
    assert len({(r["alloc_rollout"], r["alloc_reward"], r["alloc_train"]) for r in by["pivot"]}) > 2
    flags = [r["training"] == "1" for r in by["pivot"]]
    assert any(flags) and not all(flags)
    from tests.artifact.plotted import shows

    assert shows(tmp_path / "fig10.png", [float(r["actual_rollout"]) for r in by["pivot"][:5]])
    assert fig10.main(["--quick", "--out", str(tmp_path), "--plot-only"]) == 0


@pytest.mark.parametrize("bad", ["nothing"])
def test_missing_records_are_reported(tmp_path, bad):
    run = tmp_path / "run"
    run.mkdir()
    (run / "timeline.jsonl").write_text('{"kind": "shift"}\n')
    with pytest.raises(RuntimeError, match="throughput_sample_s"):
        fig10.rows_of(run, "pivot")
