"""`bash scripts/device_check.sh --cpu` end to end: every part passes and the JSON carries figures
that could not be there by accident (CI runs this; the GPU mode is the same script)."""
from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_device_check_cpu_mode_end_to_end(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path))
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    logs = {p.name: p.read_text()[-2000:] for p in tmp_path.glob("*.out")}
    assert proc.returncode == 0, (proc.stdout[-3000:], logs)
    check_cpu_results(tmp_path)


def check_cpu_results(tmp_path: Path) -> None:
    """What `device_check.sh --cpu` must have written into `tmp_path` (its $OUT)."""
    from pivotrl.bench.device_check_run import DEVICES

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"] and summary["mode"] == "cpu"
    parts = summary["parts"]
    assert list(parts) == ["env", "checks", "pytest_gpu", "run_colocated", "run_pivot"], "the parts, in order"
    env_ = parts["env"]["result"]
    assert env_["torch"]["version"].startswith("2.13") and "version" in env_["transformers"] and "version" in env_["ray"]
    junit = (tmp_path / "pytest_gpu.xml").read_text()
    assert "testsuite" in junit and 'skipped="0"' not in junit, "the gpu-marked tests ran (skipped without CUDA)"
    dc = json.loads((tmp_path / "device_check.json").read_text())
    assert dc["ok"] and all(dc[k]["ok"] for k in ("checkpoints", "trainer", "weight_sync", "engine", "handoff")), dc
    tr, ws, en, ho = dc["trainer"], dc["weight_sync"], dc["engine"], dc["handoff"]
    assert len(tr["step_s"]) == 2 and tr["offloaded_gib"] > 0 and tr["second_offload_host_allocations"] == 0
    assert tr["micro_batches"] >= 2  # token micro-batches: the batch did not fit one
    assert ws["load_path"] == "file" and ws["model_gb"] > 0 and ws["publish_s"] > 0
    assert en["n_samples"] >= 2 and math.isfinite(en["fit_mean_rel_error"]) and en["fit_mean_rel_error"] >= 0
    assert ho["policy_sleep_level"] == 2.0 and ho["genrm_sleep_level"] == 1.0
    assert ho["genrm_needed_gps"] is False and "load_s" in ho["policy_shift_up_detail"]
    # the cluster=ray run on one device: 3 steps, made from random-weight checkpoints (no bootstrap),
    # every role shifted onto that device, and its trace written; run_pivot is GPU-only (on CPU,
    # tests/e2e/test_ray_cpu.py runs deploy=pivot on cluster=ray; its command: test below)
    assert parts["run_pivot"]["skipped"] and not parts["run_colocated"]["skipped"]
    for name in ("run_colocated",):
        res = parts[name]["result"]
        s = res["summary"]
        assert res["ok"] and res["trace"] and s["steps"] == 3 and s["policy_version"] == 3 and s["cluster"] == "ray"
        assert {t["role"] for t in res["shifts"]} >= {"rollout", "reward", "train"}
        assert {t["device"] for t in res["shifts"]} == set(range(DEVICES[name.split("_")[1]]))
        assert (tmp_path / "assets" / "policy" / "config.json").is_file(), "tiny checkpoints made on the spot"
        assert "bootstrap" not in (tmp_path / f"{name}.log").read_text().lower()


@pytest.mark.parametrize("mode", ["gpu", "cpu"])
@pytest.mark.parametrize("deploy", ["colocated", "pivot"])
def test_each_runs_command_composes_into_its_run(tmp_path, mode, deploy):
    """Parts 4 and 5's `train.py` overrides make the config they mean (run_pivot runs on GPUs only)."""
    from pivotrl.bench.device_check_run import DEVICES, run_command
    from pivotrl.config import compose_config

    assets = {k: str(tmp_path / k) for k in ("policy", "genrm", "train", "val")}
    cmd = run_command(mode, deploy, assets, tmp_path / "run")
    assert cmd[1] == "train.py"
    cfg = compose_config([a for a in cmd[2:] if not a.startswith("hydra.")])
    assert cfg.deploy.mode == deploy and cfg.cluster.kind == "ray" and cfg.cluster.num_devices == DEVICES[deploy]
    assert cfg.train.steps == 3 and cfg.models.policy.hf_path == assets["policy"]
    assert cfg.engine.name == ("vllm" if mode == "gpu" else "cpu")


def test_device_check_rejects_an_unknown_argument():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--gpus=2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "allowed: --cpu" in proc.stderr
