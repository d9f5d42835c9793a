"""Advantage estimators for policy-gradient RL, registered by name.

Owns: turning per-sample scalar rewards into per-sample advantages, given which prompt group each
sample belongs to (GRPO draws G samples per prompt; the group is the baseline). Knows nothing about
tokens, models or torch: inputs and outputs are numpy arrays, so the trainer, the synchronous loop
and tests call the same functions. Token-level broadcasting (one advantage for every response
token of a sample, outcome reward) happens in the trainer.

Registered estimators (the config string `algo.advantage_estimator` is the key):

- `grpo`: `A_i = (r_i - mean_g) / (std_g + eps)` over the samples of group `g`. `std` is the
  unbiased sample standard deviation (Bessel's correction), as in verl and the GRPO paper's code.
  With `norm_by_std=False` it is `r_i - mean_g` (the "Dr. GRPO" variant, which avoids up-weighting
  groups whose rewards barely differ).
- `rloo`: leave-one-out baseline, `A_i = r_i - mean_{j != i} r_j = G/(G-1) * (r_i - mean_g)`.

A group of one sample has no baseline, so both give it advantage 0 (decision: an unbaselined raw
reward would have a different scale than every other sample; verl instead passes the raw reward).
A group whose rewards are all equal gets advantage 0 for every sample.
"""
from __future__ import annotations

from typing import Callable, Hashable, Protocol, Sequence

import numpy as np

from pivotrl.config.trainer import ADVANTAGE_ESTIMATORS


class AdvantageEstimator(Protocol):
    def __call__(
        self, rewards: np.ndarray, group_ids: Sequence[Hashable], *, norm_by_std: bool, eps: float
    ) -> np.ndarray: ...


# The registry is the config's (`pivotrl.config.trainer`: the names, with lazy targets here).


def register_advantage(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: register an estimator under `name` (the config key)."""
    return ADVANTAGE_ESTIMATORS.register(name)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as `name`; a `ConfigError` lists the known names otherwise."""
    return ADVANTAGE_ESTIMATORS[name]


def _groups(group_ids: Sequence[Hashable], n: int) -> list[np.ndarray]:
    """Index arrays, one per distinct group id, in order of first appearance."""
    if len(group_ids) != n:
        raise ValueError(f"group_ids has {len(group_ids)} entries but rewards has {n}")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    return [np.asarray(ix, dtype=np.int64) for ix in members.values()]


def _check_rewards(rewards: np.ndarray | Sequence[float]) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be one scalar per sample (1-D), got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards contain NaN or inf")
    return r


def grpo_advantages(
    rewards: np.ndarray | Sequence[float],
    group_ids: Sequence[Hashable],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """Group-normalised advantages: `(r - mean) / (std + eps)` per group, or `r - mean`."""
    r = _check_rewards(rewards)
    adv = np.zeros_like(r)
    for ix in _groups(group_ids, len(r)):
        if len(ix) < 2:
            continue  # no baseline: advantage 0 (see module docstring)
        g = r[ix]
        centred = g - g.mean()
        adv[ix] = centred / (g.std(ddof=1) + eps) if norm_by_std else centred
    return adv.astype(np.float32)


def rloo_advantages(
    rewards: np.ndarray | Sequence[float],
    group_ids: Sequence[Hashable],
    *,
    norm_by_std: bool = False,
    eps: float = 1e-6,
) -> np.ndarray:
    """Leave-one-out baseline: `r_i - mean of the other samples of the group`.

    `norm_by_std` additionally divides by the group's unbiased std (+eps), for users who want RLOO
    on GRPO's scale; off by default, as in the RLOO paper."""
    r = _check_rewards(rewards)
    adv = np.zeros_like(r)
    for ix in _groups(group_ids, len(r)):
        n = len(ix)
        if n < 2:
            continue
        g = r[ix]
        loo = (g.sum() - g) / (n - 1)
        a = g - loo
        adv[ix] = a / (g.std(ddof=1) + eps) if norm_by_std else a
    return adv.astype(np.float32)


def compute_advantages(
    name: str,
    rewards: np.ndarray | Sequence[float],
    group_ids: Sequence[Hashable],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """Per-sample advantages (float32, same order as `rewards`) by the estimator named `name`."""
    return get_advantage_estimator(name)(rewards, group_ids, norm_by_std=norm_by_std, eps=eps)
