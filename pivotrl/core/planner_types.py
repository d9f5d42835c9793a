"""The planner's inputs and outputs (DESIGN §4.3), plain values shared by the planner and the
elastic training candidates: `TrainView`, `ClusterView` (a snapshot the controller builds),
`ElasticView` (pivotrl/core/elastic.py prices it), `Candidate` and `Decision` (JSON-able for
timeline.jsonl), and `device_units` (which unit holds each device). Pure: standard library and the
control plane's types.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from pivotrl.core.scheduler import ShiftAwareScheduler
from pivotrl.core.training_time import TrainTimeModel
from pivotrl.core.types import INFERENCE_ROLES, Role, ShiftPlan, Slot


@dataclass(frozen=True)
class ElasticView:
    """What the planner needs to price a trainer of more devices than its home set."""

    sizes: tuple[int, ...]
    """World sizes training may take, ascending; the first is the home set's."""
    tokens: float
    """Policy tokens (prompt + response) of the ready batch."""
    model: TrainTimeModel | None
    """Seconds of a step on W devices (None: not known yet, train on the home set)."""
    reshard_s: float = 0.0
    """Seconds to move the trainer's state from the home layout to another and back, measured."""
    backlog: Mapping[Role, float] = field(default_factory=dict)
    """Tokens of inference work already released per role (running, queued, and for reward the
    judgements of responses not finished yet), estimated from the finished sequences' lengths."""
    tail_s: Mapping[Role, float] = field(default_factory=dict)
    """Per role, the seconds its longest sequence in flight still needs at one sequence's decode
    speed: no number of replicas drains the role's work sooner (one replica left is enough)."""
    drain_scale: float = 1.0
    """Measured over predicted drain of the released work so far (the controller's online check,
    pivotrl/deploy/elastic.py): every drain the planner predicts is scaled by it."""
    replica_throughput: Mapping[Role, float] = field(default_factory=dict)
    """Per role, the modelled tokens/s of one of its replicas now (its mean; 0 without replicas)."""
    rate: float = 0.0
    """The run's tokens per second (converts `benefit_s` into the record's tokens; 0: unknown)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "backlog", MappingProxyType(dict(self.backlog)))
        object.__setattr__(self, "tail_s", MappingProxyType(dict(self.tail_s)))
        object.__setattr__(self, "replica_throughput", MappingProxyType(dict(self.replica_throughput)))
        if not self.sizes or list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] < 1:
            raise ValueError(f"ElasticView.sizes must be ascending distinct world sizes >= 1, got {self.sizes}")


@dataclass(frozen=True)
class TrainView:
    """The training unit as the planner sees it: its home set and state."""

    home: tuple[int, ...]
    holds_devices: bool
    running: bool
    batch_ready: bool
    devices: tuple[int, ...] = ()
    """The devices the training unit holds now when that is not its home set (a grown trainer)."""
    elastic: ElasticView | None = None
    """Elastic training (`deploy.planner.elastic_training`): the sizes it may take and their
    prices (pivotrl/core/elastic.py); None: training stays on its home set."""

    @property
    def slot(self) -> Slot:
        devs = self.devices or self.home
        return Slot(Role.TRAIN, devs[0], len(devs))


@dataclass(frozen=True)
class ClusterView:
    """A snapshot the controller builds on every tick / batch-ready / training-done: a value.

    Fields cannot be reassigned and its containers are copied into read-only ones (tuples,
    `MappingProxyType`), so a strategy can neither change the controller's state through the view
    nor see it change under it. The schedulers are the controller's own objects, read only: a
    strategy that needs to try a migration clones them (`ShiftAwareScheduler.clone`, or the
    closed-form `summary` evaluation)."""

    now: float
    num_devices: int
    node_size: int
    tp: Mapping[Role, int]
    owner: tuple[Role | None, ...]
    active: Mapping[Role, tuple[Slot, ...]]
    schedulers: Mapping[Role, ShiftAwareScheduler]
    train: TrainView
    tau_shift: Mapping[Role, float]
    pending: frozenset[int] = frozenset()
    kv_capacity: Mapping[Role, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        freeze = object.__setattr__
        freeze(self, "tp", MappingProxyType(dict(self.tp)))
        freeze(self, "owner", tuple(self.owner))
        freeze(self, "active", MappingProxyType({r: tuple(v) for r, v in self.active.items()}))
        freeze(self, "schedulers", MappingProxyType(dict(self.schedulers)))
        freeze(self, "tau_shift", MappingProxyType(dict(self.tau_shift)))
        freeze(self, "pending", frozenset(self.pending))
        freeze(self, "kv_capacity", MappingProxyType(dict(self.kv_capacity)))

    def validate(self) -> None:
        if self.num_devices <= 0:
            raise ValueError(f"ClusterView.num_devices must be > 0, got {self.num_devices}")
        if len(self.owner) != self.num_devices:
            raise ValueError(f"ClusterView.owner has {len(self.owner)} entries, num_devices is {self.num_devices}")
        for r in INFERENCE_ROLES:
            tp = self.tp.get(r)
            if not tp or tp & (tp - 1) or self.node_size % tp:
                raise ValueError(f"ClusterView.tp[{r.value}] must be a power of two dividing node_size "
                                 f"{self.node_size}, got {tp}")


@dataclass
class Candidate:
    plan: ShiftPlan
    throughput: float
    benefit: float
    k: int = 0
    role_throughput: dict[str, float] = field(default_factory=dict)
    detail: dict[str, float] = field(default_factory=dict)
    """What else priced it (an elastic training candidate: world size, step, drain and reshard
    seconds, tokens lost on the borrowed devices, benefit in seconds)."""


@dataclass
class Decision:
    now: float
    role_up: Role | None
    t_now: float
    candidates: list[Candidate]
    chosen: ShiftPlan | None
    reason: str
    timings: dict[str, float] = field(default_factory=dict)
    extra: list[ShiftPlan] = field(default_factory=list)

    @property
    def plans(self) -> list[ShiftPlan]:
        """Every plan to execute, in order (`chosen` first)."""
        return ([self.chosen] if self.chosen is not None else []) + list(self.extra)

    def to_record(self) -> dict[str, Any]:
        def plan_rec(p: ShiftPlan) -> dict[str, Any]:
            return {"role_up": p.role_up.value, "up": [s.slot_id for s in p.up],
                    "down": [s.slot_id for s in p.down], "penalty": _num(p.penalty)}

        return {
            "now": self.now, "role_up": self.role_up.value if self.role_up else None,
            "t_now": _num(self.t_now), "reason": self.reason,
            "chosen": plan_rec(self.chosen) if self.chosen is not None else None,
            "extra": [plan_rec(p) for p in self.extra],
            "candidates": [{**plan_rec(c.plan), "k": c.k, "throughput": _num(c.throughput),
                            "benefit": _num(c.benefit),
                            "role_throughput": {k: _num(v) for k, v in c.role_throughput.items()},
                            **({"training": {k: _num(v) for k, v in c.detail.items()}} if c.detail else {})}
                           for c in self.candidates],
            "timings_s": dict(self.timings),
        }


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf" if x < 0 else "nan")


def device_units(view: ClusterView) -> list[Slot | None]:
    """Per device: the unit (active replica slot or training unit) holding it, None when free."""
    units: list[Slot | None] = [None] * view.num_devices
    for r in INFERENCE_ROLES:
        for s in view.active.get(r, []):
            for d in s.devices:
                units[d] = s
    if view.train.holds_devices and view.train.home:
        t = view.train.slot
        for d in t.devices:
            units[d] = t
    return units


__all__ = ["Candidate", "ClusterView", "Decision", "ElasticView", "TrainView", "device_units"]
