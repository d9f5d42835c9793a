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
        its coefficient at 0 (e.g. samples all below the kink give C = 0)."""
        rows = [(float(n), float(k), float(t)) for n, k, t in samples]
        if len(rows) < 2:
            raise ValueError(f"ThroughputModel.fit needs >= 2 decode samples (N, K, tau), got {len(rows)}")
        for n, k, t in rows:
            if not (n >= 1 and k >= 0 and t > 0 and math.isfinite(t)):
                raise ValueError(f"ThroughputModel.fit: bad decode sample (N={n}, K={k}, tau={t}): need N>=1, K>=0, tau>0")
        arr = np.asarray(rows)
        n, k, tau = arr[:, 0], arr[:, 1], arr[:, 2]
        probe = ThroughputModel(0.0, 1.0, 0.0, 0.0, moe_floor=moe_floor, moe_k_over_e=moe_k_over_e)
        g = probe.floor_v(n)  # B(N)/B
        best: tuple[float, np.ndarray] | None = None
        for cut in [-math.inf, *sorted(set(n.tolist())), math.inf]:
            below = n < cut
            # columns: A*K, B*g(N) (below cut), C*N (at/above cut), D
            X = np.stack([k, np.where(below, g, 0.0), np.where(below, 0.0, n), np.ones_like(n)], axis=1)
            coef = _nnls_relative(X, tau)
            cand = ThroughputModel(*coef.tolist(), moe_floor=moe_floor, moe_k_over_e=moe_k_over_e)
            err = float(np.sum(((cand.iter_time_v(n, k) - tau) / tau) ** 2))
            if best is None or err < best[0] - 1e-15:
                best = (err, coef)
        assert best is not None
        A, B, C, D = best[1].tolist()
        P0 = P1 = P2 = 0.0
        pre = [(float(L), float(t)) for L, t in prefill]
        if pre:
            for L, t in pre:
                if not (L >= 0 and t > 0 and math.isfinite(t)):
                    raise ValueError(f"ThroughputModel.fit: bad prefill sample (L={L}, t={t}): need L>=0, t>0")
            p = np.asarray(pre)
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
