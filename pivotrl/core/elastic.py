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
- the inference work in flight: `drain_s(W) = max over roles of backlog_tokens[role] /
  T_role(after W's shift down)` (the what-if evaluator's throughput without the replicas the
  trainer takes), i.e. how long the devices left to inference need for what is already released;
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

from pivotrl.core.planner_types import Candidate, ClusterView, Decision, device_units
from pivotrl.core.types import INFERENCE_ROLES, Role, ShiftPlan, Slot

if TYPE_CHECKING:
    from pivotrl.core.whatif import WhatIf


def training_slot(home: tuple[int, ...], world: int) -> Slot:
    """The training slot of `world` devices: the home set extended downwards (its last device kept)."""
    return Slot(Role.TRAIN, home[-1] + 1 - world, world)


def _drain(backlog: Mapping[Role, float], throughput: Mapping[Role, float]) -> float:
    out = 0.0
    for r in INFERENCE_ROLES:
        left = backlog.get(r, 0.0)
        if left > 0:
            t = throughput.get(r, 0.0)
            out = max(out, math.inf if t <= 0 else left / t)
    return out


def elastic_decision(view: ClusterView, replica_T: dict[Role, dict[str, float]], t_now: float,
                     whatif: Mapping[Role, "WhatIf"]) -> Decision | None:
    """Step 1's training branch with elastic training (module docstring); None when training
    needs no shift (the same cases as `planner.training_decision`)."""
    tr, el = view.train, view.train.elastic
    if el is None or not (tr.batch_ready and not tr.running) or not tr.home:
        return None
    if tr.holds_devices:
        return Decision(view.now, Role.TRAIN, t_now, [], None, "training batch ready; training already holds its devices")
    if any(d in view.pending for d in tr.home):
        return Decision(view.now, Role.TRAIN, t_now, [], None, "training batch ready; home devices mid-shift")
    units = device_units(view)
    T_now = {r: whatif[r].now() for r in INFERENCE_ROLES}
    home_w = len(tr.home)
    rows: list[tuple[int, ShiftPlan, dict[str, float]]] = []
    for w in el.sizes if el.model is not None else el.sizes[:1]:
        slot = training_slot(tr.home, w)
        devs = slot.devices
        if slot.first_device < 0 or any(d in view.pending or (units[d] is None and view.owner[d] is not None)
                                         for d in devs):
            continue  # off the cluster, mid-shift, or held by something the planner cannot shift
        down = sorted({units[d] for d in devs if units[d] is not None}, key=lambda s: s.first_device)
        phi = sum(view.tau_shift.get(s.role, 0.0) * replica_T.get(s.role, {}).get(s.slot_id, 0.0) for s in down)
        plan = ShiftPlan(Role.TRAIN, up=[slot], down=down, penalty=phi)
        rec: dict[str, float] = {"world": float(w)}
        if el.model is not None:
            after = {r: whatif[r].after_shift_down([s.slot_id for s in down if s.role == r])
                     if any(s.role == r for s in down) else T_now[r] for r in INFERENCE_ROLES}
            shift_s = max((view.tau_shift.get(s.role, 0.0) / 2 for s in down), default=0.0)
            step_s = el.model.seconds(w, el.tokens)
            reshard = 2 * el.reshard_s if w != home_w else 0.0
            train_s = step_s + shift_s + reshard
            borrowed = [s for s in down if not set(s.devices) <= set(tr.home)]
            rec.update(step_s=step_s, train_s=train_s, reshard_s=reshard, drain_s=_drain(el.backlog, after),
                       lost_tokens=sum(replica_T.get(s.role, {}).get(s.slot_id, 0.0) for s in borrowed) * train_s)
            rec["finish_s"] = max(train_s, rec["drain_s"])
        rows.append((w, plan, rec))
    if not rows or rows[0][0] != home_w:
        return Decision(view.now, Role.TRAIN, t_now, [], None, "training batch ready; home devices not available")
    base = rows[0][2]
    cands: list[Candidate] = []
    best: Candidate | None = None
    for w, plan, rec in rows:
        if el.model is not None:
            fa, fw = base["finish_s"], rec["finish_s"]
            gain = 0.0 if w == home_w else (fa - fw if math.isfinite(fa) else -math.inf)
            rec.update(saved_s=base["step_s"] - rec["step_s"], benefit_s=gain)
        gain = rec.get("benefit_s", 0.0)
        c = Candidate(plan, t_now, gain * el.rate if math.isfinite(gain) else -math.inf, k=w, detail=rec)
        cands.append(c)
        if w != home_w and gain > 0 and (best is None or gain > best.detail["benefit_s"]):
            best = c
    if best is None:
        why = ("no training-time model yet" if el.model is None else
               "no larger trainer ends the step and the released work sooner")
        return Decision(view.now, Role.TRAIN, t_now, cands, cands[0].plan,
                        f"training batch ready: training shifts up on its home devices ({why})")
    return Decision(view.now, Role.TRAIN, t_now, cands, best.plan,
                    f"training batch ready: training grows to {best.k} devices, {best.detail['benefit_s']:.3g} s sooner")


__all__ = ["elastic_decision", "training_slot"]
