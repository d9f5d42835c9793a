"""How a rank cuts its samples into micro-batches: by sequence count, or by padded tokens.

Owns `plan_micro_batches`, a pure function (numpy only). Every rank sees the whole batch, so every
rank computes every rank's micro-batches the same way and takes the largest count: FSDP's
collectives line up without a round of communication, and a rank with less work runs empty
micro-batches (the worker runs those as zero-weight samples).

Dynamic batch size (verl's `use_dynamic_bsz` / `ppo_max_token_len_per_gpu`, slime's
`max_tokens_per_gpu`): with `max_tokens > 0` a micro-batch holds as many sequences as fit in
`max_tokens` *padded* tokens (`count x longest`), after sorting the rank's samples by length so that
similar lengths share a micro-batch. A sequence longer than the budget gets a micro-batch of its
own. Sorting changes only the order in which gradients accumulate, not their sum.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["plan_micro_batches", "padded_tokens"]


def _by_tokens(idx: np.ndarray, lengths: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    cur: list[int] = []
    longest = 0
    for i in idx:
        n = int(lengths[i])
        if cur and (len(cur) + 1) * max(longest, n) > max_tokens:
            out.append(np.asarray(cur, dtype=idx.dtype))
            cur, longest = [], 0
        cur.append(int(i))
        longest = max(longest, n)
    if cur:
        out.append(np.asarray(cur, dtype=idx.dtype))
    return out


def plan_micro_batches(indices: np.ndarray, world_size: int, rank: int, *, micro_batch_size: int,
                       max_tokens: int = 0, lengths: np.ndarray | None = None) -> list[np.ndarray]:
    """Rank `rank`'s share of `indices` (an even split over `world_size` ranks), as micro-batches;
    the list has the same length on every rank (padded with empty arrays).

    - `max_tokens == 0`: `micro_batch_size` sequences per micro-batch (the last may be short);
      with `lengths`, the rank's samples are sorted by length first (less padding, same sum).
    - `max_tokens > 0`: token budget per micro-batch (see the module docstring); needs `lengths`
      (`lengths[i]` = prompt + response tokens of sample `i`); `micro_batch_size` is ignored."""
    indices = np.asarray(indices)
    shards = np.array_split(indices, world_size)
    if lengths is not None:  # similar lengths share a micro-batch
        shards = [s[np.argsort(lengths[s], kind="stable")] for s in shards]
    if max_tokens > 0:
        if lengths is None:
            raise ValueError("plan_micro_batches: max_tokens > 0 needs lengths")
        per_rank = [_by_tokens(s, lengths, max_tokens) for s in shards]
        n_micro = max(1, max(len(p) for p in per_rank))
        mine = per_rank[rank]
        return mine + [indices[:0]] * (n_micro - len(mine))
    n_micro = max(1, math.ceil(len(shards[0]) / micro_batch_size))
    mine = shards[rank]
    return [mine[k * micro_batch_size:(k + 1) * micro_batch_size] for k in range(n_micro)]


def padded_tokens(micro: list[np.ndarray], lengths: np.ndarray) -> tuple[int, int]:
    """(real tokens, padded tokens = sum over micro-batches of count x longest) of a plan."""
    real = sum(int(lengths[m].sum()) for m in micro if len(m))
    padded = sum(len(m) * int(lengths[m].max()) for m in micro if len(m))
    return real, padded
