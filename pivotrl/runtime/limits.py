"""Time limits of the calls into device actors (`cluster.limits`): no call of a real run waits forever.

Owns `Limits`: the limit of each kind of call, in seconds, from `LimitsConfig` and the size of each
model as the run holds it (GPS, or a frozen judge's host copy; a call that moves weights gets
`<kind>_floor_s + <kind>_s_per_gb x GB`), and the bounded wait on a Ray reference that raises
`TimeLimitExceeded` (naming the phase, the devices, the elapsed time and the key to raise) when the
limit passes. Kinds:

| kind    | calls                                                       | limit                                  |
|---------|-------------------------------------------------------------|----------------------------------------|
| `call`  | submit, abort, poll replies, info, rendezvous, drop_role    | `call_s`                               |
| `shift` | one device's shift down or up (cold starts included), start | `shift_floor_s + shift_s_per_gb x GB`  |
| `load`  | a weight load into a serving engine, a publish into GPS     | `load_floor_s + load_s_per_gb x GB`    |
| `train` | a training step, a checkpoint's staging and its wait        | `train_floor_s + train_s_per_gb x GB`  |

What a limit hit becomes is the caller's (`executor.py`): an inference device is replaced (the
existing respawn path: its sequences go back to the queue with their reported tokens); a training
call stops the run with this error. The device call bounds every engine RPC inside it (sleep,
wake, `collective_rpc`, a load): an RPC that hangs holds its device call, and the call's limit
ends it by replacing the actor, whose processes go with it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from pivotrl.config.cluster import LimitsConfig
from pivotrl.runtime.outcomes import TimeLimitExceeded

if TYPE_CHECKING:
    from pivotrl.runtime.params import ParamSource

KINDS = ("call", "shift", "load", "train")
#: Training calls (`Executor.train_call`) -> the kind of their limit.
TRAIN_CALL_LIMITS = {"train_step": "train", "save_checkpoint": "train", "wait_checkpoint": "train",
                     "load_checkpoint": "train", "publish": "load", "trainer_state": "call"}


@dataclass(frozen=True)
class Limit:
    """One call's limit and how to raise it."""

    seconds: float
    key: str
    """The config key(s) it comes from, as the error names them."""


class Limits:
    """The limits of one run (module docstring)."""

    def __init__(self, cfg: LimitsConfig | None = None, model_gb: Mapping[str, float] | None = None) -> None:
        self.cfg = cfg if cfg is not None else LimitsConfig()
        self.model_gb = dict(model_gb or {})
        """GB of weights per model (`policy`, `genrm`)."""

    @classmethod
    def of_params(cls, cfg: LimitsConfig, params: ParamSource, models: Iterable[str]) -> "Limits":
        """Limits scaled by each of `models`' size as the run holds it (GPS, or a host copy)."""
        return cls(cfg, {m: params.model_bytes(m) / 1e9 for m in models})

    def of(self, kind: str, model: str | None = None) -> Limit:
        """The limit of a `kind` call (module docstring) on `model`'s weights."""
        if kind not in KINDS:
            raise ValueError(f"time limit kind {kind!r}: allowed {', '.join(KINDS)}")
        c = self.cfg
        if kind == "call":
            return Limit(float(c.call_s), "cluster.limits.call_s")
        floor, per_gb = getattr(c, f"{kind}_floor_s"), getattr(c, f"{kind}_s_per_gb")
        gb = self.model_gb.get(model or "", 0.0)
        return Limit(float(floor) + float(per_gb) * gb,
                     f"cluster.limits.{kind}_floor_s={floor:g} + cluster.limits.{kind}_s_per_gb={per_gb:g} x "
                     f"{gb:.3g} GB of {model or 'its model'}")

    def wait(self, ref: Any, limit: Limit, phase: str, devices: int | Iterable[int],
             started: float | None = None) -> Any:
        """`ray.get(ref)` within `limit` counted from `started` (time.monotonic(); now when None);
        `TimeLimitExceeded` past it."""
        import ray

        t0 = time.monotonic() if started is None else started
        try:
            return ray.get(ref, timeout=max(0.0, t0 + limit.seconds - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            raise TimeLimitExceeded(phase, devices, time.monotonic() - t0, limit.seconds, limit.key) from None

    def get(self, ref: Any, kind: str, phase: str, devices: int | Iterable[int], model: str | None = None) -> Any:
        """`wait` with the limit of a `kind` call on `model`."""
        return self.wait(ref, self.of(kind, model), phase, devices)
