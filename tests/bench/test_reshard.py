"""`python -m pivotrl.bench reshard`: the state moved 1 -> 2 ranks through GPS and through DCP.

`slow`: it starts Ray and spawns three ranks; the same resharding (1 -> 4 -> 1 through GPS, with
the step's parity) runs in the default suite in tests/trainer/test_state_store.py."""
from __future__ import annotations

import json

import pytest

@pytest.mark.slow
def test_bench_moves_the_state_both_ways(tmp_path):
    from pivotrl.bench.reshard import main

    out = tmp_path / "reshard.json"
    assert main(["--sizes", "tiny", "--moves", "1:2", "--repeats", "1", "--dir", str(tmp_path / "dcp"),
                 "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["move"] == "1->2" and row["state_mib"] > 0
    for k in ("gps_write_s", "gps_read_s", "dcp_save_s", "dcp_load_s"):
        assert row[k] > 0, k


def test_bench_refuses_a_bad_move(capsys):
    from pivotrl.bench.reshard import main

    with pytest.raises(SystemExit):
        main(["--moves", "2-1"])
    assert "--moves must be W:W' pairs" in capsys.readouterr().err
