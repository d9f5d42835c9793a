"""Shift strategies by name (DESIGN §4.3 ablations, paper Fig. 11): `pivot`, `static`, `rule`, `vanilla`.

Owns the strategies and `make_strategy(cfg)`; their names are `pivotrl.config.planner.STRATEGIES`, and each
has its own config schema (`pivotrl.config.planner.PLANNER_SCHEMAS`). Every strategy has a `migration` attribute:
whether executors should run shift-up migration (Alg. 4) when they carry out its plans (vanilla:
False whatever the config says). Every strategy has `decide(view) -> Decision`
and shares step 1's training rule (a ready batch pulls training onto its home devices), so the
ablations differ only in how inference devices move:

* `pivot`: the five-step planner (pivotrl.core.planner). `deploy.planner.migration=false` is the
  "pivot without migration" ablation: candidates are evaluated, and shifts executed, without Alg. 4.
* `vanilla`: the same planner with a 0/1 throughput model (a replica with any running sequence
  counts 1, an idle one 0) and no migration (paper: "Vanilla", without the throughput model).
* `static`: only the devices idle training holds (or frees) move, split evenly between rollout and
  reward: idle training first shifts down (a plan with no shift-up), then the free home devices go,
  first half to rollout and second half to reward, as `Decision.chosen` (rollout) +
  `Decision.extra` (reward); neither has a shift-down, so they can run at once. Nothing else moves,
  so a controller must start static from its base allocation, `initial_plans(...)` (the
  disaggregated split of the non-home devices). Strategies without `initial_plans` leave the start
  to the controller.
* `rule`: KV utilisation. The inference role whose utilisation is above `up_kv` (the higher
  one if both; a role with work and no replica, or with a queue, counts as full) shifts up onto
  every slot whose devices are free or held by idle training, and onto slots held by replicas of
  the other role if that role's utilisation is below `down_kv`. The cold role gives up only
  replicas it does not need: it keeps enough to hold its cached tokens under `up_kv` (at least
  one while it has work), least-loaded replicas go first. Without that floor the two roles
  ping-pong every tick (each shift leaves the loser with work and no replica, i.e. "full"). A lone
  shift down with nobody to take the devices would only idle them, so the rule shifts down only as
  part of a shift up.
"""
from __future__ import annotations

import math
from typing import Protocol

from pivotrl.config.base import ConfigError
from pivotrl.config.planner import (PLANNER_SCHEMAS, STRATEGIES, PivotPlannerConfig, PlannerConfig,
                                    RulePlannerConfig, StaticPlannerConfig, VanillaPlannerConfig)
from pivotrl.core.planner import (ClusterView, Decision, PivotPlanner, device_units, eq1_throughput, role_slots,
                                  training_decision)
from pivotrl.core.types import INFERENCE_ROLES, Role, ShiftPlan, Slot


class Strategy(Protocol):
    def decide(self, view: ClusterView) -> Decision: ...


def _snapshot(view: ClusterView) -> tuple[dict[Role, float], dict[Role, float], float, dict[Role, dict[str, float]]]:
    N = {r: float(view.schedulers[r].num_sequences()) for r in INFERENCE_ROLES}
    T = {r: view.schedulers[r].throughput() for r in INFERENCE_ROLES}
    t_now = eq1_throughput(N[Role.ROLLOUT], T[Role.ROLLOUT], N[Role.REWARD], T[Role.REWARD])
    rT = {r: {s.slot_id: (view.schedulers[r].replica_throughput(s.slot_id)
                          if s.slot_id in view.schedulers[r].replicas else 0.0)
              for s in view.active.get(r, [])} for r in INFERENCE_ROLES}
    return N, T, t_now, rT


