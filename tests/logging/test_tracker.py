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


def test_wandb_gets_allocation_per_role_and_pictures(tmp_path, cfg):
    """Offline wandb: the allocation at each step's end as `allocation/<role>` metrics, and the
    run's pictures as images (written to the offline run's media folder)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pivotrl.logging.tracker import wandb_row

    row = {"step": 3, "throughput": 2.0, "ok": True, "allocation": {"rollout": 2, "reward": 1, "train": 1, "free": 0}}
    assert wandb_row(row) == {"step": 3, "throughput": 2.0, "allocation/rollout": 2, "allocation/reward": 1,
                              "allocation/train": 1, "allocation/free": 0}
    png = tmp_path / "p.png"
    fig = plt.figure(figsize=(2, 2))
    fig.savefig(png)
    plt.close(fig)
    t = Tracker(cfg, tmp_path / "run")
    t.log_step(row)
    t.log_images({"timeline": png})
    wdir = t.wandb_dir
    t.close()
    media = list((wdir / "media" / "images" / "pictures").glob("timeline_*.png"))
    assert len(media) == 1


def test_disabled_wandb_ignores_pictures(tmp_path, cfg):
    t = Tracker(cfg, tmp_path, use_wandb=False)
    t.log_images({"timeline": tmp_path / "missing.png"})  # no wandb run: nothing is read or sent
    t.close()


def test_a_resume_moves_the_rows_it_trains_again_aside(tmp_path, cfg):
    """A run killed at step 3 with its checkpoint at step 1: the resume's tracker keeps steps <= 1,
    moves 2, 3 (and a cut line) to metrics.superseded.jsonl, so steps stay one per line, in order."""
    rows = [json.dumps({"step": s}) + "\n" for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(rows) + '{"step": 4, "tok')
    (tmp_path / "timeline.jsonl").write_text('{"kind": "shift"}\n')
    (tmp_path / "summary.json").write_text("{}")
    t = Tracker(cfg, tmp_path, use_wandb=False, resume_step=1)
    t.log_step({"step": 2})
    t.close()
    assert t.superseded == 3
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    aside = (tmp_path / "metrics.superseded.jsonl").read_text().splitlines()
    assert aside[:2] == rows[1].strip().split("\n") + rows[2].strip().split("\n") and aside[2].startswith('{"step": 4')
    assert (tmp_path / "timeline.jsonl").read_text() == '{"kind": "shift"}\n', "a resume continues the timeline"
    assert not (tmp_path / "summary.json").exists() and (tmp_path / "summary.superseded.json").read_text() == "{}"


def test_a_resume_with_nothing_to_resume_starts_over(tmp_path, cfg):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "timeline.jsonl").write_text('{"kind": "shift"}\n')
    Tracker(cfg, tmp_path, use_wandb=False, resume_step=0).close()
    assert (tmp_path / "metrics.jsonl").read_text() == "" and (tmp_path / "timeline.jsonl").read_text() == ""
    assert (tmp_path / "metrics.superseded.jsonl").read_text() == '{"step": 1}\n'
    assert (tmp_path / "timeline.superseded.jsonl").read_text() == '{"kind": "shift"}\n'
