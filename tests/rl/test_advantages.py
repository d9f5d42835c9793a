"""Advantage estimators: hand-computed tables, contract tests over the registry, invariants."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pivotrl.rl.advantages import ADVANTAGE_ESTIMATORS, compute_advantages, get_advantage_estimator

S3 = math.sqrt(1.0 / 3.0)  # unbiased std of [1, 0, 0, 1]

# (estimator, rewards, group ids, norm_by_std, expected advantages) — computed by hand.
TABLE = [
    ("grpo", [1, 0, 0, 1], [7, 7, 7, 7], True, [0.5 / S3, -0.5 / S3, -0.5 / S3, 0.5 / S3]),
    ("grpo", [1, 0, 0, 1], [7, 7, 7, 7], False, [0.5, -0.5, -0.5, 0.5]),
    ("grpo", [1, 2, 3, 5, 5], [0, 0, 0, 1, 1], True, [-1.0, 0.0, 1.0, 0.0, 0.0]),
    # interleaved groups keep sample order; group "b" = [4, 0] -> mean 2, std sqrt(8) = 2.828
    ("grpo", [1, 4, 3, 0], ["a", "b", "a", "b"], True, [-1 / math.sqrt(2), 2 / math.sqrt(8), 1 / math.sqrt(2), -2 / math.sqrt(8)]),
    ("grpo", [0.7], [0], True, [0.0]),  # singleton: no baseline
    ("grpo", [2, 2, 2], [0, 0, 0], True, [0.0, 0.0, 0.0]),
    ("rloo", [1, 0, 0, 1], [0, 0, 0, 0], False, [2 / 3, -2 / 3, -2 / 3, 2 / 3]),
    ("rloo", [3, 1], [0, 0], False, [2.0, -2.0]),
    ("rloo", [3, 1], [0, 0], True, [2.0 / math.sqrt(2), -2.0 / math.sqrt(2)]),
    ("rloo", [5.0], [0], False, [0.0]),
]


@pytest.mark.parametrize("name,rewards,groups,norm,expected", TABLE)
def test_table(name, rewards, groups, norm, expected):
    adv = compute_advantages(name, rewards, groups, norm_by_std=norm, eps=1e-6)
    assert adv.dtype == np.float32
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_contract_every_estimator(name):
    fn = get_advantage_estimator(name)
    rng = np.random.default_rng(0)
    r = rng.normal(size=12)
    g = [i // 4 for i in range(12)]
    for norm in (True, False):
        adv = fn(r, g, norm_by_std=norm, eps=1e-6)
        assert adv.shape == (12,) and adv.dtype == np.float32 and np.all(np.isfinite(adv))
        # a group's advantages are centred: the baseline is the group itself
        for k in range(3):
            assert abs(adv[4 * k : 4 * k + 4].sum()) < 1e-4
    assert fn([1.0], [0], norm_by_std=True, eps=1e-6).tolist() == [0.0]
    assert fn([3.0, 3.0], [0, 0], norm_by_std=True, eps=1e-6).tolist() == [0.0, 0.0]


def test_bad_input():
    with pytest.raises(ValueError, match="algo.advantage_estimator='ppo' is invalid; allowed: .*grpo"):
        compute_advantages("ppo", [1.0], [0])
    with pytest.raises(ValueError, match="group_ids has 1 entries but rewards has 2"):
        compute_advantages("grpo", [1.0, 2.0], [0])
    with pytest.raises(ValueError, match="NaN"):
        compute_advantages("grpo", [1.0, float("nan")], [0, 0])
    with pytest.raises(ValueError, match="1-D"):
        compute_advantages("grpo", [[1.0, 2.0]], [0])


rewards_st = st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=16)


@settings(max_examples=60, deadline=None)
@given(rewards_st, st.floats(-5, 5), st.floats(0.5, 4))
def test_grpo_is_invariant_to_affine_reward_changes(r, shift, scale):
    r = np.asarray(r)
    g = [0] * len(r)
    if np.std(r) < 1e-2:  # eps dominates for near-constant groups; invariance is only approximate
        return
    a = compute_advantages("grpo", r, g, eps=1e-9)
    b = compute_advantages("grpo", r * scale + shift, g, eps=1e-9)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(rewards_st)
def test_rloo_is_scaled_centred_reward(r):
    r = np.asarray(r)
    n = len(r)
    adv = compute_advantages("rloo", r, [0] * n, norm_by_std=False)
    np.testing.assert_allclose(adv, n / (n - 1) * (r - r.mean()), rtol=1e-4, atol=1e-4)
