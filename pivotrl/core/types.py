"""Plain data types shared by the whole control plane.

Owns: roles, sequences, device slots and shift plans. Knows nothing about how any of them run
(no torch, Ray or vLLM here: see tests/core/test_purity.py). Every runtime (`local`, `ray`,
`sim`) speaks in these types, which is what lets one control plane drive all three.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field


class Role(str, enum.Enum):
    """The three RL roles. Rollout and reward are inference roles with schedulers; training is
    shifted as a whole on its home devices."""

    ROLLOUT = "rollout"
    REWARD = "reward"
    TRAIN = "train"


INFERENCE_ROLES = (Role.ROLLOUT, Role.REWARD)


@dataclass
class Sequence:
    """One generation: a policy response (role=ROLLOUT) or a GenRM judgement (role=REWARD).

    `seq_id` is unique per scheduler and is the default priority (lower first). `generated` only
    grows: an aborted sequence keeps its tokens and resumes by re-prefilling
    `prompt_len + generated` tokens. `target_len` is known only to the simulator.
    """

    seq_id: int
    role: Role
    prompt_len: int
    sample_id: int = -1
    generated: int = 0
    target_len: int | None = None
    version: int = 0
    step: int = 0

    @property
    def length(self) -> int:
        """Tokens in KV cache when running: prompt plus generated so far."""
        return self.prompt_len + self.generated

    @property
    def done(self) -> bool:
        return self.target_len is not None and self.generated >= self.target_len


@dataclass(frozen=True)
class Slot:
    """A place a replica of `role` could run: `tp` aligned devices starting at `first_device`.

    Replica sizes are powers of two dividing the node size, so slots of different roles nest."""

    role: Role
    first_device: int
    tp: int

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(range(self.first_device, self.first_device + self.tp))

    @functools.cached_property
    def slot_id(self) -> str:
        # cached: the planner reads it for every candidate (not a field, so eq/hash ignore it)
        return f"{self.role.value}@{self.first_device}x{self.tp}"


@dataclass
class ShiftPlan:
    """What the executor does: shift `down` (slot ids of active replicas, or the training unit),
    then shift `up` (slots of `role_up`). `penalty` is phi: tokens lost while shifting."""

    role_up: Role
    up: list[Slot] = field(default_factory=list)
    down: list[Slot] = field(default_factory=list)
    penalty: float = 0.0

    @property
    def empty(self) -> bool:
        return not self.up and not self.down
