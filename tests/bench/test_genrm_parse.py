"""`python -m pivotrl.bench genrm_parse` at small sizes: a row per (input, parser, size) for every
registered parser and adversarial input, a per-parser summary, and the JSON file."""
from __future__ import annotations

import json

from pivotrl.bench.genrm_parse import ADVERSARIAL, main
from pivotrl.config.rl import SCORE_PARSERS


def test_every_parser_reads_every_adversarial_input(tmp_path, capsys):
    import logging

    out = tmp_path / "gp.json"
    level = logging.getLogger("pivotrl.rl.genrm").level
    assert main(["--json", str(out), "--sizes", "2048,8192", "--repeats", "1"]) == 0
    # the judge's warnings are back as they were (left at ERROR, a later test in the same
    # process saw no parse-failure warning: tests/rl/test_genrm.py)
    assert logging.getLogger("pivotrl.rl.genrm").level == level
    got = json.loads(out.read_text())
    keys = {(r["input"], r["parser"]) for r in got["rows"]}
    assert keys == {(i, p) for i in ADVERSARIAL for p in SCORE_PARSERS.names()}
    assert len(got["rows"]) == 2 * len(keys) and all(r["cpu_ms"] >= 0 and r["kb"] > 0 for r in got["rows"])
    assert {s["parser"] for s in got["summary"]} == set(SCORE_PARSERS.names())
    assert got["target_ms_per_80kb"] == 50.0
    assert "worst_cpu_ms_per_80kb" in capsys.readouterr().out


def test_unknown_input_names_the_allowed_ones(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--inputs", "nope"])
    assert "unclosed_boxed" in capsys.readouterr().err
