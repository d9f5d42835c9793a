"""Hydra multirun (`python train.py -m ...`), as users sweep ablations: one flat folder per job, even
when a swept key is a nested group (`deploy/planner=...`, whose `/` used to nest the folders)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_multirun_over_a_nested_group_writes_one_flat_folder_per_job(tmp_path):
    out = subprocess.run(
        [sys.executable, "train.py", "-m", "cluster=sim", "models=qwen1.5b_glm9b", "experiment=quick",
         "deploy=pivot", "deploy/planner=rule,static", f"hydra.sweep.dir={tmp_path}",
         "logging.wandb_mode=disabled"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert [p.name.split("_", 1)[0] for p in jobs] == ["0", "1"]
    strategies = []
    for job in jobs:
        assert "deploy.planner=" in job.name and "/" not in job.name.split("_", 1)[1]
        summary = json.loads((job / "summary.json").read_text())
        assert summary["deploy"] == "pivot" and summary["throughput_tokens_per_s"] > 0
        cfg = (job / ".hydra" / "config.yaml").read_text()
        strategies.append(next(line.split(":", 1)[1].strip() for line in cfg.splitlines()
                               if line.strip().startswith("strategy:")))
    assert strategies == ["rule", "static"]
