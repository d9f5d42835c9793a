"""The pivot planner (DESIGN §4.3, paper §7 and App. D): which devices shift to which role, now.

Owns the slot geometry, shift pairs, the DP of Algorithm 1 (`dp_candidates`, a pure function), and
`PivotPlanner`, which runs the five steps. Its inputs (`ClusterView`, `TrainView`) and its output
(`Decision` with every candidate, penalty, throughput and benefit, JSON-able for timeline.jsonl)
are planner_types.py's, re-exported here.

1. shift-up role: training if its batch is ready and it neither runs nor holds its devices (one
   plan: whatever holds the home devices shifts down; no DP, no evaluation; with elastic training
   one candidate per world size the trainer may take, pivotrl/core/elastic.py); else rollout or
   reward by the larger `tau = N/T` (`T = 0` with `N > 0` is infinite demand; `N = 0` is none);
2. shift pairs: the role's inactive, non-pending slots grouped by the set of other-role units that
   block their devices; free devices and idle training (batch not ready) cost `phi = 0`; training
   mid-step is never shifted down (its slots are not eligible); `phi = sum tau_shift[role]*T_i` over
   the pair's shift-down replicas; pairs sorted by `phi` (then by first device, for determinism);
3. `dp_candidates`: one minimum-penalty candidate per shift-up count `k`;
4. evaluation: the gaining role's throughput after `k` replicas shift up (with or without
   migration) and the losing role's after its shift-down set goes, by a what-if evaluator
   (pivotrl.core.whatif: "migrate" = the real scheduler on clones, "summary" = closed form), then
   paper Eq. 1 `T = (N_ro + N_rm) / (N_ro/T_ro + N_rm/T_rm)`;
5. select the largest positive `B = H*(T_cand - T_now) - phi`, else keep the allocation.

Conventions the controllers rely on (contract with pivotrl/deploy):
  * scheduler replica ids are `Slot.slot_id`; training's unit is `Slot(Role.TRAIN, home[0], len(home))`;
  * a plan's `up` slots all have the role `role_up` (one role per plan). A strategy that wants two
    roles up at once (static) returns extra plans in `Decision.plans` (`chosen` is `plans[0]`);
    executors should run every plan in `Decision.plans`, in order;
  * new replicas' KV capacity comes from `ClusterView.kv_capacity[role]` when given, else the
    largest capacity of the role's active replicas, else the last one the planner saw, else 2^40.
"""
from __future__ import annotations

import math
import operator
import time
from dataclasses import dataclass

import numpy as np

from pivotrl.config.planner import EVALUATIONS, PivotPlannerConfig
from pivotrl.core.elastic import elastic_decision
# the planner's inputs and outputs live in planner_types.py (shared with elastic.py); re-exported
from pivotrl.core.planner_types import (Candidate, ClusterView, Decision, ElasticView, TrainView,  # noqa: F401
                                        device_units)
from pivotrl.core.scheduler import ShiftAwareScheduler
from pivotrl.core.types import INFERENCE_ROLES, Role, ShiftPlan, Slot
from pivotrl.core.whatif import WhatIf

_UNKNOWN_CAPACITY = 1 << 40


def eq1_throughput(n_ro: float, t_ro: float, n_rm: float, t_rm: float) -> float:
    """Paper Eq. 1, the weighted harmonic mean. A role with no sequences drops out; a role with
    sequences and zero throughput makes the whole pipeline stall (0.0). Never NaN."""
    denom = 0.0
    for n, t in ((n_ro, t_ro), (n_rm, t_rm)):
        if n > 0:
            if t <= 0:
                return 0.0
            denom += n / t
    return (n_ro + n_rm) / denom if denom > 0 else 0.0


def role_demand(n: float, t: float) -> float:
    """tau_role = N/T: infinite when T = 0 with work, 0 without work."""
    if n <= 0:
        return 0.0
    return math.inf if t <= 0 else n / t