def _free_or(view: ClusterView, slot: Slot, units: list[Slot | None], allowed) -> set[Slot] | None:
    """The blocker set of `slot` if every device is free or held by a unit `allowed(unit)` accepts."""
    blockers: set[Slot] = set()
    active = {s.first_device for s in view.active.get(slot.role, [])}
    if slot.first_device in active:
        return None
    for d in slot.devices:
        if d in view.pending:
            return None
        u = units[d]
        if u is None:
            if view.owner[d] is not None:
                return None
            continue
        if not allowed(u):
            return None
        blockers.add(u)
    return blockers


def _plan(role: Role, ups: list[Slot], downs: set[Slot], view: ClusterView, rT) -> ShiftPlan:
    down = sorted(downs, key=lambda s: (s.first_device, s.role.value))
    phi = sum(view.tau_shift.get(s.role, 0.0) * rT.get(s.role, {}).get(s.slot_id, 0.0)
              for s in down if s.role != Role.TRAIN)
    return ShiftPlan(role, up=ups, down=down, penalty=phi)


class StaticStrategy:
    """Idle training devices only, split evenly between rollout and reward."""

    def __init__(self, cfg: StaticPlannerConfig) -> None:
        self.cfg = cfg
        self.migration = cfg.migration

    def initial_plans(self, num_devices: int, tp: dict[Role, int], home: tuple[int, ...]) -> list[ShiftPlan]:
        """The base allocation static moves around: the disaggregated split of the devices outside
        the training home, half rollout (first half), half reward (paper Table 4 gives RO = RM in
        every group). Static never moves these, so a controller must start from them; starting
        from all-rollout (pivot's start) would leave reward without devices forever."""
        homeset = set(home)
        rest = [d for d in range(num_devices) if d not in homeset]
        half = len(rest) // 2
        plans = []
        for role, devs in ((Role.ROLLOUT, set(rest[:half])), (Role.REWARD, set(rest[half:]))):
            ups = [s for s in role_slots(role, tp[role], num_devices) if set(s.devices) <= devs]
            if ups:
                plans.append(ShiftPlan(role, up=ups))
        return plans

    def decide(self, view: ClusterView) -> Decision:
        view.validate()
        N, T, t_now, rT = _snapshot(view)
        train = training_decision(view, rT, t_now)
        if train is not None:
            return train
        tr = view.train
        if tr.running or tr.batch_ready or not tr.home:
            return Decision(view.now, None, t_now, [], None, "static: training busy or about to train")
        if tr.holds_devices:
            # shift the idle training unit down first; its devices come back free, and the next
            # decision (the controller replans when devices are freed) splits them without a race
            plan = ShiftPlan(Role.ROLLOUT, up=[], down=[tr.slot], penalty=0.0)
            return Decision(view.now, None, t_now, [], plan, "static: idle training shifts down")
        home = list(tr.home)
        half = len(home) // 2
        plans: list[ShiftPlan] = []
        for role, part in ((Role.ROLLOUT, home[:half]), (Role.REWARD, home[half:])):
            devs = set(part)
            ups = [s for s in role_slots(role, view.tp[role], view.num_devices)
                   if set(s.devices) <= devs and _free_or(view, s, [None] * view.num_devices, lambda u: False) == set()]
            if ups:
                plans.append(ShiftPlan(role, up=ups, down=[], penalty=0.0))
        if not plans:
            return Decision(view.now, None, t_now, [], None, "static: no free training devices to hand out")
        return Decision(view.now, plans[0].role_up, t_now, [], plans[0],
                        "static: free training devices split between rollout and reward", extra=plans[1:])


