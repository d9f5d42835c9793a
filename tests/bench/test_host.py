"""`python -m pivotrl.bench host` at one step: a row with the GenRM SFT step's CPU-seconds, the
JSON file, and the caller's torch thread count left as it was."""
from __future__ import annotations

import json

import pytest
import torch

from pivotrl.bench.host import main


def test_host_probe_times_a_genrm_sft_step(tmp_path, capsys):
    threads = torch.get_num_threads()
    out = tmp_path / "host.json"
    assert main(["--json", str(out), "--steps", "2"]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["steps"] == 2 and row["cpu_s_per_step"] > 0
    assert 0.1 < row["shipped_build_s_per_step"] < 2.0  # the shipped report's genrm SFT seconds / steps
    assert "GenRM SFT step" in capsys.readouterr().out
    assert torch.get_num_threads() == threads


def test_steps_below_one_is_an_error(capsys):
    with pytest.raises(SystemExit):
        main(["--steps", "0"])
    assert "--steps must be >= 1, got 0" in capsys.readouterr().err