@dataclass
class ShiftPair:
    """Ordered shift-up slots of the target role sharing one shift-down set, and its penalty phi."""

    up: list[Slot]
    down: list[Slot]
    penalty: float


# ---------------------------------------------------------------------- slot geometry
def role_slots(role: Role, tp: int, num_devices: int) -> list[Slot]:
    """All aligned slots of `role` (replica size `tp`) on `num_devices` devices."""
    return [Slot(role, d, tp) for d in range(0, num_devices - tp + 1, tp)]


def shift_pairs(view: ClusterView, role: Role, replica_T: dict[str, float],
                units: list[Slot | None] | None = None) -> list[ShiftPair]:
    """Step 2: group `role`'s eligible inactive slots by their blocker set (see module docstring).
    `replica_T` gives the throughput of every active other-role replica by slot id."""
    units = device_units(view) if units is None else units
    tp = view.tp[role]
    active_first = {s.first_device for s in view.active.get(role, [])}
    pending = view.pending
    groups: dict[frozenset[Slot], list[Slot]] = {}
    for slot in role_slots(role, tp, view.num_devices):
        if slot.first_device in active_first:
            continue
        blockers: set[Slot] = set()
        ok = True
        for d in slot.devices:
            if d in pending:
                ok = False
                break
            u = units[d]
            if u is None:
                if view.owner[d] is not None:  # held but not by a known unit: mid-shift or same role
                    ok = False
                    break
                continue
            if u.role == role or (u.role == Role.TRAIN and (view.train.running or view.train.batch_ready)):
                ok = False  # same role (not nested) or training that is (about to be) busy
                break
            blockers.add(u)
        if ok:
            groups.setdefault(frozenset(blockers), []).append(slot)
    pairs = []
    for blk, ups in groups.items():
        down = sorted(blk, key=lambda s: (s.first_device, s.role.value))
        phi = sum(view.tau_shift.get(s.role, 0.0) * replica_T.get(s.slot_id, 0.0)
                  for s in down if s.role != Role.TRAIN)
        pairs.append(ShiftPair(sorted(ups, key=lambda s: s.first_device), down, phi))
    pairs.sort(key=lambda p: (p.penalty, p.up[0].first_device))
    return pairs


# ---------------------------------------------------------------------- Algorithm 1
def dp_candidates(pairs: list[tuple[int, float]], K: int) -> list[tuple[int, float, tuple[tuple[int, int], ...]]]:
    """Algorithm 1 (paper App. D). `pairs[i] = (r_i, phi_i)`: taking the first `e >= 1` slots of
    pair i costs `phi_i` once. Returns, for every reachable `k` in 1..K, `(k, D[k], choice)` with
    `choice = ((i, e), ...)` in pair order and `D[k]` the minimum total penalty for exactly `k`
    slots. Ties keep the later candidate in traversal order (App. D.2). O(K * sum r_i).

    Vectorised over the target count: for pair i, the transition into state t from (j = t-e, e)
    keeps, among all that reach the new minimum, the one traversed last (largest j, so smallest e),
    and it replaces the skip state on a tie (`d <= D_hat`), exactly as the paper's loop does. The
    chosen e per (pair, state) is kept in a table and every candidate is read back at once."""
    if K < 0:
        raise ValueError(f"dp_candidates: K must be >= 0, got {K}")
    if K == 0:
        return []
    INF = np.inf
    D = np.full(K + 1, INF)
    D[0] = 0.0
    used = [(i, int(r), float(phi)) for i, (r, phi) in enumerate(pairs) if r > 0]
    choice = np.zeros((len(used), K + 1), dtype=np.int32)
    for layer, (_, r, phi) in enumerate(used):
        best = D.copy()
        rr = min(r, K)
        for e in range(1, rr + 1):  # the new minimum over skip and every e
            np.minimum(best[e:], D[:K + 1 - e] + phi, out=best[e:])
        ch = choice[layer]
        for e in range(rr, 0, -1):  # smallest e reaching the minimum wins (traversed last)
            hit = (D[:K + 1 - e] + phi == best[e:]) & np.isfinite(best[e:])
            ch[e:][hit] = e
        D = best
    ks = np.flatnonzero(np.isfinite(D[1:])) + 1
    state = ks.copy()
    taken = np.zeros((len(used), len(ks)), dtype=np.int32)
    for layer in range(len(used) - 1, -1, -1):
        e = choice[layer][state]
        taken[layer] = e
        state -= e
    cand, layer_of = np.nonzero(taken.T)  # sorted by candidate, then by pair order
    pair_of = np.array([u[0] for u in used], dtype=np.int64)[layer_of].tolist() if len(used) else []
    steps = list(zip(pair_of, taken.T[cand, layer_of].tolist()))
    bounds = np.concatenate([[0], np.cumsum(np.bincount(cand, minlength=len(ks)))]).tolist()
    return [(k, float(D[k]), tuple(steps[bounds[c]:bounds[c + 1]])) for c, k in enumerate(ks.tolist())]


