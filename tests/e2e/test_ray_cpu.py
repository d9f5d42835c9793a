"""The whole `cluster=ray` path on CPU (issue 14 item 10), run as a user types it:
`python train.py cluster=ray cluster.accelerator=cpu cluster.address=local deploy=pivot`.

Its own Ray head (a private one: own temp dir and port) declares 2 devices; vLLM's CPU build is
the engine, gloo the training backend, the weights bf16. The policy is the bootstrap's tiny Qwen2,
the GenRM the bootstrap's tiny Qwen3-MoE (upcycled from its dense GenRM and fine-tuned so that it
judges), hosted as a replica of both devices: the slot's first device runs vLLM with
tensor_parallel_size=2, the other is a member of it. Weights never pass through the driver: the
trainer's ranks publish into GPS, every policy engine reads its node's GPS file itself; the frozen
GenRM's engines load a host copy of its folder.

pivot, 2 steps: every role shifts on these devices (rollout and training on one each, the judge
on both), so the run does what a static deployment does on them and more. 2 devices, not 4: the
same paths with 2 vLLM engine starts (a rollout engine and a TP-2 judge) instead of 6 (4 devices
started a rollout engine on each and two TP-2 judges): 253 CPU-s and 17 GB at peak alone, against
93 CPU-s and 8 GB. A disaggregated run here (another ~90 s of the suite) was dropped: that mode is
`tests/e2e/test_local_modes.py`, and a static deployment on `cluster=ray` is the device check's
colocated run (`tests/bench/test_device_check.py`).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
P, G = 4, 4
RUN = ["cluster=ray", "cluster.accelerator=cpu", "cluster.address=local", "cluster.num_devices=2",
       "models.genrm.tp=2", "models.bootstrap.genrm_arch=qwen3_moe", "models.bootstrap.dtype=bfloat16",
       "train.steps=2", f"train.prompts_per_step={P}", f"train.group_size={G}", "data.val_size=16",
       "logging.wandb_mode=disabled", "logging.progress=false"]


def _records(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def test_train_py_on_a_ray_head_of_cpu_devices_pivot(tmp_path):
    check_run("pivot", tmp_path)


def check_run(mode: str, tmp_path: Path) -> None:
    """Run `train.py` on the CPU Ray head in `mode` and check what it did (module docstring)."""
    run_dir = tmp_path / mode
    proc = subprocess.run([sys.executable, "train.py", f"deploy={mode}", *RUN, f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["cluster"], summary["deploy"], summary["policy_version"]) == ("ray", mode, 2)
    assert summary["samples_trained"] == summary["samples_trained_unique"] == 2 * P * G
    assert summary["device_deaths"] == 0

    boot = summary["bootstrap"]  # the folders served: the bootstrap's bf16 Qwen2 policy and Qwen3-MoE GenRM
    for role, arch in (("policy", "qwen2"), ("genrm", "qwen3_moe")):
        hf = json.loads((Path(boot[f"{role}_path"]) / "config.json").read_text())
        assert hf["model_type"] == arch and (hf.get("dtype") or hf.get("torch_dtype")) == "bfloat16", role
    assert boot["genrm_on_policy_samples"]["auc"] >= 0.8, "the MoE GenRM judges"

    # the GenRM replica: vLLM reports tensor parallelism 2 on the slot's first device, the next
    # device is its member; the KV capacity the scheduler uses is the one the engine reported
    ups = [t for r in _records(run_dir, "timeline.jsonl") if r["kind"] == "shift_timing"
           for t in r["devices"] if t["direction"] == "up" and t["role"] == "reward"]
    leads = [t for t in ups if t.get("tensor_parallel_size") == 2.0]
    assert leads and all(t["device"] % 2 == 0 for t in leads)
    assert {t["device"] for t in ups if t.get("member_of") is not None} == {t["device"] + 1 for t in leads}
    engines = [t for r in _records(run_dir, "timeline.jsonl") if r["kind"] == "shift_timing" for t in r["devices"]
               if t["direction"] == "up" and t["role"] in ("rollout", "reward") and t.get("member_of") is None]
    policy = [t for t in engines if t["role"] == "rollout"]
    judge = [t for t in engines if t["role"] == "reward"]
    assert policy and all(t.get("gps_file") == 1.0 and t["gps_bytes"] > 0 for t in policy), \
        "every policy engine read its node's GPS file itself"
    assert judge and not any("gps_file" in t for t in judge), \
        "the frozen judge never goes through GPS: its engine loads its host copy (or kept its weights)"
    publishes = [r for r in _records(run_dir, "timeline.jsonl") if r["kind"] == "weight_publish"]
    assert [r["version"] for r in publishes] == [1, 2], "the trainer's ranks published each version into GPS"
    reported = {t["kv_capacity_tokens"] for t in leads}
    assert len(reported) == 1 and reported.pop() > 0
    reward = [r["reward"] for r in _records(run_dir, "timeline.jsonl")
              if r["kind"] == "role_load" and r["reward"]["replicas"]]
    assert reward and all(s["kv_capacity"] == s["replicas"] * leads[0]["kv_capacity_tokens"] for s in reward)
    metrics = _records(run_dir, "metrics.jsonl")

    # held-out accuracy before the run on a rollout replica shifted up for it, on the slot the
    # controller then shifts rollout up on: the run's first rollout replica there is that engine
    val_up, *later = [t for x in summary["shift_log"] for t in x["timings"]
                      if t["role"] == "rollout" and t["direction"] == "up"]
    assert summary["shift_log"][0]["timings"] == [val_up] and val_up["cold"]
    assert any(t["device"] == val_up["device"] and not t["cold"] for t in later), "validated on the run's engine"

    # the MoE GenRM judges: its outputs parse
    judged = sum(m["samples"] for m in metrics)
    assert sum(m["genrm_parse_failures"] for m in metrics) <= 0.1 * judged
    if mode == "pivot":
        assert summary["num_shifts"] > 0
