"""Elastic training candidates (DESIGN §4.6): when a batch is ready, train on the home set or on it
plus borrowed devices, whichever ends the current work soonest.

Owns `training_slot` (the slot of a trainer of W devices: the home set extended downwards, so it stays
aligned with the replicas it displaces) and `elastic_decision`, the training branch of step 1 when
`deploy.planner.elastic_training` is on. Pure: standard library and the control plane's types. What the controller tells the planner about
a trainer that may grow is `planner_types.ElasticView`.

The decision, for every allowed world size W (the home size first):
- the training slot of W devices and the units holding its devices, shifted down (as the home
  candidate's are); `phi` the shift penalty of those replicas, as for any shift;
- the step's seconds `train_s(W) = t(W, tokens) + shift_s + (W != home) * 2 * reshard_s`, with
  `t` the training-time model (`pivotrl.core.training_time`, fitted online), `shift_s` half the
  `tau_shift` of the slowest role shifted down (the down half the step waits for) and `reshard_s`
  the measured seconds to move the state from the home layout to W's and back (host memory);
- the inference work in flight: `drain_s(W) = max over roles of max(backlog_tokens[role] /
  T_role(after W's shift down), tail_s[role])` (the what-if evaluator's throughput without the
  replicas the trainer takes; the tail, the longest sequence at one sequence's speed, which no
  replica count shortens; a role left with work and no replica gets one back by a shift, at once
  on devices left free, else after the other role's work, whose devices it then takes), i.e. how
  long the devices left to inference need for what is already released, times `drain_scale`
  (measured over predicted so far: the controller checks each prediction against the batches);
- `finish(W) = max(train_s(W), drain_s(W))`: when both the step and the released work are done,
  the point the pipeline waits for (the next batch is released only after the step, under the
  staleness bound); `benefit_s(W) = finish(home) - finish(W)`. Its parts go to the record:
  `saved_s` (step time saved), `reshard_s`, `lost_tokens` (what the borrowed replicas would have
  generated during the step at their current throughput: the inference cost of the growth) and
  the drain it causes.
The largest `benefit_s > 0` wins (ties keep the smaller trainer); none: the home set. Without a
training-time model (no step measured yet on a real runtime) the home set is the only candidate.
A candidate's `benefit` in the record is in tokens, `benefit_s * rate` (the run's tokens per
second so far), so the timeline's decision table reads it beside the inference shifts'; its
`penalty` is `phi`, and `k` its world size.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping

from pivotrl.core.planner_types import Candidate, ClusterView, Decision, ElasticView, device_units
from pivotrl.core.types import INFERENCE_ROLES, Role, ShiftPlan, Slot

if TYPE_CHECKING:
    from pivotrl.core.whatif import WhatIf


def training_slot(home: tuple[int, ...], world: int) -> Slot:
    """The training slot of `world` devices: the home set extended downwards (its last device kept)."""
    return Slot(Role.TRAIN, home[-1] + 1 - world, world)


def _drain(el: ElasticView, throughput: Mapping[Role, float], free: int, tp: Mapping[Role, int],
           tau_shift: Mapping[Role, float]) -> float:
    """Seconds until the released inference work is done with the replicas left: per role its
    tokens at the role's throughput, at least its tail. A role left with work and no replica gets
    one back by a shift: at once on `free` devices if they hold one of its replicas, else only
    once the other role's work is done and its devices can be taken (the two drain one after the
    other); then its tail at one replica's speed. No inference replica at all: it never ends."""
    served, starved = 0.0, []
    for r in INFERENCE_ROLES:
        left = el.backlog.get(r, 0.0)
        if left <= 0:
            continue
        t = throughput.get(r, 0.0)
        if t > 0:
            served = max(served, left / t, el.tail_s.get(r, 0.0))
        else:
            starved.append(r)
    out = served
    for r in starved:
        one = el.replica_throughput.get(r, 0.0)
        own = tau_shift.get(r, 0.0) + max(el.tail_s.get(r, 0.0), el.backlog[r] / one if one > 0 else 0.0)
        if free >= tp.get(r, 1):
            out = max(out, own)
        elif served > 0 or any(throughput.get(x, 0.0) > 0 for x in INFERENCE_ROLES):
            out = max(out, served + own)  # it waits for the other role's devices
        else:
            return math.inf
    return out


