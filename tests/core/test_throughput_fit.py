"""`ThroughputModel.fit`'s decode fit from prefix-summed normal equations gives the model of the
direct method it replaced (every breakpoint, every free set, one least-squares solve over all
samples each), up to float rounding: on dense and MoE models, heavy-tailed noise like a shared
machine's, few distinct batch sizes, samples on one side of the kink, and a degenerate one-K set.

Where a breakpoint's columns are linearly dependent (a dense model's floor column and the constant,
at the breakpoint above every N and at the one below only the largest N), several coefficient sets
fit its linear problem equally, and the direct method's pick among them is decided by the
machine's rounding; the fit takes the best of them under the max() model, so it is never worse and
sometimes better (`test_a_degenerate_breakpoint_takes_the_best_of_its_ties`)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pivotrl.core.throughput import ThroughputModel, _nnls_relative

DENSE = ThroughputModel(A=3.2e-8, B=10.9e-3, C=0.139e-3, D=1.4e-3)
MOE = ThroughputModel(A=5.5e-8, B=43.6e-3, C=0.094e-3, D=1.4e-3, moe_floor=0.0483, moe_k_over_e=8 / 128)


def direct_fit(samples, moe_floor=None, moe_k_over_e=0.0):
    """(A, B, C, D) by the direct method (the fit as it was before the normal equations)."""
    arr = np.asarray(samples, dtype=np.float64)
    n, k, tau = arr[:, 0], arr[:, 1], arr[:, 2]
    probe = ThroughputModel(0.0, 1.0, 0.0, 0.0, moe_floor=moe_floor, moe_k_over_e=moe_k_over_e)
    g = probe.floor_v(n)
    best = None
    for cut in [-math.inf, *sorted(set(n.tolist())), math.inf]:
        below = n < cut
        X = np.stack([k, np.where(below, g, 0.0), np.where(below, 0.0, n), np.ones_like(n)], axis=1)
        coef = _nnls_relative(X, tau)
        cand = ThroughputModel(*coef.tolist(), moe_floor=moe_floor, moe_k_over_e=moe_k_over_e)
        err = float(np.sum(((cand.iter_time_v(n, k) - tau) / tau) ** 2))
        if best is None or err < best[0] - 1e-15:
            best = (err, coef)
    return best[1]


def _samples(truth, rng, count, n_max, k_max, noise):
    ns = rng.integers(1, n_max + 1, count)
    ks = rng.integers(0, k_max, count)
    # heavy-tailed slowdowns (a descheduled iteration on shared cores takes many times its time)
    slow = 1 + noise * rng.pareto(2.5, count)
    return [(int(n), int(k), truth.iter_time(int(n), int(k)) * float(s)) for n, k, s in zip(ns, ks, slow)]


CASES = {
    "dense_noisy_64N": (DENSE, 4096, 64, 20_000, 0.5),
    "moe_noisy": (MOE, 2000, 128, 400_000, 0.3),
    "dense_exact": (DENSE, 300, 300, 600_000, 0.0),
    "below_kink_only": (DENSE, 500, 40, 50_000, 0.1),  # C*N < B for every N: C stays 0
}


def _case(case):
    truth, count, n_max, k_max, noise = CASES[case]
    rng = np.random.default_rng(sorted(CASES).index(case))
    return truth, _samples(truth, rng, count, n_max, k_max, noise), np.array([k_max, 1.0, n_max, 1.0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_answer_as_the_direct_method(case):
    truth, samples, scale = _case(case)  # scale: each coefficient's weight in an iteration time
    moe = dict(moe_floor=truth.moe_floor, moe_k_over_e=truth.moe_k_over_e)
    want = direct_fit(samples, **moe)
    got = ThroughputModel.fit(samples, **moe)
    ref = ThroughputModel(*want.tolist(), **moe)
    # the same model: the same iteration time at every sample. Not the same coefficients: where
    # the best breakpoint lies above every N, the floor and the constant are one column, and which
    # split of their sum the direct method returned was decided by the machine's float rounding
    # (B = 13.3e-3, D = 0 on one machine; B = 6.6e-3, D = 6.7e-3 and half the C on another)
    n, k, _ = np.asarray(samples, dtype=np.float64).T
    assert got.iter_time_v(n, k) == pytest.approx(ref.iter_time_v(n, k), rel=1e-9)
    assert got.relative_error(samples) == pytest.approx(ref.relative_error(samples), rel=1e-9, abs=1e-12)


def test_a_degenerate_breakpoint_takes_the_best_of_its_ties():
    """Batch sizes 1..8: at the breakpoint below N = 8 only, floor, C*N and the constant are
    dependent. The tie member without the floor (B = 0: below the kink the max() model charges
    C*N instead of B) is worse; on some machines the direct method's rounding picked it. The fit
    keeps B, and is never worse than the direct method."""
    samples = _samples(DENSE, np.random.default_rng(3), 600, 8, 5_000, 0.2)
    want = ThroughputModel(*direct_fit(samples).tolist())
    got = ThroughputModel.fit(samples)
    assert got.relative_error(samples) <= want.relative_error(samples) * (1 + 1e-9)
    assert got.B > 0 and got.C * 7 < got.B <= got.C * 8  # self-consistent: the kink lies at N = 8
    # the tie member without the floor: (B + t, C + t/8, D - t) fits the breakpoint's linear
    # problem equally for any t; at t = -B the max() model charges C*N + D below the kink
    floorless = ThroughputModel(A=got.A, B=0.0, C=got.C - got.B / 8, D=got.D + got.B)
    assert got.relative_error(samples) < floorless.relative_error(samples) * (1 - 1e-6)


def test_never_worse_than_the_direct_method_on_random_sets():
    rng = np.random.default_rng(5)
    for i in range(24):
        truth = (DENSE, MOE)[i % 2]
        moe = dict(moe_floor=truth.moe_floor, moe_k_over_e=truth.moe_k_over_e)
        samples = _samples(truth, rng, int(rng.integers(30, 800)), int(rng.integers(3, 130)),
                           int(rng.integers(1000, 500_000)), float(rng.choice([0.0, 0.05, 0.3, 1.0])))
        want = ThroughputModel(*direct_fit(samples, **moe).tolist(), **moe).relative_error(samples)
        assert ThroughputModel.fit(samples, **moe).relative_error(samples) <= want * (1 + 1e-9) + 1e-12


def test_one_kv_size_everywhere_falls_back_to_least_squares():
    """Every sample holds the same K: the K and constant columns are parallel, the normal
    equations singular; those breakpoints are solved from the rows, as before."""
    rng = np.random.default_rng(7)
    samples = [(int(n), 4096, DENSE.iter_time(int(n), 4096) * (1 + 0.05 * rng.random()))
               for n in rng.integers(1, 200, 400)]
    want = direct_fit(samples)
    got = ThroughputModel.fit(samples)
    pred = lambda m: np.array([m.iter_time(n, k) for n, k, _ in samples])  # noqa: E731
    assert pred(got) == pytest.approx(pred(ThroughputModel(*want.tolist())), rel=1e-9)


def test_ties_between_free_sets_keep_the_larger_one_first():
    """Exact samples of a model with D = 0: the free sets with and without D fit equally well;
    like the direct method, the fit keeps the first (larger) one, and both give D ~ 0."""
    truth = ThroughputModel(A=3e-8, B=0.01, C=2e-4, D=0.0)
    samples = [(n, k, truth.iter_time(n, k)) for n, k in itertools.product(range(1, 120, 7), (0, 900, 30_000))]
    got = ThroughputModel.fit(samples)
    want = direct_fit(samples)
    assert [got.A, got.B, got.C, got.D] == pytest.approx(want.tolist(), rel=1e-7, abs=1e-12)
