"""Policy losses for PPO-style RL, registered by name, and the KL penalty to a reference policy.

Owns: the per-token loss arithmetic and how token losses are aggregated into one scalar. Knows
nothing about models, micro-batches or processes: every function takes `[batch, tokens]` tensors
plus a 0/1 `mask` of valid response tokens, and returns a scalar loss and detached metrics.

Aggregation modes (`algo.loss_agg_mode`):

- `token-mean`: sum of token losses / number of valid tokens (DAPO / verl default; long and short
  responses weigh the same per token).
- `seq-mean-token-mean`: mean over tokens within each sequence, then mean over sequences (the
  original GRPO formulation).
- `seq-mean-token-sum`: sum over tokens within each sequence, then mean over sequences.

Micro-batching and data parallelism need the *global* denominator: a micro-batch holds only part
of the batch. `denominator` overrides the local count (valid tokens for `token-mean`, sequences for
the `seq-*` modes) so that summing the micro-batch losses of every rank gives exactly the loss of
the whole batch. Sequences with no valid token contribute 0 and are not counted by the local count.

Registered policy losses (`algo.loss`):

- `ppo_clip`: `max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))` per token, with
  `r = exp(logp - old_logp)`; asymmetric clip ranges allow DAPO's clip-higher.
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch

# The names (and the registry of losses) are the config's (`pivotrl.config.trainer`: lazy targets here).
from pivotrl.config.trainer import KL_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str, denominator: float | None = None
) -> torch.Tensor:
    """Reduce `[B, T]` token values to a scalar under `mask` by `mode` (see module docstring)."""
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        denom = mask.sum() if denominator is None else denominator
        return (values * mask).sum() / denom
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        tok = mask.sum(-1)
        seq = (values * mask).sum(-1)
        if mode == "seq-mean-token-mean":
            seq = seq / tok.clamp(min=1.0)
        denom = (tok > 0).sum() if denominator is None else denominator
        return seq.sum() / denom
    raise ValueError(f"unknown loss_agg_mode {mode!r}; allowed: {list(LOSS_AGG_MODES)}")


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1/k2/k3).

    k1 = logp - logp_ref (unbiased, high variance, can be negative); k2 = (logp - logp_ref)^2 / 2;
    k3 = exp(logp_ref - logp) - (logp_ref - logp) - 1 (unbiased, always >= 0; GRPO's choice).
    k3 is clamped to [-10, 10] in log-ratio, as in verl, so one wild token cannot blow up the step.
    """
    diff = log_probs - ref_log_probs
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator == "k3":
        d = torch.clamp(-diff, min=-10.0, max=10.0)
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown kl_estimator {estimator!r}; allowed: {list(KL_ESTIMATORS)}")


class PolicyLoss(Protocol):
    def __call__(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        clip_ratio_low: float,
        clip_ratio_high: float,
        agg_mode: str,
        denominator: float | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...




def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: register a policy loss under `name` (the config key)."""
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> PolicyLoss:
    """The loss registered as `name`; a `ConfigError` lists the known names otherwise."""
    return POLICY_LOSSES[name]


def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    agg_mode: str = "token-mean",
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip surrogate. `advantages` is `[B, T]` (or `[B]`, broadcast to every token).

    Returns `(loss, metrics)`; metrics are detached sums/means over valid tokens of this call:
    `clipfrac` (fraction of tokens where the clipped branch is active), `approx_kl` (k1 of old vs
    new, i.e. how far the policy moved since the samples were scored) and `ratio_mean`."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(log_probs)
    log_ratio = log_probs - old_log_probs
    # Clamp before exp: a stale token with a huge log-ratio would otherwise overflow to inf and
    # turn the (clipped, zero-gradient) branch into NaN.
    ratio = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = aggregate(per_token, mask, agg_mode, denominator)
    with torch.no_grad():
        m = mask.to(per_token.dtype)
        n = m.sum().clamp(min=1.0)
        metrics = {
            "clipfrac": ((clipped > unclipped).to(m.dtype) * m).sum() / n,
            "approx_kl": (-log_ratio * m).sum() / n,
            "ratio_mean": (ratio * m).sum() / n,
        }
    return loss, metrics


def policy_loss(
    name: str,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    agg_mode: str = "token-mean",
    denominator: float | None = None,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The full policy objective: registered loss `name` plus `kl_coef * KL(pi || pi_ref)`,
    both aggregated by `agg_mode` with the same `denominator`. Metrics gain `pg_loss` and, with
    a reference, `kl`."""
    pg, metrics = get_policy_loss(name)(
        log_probs,
        old_log_probs,
        advantages,
        mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        agg_mode=agg_mode,
        denominator=denominator,
    )
    metrics["pg_loss"] = pg.detach()
    loss = pg
    if kl_coef != 0.0:
        if ref_log_probs is None:
            raise ValueError("kl_coef is non-zero but no ref_log_probs were given")
        kl = aggregate(kl_penalty(log_probs, ref_log_probs, kl_estimator), mask, agg_mode, denominator)
        metrics["kl"] = kl.detach()
        loss = loss + kl_coef * kl
    return loss, metrics
