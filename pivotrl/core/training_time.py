"""Seconds of one training step on W devices (DESIGN §4.6): the model elastic training is priced with.

Owns `TrainTimeModel`, the step-time formula the planner evaluates for every world size it may
give the trainer, and `TrainTimeFit`, which fits it online from the steps a run measures (as the
monitor fits the decode model). Pure: standard library and numpy.

The formula, for `tokens` policy tokens (prompt + response) on `W` devices:

    t(W, tokens) = fixed_s + token_s * tokens / W + (comm_s + spans(W) * cross_node_s) * (W - 1) / W

- `fixed_s`: what does not shrink with W (the optimizer's own work, launches, the step's
  bookkeeping): the scaling loss that makes a bigger trainer worth less than linear;
- `token_s`: device-seconds per token (forward, backward, log-probs);
- `comm_s`: FSDP collectives within a node at W -> infinity (a ring moves `(W-1)/W` of the bytes);
- `cross_node_s`: the same collectives' extra time once the trainer spans nodes (`spans(W)` is 1
  when `W > node_size`: the ring's slowest links are then the inter-node ones), which one node's
  measurements cannot show, so the fit keeps the prior's value (the simulator's model says it
  from the declared link bandwidth).

`TrainTimeFit` keeps the last `window` measured steps and fits `fixed_s`, `token_s` and `comm_s`
by relative-error least squares with every coefficient >= 0 (each subset of the three is tried;
the best non-negative one wins). One world size alone says nothing about scaling: then the prior's
shape is scaled through the measurements, or without a prior the step is taken as pure per-token
work (perfect scaling: the optimistic guess that lets the planner try a bigger trainer once and
learn from it; a window that has forgotten every other size guesses again). No step measured
yet and no prior: no model (the planner then keeps the home set).
"""
from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class TrainTimeModel:
    """`t(W, tokens)` seconds of one training step (module docstring)."""

    fixed_s: float = 0.0
    token_s: float = 0.0
    """Device-seconds per policy token."""
    comm_s: float = 0.0
    cross_node_s: float = 0.0
    node_size: int = 0
    """Devices per node (0: a single node, `cross_node_s` never applies)."""

    def __post_init__(self) -> None:
        for name in ("fixed_s", "token_s", "comm_s", "cross_node_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"TrainTimeModel.{name} must be a finite number >= 0, got {v!r}")
        if not (isinstance(self.node_size, int) and self.node_size >= 0):
            raise ValueError(f"TrainTimeModel.node_size must be an int >= 0, got {self.node_size!r}")

    def spans_nodes(self, world: int) -> bool:
        return 0 < self.node_size < world

    def seconds(self, world: int, tokens: float) -> float:
        """Seconds of a step over `tokens` policy tokens on `world` devices."""
        if world < 1:
            raise ValueError(f"a trainer needs >= 1 device, got world={world}")
        comm = self.comm_s + (self.cross_node_s if self.spans_nodes(world) else 0.0)
        return self.fixed_s + self.token_s * max(tokens, 0.0) / world + comm * (world - 1) / world

    def as_record(self) -> dict[str, float]:
        return {"fixed_s": self.fixed_s, "token_s": self.token_s, "comm_s": self.comm_s,
                "cross_node_s": self.cross_node_s, "node_size": float(self.node_size)}


@dataclass(frozen=True)
class TrainStepSample:
    """One measured step: its world size, policy tokens and seconds."""

    world: int
    tokens: float
    seconds: float


class TrainTimeFit:
    """The online fit of `TrainTimeModel` (module docstring). `fixed=True` keeps the prior as is
    (the simulator's model is the truth of its own clock, as its decode models are)."""

    def __init__(self, prior: TrainTimeModel | None = None, node_size: int = 0, window: int = 16,
                 fixed: bool = False) -> None:
        if window < 1:
            raise ValueError(f"TrainTimeFit.window must be >= 1, got {window}")
        self.prior = prior
        self.node_size = prior.node_size if prior is not None else int(node_size)
        self.fixed = bool(fixed and prior is not None)
        self.samples: deque[TrainStepSample] = deque(maxlen=window)
        self._model = prior

    def observe(self, world: int, tokens: float, seconds: float) -> None:
        """Add one measured step and refit (a non-positive or non-finite measurement is skipped)."""
        if world < 1 or not (math.isfinite(seconds) and seconds > 0) or not math.isfinite(tokens):
            return
        self.samples.append(TrainStepSample(int(world), float(tokens), float(seconds)))
        if not self.fixed:
            self._model = self._fit()

    def model(self) -> TrainTimeModel | None:
        return self._model

    def worlds(self) -> list[int]:
        """The distinct world sizes measured so far."""
        return sorted({s.world for s in self.samples})

    def _fit(self) -> TrainTimeModel:
        base = self.prior or TrainTimeModel(node_size=self.node_size)
        rows = list(self.samples)
        if len({s.world for s in rows}) == 1:
            # one world size tells nothing about scaling: keep the prior's shape scaled through the
            # measurements, or (no prior) pure per-token work, the optimistic guess a try corrects
            if self.prior is not None:
                ks = [s.seconds / p for s in rows if (p := self.prior.seconds(s.world, s.tokens)) > 0]
                k = sum(ks) / len(ks) if ks else 1.0
                return replace(base, fixed_s=base.fixed_s * k, token_s=base.token_s * k, comm_s=base.comm_s * k)
            per = [s.seconds * s.world / max(s.tokens, 1.0) for s in rows]
            return replace(base, fixed_s=0.0, token_s=sum(per) / len(per), comm_s=0.0)
        t = np.array([s.seconds for s in rows])
        cross = np.array([base.cross_node_s * (s.world - 1) / s.world * base.spans_nodes(s.world) for s in rows])
        cols = {"fixed_s": np.ones(len(rows)),
                "token_s": np.array([s.tokens / s.world for s in rows]),
                "comm_s": np.array([(s.world - 1) / s.world for s in rows])}
        free = ("fixed_s", "token_s", "comm_s")
        target = t - cross
        best: tuple[float, dict[str, float]] | None = None
        for r in range(1, len(free) + 1):
            for subset in itertools.combinations(free, r):
                # relative error: each row divided by its measured seconds
                X = np.stack([cols[k] / t for k in subset], axis=1)
                coef, *_ = np.linalg.lstsq(X, target / t, rcond=None)
                if (coef < 0).any() or not np.isfinite(coef).all():
                    continue
                res = float(np.sum((X @ coef - target / t) ** 2))
                if best is None or res < best[0] - 1e-15:
                    best = (res, dict(zip(subset, coef.tolist())))
        fitted = {k: 0.0 for k in free}
        if best is not None:
            fitted.update(best[1])
        return replace(base, **fitted)


__all__ = ["TrainStepSample", "TrainTimeFit", "TrainTimeModel"]
