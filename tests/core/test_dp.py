"""Algorithm 1 (`dp_candidates`) against brute-force enumeration, plus table tests of its rules."""
import itertools
import math
import random

import pytest

from pivotrl.core.planner import dp_candidates


def brute_force(pairs, K):
    """Min penalty for exactly k slots, over every choice of e_i in 0..r_i."""
    best = {}
    for es in itertools.product(*[range(r + 1) for r, _ in pairs]):
        k = sum(es)
        if 1 <= k <= K:
            pen = sum(phi for (r, phi), e in zip(pairs, es) if e > 0)
            best[k] = min(best.get(k, math.inf), pen)
    return best


@pytest.mark.parametrize("seed", range(60))
def test_dp_matches_brute_force(seed):
    rng = random.Random(seed)
    pairs = [(rng.randint(1, 4), rng.choice([0.0, float(rng.randint(0, 20)), rng.random() * 10]))
             for _ in range(rng.randint(0, 6))]
    pairs.sort(key=lambda p: p[1])
    total = sum(r for r, _ in pairs)
    K = rng.randint(0, total) if rng.random() < 0.3 else total
    out = dp_candidates(pairs, K)
    ref = brute_force(pairs, K)
    assert {k: d for k, d, _ in out} == pytest.approx(ref)
    for k, d, choice in out:
        # the recorded choice is valid: first-e prefixes, each pair once, counts and penalty add up
        idx = [i for i, _ in choice]
        assert idx == sorted(set(idx))
        assert all(1 <= e <= pairs[i][0] for i, e in choice)
        assert sum(e for _, e in choice) == k
        assert sum(pairs[i][1] for i, _ in choice) == pytest.approx(d)


def test_dp_table():
    # Fig. 8 shape: one free/idle-training pair of 2 (phi 0), two pairs of 1 (phi 706, 1843)
    out = dp_candidates([(2, 0.0), (1, 706.0), (1, 1843.0)], 4)
    assert [(k, d) for k, d, _ in out] == [(1, 0.0), (2, 0.0), (3, 706.0), (4, 2549.0)]
    assert out[2][2] == ((0, 2), (1, 1))


def test_dp_tie_keeps_later_candidate():
    # two equal-penalty pairs of one slot: k=1 can come from either; App. D.2 keeps the later one
    out = dp_candidates([(1, 5.0), (1, 5.0)], 2)
    assert out[0] == (1, 5.0, ((1, 1),))
    assert out[1] == (2, 10.0, ((0, 1), (1, 1)))


def test_dp_edge_cases():
    assert dp_candidates([], 0) == []
    assert dp_candidates([(3, 1.0)], 0) == []
    assert dp_candidates([(3, 1.0)], 2) == [(1, 1.0, ((0, 1),)), (2, 1.0, ((0, 2),))]
    with pytest.raises(ValueError, match="K"):
        dp_candidates([], -1)


def paper_loop(pairs, K):
    """Algorithm 1 written as the paper's loops (tables copied per pair, `d <= D_hat` keeps later)."""
    D = [0.0] + [math.inf] * K
    C = [()] + [()] * K
    for i, (r, phi) in enumerate(pairs):
        Dh, Ch = D[:], C[:]
        for j in range(K + 1):
            if D[j] == math.inf:
                continue
            for e in range(1, min(r, K - j) + 1):
                d = D[j] + phi
                if d <= Dh[j + e]:
                    Dh[j + e] = d
                    Ch[j + e] = C[j] + ((i, e),)
        D, C = Dh, Ch
    return [(k, D[k], C[k]) for k in range(1, K + 1) if D[k] < math.inf]


@pytest.mark.parametrize("seed", range(80))
def test_dp_equals_paper_loop_including_ties(seed):
    rng = random.Random(1000 + seed)
    # small integer penalties make ties common
    pairs = sorted(((rng.randint(1, 5), float(rng.randint(0, 3))) for _ in range(rng.randint(0, 8))),
                   key=lambda p: p[1])
    K = sum(r for r, _ in pairs)
    if rng.random() < 0.3 and K:
        K = rng.randint(0, K)
    assert dp_candidates(pairs, K) == paper_loop(pairs, K)
