"""Device and process-group helpers of the trainer ranks: which device and collective backend a
`TrainerSpec` means, the processes ranks start in, and joining the default process group."""
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from pivotrl.config.trainer import TrainerSpec

__all__ = ["init_process_group", "rank_context", "rank_process", "resolve_device"]

#: What the fork server of `rank_context` imports before it forks a rank.
RANK_MODULES = ("pivotrl.trainer.trainer_worker",)


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


def rank_context() -> Any:
    """The multiprocessing context rank processes start in (`rank_process`; their queues too):
    multiprocessing's fork server, which imports `RANK_MODULES` (torch, transformers, the
    trainer's worker) once, at its own start in this process, and forks each rank from there. A
    spawned rank spent about 6 CPU-s importing them, every rank of every start."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(RANK_MODULES))
    return ctx


def rank_process(target: Callable[..., None], args: tuple, **kwargs: Any) -> Any:
    """One rank's process (not yet started), from `rank_context`, running `target(*args)`. As
    with the spawn start method, the rank re-imports the caller's `__main__` and gets `target`
    and `args` pickled, and its environment is the caller's as it is now (the fork server's own
    dates from the server's start: a Ray session started since then, for one, set variables its
    clients need)."""
    return rank_context().Process(target=_in_environ, args=(dict(os.environ), target, args), **kwargs)


def _in_environ(environ: dict[str, str], target: Callable[..., None], args: tuple) -> None:
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)
    target(*args)
