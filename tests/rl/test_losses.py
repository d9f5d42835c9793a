"""Policy losses and KL estimators: hand-computed tables, micro-batch additivity, bad input."""
from __future__ import annotations

import math

import pytest
import torch

from pivotrl.rl.losses import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    aggregate,
    get_policy_loss,
    kl_penalty,
    policy_loss,
    ppo_clip_loss,
)

torch.set_num_threads(1)

# Two sequences of 4 tokens. Ratios r = [1.5, 0.5, 1.1, 1.0] in both; A = +1 then -1; the last
# token of sequence 1 is padding. clip range (1 - 0.2, 1 + 0.28).
RATIOS = [1.5, 0.5, 1.1, 1.0]
# A=+1: -min(r, clip(r)) = [-1.28, -0.5, -1.1, -1.0]   (r=1.5 clipped)
# A=-1:  max(r, clip(r)) = [ 1.5,   0.8,  1.1,  1.0]   (r=0.5 clipped; last token masked)
SEQ0 = -1.28 - 0.5 - 1.1 - 1.0  # -3.88
SEQ1 = 1.5 + 0.8 + 1.1  # 3.4
EXPECTED = {
    "token-mean": (SEQ0 + SEQ1) / 7,
    "seq-mean-token-mean": (SEQ0 / 4 + SEQ1 / 3) / 2,
    "seq-mean-token-sum": (SEQ0 + SEQ1) / 2,
}


def _inputs():
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]] * 2)
    logp = (old + torch.log(torch.tensor([RATIOS] * 2))).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    return logp, old, adv, mask


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_ppo_clip_table(mode):
    logp, old, adv, mask = _inputs()
    loss, m = ppo_clip_loss(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, agg_mode=mode)
    assert float(loss.detach()) == pytest.approx(EXPECTED[mode], abs=1e-6)
    assert float(m["clipfrac"]) == pytest.approx(2 / 7)
    assert float(m["ratio_mean"]) == pytest.approx((sum(RATIOS) + sum(RATIOS[:3])) / 7)


def test_ppo_clip_gradient_is_zero_on_clipped_tokens():
    logp, old, adv, mask = _inputs()
    loss, _ = ppo_clip_loss(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, agg_mode="token-mean")
    loss.backward()
    # d/dlogp of -A*r is -A*r; clipped tokens and padding get nothing.
    expected = torch.tensor([[0.0, -0.5, -1.1, -1.0], [1.5, 0.0, 1.1, 0.0]]) / 7
    torch.testing.assert_close(logp.grad, expected, atol=1e-6, rtol=1e-5)


def test_on_policy_loss_is_minus_mean_advantage():
    logp = torch.randn(3, 5, requires_grad=True)
    adv = torch.tensor([0.5, -1.0, 2.0])
    mask = torch.ones(3, 5)
    loss, m = ppo_clip_loss(logp, logp.detach(), adv, mask)
    assert float(loss.detach()) == pytest.approx(-float(adv.mean()), abs=1e-6)
    assert float(m["clipfrac"]) == 0.0 and float(m["approx_kl"]) == pytest.approx(0.0)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_with_global_denominator_add_up(mode):
    torch.manual_seed(0)
    logp, old = torch.randn(6, 7), torch.randn(6, 7)
    adv = torch.randn(6)
    mask = (torch.rand(6, 7) > 0.3).float()
    mask[2] = 0.0  # a sequence with no valid token counts for nothing
    full, _ = ppo_clip_loss(logp, old, adv, mask, agg_mode=mode)
    denom = float(mask.sum()) if mode == "token-mean" else float((mask.sum(-1) > 0).sum())
    parts = [ppo_clip_loss(logp[s], old[s], adv[s], mask[s], agg_mode=mode, denominator=denom)[0]
             for s in (slice(0, 2), slice(2, 3), slice(3, 6))]
    assert float(sum(parts)) == pytest.approx(float(full), abs=1e-6)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    assert float(kl_penalty(logp, ref, "k1")) == pytest.approx(0.5)
    assert float(kl_penalty(logp, ref, "k2")) == pytest.approx(0.125)
    assert float(kl_penalty(logp, ref, "k3")) == pytest.approx(math.exp(-0.5) + 0.5 - 1.0)
    assert float(kl_penalty(ref, ref, "k3")) == 0.0


def test_policy_loss_adds_weighted_kl():
    logp, old, adv, mask = _inputs()
    ref = old - 0.3
    pg, _ = ppo_clip_loss(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    kl = aggregate(kl_penalty(logp, ref, "k3"), mask, "token-mean")
    total, m = policy_loss("ppo_clip", logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28,
                           ref_log_probs=ref, kl_coef=0.1, kl_estimator="k3")
    assert float(total.detach()) == pytest.approx(float(pg.detach()) + 0.1 * float(kl.detach()), abs=1e-6)
    assert float(m["pg_loss"]) == pytest.approx(float(pg.detach())) and float(m["kl"]) == pytest.approx(float(kl.detach()))


def test_huge_ratio_stays_finite():
    logp = torch.tensor([[100.0, -100.0]], requires_grad=True)
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2))
    loss.backward()
    assert math.isfinite(float(loss.detach())) and torch.isfinite(logp.grad).all()


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_contract_every_loss(name):
    logp, old, adv, mask = _inputs()
    loss, m = get_policy_loss(name)(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2,
                                    agg_mode="token-mean", denominator=None)
    assert loss.dim() == 0 and loss.requires_grad
    assert {"clipfrac", "approx_kl", "ratio_mean"} <= set(m)


def test_bad_input():
    logp, old, adv, mask = _inputs()
    with pytest.raises(ValueError, match="algo.loss='dpo' is invalid; allowed: .*ppo_clip"):
        policy_loss("dpo", logp, old, adv, mask)
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'sum'"):
        aggregate(logp, mask, "sum")
    with pytest.raises(ValueError, match="unknown kl_estimator 'k9'"):
        kl_penalty(logp, old, "k9")
    with pytest.raises(ValueError, match="no ref_log_probs"):
        policy_loss("ppo_clip", logp, old, adv, mask, kl_coef=0.1)
