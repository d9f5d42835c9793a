"""The control plane is pure: importing pivotrl.core.* and pivotrl.deploy.* pulls in no torch, ray,
vllm, omegaconf or hydra (checked in a fresh interpreter, over whatever modules exist)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import importlib, json, pkgutil, sys
names = []
for pkg in ("pivotrl.core", "pivotrl.deploy"):
    try:
        mod = importlib.import_module(pkg)
    except ModuleNotFoundError:
        continue
    names.append(pkg)
    for m in pkgutil.walk_packages(mod.__path__, pkg + "."):
        importlib.import_module(m.name)
        names.append(m.name)
heavy = sorted(k for k in sys.modules if k.split(".")[0] in ("torch", "ray", "vllm", "omegaconf", "hydra"))
print(json.dumps({"imported": names, "heavy": heavy}))
"""


def test_core_and_deploy_import_no_torch_ray_vllm_omegaconf_hydra():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert "pivotrl.core.scheduler" in res["imported"] and "pivotrl.core.planner" in res["imported"]
    assert res["heavy"] == [], f"pure control plane imported {res['heavy']}"
