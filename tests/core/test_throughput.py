"""ThroughputModel: scalar/vector agreement, robustness at N=0, MoE floor, and the relative-error fit."""
import math

import numpy as np
import pytest

from pivotrl.core.throughput import ThroughputModel

DENSE = ThroughputModel(A=3.2e-8, B=10.9e-3, C=0.139e-3, D=1.4e-3, P0=0.02, P1=1.2e-4, P2=2e-9)
MOE = ThroughputModel(A=5.5e-8, B=43.6e-3, C=0.094e-3, D=1.4e-3, moe_floor=0.0483, moe_k_over_e=8 / 128)


def test_iter_time_and_kink():
    # below the kink the weight floor B dominates, above it C*N
    assert DENSE.iter_time(10, 1000) == pytest.approx(3.2e-8 * 1000 + 10.9e-3 + 1.4e-3)
    assert DENSE.iter_time(200, 0) == pytest.approx(200 * 0.139e-3 + 1.4e-3)
    assert DENSE.throughput(64, 64_000) == pytest.approx(64 / DENSE.iter_time(64, 64_000))


def test_zero_and_degenerate_never_nan():
    assert DENSE.throughput(0, 0) == 0.0
    assert DENSE.throughput(0, 12345) == 0.0
    zero = ThroughputModel(0.0, 0.0, 0.0, 0.0)
    for n, k in [(0, 0), (1, 0), (100, 10**6)]:
        for v in (zero.throughput(n, k), zero.gain(n, k, 10), zero.iter_time(n, k)):
            assert math.isfinite(v)
    assert np.all(np.isfinite(zero.throughput_v(np.array([0, 1, 5]), np.array([0, 0, 9]))))


def test_gain_definition_and_vectorised_agreement():
    assert DENSE.gain(3, 3000, 500) == pytest.approx(DENSE.throughput(4, 3500) - DENSE.throughput(3, 3000))
    n = np.array([0, 1, 7, 64, 300])
    k = np.array([0, 10, 9000, 130000, 10**6])
    for m in (DENSE, MOE):
        assert np.allclose(m.throughput_v(n, k), [m.throughput(a, b) for a, b in zip(n, k)])
        assert np.allclose(m.iter_time_v(n, k), [m.iter_time(a, b) for a, b in zip(n, k)])


def test_moe_floor_grows_with_batch():
    # calibration.md: Qwen3-30B-A3B floor ~4.7 ms at N=1 rising to ~43.6 ms once all experts are hit
    assert MOE.floor(1) == pytest.approx(4.7e-3, rel=0.02)
    assert MOE.floor(128) == pytest.approx(43.6e-3, rel=0.01)
    assert all(MOE.floor(n) < MOE.floor(n + 1) for n in range(1, 100))


def test_prefill_and_decode_time():
    assert DENSE.prefill_time(0) == 0.0
    assert DENSE.prefill_time(1000) == pytest.approx(0.02 + 0.12 + 2e-3)
    # closed-form decode over iterations equals the step-by-step sum
    n, k, it = 5, 1000, 37
    step = sum(DENSE.iter_time(n, k + j * n) for j in range(it))
    assert DENSE.decode_time(n, k, it) == pytest.approx(step)


@pytest.mark.parametrize("truth", [DENSE, MOE])
def test_fit_recovers_constants(truth):
    rng = np.random.default_rng(0)
    ns = rng.integers(1, 512, 300)
    ks = rng.integers(0, 600_000, 300)
    samples = [(int(n), int(k), truth.iter_time(int(n), int(k))) for n, k in zip(ns, ks)]
    pre = [(L, truth.prefill_time(L)) for L in (64, 500, 2000, 8000, 17000)] if truth.P1 else []
    fit = ThroughputModel.fit(samples, pre, moe_floor=truth.moe_floor, moe_k_over_e=truth.moe_k_over_e)
    assert fit.relative_error(samples) < 1e-6
    assert fit.A == pytest.approx(truth.A, rel=1e-4)
    assert fit.B == pytest.approx(truth.B, rel=1e-4)
    assert fit.D == pytest.approx(truth.D, rel=1e-3, abs=1e-6)
    if truth is DENSE:
        assert fit.C == pytest.approx(truth.C, rel=1e-4)
        assert (fit.P0, fit.P1, fit.P2) == pytest.approx((truth.P0, truth.P1, truth.P2), rel=1e-4)


def test_fit_is_relative_error_and_nonnegative():
    # noisy samples: the fit stays non-negative and its relative error is near the noise level
    rng = np.random.default_rng(1)
    samples = [(int(n), int(k), DENSE.iter_time(int(n), int(k)) * (1 + 0.03 * rng.standard_normal()))
               for n, k in zip(rng.integers(1, 300, 400), rng.integers(0, 400_000, 400))]
    fit = ThroughputModel.fit(samples)
    assert min(fit.A, fit.B, fit.C, fit.D) >= 0
    assert fit.relative_error(samples) < 0.035


def test_bad_input_names_field():
    with pytest.raises(ValueError, match="ThroughputModel.A"):
        ThroughputModel(-1.0, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="moe_floor"):
        ThroughputModel(0.0, 1.0, 0.0, 0.0, moe_floor=1.5, moe_k_over_e=0.1)
    with pytest.raises(ValueError, match="decode sample"):
        ThroughputModel.fit([(0, 10, 1.0), (1, 10, 1.0)])
