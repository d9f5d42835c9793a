"""What carrying out the control plane's decisions found out (plain data, no Ray): the result of a
batch of scheduler moves, of a shift plan and of a training step, one device death, the measured
shift seconds the planner's `tau_shift` learns from, the two training errors, a call past its time
limit (`TimeLimitExceeded`), and a driver thread's failure. `executor.py` and `training.py` produce
them; the driver and the launch read them (the driver's threads hand back a `ShiftResult`, a
`TrainingResult` or a `ThreadFailed`). Also which errors of a call into a device mean that device
must be replaced (`is_dead`, `must_replace`: Ray's and the engines' exception types are imported
only when they are called).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from pivotrl.core.types import Role, ShiftPlan, Slot

if TYPE_CHECKING:
    from pivotrl.deploy.events import StartTraining
    from pivotrl.engines.protocol import Completion


@dataclass
class MoveResult:
    """What executing one batch of moves found out."""

    aborted: dict[int, list[int]] = field(default_factory=dict)
    """seq_id -> every token generated so far (the engine's count)."""
    finished: list[tuple[int, Completion]] = field(default_factory=list)
    """(device, Completion) of sequences that finished before their abort reached the engine."""
    dead: set[int] = field(default_factory=set)
    """Devices an abort found dead (already respawned, holding no role); a submit's death is
    found later (`submits.Submits.check`)."""


@dataclass
class Death:
    """One device death, found by whichever call hit it first."""

    device: int
    role: Role | None
    """The role the device held (None: none, or mid-shift)."""
    slot: Slot | None
    """The inference slot it served, or was being re-hosted into (None: none)."""
    why: str
    generation: int
    """Generation of the fresh actor that replaced the dead one."""
    held_train: bool = False
    """Its actor held a trainer rank (active or offloaded): the trainer's state is incomplete."""
    crash_loop: bool = False
    """It died more than `max_respawns` times within `respawn_window_s`: it should leave the pool."""


class TrainingRankDied(RuntimeError):
    """A training rank's actor died during a collective training call."""

    def __init__(self, devices: list[int], method: str) -> None:
        self.devices, self.method = list(devices), method
        super().__init__(f"training rank(s) on device(s) {self.devices} died during {method}")


class TrainingStateLost(RuntimeError):
    """A trainer rank's state died with its device and cannot be rebuilt at the right version."""


@dataclass(frozen=True)
class TrainingResult:
    """One training step done (trained, published, checkpoint started)."""

    act: StartTraining
    metrics: dict[str, float]
    """The trainer's metrics of the step (rank 0's)."""
    seconds: float
    """The step's own seconds (the publish and the checkpoint's staging not included)."""
    world: int = 0
    """Devices the step ran on (0: all of `act.devices`; fewer after a restart without a dead one)."""
    reshard_s: float | None = None
    """Seconds this step's trainer spent being rebuilt on another layout from host memory (None:
    it trained on its own group's state)."""


@dataclass(frozen=True)
class ThreadFailed:
    """A driver thread (a shift or a training step) raised: the driver re-raises `error`."""

    error: BaseException


@dataclass
class ShiftResult:
    """One shift plan carried out: its halves' seconds, the new replicas' KV capacity, per-device
    timings, devices found dead, and the error that stopped it (None: done)."""

    plan: ShiftPlan
    seconds: tuple[float, float] = (0.0, 0.0)
    kv_capacity: dict[str, int] = field(default_factory=dict)
    timings: list[dict[str, Any]] = field(default_factory=list)
    dead: set[int] = field(default_factory=set)
    error: BaseException | None = None
    measured: dict[Role, float] = field(default_factory=dict)
    """Per role: mean warm shift up + mean shift down of this plan's devices (`ShiftDone.measured`)."""


def measured_shift_seconds(timings: list[dict[str, Any]]) -> dict[Role, float]:
    """Per role, the mean warm shift up plus the mean shift down over the devices that did them
    (cold first starts build the engine or trainer once and would overstate every later shift)."""
    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    out: dict[Role, float] = {}
    for role in (Role.ROLLOUT, Role.REWARD, Role.TRAIN):
        up = mean([t["seconds"] for t in timings if t["role"] == role.value and t["direction"] == "up" and not t["cold"]])
        down = mean([t["seconds"] for t in timings if t["role"] == role.value and t["direction"] == "down"])
        if up is not None or down is not None:
            out[role] = (up or 0.0) + (down or 0.0)
    return out


class TimeLimitExceeded(RuntimeError):
    """A call into device(s) ran past its time limit (`runtime/limits.py`, `cluster.limits.*`)."""

    def __init__(self, phase: str, devices: int | Iterable[int], elapsed_s: float, limit_s: float, key: str) -> None:
        self.phase, self.elapsed_s, self.limit_s, self.key = phase, float(elapsed_s), float(limit_s), key
        self.devices = [int(devices)] if isinstance(devices, int) else [int(d) for d in devices]
        super().__init__(f"{phase} on device(s) {self.devices} ran {self.elapsed_s:.1f}s, past its time limit of "
                         f"{self.limit_s:.1f}s ({key}); if it is only slow, raise that limit")


def is_dead(exc: BaseException) -> bool:
    """The actor is gone (its process died, or Ray lost it)."""
    import ray

    return isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError))


def must_replace(exc: BaseException) -> bool:
    """The actor is dead, its engine failed a wake or a load and shut itself down
    (`EngineFailedError`), or its call ran past its time limit: either way the device must be
    replaced, never left serving."""
    from pivotrl.engines.errors import EngineFailedError

    return (is_dead(exc) or isinstance(exc, (EngineFailedError, TimeLimitExceeded))
            or isinstance(getattr(exc, "cause", None), EngineFailedError))


def death_reason(what: str, exc: BaseException) -> str:
    """A death's `why`: the call, and what it ran into (a time limit's own message)."""
    return f"{what}: {exc}" if isinstance(exc, TimeLimitExceeded) else f"{what}: {type(exc).__name__}"