def elastic_decision(view: ClusterView, replica_T: dict[Role, dict[str, float]], t_now: float,
                     whatif: Mapping[Role, "WhatIf"]) -> Decision | None:
    """Step 1's training branch with elastic training (module docstring); None when training
    needs no shift (the same cases as `planner.training_decision`). Training that already holds
    devices with a batch waiting (its last step just ended) is priced the same way from where it
    is: keeping its size costs nothing more, another size a training shift and a reshard; the
    decision to keep it has no plan (the controller trains on at once)."""
    tr, el = view.train, view.train.elastic
    if el is None or not (tr.batch_ready and not tr.running) or not tr.home:
        return None
    held = tr.slot if tr.holds_devices else None
    if held is not None and (el.model is None or any(d in view.pending for d in held.devices)):
        return Decision(view.now, Role.TRAIN, t_now, [], None, "training batch ready; training already holds its devices")
    if held is None and any(d in view.pending for d in tr.home):
        return Decision(view.now, Role.TRAIN, t_now, [], None, "training batch ready; home devices mid-shift")
    units = device_units(view)
    T_now = {r: whatif[r].now() for r in INFERENCE_ROLES}
    home_w = len(tr.home)
    base_w = held.tp if held is not None else home_w
    rows: list[tuple[int, ShiftPlan | None, dict[str, float]]] = []
    for w in el.sizes if el.model is not None else el.sizes[:1]:
        slot = training_slot(tr.home, w)
        devs = slot.devices
        if slot.first_device < 0 or any(d in view.pending or (units[d] is None and view.owner[d] is not None)
                                         for d in devs):
            continue  # off the cluster, mid-shift, or held by something the planner cannot shift
        down = sorted({units[d] for d in devs if units[d] is not None and units[d] != held},
                      key=lambda s: s.first_device)
        phi = sum(view.tau_shift.get(s.role, 0.0) * replica_T.get(s.role, {}).get(s.slot_id, 0.0) for s in down)
        keep = held is not None and w == held.tp
        plan = None if keep else ShiftPlan(Role.TRAIN, up=[slot], down=sorted(down + ([held] if held else []),
                                                                              key=lambda s: s.first_device), penalty=phi)
        rec: dict[str, float] = {"world": float(w)}
        if el.model is not None:
            after = {r: whatif[r].after_shift_down([s.slot_id for s in down if s.role == r])
                     if any(s.role == r for s in down) else T_now[r] for r in INFERENCE_ROLES}
            shift_s = max((view.tau_shift.get(s.role, 0.0) / 2 for s in down), default=0.0)
            step_s = el.model.seconds(w, el.tokens)
            if held is None:  # the training shift up is paid whatever the size; a reshard there and back
                reshard = 2 * el.reshard_s if w != home_w else 0.0
            else:  # from where it is: nothing to keep it, a training shift and a reshard to change it
                reshard = 0.0 if keep else el.reshard_s * (1 + (w != home_w))
                shift_s = 0.0 if keep else shift_s + view.tau_shift.get(Role.TRAIN, 0.0)
            train_s = step_s + shift_s + reshard
            borrowed = [s for s in down if not set(s.devices) <= set(tr.home)]
            free = sum(1 for d in range(view.num_devices) if d not in devs and d not in view.pending
                       and (view.owner[d] is None or (units[d] is not None and units[d] in down)))
            drain = _drain(el, after, free, view.tp, view.tau_shift) * el.drain_scale
            rec.update(step_s=step_s, train_s=train_s, reshard_s=reshard, drain_s=drain, finish_s=max(train_s, drain),
                       lost_tokens=sum(replica_T.get(s.role, {}).get(s.slot_id, 0.0) for s in borrowed) * train_s)
        rows.append((w, plan, rec))
    base = next((rec for w, _, rec in rows if w == base_w), None)
    if base is None:
        return Decision(view.now, Role.TRAIN, t_now, [], None, "training batch ready; home devices not available")
    cands: list[Candidate] = []
    best: Candidate | None = None
    for w, plan, rec in rows:
        if el.model is not None:
            fa, fw = base["finish_s"], rec["finish_s"]
            gain = 0.0 if w == base_w else (fa - fw if math.isfinite(fa) else -math.inf)
            rec.update(saved_s=base["step_s"] - rec["step_s"], benefit_s=gain)
        gain = rec.get("benefit_s", 0.0)
        c = Candidate(plan or ShiftPlan(Role.TRAIN, up=[held] if held else []), t_now,
                      gain * el.rate if math.isfinite(gain) else -math.inf, k=w, detail=rec)
        cands.append(c)
        if w != base_w and gain > 0 and (best is None or gain > best.detail["benefit_s"]):
            best = c
    if best is None:
        if held is not None:
            return Decision(view.now, Role.TRAIN, t_now, cands, None,
                            f"training batch ready: training keeps its {held.tp} devices")
        why = ("no training-time model yet" if el.model is None else
               "no larger trainer ends the step and the released work sooner")
        return Decision(view.now, Role.TRAIN, t_now, cands, cands[0].plan,
                        f"training batch ready: training shifts up on its home devices ({why})")
    verb = "grows" if best.k > base_w else "shrinks"
    return Decision(view.now, Role.TRAIN, t_now, cands, best.plan,
                    f"training batch ready: training {verb} to {best.k} devices, {best.detail['benefit_s']:.3g} s sooner")


__all__ = ["elastic_decision", "training_slot"]
