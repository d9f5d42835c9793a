"""Per-replica decode throughput model (DESIGN §4.1, paper §6.1 and App. A).

Owns: the analytic iteration-time model `tau = A*K + max(B(N), C*N) + D`, the prefill model
`P0 + P1*L + P2*L^2`, and their relative-error least-squares fits. Knows nothing about replicas,
queues or runtimes: the scheduler and planner call it, the simulator uses it as its decode clock.

Units: seconds and tokens. `N` is the number of running sequences on a replica, `K` the tokens
they hold in KV cache; one decode iteration emits `N` tokens, so `T = N / tau` tokens/s.

MoE weight floor (calibration.md §3): a dense model streams all its weights every iteration, so the
floor `B` is constant. A MoE model streams its dense part plus only the experts the batch touches:
with top-k routing over E experts, a batch of N tokens touches a fraction `1 - (1 - k/E)^N` of each
layer's experts. We write this as

    B(N) = B * (f + (1 - f) * (1 - (1 - k/E)^N))

where `B` is the floor with every expert touched (all weights) and `f = moe_floor` is the dense
share of the weight bytes (`W_dense / W_total`). `moe_floor=None` means a dense model: `B(N) = B`.

Robustness: `throughput(0, k) == 0.0`, and a non-positive iteration time (a degenerate fit) is
clamped to a tiny positive value, so nothing downstream ever sees NaN or inf.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

_TAU_MIN = 1e-9  # seconds: clamp for degenerate models, keeps T finite
# Normal equations square the condition number: past this (1e4 on the rows, ~8 of 16 digits kept)
# a breakpoint's system is solved from its rows instead (`_fit_decode`).
_GRAM_COND_MAX = 1e8
_TIE = 1e-10  # per sample: squared relative errors closer than this are a tie between free sets


@dataclass(frozen=True)
class ThroughputModel:
    """`tau(N, K) = A*K + max(B(N), C*N) + D` seconds per decode iteration; prefill of L tokens
    costs `P0 + P1*L + P2*L^2` seconds. See the module docstring for the MoE floor `B(N)`."""

    A: float
    B: float
    C: float
    D: float
    P0: float = 0.0
    P1: float = 0.0
    P2: float = 0.0
    moe_floor: float | None = None
    moe_k_over_e: float = 0.0

    def __post_init__(self) -> None:
        for name in ("A", "B", "C", "D", "P0", "P1", "P2", "moe_k_over_e"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"ThroughputModel.{name} must be a finite number >= 0, got {v!r}")
        if self.moe_floor is not None and not 0.0 <= self.moe_floor <= 1.0:
            raise ValueError(f"ThroughputModel.moe_floor must be in [0, 1] or None, got {self.moe_floor!r}")
        if self.moe_floor is not None and not 0.0 < self.moe_k_over_e <= 1.0:
            raise ValueError(
                f"ThroughputModel.moe_k_over_e must be in (0, 1] for a MoE model, got {self.moe_k_over_e!r}")

    # ------------------------------------------------------------------ scalar model
    def floor(self, n: int) -> float:
        """B(N): the weight-streaming floor of one iteration with N sequences."""
        if self.moe_floor is None:
            return self.B
        touched = 1.0 - (1.0 - self.moe_k_over_e) ** max(n, 0)
        return self.B * (self.moe_floor + (1.0 - self.moe_floor) * touched)

    def iter_time(self, n: int, k: int) -> float:
        """Seconds for one decode iteration of N sequences holding K tokens (always > 0)."""
        tau = self.A * k + max(self.floor(n), self.C * n) + self.D
        return tau if tau > _TAU_MIN else _TAU_MIN

    def throughput(self, n: int, k: int) -> float:
        """Tokens/s of a replica with N running sequences and K cached tokens; 0.0 when N == 0."""
        if n <= 0:
            return 0.0
        return n / self.iter_time(n, k)

    def gain(self, n: int, k: int, length: int) -> float:
        """dT of adding one sequence of `length` cached tokens to a replica at (N, K)."""
        return self.throughput(n + 1, k + length) - self.throughput(n, k)

    def prefill_time(self, tokens: float) -> float:
        """Seconds to prefill `tokens` tokens (a new prompt, or a re-prefill after migration; a
        fractional count is a per-sequence share of a batched prefill)."""
        if tokens <= 0:
            return 0.0
        return self.P0 + self.P1 * tokens + self.P2 * tokens * tokens

    def decode_time(self, n: int, k: int, iterations: int) -> float:
        """Seconds for `iterations` decode steps with N fixed: K grows by N per step, so the sum is
        closed-form (the simulator's analytic advance). Exact for dense models and for MoE, since
        B(N) does not change while N is fixed."""
        if iterations <= 0 or n <= 0:
            return 0.0
        it = iterations
        base = max(self.floor(n), self.C * n) + self.D
        # sum_{j=0}^{it-1} A*(k + j*n) = A*(it*k + n*it*(it-1)/2)
        return max(it * base + self.A * (it * k + n * it * (it - 1) / 2.0), it * _TAU_MIN)

    # ------------------------------------------------------------------ vectorised model
    def floor_v(self, n: np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=np.float64)
        if self.moe_floor is None:
            return np.full_like(n, self.B)
        touched = 1.0 - (1.0 - self.moe_k_over_e) ** np.maximum(n, 0.0)
        return self.B * (self.moe_floor + (1.0 - self.moe_floor) * touched)

    def iter_time_v(self, n: np.ndarray, k: np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=np.float64)
        tau = self.A * np.asarray(k, dtype=np.float64) + np.maximum(self.floor_v(n), self.C * n) + self.D
        return np.maximum(tau, _TAU_MIN)

    def throughput_v(self, n: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Vectorised `throughput` over arrays of N and K (0 where N <= 0)."""
        n = np.asarray(n, dtype=np.float64)
        return np.where(n > 0, n / self.iter_time_v(n, k), 0.0)

    def prefill_time_v(self, tokens: np.ndarray) -> np.ndarray:
        """Vectorised `prefill_time` (0 where `tokens` <= 0)."""
        L = np.asarray(tokens, dtype=np.float64)
        return np.where(L > 0, self.P0 + self.P1 * L + self.P2 * L * L, 0.0)

    # ------------------------------------------------------------------ fitting
    @staticmethod
    def fit(samples: Iterable[tuple[int, int, float]], prefill: Iterable[tuple[int, float]] = (),
            moe_floor: float | None = None, moe_k_over_e: float = 0.0) -> "ThroughputModel":
        """Relative-error least squares: minimise sum(((tau_pred - tau)/tau)^2) over (N, K, tau)
        decode samples, and likewise over (L, t) prefill samples.

        The `max(B(N), C*N)` kink makes the decode model piecewise linear. As DistServe does (one
        fit below and one above a batch-size breakpoint), we try every breakpoint between distinct
        sample N values: below it the floor term is `B*g(N)` (g = 1 for dense, the touched-expert
        fraction for MoE), at or above it `C*N`. Each breakpoint is an ordinary weighted linear
        least-squares problem in (A, B, C, D) with weights 1/tau. Coefficients are kept >= 0 by
        re-solving with the offending ones pinned at 0 (a tiny active-set NNLS over <= 4 unknowns).
        The winner is the breakpoint whose fit has the smallest relative error *under the true
        max() model*, so the reported model is self-consistent. A regime with no samples leaves
        its coefficient at 0 (e.g. samples all below the kink give C = 0). How this stays cheap
        with thousands of samples and dozens of breakpoints: `_fit_decode`."""
        arr = np.asarray([(n, k, t) for n, k, t in samples], dtype=np.float64).reshape(-1, 3)
        if len(arr) < 2:
            raise ValueError(f"ThroughputModel.fit needs >= 2 decode samples (N, K, tau), got {len(arr)}")
        n, k, tau = arr[:, 0], arr[:, 1], arr[:, 2]
        bad = ~((n >= 1) & (k >= 0) & (tau > 0) & np.isfinite(tau))
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"ThroughputModel.fit: bad decode sample (N={n[i]}, K={k[i]}, tau={tau[i]}): "
                             "need N>=1, K>=0, tau>0")
        probe = ThroughputModel(0.0, 1.0, 0.0, 0.0, moe_floor=moe_floor, moe_k_over_e=moe_k_over_e)
        A, B, C, D = _fit_decode(n, k, tau, probe.floor_v(n)).tolist()  # floor_v with B=1: g(N) = B(N)/B
        P0 = P1 = P2 = 0.0
        p = np.asarray([(L, t) for L, t in prefill], dtype=np.float64).reshape(-1, 2)
        if len(p):
            bad = ~((p[:, 0] >= 0) & (p[:, 1] > 0) & np.isfinite(p[:, 1]))
            if bad.any():
                L, t = p[int(np.argmax(bad))]
                raise ValueError(f"ThroughputModel.fit: bad prefill sample (L={L}, t={t}): need L>=0, t>0")
            X = np.stack([np.ones(len(p)), p[:, 0], p[:, 0] ** 2], axis=1)
            P0, P1, P2 = _nnls_relative(X, p[:, 1]).tolist()
        return ThroughputModel(A, B, C, D, P0, P1, P2, moe_floor=moe_floor, moe_k_over_e=moe_k_over_e)

    def relative_error(self, samples: Iterable[tuple[int, int, float]]) -> float:
        """Root-mean-square relative error of the decode model on (N, K, tau) samples."""
        arr = np.asarray([(n, k, t) for n, k, t in samples], dtype=np.float64)
        if arr.size == 0:
            return 0.0
        pred = self.iter_time_v(arr[:, 0], arr[:, 1])
        return float(np.sqrt(np.mean(((pred - arr[:, 2]) / arr[:, 2]) ** 2)))


