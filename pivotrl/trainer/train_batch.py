"""`TrainBatch`: the contract between whoever assembles a GRPO batch (the runtimes' samples,
benchmarks) and the trainer that consumes it. Plain lists, checked on construction;
no torch, so a batch can be built and shipped without importing the trainer.

On the wire (pickling: `ray.put(batch)` to the trainer's ranks) a batch travels as arrays, not
Python lists: the per-token fields (`prompt_ids`, `response_ids`, `old_log_probs`) become one flat
numpy array each plus row offsets (`PackedRows`), which pickle as raw buffers (Ray ships numpy
arrays out of band, zero-copy on the receiving node). A paper-scale batch (2,048 samples of up to
15K tokens) is then ~100-200 MB of arrays instead of tens of millions of pickled Python objects.
Unpickling gives back the same lists (token ids as int, log-probs as the same float64 values),
so the trainer sees exactly the batch that was built.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np

__all__ = ["PackedRows", "TrainBatch"]


@dataclass(frozen=True)
class PackedRows:
    """Ragged rows as one flat array and `len(rows) + 1` offsets (row `i` is
    `values[offsets[i]:offsets[i + 1]]`)."""

    values: np.ndarray
    offsets: np.ndarray

    @classmethod
    def pack(cls, rows: Sequence[Sequence[Any]], dtype: Any) -> "PackedRows":
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter(itertools.chain.from_iterable(rows), dtype=dtype, count=int(offsets[-1]))
        return cls(values, offsets)

    def unpack(self) -> list[list[Any]]:
        flat = self.values.tolist()  # Python ints / floats, as the rows were built
        o = self.offsets.tolist()
        return [flat[o[i]:o[i + 1]] for i in range(len(o) - 1)]

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.offsets.nbytes)


def _token_dtype(rows: Sequence[Sequence[int]]) -> Any:
    """int32 when every id fits (every vocabulary does), else int64: the ids come back unchanged."""
    hi = max((max(r) for r in rows if len(r)), default=0)
    lo = min((min(r) for r in rows if len(r)), default=0)
    return np.int32 if -2**31 <= lo and hi < 2**31 else np.int64


_PACKED_FIELDS = ("prompt_ids", "response_ids", "old_log_probs")


def _rebuild(fields: dict[str, Any]) -> "TrainBatch":
    for name in _PACKED_FIELDS:
        if isinstance(fields.get(name), PackedRows):
            fields[name] = fields[name].unpack()
    return TrainBatch(**fields)


@dataclass
class TrainBatch:
    """Samples for one policy update. Lists are per sample, all of the same length.

    - `prompt_ids` / `response_ids`: token ids (no padding). Prompts must be non-empty; the loss
      covers response tokens only.
    - `versions`: the policy version that generated each sample (for the staleness bound).
    - Either `advantages` (one scalar per sample, broadcast to its response tokens) or `rewards` +
      `group_ids` (samples of one prompt share a group id; the trainer's estimator computes the
      advantages over the whole batch *before* stale samples are dropped, so a group's baseline
      does not depend on which of its samples are still fresh).
    - `old_log_probs`: per response token, from the behaviour policy (e.g. the rollout engine).
      When None, the current policy's own log-probs are used, detached: with one optimizer step
      per batch that is exactly verl's "recompute old log-probs before the update", so the ratio
      is 1 and PPO-clip reduces to the policy gradient. Pass them for stale samples if the
      importance ratio should correct for staleness. With several mini-batches or epochs per
      batch (`algo.ppo_mini_batches`, `ppo_epochs`), None means "recompute once before
      the first optimizer step".
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    versions: list[int]
    rewards: list[float] | None = None
    group_ids: list[Hashable] | None = None
    advantages: list[float] | None = None
    old_log_probs: list[list[float]] | None = None

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def packed(self) -> dict[str, Any]:
        """The batch's fields as it travels (module docstring): per-token fields as `PackedRows`,
        the per-sample ones as they are."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["prompt_ids"] = PackedRows.pack(self.prompt_ids, _token_dtype(self.prompt_ids))
        out["response_ids"] = PackedRows.pack(self.response_ids, _token_dtype(self.response_ids))
        if self.old_log_probs is not None:
            out["old_log_probs"] = PackedRows.pack(self.old_log_probs, np.float64)
        return out

    def __reduce__(self) -> tuple:
        return (_rebuild, (self.packed(),))

    def with_old_log_probs(self, old_log_probs: list[list[float]]) -> "TrainBatch":
        """A copy of this batch carrying `old_log_probs`."""
        return dataclasses.replace(self, old_log_probs=old_log_probs)

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValueError naming the field that is missing, ragged or malformed (and, given
        `vocab_size`, holding a token id outside the model's vocabulary)."""
        n = len(self.prompt_ids)
        if n == 0:
            raise ValueError("TrainBatch.prompt_ids is empty: a batch needs at least one sample")
        for name in ("response_ids", "versions", "rewards", "group_ids", "advantages", "old_log_probs"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"TrainBatch.{name} has {len(v)} entries, prompt_ids has {n}")
        if self.advantages is None and (self.rewards is None or self.group_ids is None):
            raise ValueError("TrainBatch needs either advantages, or rewards and group_ids")
        for i, p in enumerate(self.prompt_ids):
            if len(p) == 0:
                raise ValueError(f"TrainBatch.prompt_ids[{i}] is empty (a prompt needs >= 1 token)")
        if vocab_size is not None:
            for name in ("prompt_ids", "response_ids"):
                for i, ids in enumerate(getattr(self, name)):
                    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
                        raise ValueError(f"TrainBatch.{name}[{i}] has a token id outside [0, {vocab_size})")
        if self.old_log_probs is not None:
            for i, (r, lp) in enumerate(zip(self.response_ids, self.old_log_probs)):
                if len(r) != len(lp):
                    raise ValueError(
                        f"TrainBatch.old_log_probs[{i}] has {len(lp)} entries, response_ids[{i}] has {len(r)}"
                    )