# ---------------------------------------------------------------------- the planner
def training_decision(view: ClusterView, replica_T: dict[Role, dict[str, float]], t_now: float) -> Decision | None:
    """Step 1's training branch, shared by every strategy. None when training needs no shift."""
    tr = view.train
    if not (tr.batch_ready and not tr.running) or not tr.home:
        return None
    if tr.holds_devices:
        return Decision(view.now, Role.TRAIN, t_now, [], None, "training batch ready; training already holds its devices")
    if any(d in view.pending for d in tr.home):
        return Decision(view.now, Role.TRAIN, t_now, [], None, "training batch ready; home devices mid-shift")
    units = device_units(view)
    down = sorted({units[d] for d in tr.home if units[d] is not None}, key=lambda s: s.first_device)
    # a replica straddling the home set also goes: it cannot keep running on part of its devices
    phi = sum(view.tau_shift.get(s.role, 0.0) * replica_T.get(s.role, {}).get(s.slot_id, 0.0) for s in down)
    plan = ShiftPlan(Role.TRAIN, up=[tr.slot], down=down, penalty=phi)
    return Decision(view.now, Role.TRAIN, t_now, [Candidate(plan, t_now, -phi, k=1)], plan,
                    "training batch ready: training shifts up on its home devices")


class PivotPlanner:
    """The five-step planner. `zero_one` swaps in the vanilla 0/1 throughput model."""

    def __init__(self, cfg: PivotPlannerConfig, migration: bool | None = None, zero_one: bool = False) -> None:
        self.cfg = cfg
        self.migration = cfg.migration if migration is None else migration
        self.zero_one = zero_one
        ev = getattr(cfg, "evaluation", "summary")
        self.evaluator = EVALUATIONS[ev]
        self._seen_capacity: dict[Role, int] = {}

    def capacity(self, view: ClusterView, role: Role) -> int:
        if role in view.kv_capacity:
            return int(view.kv_capacity[role])
        caps = [r.kv_capacity for r in view.schedulers[role].replicas.values()]
        if caps:
            self._seen_capacity[role] = max(caps)
        return self._seen_capacity.get(role, _UNKNOWN_CAPACITY)

    def role_throughput(self, s: ShiftAwareScheduler) -> float:
        if self.zero_one:
            return float(sum(1 for r in s.replicas.values() if r.n > 0))
        return s.throughput()

    def replica_throughputs(self, view: ClusterView, role: Role) -> dict[str, float]:
        """T_i of every active replica of `role` by slot id (0/1 under the vanilla model)."""
        s = view.schedulers[role]
        out = {}
        for slot in view.active.get(role, []):
            rep = s.replicas.get(slot.slot_id)
            if rep is None:
                out[slot.slot_id] = 0.0
            else:
                out[slot.slot_id] = float(rep.n > 0) if self.zero_one else s.replica_throughput(slot.slot_id)
        return out

    def decide(self, view: ClusterView) -> Decision:
        view.validate()
        tm: dict[str, float] = {}
        t0 = time.perf_counter()
        sch = view.schedulers
        N = {r: float(sch[r].num_sequences()) for r in INFERENCE_ROLES}
        T = {r: self.role_throughput(sch[r]) for r in INFERENCE_ROLES}
        t_now = eq1_throughput(N[Role.ROLLOUT], T[Role.ROLLOUT], N[Role.REWARD], T[Role.REWARD])
        # step 1: shift-up role
        if view.train.batch_ready and not view.train.running:
            rT = {r: self.replica_throughputs(view, r) for r in INFERENCE_ROLES}
            if view.train.elastic is not None:
                wi = {r: self.evaluator(sch[r], zero_one=self.zero_one) for r in INFERENCE_ROLES}
                train = elastic_decision(view, rT, t_now, wi)
            else:
                train = training_decision(view, rT, t_now)
            if train is not None:
                train.timings = {"role": time.perf_counter() - t0}
                return train
        demand = {r: role_demand(N[r], T[r]) for r in INFERENCE_ROLES}
        up = max(INFERENCE_ROLES, key=lambda r: (demand[r], N[r]))
        tm["role"] = time.perf_counter() - t0
        if demand[up] <= 0:
            return Decision(view.now, None, t_now, [], None, "no demand: no queued or running sequences", tm)
        other = Role.REWARD if up == Role.ROLLOUT else Role.ROLLOUT
        # step 2: shift pairs
        t1 = time.perf_counter()
        pairs = shift_pairs(view, up, self.replica_throughputs(view, other))
        tm["pairs"] = time.perf_counter() - t1
        K = sum(len(p.up) for p in pairs)
        # step 3: candidates by DP
        t2 = time.perf_counter()
        cands = dp_candidates([(len(p.up), p.penalty) for p in pairs], K)
        tm["dp"] = time.perf_counter() - t2
        # step 4: evaluate
        t3 = time.perf_counter()
        wi: dict[Role, WhatIf] = {r: self.evaluator(sch[r], zero_one=self.zero_one) for r in INFERENCE_ROLES}
        cap = self.capacity(view, up)
        self.capacity(view, other)
        out: list[Candidate] = []
        lost_ids = [[s.slot_id for s in p.down if s.role == other] for p in pairs]
        first = operator.attrgetter("first_device")  # units never share a first device
        H = self.cfg.horizon_s
        for k, phi, choice in cands:
            ups: list[Slot] = []
            downs: list[Slot] = []
            lost: list[str] = []
            for i, e in choice:
                ups += pairs[i].up[:e]
                downs += pairs[i].down
                lost += lost_ids[i]
            t_up = wi[up].after_shift_up(k, cap, self.migration)
            t_other = wi[other].after_shift_down(lost) if lost else T[other]
            Tr = {up: t_up, other: t_other}
            t_c = eq1_throughput(N[Role.ROLLOUT], Tr[Role.ROLLOUT], N[Role.REWARD], Tr[Role.REWARD])
            plan = ShiftPlan(up, up=ups, down=sorted(downs, key=first), penalty=phi)
            out.append(Candidate(plan, t_c, H * (t_c - t_now) - phi, k, {up.value: t_up, other.value: t_other}))
        tm["evaluate"] = time.perf_counter() - t3
        # step 5: select
        t4 = time.perf_counter()
        best = None
        for c in out:
            if c.benefit > 0 and (best is None or c.benefit > best.benefit):
                best = c
        tm["select"] = time.perf_counter() - t4
        if best is None:
            reason = "no eligible slots" if not out else "no candidate has a positive benefit"
            return Decision(view.now, up, t_now, out, None, reason, tm)
        return Decision(view.now, up, t_now, out, best.plan,
                        f"k={best.k} {up.value} replicas up, benefit {best.benefit:.4g}", tm)
