"""Static-pool deployment modes: `disaggregated` and the phased pools of `colocated`/`rr_colocated`.

Owns the three baselines of paper §8.1 as short subclasses of `Controller`:
- `DisaggregatedController`: disjoint rollout / reward / training pools fixed at start; roles run
  concurrently, GenRM judgements stream as responses finish, async up to the staleness bound.
- `ColocatedController`: every device serves each role in turn (rollout -> reward -> training of one
  batch), swapping models at stage boundaries (each swap is a shift and pays its cost).
- `RRColocatedController`: rollout then reward of one batch on a shared pool, swapping between them;
  training concurrent on its own pool, async up to the staleness bound.
"""
from __future__ import annotations

from pivotrl.core.types import Role, ShiftPlan, Slot
from pivotrl.deploy.base import Controller, role_slots
from pivotrl.deploy.events import Action, BatchReady, TrainingDone


def _layout(pools: list[tuple[Role, int, int]]) -> dict[Role, tuple[int, int]]:
    """Place pools (role, devices, alignment) back to back, most-aligned first, so every replica
    starts on a multiple of its size. Returns role -> (first device, devices)."""
    out, at = {}, 0
    for role, n, align in sorted(pools, key=lambda p: -p[2]):
        if at % align:
            raise ValueError(f"cannot align the {role.value} pool (replica size {align}) at device {at}")
        out[role] = (at, n)
        at += n
    return out


class DisaggregatedController(Controller):
    """Static disjoint pools; everything else is the base pipeline."""

    name = "disaggregated"

    def initial_plans(self) -> list[ShiftPlan]:
        a, tp = self.env.allocation, self.env.tp
        ro, rm, tr = a.get(Role.ROLLOUT, 0), a.get(Role.REWARD, 0), a.get(Role.TRAIN, 0)
        if min(ro, rm, tr) < 1 or ro + rm + tr != self.env.num_devices:
            raise ValueError(f"deploy.allocation for disaggregated must give rollout, reward, train >= 1 "
                             f"adding up to {self.env.num_devices}, got {ro}/{rm}/{tr}")
        lay = _layout([(Role.ROLLOUT, ro, tp[Role.ROLLOUT]), (Role.REWARD, rm, tp[Role.REWARD]), (Role.TRAIN, tr, 1)])
        return [ShiftPlan(Role.ROLLOUT, up=role_slots(Role.ROLLOUT, *lay[Role.ROLLOUT], tp[Role.ROLLOUT])),
                ShiftPlan(Role.REWARD, up=role_slots(Role.REWARD, *lay[Role.REWARD], tp[Role.REWARD])),
                ShiftPlan(Role.TRAIN, up=[Slot(Role.TRAIN, *lay[Role.TRAIN])])]


class PhasedController(Controller):
    """A pool that serves rollout, then reward, of one batch at a time (and, for colocated, training).

    Phases: `rollout` (pool holds rollout replicas, serving `rollout_batch`), `reward`, `train`.
    GenRM sequences are submitted as responses finish but only run once the pool turns to reward."""

    train_in_pool = False

    def __init__(self, env) -> None:
        super().__init__(env)
        self.phase = "rollout"
        self.rollout_batch = 0
        self.pool: tuple[int, int] = (0, env.num_devices)

    def _slots(self, role: Role) -> list[Slot]:
        if role == Role.TRAIN:
            return [Slot(Role.TRAIN, *self.pool)]
        return role_slots(role, *self.pool, self.env.tp[role])

    def _switch(self, to: Role, now: float) -> list[Action]:
        held = [s for r in (Role.ROLLOUT, Role.REWARD) for s in self.active[r].values()]
        if self.train_slot is not None and self.train_in_pool:
            held.append(self.train_slot)
        return self.start_shift(ShiftPlan(to, up=self._slots(to), down=held), now)

    def may_release(self, batch: int) -> bool:
        return self.phase == "rollout" and batch == self.rollout_batch

    def on_rollouts_complete(self, batch: int, now: float) -> list[Action]:
        if batch != self.rollout_batch:
            return []
        self.phase = "reward"
        return self._switch(Role.REWARD, now)


class ColocatedController(PhasedController):
    """Every device, every role, one stage at a time (staleness 0)."""

    name = "colocated"
    train_in_pool = True

    def __init__(self, env) -> None:
        if env.staleness != 0:
            raise ValueError(f"deploy=colocated runs stages in sequence: deploy.staleness must be 0, got {env.staleness}")
        super().__init__(env)

    def initial_plans(self) -> list[ShiftPlan]:
        return [ShiftPlan(Role.ROLLOUT, up=self._slots(Role.ROLLOUT))]

    def on_batch_ready(self, ev: BatchReady) -> list[Action]:
        self.phase = "train"
        return self._switch(Role.TRAIN, ev.now)

    def on_training_done(self, ev: TrainingDone) -> list[Action]:
        self.phase = "rollout"
        self.rollout_batch = ev.batch + 1
        return self._switch(Role.ROLLOUT, ev.now)


class RRColocatedController(PhasedController):
    """Rollout + reward share a pool (rollout then reward per batch); training has its own pool."""

    name = "rr_colocated"

    def __init__(self, env) -> None:
        super().__init__(env)
        a = env.allocation
        pool, tr = a.get(Role.ROLLOUT, 0), a.get(Role.TRAIN, 0)
        if min(pool, tr) < 1 or pool + tr != env.num_devices:
            raise ValueError(f"deploy.allocation for rr_colocated must give rollout (shared pool) and train "
                             f">= 1 adding up to {env.num_devices}, got {pool}/{tr}")
        align = max(env.tp[Role.ROLLOUT], env.tp[Role.REWARD])
        if pool % align:
            raise ValueError(f"rr_colocated pool of {pool} devices is not a multiple of the replica size {align}")
        self.pool = (0, pool)
        self.train_home = Slot(Role.TRAIN, pool, tr)

    def initial_plans(self) -> list[ShiftPlan]:
        return [ShiftPlan(Role.ROLLOUT, up=self._slots(Role.ROLLOUT)), ShiftPlan(Role.TRAIN, up=[self.train_home])]

    def on_batch_ready(self, ev: BatchReady) -> list[Action]:
        acts: list[Action] = []
        if ev.batch == self.rollout_batch and ev.batch + 1 < self.env.steps:
            # the pool turns back to rollout now; the next batch is released as soon as the
            # staleness bound allows (here, or when a training step finishes)
            self.phase, self.rollout_batch = "rollout", ev.batch + 1
            acts += self._switch(Role.ROLLOUT, ev.now)
            acts += self.release(ev.now)
        return acts + self.try_train(ev.now)