def _nnls_relative(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Minimise sum(((X@c - y)/y)^2) subject to c >= 0 by solving every free set of columns
    (<= 2^4 tiny solves) and keeping the best feasible one; the constrained optimum is the
    unconstrained optimum of some free set. Columns that are all zero stay at 0."""
    W = X / y[:, None]
    ones = np.ones_like(y)
    m = X.shape[1]
    live = [j for j in range(m) if np.any(X[:, j] != 0)]
    best_err, best = math.inf, np.zeros(m)
    for size in range(len(live), 0, -1):
        for free in itertools.combinations(live, size):
            sol, *_ = np.linalg.lstsq(W[:, free], ones, rcond=None)
            if np.all(sol >= -1e-12):
                c = np.zeros(m)
                c[list(free)] = np.maximum(sol, 0.0)
                err = float(np.sum((W @ c - ones) ** 2))
                if err < best_err:
                    best_err, best = err, c
    return best


def _fit_decode(n: np.ndarray, k: np.ndarray, tau: np.ndarray, g: np.ndarray) -> np.ndarray:
    """(A, B, C, D) of `fit`'s decode model: every breakpoint, every free set, the same choices as
    running `_nnls_relative` on each breakpoint's design matrix, from its normal equations.

    Why it is cheap: the breakpoint's rows only switch the floor column from `g/tau` (below) to
    `N/tau` (at or above), so with the samples sorted by N the Gram matrix `W'W` and `W'1` of a
    breakpoint are a prefix sum over the "below" rows plus a suffix sum over the others. All
    breakpoints' 4x4 systems then come from two cumulative sums, and each free set is one batched
    solve over the breakpoints (instead of ~1,000 least-squares solves over all samples per fit).
    The columns are scaled to unit norm before solving (the normal equations square the condition
    number; K/tau and 1/tau differ by ~1e5). The squared error of a free set's (clipped) solution
    is `m - 2c'W'1 + c'W'Wc`. A (nearly) singular system (say, one K in every sample) falls back
    to least squares on that breakpoint's rows, as `_nnls_relative` solves it."""
    order = np.argsort(n, kind="stable")
    n, k, tau, g = n[order], k[order], tau[order], g[order]
    m = len(n)
    inv = 1.0 / tau
    zero = np.zeros(m)
    below_rows = np.stack([k * inv, g * inv, zero, inv], axis=1)
    above_rows = np.stack([k * inv, zero, n * inv, inv], axis=1)
    # pre[p] = sum of the first p "below" rows' outer products; suf[p] = of the "above" rows from p on
    pre_G = np.zeros((m + 1, 4, 4))
    np.cumsum(below_rows[:, :, None] * below_rows[:, None, :], axis=0, out=pre_G[1:])
    suf_G = np.zeros((m + 1, 4, 4))
    np.cumsum((above_rows[:, :, None] * above_rows[:, None, :])[::-1], axis=0, out=suf_G[-2::-1])
    pre_r = np.concatenate([np.zeros((1, 4)), np.cumsum(below_rows, axis=0)])
    suf_r = np.zeros((m + 1, 4))
    np.cumsum(above_rows[::-1], axis=0, out=suf_r[-2::-1])
    cuts = np.array([-math.inf, *np.unique(n), math.inf])
    p = np.searchsorted(n, cuts, side="left")  # rows below each breakpoint
    G, r = pre_G[p] + suf_G[p], pre_r[p] + suf_r[p]
    g_rows = np.concatenate([[0], np.cumsum(g != 0)])  # nonzero floor entries among the first q rows
    # a column that is all zero in a breakpoint's matrix stays at 0 (as in `_nnls_relative`)
    live = np.stack([np.full(len(p), bool(np.any(k != 0))), g_rows[p] > 0, p < m, np.full(len(p), True)], axis=1)
    sets = [list(f) for size in range(4, 0, -1) for f in itertools.combinations(range(4), size)]
    lin_err = np.full((len(sets), len(p)), math.inf)  # per free set and breakpoint; inf: infeasible
    coef = np.zeros((len(sets), len(p), 4))
    for si, cols in enumerate(sets):
        at = np.flatnonzero(live[:, cols].all(axis=1))
        if not len(at):
            continue
        Gf, rf = G[at][:, cols][:, :, cols], r[at][:, cols]
        sol = _solve_free(Gf, rf)
        for j in np.flatnonzero(np.isnan(sol).any(axis=1)):  # ill-conditioned: the rows' own least squares
            W = np.where((n < cuts[at[j]])[:, None], below_rows, above_rows)[:, cols]
            sol[j] = np.linalg.lstsq(W, np.ones(m), rcond=None)[0]
        c = np.maximum(sol, 0.0)
        ok = np.all(sol >= -1e-12, axis=1)
        lin_err[si, at[ok]] = (m - 2.0 * np.sum(c * rf, axis=1) + np.einsum("ij,ijk,ik->i", c, Gf, c))[ok]
        coef[si, at[ok][:, None], cols] = c[ok]
    # per breakpoint: the first free set (larger first) with the least error, as the direct solves
    # pick; free sets within the formula's rounding of it are a tie (a column the others span, as
    # the dense floor and the constant at the last breakpoints): among them the best under max()
    tied = lin_err <= lin_err.min(axis=0) + _TIE * m
    pick = coef[np.argmax(tied, axis=0), np.arange(len(p))]
    for i in np.flatnonzero(tied.sum(axis=0) > 1):
        errs = _max_model_errors(coef[tied[:, i], i], n, k, tau, g)
        pick[i] = coef[tied[:, i], i][int(np.argmin(errs))]
    # the winner: the smallest relative error under the true max() model (first on ties, as `fit`)
    win, win_err = 0, math.inf
    for i, e in enumerate(_max_model_errors(pick, n, k, tau, g).tolist()):
        if e < win_err - 1e-15:
            win, win_err = i, e
    return pick[win]


def _max_model_errors(coefs: np.ndarray, n: np.ndarray, k: np.ndarray, tau: np.ndarray,
                      g: np.ndarray) -> np.ndarray:
    """Squared relative error over the samples of each row (A, B, C, D) of `coefs` under the true
    model `max(A*K + max(B*g(N), C*N) + D, tau_min)`."""
    A, B, C, D = (coefs[:, j:j + 1] for j in range(4))
    pred = np.maximum(A * k + np.maximum(B * g, C * n) + D, _TAU_MIN)
    return np.sum(((pred - tau) / tau) ** 2, axis=1)


def _solve_free(G: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Solve each of the stacked normal-equation systems `G[i] c = r[i]`, columns scaled to unit
    norm; a row of NaN where a system is too ill-conditioned for the normal equations (condition
    number of the scaled system over `_GRAM_COND_MAX`, i.e. of the rows over its square root): the
    caller solves those from the rows themselves."""
    d = np.sqrt(np.einsum("ijj->ij", G))
    d[d == 0] = 1.0
    Gs = G / d[:, :, None] / d[:, None, :]
    rs = r / d
    out = np.full(r.shape, np.nan)
    with np.errstate(all="ignore"):
        ok = np.linalg.cond(Gs) <= _GRAM_COND_MAX
    if ok.any():
        out[ok] = np.linalg.solve(Gs[ok], rs[ok][:, :, None])[:, :, 0] / d[ok]
    return out
