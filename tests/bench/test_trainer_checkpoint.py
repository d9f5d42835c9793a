"""`python -m pivotrl.bench trainer_checkpoint` runs end to end on the tiny policy and its JSON has
one row per mode, with both saves writing the same checkpoint size (to metadata bytes) (figures are not asserted:
speed is what the benchmark measures, not what a test checks)."""
from __future__ import annotations

import json

import pytest

from pivotrl.bench.trainer_checkpoint import MODES, main


def test_bench_writes_a_row_per_mode(tmp_path):
    out = tmp_path / "ckpt.json"
    assert main(["--repeats", "1", "--sizes", "tiny", "--json", str(out)]) == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == set(MODES) == {"none", "blocking", "async"}
    assert rows["none"]["checkpoint_mib"] == 0 and rows["blocking"]["checkpoint_mib"] > 1
    assert rows["async"]["checkpoint_mib"] == pytest.approx(rows["blocking"]["checkpoint_mib"], rel=1e-3)
    assert rows["async"]["complete_by_s"] >= rows["async"]["blocks_step_s"] > 0


def test_bench_rejects_an_unknown_size(capsys):
    with pytest.raises(SystemExit):
        main(["--sizes", "huge"])
    assert "--sizes must be of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--modes", "blocking,lazy"])
    assert "unknown: ['lazy']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--world-sizes", "0"])
    assert "--world-sizes must be" in capsys.readouterr().err
