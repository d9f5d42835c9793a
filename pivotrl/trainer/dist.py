"""Device and process-group helpers of the trainer ranks: which device and collective backend a
`TrainerSpec` means, and joining the default process group."""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from pivotrl.config.trainer import TrainerSpec

__all__ = ["init_process_group", "resolve_device"]


def resolve_device(cfg: TrainerSpec) -> tuple[str, str]:
    """(device kind, backend) from `cfg.device` / `cfg.backend`, resolving `auto`."""
    kind = cfg.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("TrainerSpec.device='cuda' but CUDA is not available; use 'cpu' or 'auto'")
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if kind == "cuda" else "gloo")
    return kind, backend


def init_process_group(rank: int, world_size: int, init_method: str, backend: str, timeout_s: float = 600.0) -> None:
    """Join the default process group (`init_method`: a `file://` or `tcp://` URL shared by all ranks)."""
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
