"""Micro-batch planning: by count (the original cut) and by a padded-token budget."""
from __future__ import annotations

import numpy as np
import pytest

from pivotrl.trainer.batching import padded_tokens, plan_micro_batches


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("budget", [0, 40, 100, 1000])
def test_every_sample_once_same_count_on_every_rank_budget_kept(world_size, budget):
    rng = np.random.default_rng(world_size * 7 + budget)
    n = 23
    lengths = rng.integers(3, 60, size=n)
    idx = np.arange(n)
    plans = [plan_micro_batches(idx, world_size, r, micro_batch_size=4, max_tokens=budget, lengths=lengths)
             for r in range(world_size)]
    assert len({len(p) for p in plans}) == 1
    got = sorted(int(i) for p in plans for m in p for i in m)
    assert got == list(range(n))
    if budget:
        for p in plans:
            for m in p:
                # within budget, unless a single sequence is longer than the budget on its own
                assert len(m) == 0 or len(m) * lengths[m].max() <= budget or len(m) == 1
    else:
        assert all(len(m) <= 4 for p in plans for m in p)


def test_count_mode_is_the_original_cut():
    idx = np.arange(9)
    plan = plan_micro_batches(idx, 2, 1, micro_batch_size=4)
    assert [m.tolist() for m in plan] == [[5, 6, 7, 8], []]  # rank 1 has 4, rank 0 has 5: two micro-batches


def test_token_budget_cuts_padding_against_a_count_cut():
    lengths = np.array([5, 200, 6, 190, 7, 210, 5, 205])
    idx = np.arange(8)
    by_count = plan_micro_batches(idx, 1, 0, micro_batch_size=4)
    by_tokens = plan_micro_batches(idx, 1, 0, micro_batch_size=4, max_tokens=420, lengths=lengths)
    real_c, pad_c = padded_tokens(by_count, lengths)
    real_t, pad_t = padded_tokens(by_tokens, lengths)
    assert real_c == real_t == int(lengths.sum())
    assert pad_t < pad_c
    assert max(len(m) * lengths[m].max() for m in by_tokens) <= 420


def test_budget_needs_lengths():
    with pytest.raises(ValueError, match="lengths"):
        plan_micro_batches(np.arange(3), 1, 0, micro_batch_size=2, max_tokens=10)
