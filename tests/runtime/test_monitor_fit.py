"""The monitor's online fit predicts what replicas deliver: per-sequence prefill shares, and a
scale set so the model's total time over the samples equals the measured total (heavy-tailed
timing noise would otherwise pull core's relative-error fit down to the typical iteration)."""
from __future__ import annotations

import random
from types import SimpleNamespace as NS

import pytest

from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import Role
from pivotrl.runtime.monitor import MIN_FIT_SAMPLES, Monitor, fit_delivered

TRUE = ThroughputModel(A=1e-6, B=0.0, C=1e-4, D=2e-3, P0=1e-3, P1=2e-5, P2=0.0)


def _noisy(seed=0, n=2000):
    """Iterations and per-sequence prefills of TRUE, each time multiplied by heavy-tailed noise
    (mostly ~1x, sometimes descheduled for 5-30x), as on shared cores."""
    rng = random.Random(seed)

    def noise():
        return rng.uniform(0.9, 1.1) * (rng.uniform(5, 30) if rng.random() < 0.05 else 1.0)

    iters = []
    for _ in range(n):
        N = rng.randint(1, 64)
        K = N * rng.randint(40, 120)
        iters.append((N, K, TRUE.iter_time(N, K) * noise()))
    pre = [(L, TRUE.prefill_time(L) * noise()) for L in (rng.randint(20, 200) for _ in range(n // 4))]
    return iters, pre


def test_fit_matches_the_measured_total_under_heavy_tailed_noise():
    iters, pre = _noisy()
    raw = ThroughputModel.fit(iters, pre)
    meas = sum(t for _, _, t in iters)
    assert sum(raw.iter_time(n, k) for n, k, _ in iters) < 0.8 * meas  # the relative-error optimum: low
    m = fit_delivered(iters, pre)
    assert sum(m.iter_time(n, k) for n, k, _ in iters) == pytest.approx(meas, rel=1e-9)
    assert sum(m.prefill_time(L) for L, _ in pre) == pytest.approx(sum(t for _, t in pre), rel=1e-9)
    # the shape is core's: one factor for the decode coefficients, one for the prefill ones
    assert m.C / raw.C == pytest.approx(m.D / raw.D) and m.P0 / raw.P0 == pytest.approx(m.P1 / raw.P1)


def test_fit_of_noise_free_samples_is_unchanged():
    iters = [(n, 50 * n, TRUE.iter_time(n, 50 * n)) for n in range(1, 40)]
    pre = [(L, TRUE.prefill_time(L)) for L in range(10, 300, 7)]
    m = fit_delivered(iters, pre)
    for n, k, t in iters:
        assert m.iter_time(n, k) == pytest.approx(t, rel=1e-3)


def test_batched_prefills_enter_the_fit_as_per_sequence_shares():
    mon = Monitor()
    iters = [NS(num_seqs=n, kv_tokens=60 * n, seconds=TRUE.iter_time(n, 60 * n)) for n in range(1, MIN_FIT_SAMPLES + 8)]
    # one batch of 4 sequences, 240 tokens, 40 ms: four samples of (60 tokens, 10 ms)
    mon.ingest(Role.ROLLOUT, 0, NS(iterations=iters, prefills=[NS(tokens=240, num_seqs=4, seconds=0.04)]), 0)
    assert mon.prefill_samples(Role.ROLLOUT) == [(60.0, 0.01)] * 4
    m = mon.fit(Role.ROLLOUT)
    assert m is not None and m.prefill_time(60) == pytest.approx(0.01, rel=1e-6)


def test_state_throughput_ages_out_of_the_window():
    """A role that stopped producing reads 0 tokens/s once a whole window passed (it kept its last
    value before: the window was aged only when new tokens arrived)."""
    from pivotrl.core.types import Role
    from pivotrl.runtime.monitor import Monitor

    m = Monitor(window_s=10.0)
    m.ingest(Role.ROLLOUT, 0, None, 500, now=100.0)
    m.ingest(Role.ROLLOUT, 0, None, 500, now=105.0)
    assert m.state(Role.ROLLOUT, now=106.0).throughput_tokens_per_s == 1000 / 6.0
    assert m.state(Role.ROLLOUT, now=112.0).throughput_tokens_per_s == 500 / 7.0  # the first fell out
    assert m.state(Role.ROLLOUT, now=200.0).throughput_tokens_per_s == 0.0