class RuleStrategy:
    """KV-utilisation thresholds (see the module docstring)."""

    def __init__(self, cfg: RulePlannerConfig) -> None:
        self.cfg = cfg
        self.migration = cfg.migration

    def utilisation(self, view: ClusterView, role: Role) -> float:
        s = view.schedulers[role]
        if not s.replicas:
            return float("inf") if s.num_sequences() > 0 else 0.0
        return s.kv_utilisation() if s.queued() == 0 else max(1.0, s.kv_utilisation())

    def decide(self, view: ClusterView) -> Decision:
        view.validate()
        N, T, t_now, rT = _snapshot(view)
        train = training_decision(view, rT, t_now)
        if train is not None:
            return train
        util = {r: self.utilisation(view, r) for r in INFERENCE_ROLES}
        hot = [r for r in INFERENCE_ROLES if util[r] > self.cfg.up_kv]
        if not hot:
            return Decision(view.now, None, t_now, [], None, f"rule: no role above {self.cfg.up_kv} KV utilisation")
        up = max(hot, key=lambda r: util[r])
        other = Role.REWARD if up == Role.ROLLOUT else Role.ROLLOUT
        cold = util[other] < self.cfg.down_kv
        train_idle = view.train.holds_devices and not view.train.running and not view.train.batch_ready

        # the cold role gives up only the replicas it does not need: it keeps enough to hold its
        # cached tokens below up_kv (and at least one while it has work), so a shift never
        # makes it hot in turn (no ping-pong)
        osched = view.schedulers[other]
        n_other = len(view.active.get(other, []))
        allowance = 0
        if cold and n_other:
            caps = [r.kv_capacity for r in osched.replicas.values()] or [1]
            used = sum(r.k for r in osched.replicas.values())
            keep = math.ceil(used / (self.cfg.up_kv * (sum(caps) / len(caps))))
            keep = max(keep, 1 if N[other] > 0 else 0)
            allowance = max(0, n_other - keep)

        def allowed(u: Slot) -> bool:
            return (u.role == Role.TRAIN and train_idle) or (u.role == other and allowance > 0)

        units = device_units(view)
        options = []
        for s in role_slots(up, view.tp[up], view.num_devices):
            blk = _free_or(view, s, units, allowed)
            if blk is not None:
                victims = [b for b in blk if b.role == other]
                load = sum(osched.replicas[b.slot_id].k for b in victims if b.slot_id in osched.replicas)
                options.append((len(victims) > 0, load, s.first_device, s, blk, victims))
        options.sort(key=lambda o: o[:3])  # free / idle-training slots first, then the least loaded
        ups, downs, taken = [], set(), set()
        for _, _, _, s, blk, victims in options:
            new = [v for v in victims if v not in taken]
            if len(taken) + len(new) > allowance:
                continue
            taken |= set(new)
            ups.append(s)
            downs |= blk
        if not ups:
            return Decision(view.now, up, t_now, [], None, f"rule: {up.value} is hot but no device can move")
        ups.sort(key=lambda s: s.first_device)
        plan = _plan(up, ups, downs, view, rT)
        return Decision(view.now, up, t_now, [], plan,
                        f"rule: {up.value} KV {util[up]:.2f} > {self.cfg.up_kv}; {other.value} KV {util[other]:.2f}")


class VanillaStrategy(PivotPlanner):
    """The pivot planner with a 0/1 throughput model and no migration."""

    def __init__(self, cfg: VanillaPlannerConfig) -> None:
        super().__init__(cfg, migration=False, zero_one=True)


class PivotStrategy(PivotPlanner):
    def __init__(self, cfg: PivotPlannerConfig) -> None:
        super().__init__(cfg)


def make_strategy(cfg: PlannerConfig) -> Strategy:
    """Build the strategy `cfg.strategy` names (`pivotrl.config.planner.STRATEGIES`) from its own
    schema (`PLANNER_SCHEMAS`: `planner_config(name, ...)`, or Hydra's `deploy/planner=<name>`)."""
    schema = PLANNER_SCHEMAS[cfg.strategy]  # an unknown name: ConfigError naming the registered ones
    if type(cfg) is not schema:
        raise ConfigError("planner", f"a {schema.__name__} for strategy {cfg.strategy!r} "
                          f"(pivotrl.config.planner.planner_config)", type(cfg).__name__, "deploy")
    return STRATEGIES.build(cfg.strategy, cfg)


__all__ = ["STRATEGIES", "Strategy", "make_strategy"]
