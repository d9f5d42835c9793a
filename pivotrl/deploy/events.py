"""Events a runtime feeds to a deployment controller, and actions the controller returns.

Owns only plain dataclasses: the protocol between the control plane (`pivotrl/deploy`, pure) and a
runtime (`sim` now; `local`/`ray` later). A runtime delivers one event at a time through
`Controller.handle(event) -> list[Action]` and carries the actions out in order.

Conventions every runtime follows:
- Sample ids are global: `batch * samples_per_batch + prompt * G + index`. Each sample has one
  rollout sequence and at most one reward sequence, both with `seq_id == sample_id` (schedulers are
  per role); a sample whose judge prompt repeats an earlier one of its batch has none and shares
  that one's judgement (`SequenceFinished.shares_judgement_of`).
- Token counts the controller holds may lag (engines report progress on ticks and on shift/training
  completions, the `progress` field); a runtime keeps the truth and uses it when it aborts or
  resumes a sequence.
- Replica ids are `Slot.slot_id` strings; the runtime creates a replica when a shift up of its slot
  completes and reports its KV capacity in `ShiftDone.kv_capacity`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pivotrl.core.dispatch import Move
from pivotrl.core.types import Role, ShiftPlan

Progress = dict[Role, dict[int, int]]  # role -> seq_id -> generated tokens


# ---------------------------------------------------------------- events (runtime -> controller)
@dataclass
class Event:
    now: float
    """Runtime clock, seconds."""


@dataclass
class Start(Event):
    """The run begins: the controller sets up its allocation and releases the first batches."""


@dataclass
class SequenceFinished(Event):
    """A sequence reached its end (EOS or length cap) on `replica_id`."""

    role: Role = Role.ROLLOUT
    seq_id: int = -1
    generated: int = 0
    replica_id: str = ""
    shares_judgement_of: int = -1
    """A rollout's only: an earlier finished sample of the same batch whose judge prompt is identical
    (a greedy judge gives both one judgement). This sample gets no GenRM sequence and takes that
    one's judgement when it is done. -1: judged on its own."""


@dataclass
class BatchReady(Event):
    """Every sample of `batch` has its reward (raised by the controller's own pipeline)."""

    batch: int = -1


@dataclass
class TrainingDone(Event):
    """The training step on `batch` finished; the policy is now at `version`. `seconds` is the
    step itself (what the training-time model is fitted to), on `world` devices (0: on all the
    devices it started on; fewer when a borrowed device died and the step restarted without it);
    `reshard_s` the seconds the step spent moving the trainer's state between layouts in host
    memory (None: it ran on its home layout and moved nothing)."""

    batch: int = -1
    version: int = 0
    seconds: float = 0.0
    progress: Progress = field(default_factory=dict)
    world: int = 0
    reshard_s: float | None = None


@dataclass
class ShiftDone(Event):
    """A `StartShift(plan)` completed: down-shifted replicas are gone, up-shifted ones serve.

    `kv_capacity` gives each new inference replica's KV capacity (tokens); `seconds` the measured
    (down, up) wall durations of the whole plan; `measured` per role the warm shift time the
    runtime measured in this plan (mean warm shift up plus mean shift down of that role's
    devices, seconds), which the controller folds into the planner's `tau_shift` (empty: the
    runtime measures nothing, as the simulator, whose shift times are its model's)."""

    plan: ShiftPlan | None = None
    kv_capacity: dict[str, int] = field(default_factory=dict)
    seconds: tuple[float, float] = (0.0, 0.0)
    progress: Progress = field(default_factory=dict)
    measured: dict[Role, float] = field(default_factory=dict)


@dataclass
class ReplicaLost(Event):
    """The engine of active replica `replica_id` was replaced by a fresh, empty one (its device died
    and was respawned and re-hosted): its sequences go back to the queue with their tokens."""

    role: Role = Role.ROLLOUT
    replica_id: str = ""


@dataclass
class DeviceLost(Event):
    """Device `device` left the pool for good (its actor crashed too often): no role may use it."""

    device: int = -1


@dataclass
class Tick(Event):
    """Monitor tick (every `deploy.planner.tick_s`), with the engines' token counts."""

    progress: Progress = field(default_factory=dict)


# ---------------------------------------------------------------- actions (controller -> runtime)
@dataclass
class Action:
    pass


@dataclass
class Dispatch(Action):
    """Carry out scheduler moves of one role, in order (aborts keep the sequence's tokens)."""

    role: Role
    moves: list[Move]


@dataclass
class StartShift(Action):
    """Shift down `plan.down` (inference replicas or the training unit), then shift up `plan.up`.
    The runtime answers with `ShiftDone(plan)`. Sequences on down replicas were already moved away
    by a preceding `Dispatch`."""

    plan: ShiftPlan


@dataclass
class StartTraining(Action):
    """Run one training step on `devices` over the samples of `batch` (policy `version` -> +1).
    `tokens` are the policy tokens (prompt + response) of those samples. `home` is the training
    home set when `devices` is another set (elastic training: the state moves to `devices` and
    back); empty when the step runs on its home set."""

    batch: int
    version: int
    sample_ids: list[int]
    tokens: int
    devices: tuple[int, ...]
    home: tuple[int, ...] = ()


@dataclass
class PublishWeights(Action):
    """Make policy `version` the weights of every current and future rollout replica."""

    version: int


@dataclass
class Record(Action):
    """One timeline record (allocation, shift, planner decision) for the run's files."""

    kind: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepDone(Action):
    """A training step finished: per-step figures for metrics.jsonl (the runtime adds its own)."""

    step: int
    batch: int
    version: int
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class Finish(Action):
    """All configured steps are trained: the runtime stops."""
