"""The tracker writes the run folder's files and an offline wandb run."""
from __future__ import annotations

import json
import math

import pytest
import yaml

from pivotrl.config import PivotConfig
from pivotrl.logging.tracker import REQUIRED_SUMMARY_KEYS, Tracker, to_jsonable
from tests.config.test_compose import make


@pytest.fixture()
def cfg() -> PivotConfig:
    return make(["cluster=sim", "models=qwen7b_qwen30b"])


def test_run_folder_files(tmp_path, cfg):
    t = Tracker(cfg, tmp_path)
    t.log_step({"step": 0, "throughput": 1.5})
    t.log_step({"step": 1, "throughput": float("nan")})
    t.log_event("shift", plan={"up": [1]}, penalty=2.0)
    summary = {k: 1 for k in REQUIRED_SUMMARY_KEYS}
    t.write_summary(summary)
    wandb_dir = t.wandb_dir
    t.close()
    conf = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert conf["models"]["name"] == "qwen7b_qwen30b" and conf["deploy"]["mode"] == "pivot"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["throughput"] is None
    ev = json.loads((tmp_path / "timeline.jsonl").read_text())
    assert ev == {"kind": "shift", "plan": {"up": [1]}, "penalty": 2.0}
    assert json.loads((tmp_path / "summary.json").read_text())["num_shifts"] == 1
    assert wandb_dir is not None and "offline-run" in str(wandb_dir)


def test_summary_missing_keys_is_an_error(tmp_path, cfg):
    t = Tracker(cfg, tmp_path, use_wandb=False)
    with pytest.raises(ValueError, match="throughput_tokens_per_s"):
        t.write_summary({"deploy": "pivot"})
    t.close()


def test_to_jsonable_handles_inf_and_enums(cfg):
    out = to_jsonable({"a": math.inf, "b": cfg.deploy.mode, "c": (1, 2)})
    assert out == {"a": "inf", "b": "pivot", "c": [1, 2]}
