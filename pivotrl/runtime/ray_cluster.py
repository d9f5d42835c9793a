"""`cluster=ray`: the local runtime's loop on the GPUs of a Ray cluster (vLLM engines, NCCL training).

Owns only what differs from `cluster=local`: devices are the `GPU` resource of a running Ray
cluster (`cluster.address`) reserved in per-node placement groups
(`cluster.py`), inference replicas run the engine `engine.name` names (vLLM by default),
and training ranks use CUDA with NCCL. The device actors, role shifting, executor, monitor,
controllers and records are the very ones `cluster=local` uses (`local.py`, `local_setup.py`).

Limits of this version (said, not hidden): one engine per device actor, so `tp` must be 1 (a TP
replica would need one actor owning several GPUs); GPS reads run in the driver and travel through
Ray's object store, not NIXL. The GPU paths are exercised by `tests/runtime/test_ray_cluster.py`
under the `gpu` marker; without GPUs a start fails with the resource error naming both numbers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any



def run_ray(cfg: Any, run_dir: Path, tracker: Any) -> dict[str, Any]:
    """`cluster=ray` entry (pivotrl.run's registry). Ray connections and devices are always released."""
    from pivotrl.runtime.local import run_real

    return run_real(cfg, run_dir, tracker)
