"""One GPS row write made by every rank of a trainer: the collective protocol, whatever is written.

Owns `collective_row_write`: rank 0 opens a row write (`GlobalParameterStore.begin_row_write`) and
broadcasts it; every rank fills its own rows (`fill(w)`, returning the rows it wrote per stored
tensor); the counts and any error reach rank 0, which commits (GPS then checks every row of every
tensor arrived, so the version appears whole or not at all) or aborts on any rank's error; every
rank gets the new version or the same error. The policy's publish (`engines.weight_sync.
publish_shards`) and the trainer's state (`trainer.state_store.write_state`) both write this way.
With one rank no collective runs (no process group is needed).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch.distributed as dist

if TYPE_CHECKING:
    from pivotrl.gps.handles import RowWrite
    from pivotrl.gps.store import GlobalParameterStore

__all__ = ["collective_row_write"]


def collective_row_write(store: GlobalParameterStore, model: str, rank: int, world: int,
                         fill: Callable[[RowWrite], dict[str, int]],
                         what: str) -> int:
    """A new version of GPS model `model` written by every rank's `fill` (module docstring).
    Collective over the default group. `what` names the write in the error."""
    box = [store.begin_row_write(model) if rank == 0 else None]
    if world > 1:
        dist.broadcast_object_list(box, src=0)
    w = box[0]
    rows: dict[str, int] = {}
    err: str | None = None
    try:
        rows = fill(w)
    except Exception as e:  # noqa: BLE001 - every rank must reach the gather below
        err = f"rank {rank}: {type(e).__name__}: {e}"
    parts: list[Any] = [None] * world
    if world > 1:
        dist.all_gather_object(parts, (rows, err))
    else:
        parts = [(rows, err)]
    result: list[Any] = [None]
    if rank == 0:
        errors = [e for _, e in parts if e]
        if errors:
            store.abort_row_write(w)
            result = [RuntimeError(f"{what} failed: " + "; ".join(errors))]
        else:
            total: dict[str, int] = {}
            for r, _ in parts:
                for k, n in r.items():
                    total[k] = total.get(k, 0) + n
            try:
                result = [int(store.commit_row_write(w, total))]
            except Exception as e:  # noqa: BLE001 - handed to every rank
                result = [e]
    if world > 1:
        dist.broadcast_object_list(result, src=0)
    if isinstance(result[0], BaseException):
        raise result[0]
    return int(result[0])
