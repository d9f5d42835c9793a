"""`TrainBatch`: the contract between whoever assembles a GRPO batch (the runtimes' samples,
benchmarks) and the trainer that consumes it. Plain lists, checked on construction;
no torch, so a batch can be built and shipped without importing the trainer."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Hashable

__all__ = ["TrainBatch"]


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
