"""`cluster=sim`: the discrete-event runtime that drives a deployment controller on a simulated cluster.

Owns the simulated clock and event queue, the replicas' ground truth (`SimReplica`), carrying out
the controller's actions (dispatch/abort moves with prefill and re-prefill, shifts with their
durations, training steps, weight publishes), monitor ticks, and the run's records (metrics.jsonl,
timeline.jsonl, summary.json through the `Tracker`). The control plane is the real one: the same
controllers, schedulers and planner the other runtimes use (DESIGN §1-2, §5).

Events: sequence completions (per replica, computed in closed form by `SimReplica`), shift
completions, training completions, monitor ticks and throughput samples. Between events nothing is
stepped.

Throughput samples (`models.sim.throughput_sample_s`, every mode, Fig. 10) are read-only: the
controller never sees them. Each writes a `throughput` timeline record with two views:
- `rollout`, `reward`, `overall`: what the planner sees: the schedulers' modelled throughput
  (`sum_i N_i / tau_i` over the scheduler's replica states) and paper Eq. 1 over them with
  `n_rollout`/`n_reward` = running + queued sequences. The static modes get no progress reports, so
  their schedulers' K lags the engines by the tokens generated since each dispatch (T is a little
  optimistic there).
- `actual`: tokens the simulated engines really emitted per role in the last interval / interval
  (ground truth, retired replicas included), and `actual_total` their sum.

Token counts reach the controller the way a real engine would report them: on completion, and as a
progress snapshot on ticks, shift and training completions (pivot only; the static modes never
abort a running sequence). Scheduler dispatch between snapshots sees K up to one tick stale.
"""
from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivotrl.config import PivotConfig
from pivotrl.core.planner import eq1_throughput
from pivotrl.core.types import INFERENCE_ROLES, Role
from pivotrl.deploy import ControlEnv, make_controller
from pivotrl.deploy.events import (
    Dispatch, Finish, PublishWeights, Record, SequenceFinished, ShiftDone, Start, StartShift,
    StartTraining, StepDone, Tick, TrainingDone,
)
from pivotrl.sim import timemodel as tm
from pivotrl.sim.engine import SimReplica
from pivotrl.sim.metrics import RunStats
from pivotrl.sim.workload import Workload

STUCK_S = 3600.0  # simulated seconds with only ticks happening = a deadlocked deployment
LOW_FRACTION = 0.2  # "below 20 % of peak per-device throughput" (paper Fig. 3)


@dataclass
class SimSetup:
    """Everything resolved from the config for one simulated run."""

    cfg: PivotConfig
    costs: dict[Role, tm.RoleCosts]
    workload: Workload
    steps: int
    warmup: int
    allocation: dict[Role, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: PivotConfig, allocation: dict[Role, int] | None = None,
                    steps: int | None = None) -> "SimSetup":
        m, hw, sim = cfg.models, cfg.cluster.hardware, cfg.models.sim
        P = sim.prompts_per_step or cfg.train.prompts_per_step
        G = sim.group_size or cfg.train.group_size
        costs = {r: tm.role_costs(m, hw, r) for r in INFERENCE_ROLES}
        wl = Workload(m.workload, cfg.seed, P, G, sim.step_offset)
        st = steps if steps is not None else cfg.train.steps
        warm = min(cfg.train.warmup_steps, st - 1)
        return cls(cfg, costs, wl, st, warm, dict(allocation or {}))

    @property
    def num_devices(self) -> int:
        return int(self.cfg.cluster.num_devices or self.cfg.models.devices)

    def control_env(self) -> ControlEnv:
        cfg, m = self.cfg, self.cfg.models
        tau = {r: c.shift_up_s + c.shift_down_s for r, c in self.costs.items()}
        tau[Role.TRAIN] = m.policy.train_shift_up_s + m.policy.train_shift_down_s
        mode = cfg.deploy.mode.value if hasattr(cfg.deploy.mode, "value") else str(cfg.deploy.mode)
        return ControlEnv(
            num_devices=self.num_devices, node_size=cfg.cluster.node_size,
            tp={r: c.tp for r, c in self.costs.items()},
            models={r: c.model for r, c in self.costs.items()},
            tau_shift=tau, prompts=self.workload,
            prompts_per_step=self.workload.P, group_size=self.workload.G, steps=self.steps,
            staleness=0 if mode == "colocated" else cfg.deploy.staleness,
            allocation=self.allocation, planner=cfg.deploy.planner,
            kv_reserve=m.sim.kv_reserve_tokens,
            kv_capacity={r: c.kv_capacity for r, c in self.costs.items()})


class SimRuntime:
    """Feeds events to one controller and carries out its actions on simulated replicas."""

    def __init__(self, setup: SimSetup, tracker: Any = None, progress: bool = False) -> None:
        self.s = setup
        self.cfg = setup.cfg
        self.tracker = tracker
        self.ctrl = make_controller(self.cfg.deploy.mode, setup.control_env())
        self.now = 0.0
        self._events: list[tuple[float, int, str, Any]] = []
        self._finishes: list[tuple[float, int, str, int]] = []
        self._seq = itertools.count()
        self.replicas: dict[str, SimReplica] = {}
        self.role_of: dict[str, Role] = {}
        self.truth: dict[Role, dict[int, int]] = {r: {} for r in INFERENCE_ROLES}  # aborted: generated
        self.done = False
        m, hw = self.cfg.models, self.cfg.cluster.hardware
        self.publish_s = tm.publish_time(m.policy, m.sim)
        ctx = self._contexts()
        self.peak = {r: c.peak_per_device(ctx[r]) for r, c in setup.costs.items()}
        self.stats = RunStats(setup, self.peak)
        self.progress = progress
        self._bar = None
        self._last_progress = 0.0
        self.sample_s = float(self.cfg.models.sim.throughput_sample_s or 0.0)
        self._last_sample: tuple[float, dict[Role, float]] = (0.0, {r: 0.0 for r in INFERENCE_ROLES})

    def _contexts(self) -> dict[Role, float]:
        """Mean KV length of a running sequence per role, from the workload's first batch."""
        rows = [x for row in self.s.workload.batch_lengths(0) for x in row]
        n = max(len(rows), 1)
        p = sum(x.prompt for x in rows) / n
        r = sum(x.response for x in rows) / n
        g = sum(x.genrm for x in rows) / n
        return {Role.ROLLOUT: p + r / 2.0, Role.REWARD: p + r + g / 2.0}

    # ------------------------------------------------------------------ event queue
    def _push(self, t: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, payload))

    def _reschedule(self, rid: str) -> None:
        rep = self.replicas.get(rid)
        if rep is None:
            return
        t = rep.next_finish()
        if t is not None:
            heapq.heappush(self._finishes, (t, next(self._seq), rid, rep.epoch))

    def _next(self) -> tuple[float, str, Any] | None:
        while self._finishes:
            t, _, rid, epoch = self._finishes[0]
            rep = self.replicas.get(rid)
            if rep is None or rep.epoch != epoch:
                heapq.heappop(self._finishes)
                continue
            break
        te = self._events[0][0] if self._events else float("inf")
        tf = self._finishes[0][0] if self._finishes else float("inf")
        if te == tf == float("inf"):
            return None
        if tf < te:
            t, _, rid, _ = heapq.heappop(self._finishes)
            return t, "finish", rid
        t, _, kind, payload = heapq.heappop(self._events)
        return t, kind, payload

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict[str, Any]:
        wall0 = time.perf_counter()
        if self.progress:
            from tqdm import tqdm

            self._bar = tqdm(total=self.s.steps, desc=f"sim {self.ctrl.name}", unit="step", leave=False)
        self._handle(Start(0.0))
        if self.ctrl.tick_s:
            self._push(self.ctrl.tick_s, "tick")
        if self.sample_s > 0:
            self._sample()
            self._push(self.sample_s, "sample")
        cap = self.cfg.models.sim.max_sim_time_s
        try:
            while not self.done:
                nxt = self._next()
                if nxt is None:
                    raise RuntimeError(f"simulation of {self.ctrl.name} stalled at t={self.now:.1f}s: no events "
                                       f"left before step {self.ctrl.step + 1}/{self.s.steps} (state {self.ctrl.state()})")
                t, kind, payload = nxt
                if kind not in ("tick", "sample"):
                    self._last_progress = t
                elif t - self._last_progress > STUCK_S:
                    raise RuntimeError(f"simulation of {self.ctrl.name} is stuck: nothing finished, shifted or "
                                       f"trained for {STUCK_S:.0f} simulated seconds before t={t:.0f}s "
                                       f"(state {self.ctrl.state()})")
                if t > cap:
                    raise RuntimeError(f"simulation passed models.sim.max_sim_time_s={cap}s at step {self.ctrl.step}")
                self.now = max(self.now, t)
                if kind == "finish":
                    self._on_replica(payload)
                elif kind == "tick":
                    self._handle(Tick(self.now, progress=self._snapshot()))
                    if not self.done:
                        self._push(self.now + self.ctrl.tick_s, "tick")
                elif kind == "sample":
                    self._sample()
                    self._push(self.now + self.sample_s, "sample")
                elif kind == "shift_done":
                    self._on_shift_done(*payload)
                elif kind == "train_done":
                    self.stats.train_end(self.now)
                    b, v, secs = payload
                    self._handle(TrainingDone(self.now, batch=b, version=v, seconds=secs,
                                              progress=self._snapshot()))
        finally:
            if self._bar is not None:
                self._bar.close()
        for rid in list(self.replicas):
            self.replicas[rid].advance(self.now)
        summary = self.stats.summary(self, time.perf_counter() - wall0)
        return summary

    def _on_replica(self, rid: str) -> None:
        rep = self.replicas[rid]
        rep.advance(self.now)
        role = self.role_of[rid]
        rep.relieve()  # KV full: the engine pauses its newest sequences
        while not self.done and self.replicas.get(rid) is rep:
            got = rep.pop_finished()
            if got is None:
                break
            sid, gen = got
            self.truth[role].pop(sid, None)
            rep.resume()
            self._handle(SequenceFinished(self.now, role=role, seq_id=sid, generated=gen, replica_id=rid))
        self._reschedule(rid)

    def _snapshot(self) -> dict[Role, dict[int, int]]:
        if not self.ctrl.tick_s:  # static modes never abort running sequences: skip the cost
            return {}
        out: dict[Role, dict[int, int]] = {r: {} for r in INFERENCE_ROLES}
        for rid, rep in self.replicas.items():
            rep.advance(self.now)
            out[self.role_of[rid]].update(rep.snapshot())
        return out

    def _role_tokens(self) -> dict[Role, float]:
        """Tokens emitted so far per role (retired replicas included), replicas advanced to now."""
        out = {r: self.stats.retired[r][2] for r in INFERENCE_ROLES}
        for rid, rep in self.replicas.items():
            rep.advance(self.now)
            out[self.role_of[rid]] += rep.tokens
        return out

    def _sample(self) -> None:
        """One `throughput` record (read-only: advancing a replica in pieces is exact)."""
        sch = self.ctrl.sched
        n = {r: float(sch[r].num_sequences()) for r in INFERENCE_ROLES}
        T = {r: float(sch[r].throughput()) for r in INFERENCE_ROLES}
        tokens = self._role_tokens()
        t0, tok0 = self._last_sample
        dt = self.now - t0
        actual = {r.value: ((tokens[r] - tok0[r]) / dt if dt > 0 else 0.0) for r in INFERENCE_ROLES}
        self._last_sample = (self.now, tokens)
        rec = {"now": self.now, "step": self.ctrl.step,
               "rollout": T[Role.ROLLOUT], "reward": T[Role.REWARD],
               "overall": eq1_throughput(n[Role.ROLLOUT], T[Role.ROLLOUT], n[Role.REWARD], T[Role.REWARD]),
               "n_rollout": n[Role.ROLLOUT], "n_reward": n[Role.REWARD],
               "actual": actual, "actual_total": sum(actual.values()),
               "allocation": self.ctrl.allocation(), "training": bool(self.ctrl.training)}
        self.stats.samples.append(rec)
        if self.tracker is not None:
            self.tracker.log_event("throughput", **rec)

    # ------------------------------------------------------------------ actions
    def _handle(self, ev) -> None:
        for act in self.ctrl.handle(ev):
            if isinstance(act, Dispatch):
                self._dispatch(act)
            elif isinstance(act, StartShift):
                self._start_shift(act)
            elif isinstance(act, StartTraining):
                self._start_training(act)
            elif isinstance(act, PublishWeights):
                for rid, rep in self.replicas.items():
                    if self.role_of[rid] == Role.ROLLOUT:
                        rep.advance(self.now)
                        rep.stall(self.publish_s)
                        self._reschedule(rid)
            elif isinstance(act, Record):
                self.stats.count_record(act)
                if self.tracker is not None:
                    self.tracker.log_event(act.kind, **act.fields)
            elif isinstance(act, StepDone):
                row = self.stats.step_done(self, act)
                if self.tracker is not None:
                    self.tracker.log_step(row)
                if self._bar is not None:
                    self._bar.update(1)
                    self._bar.set_postfix(tok_s=f"{row['throughput_tokens_per_s']:.0f}")
            elif isinstance(act, Finish):
                self.done = True
            else:
                raise TypeError(f"sim runtime cannot carry out {type(act).__name__}")

    def _dispatch(self, act: Dispatch) -> None:
        role, costs, wl = act.role, self.s.costs[act.role], self.s.workload
        dirty: dict[str, None] = {}  # ordered: a str set's order varies with PYTHONHASHSEED
        for mv in act.moves:
            rep = self.replicas[mv.replica_id]
            rep.advance(self.now)
            if mv.kind == "abort":
                self.truth[role][mv.seq_id] = rep.remove(mv.seq_id)
                rep.resume()
                self.stats.aborts += 1
            else:
                L = wl.lengths(mv.seq_id)
                gen = self.truth[role].get(mv.seq_id, 0)
                if role == Role.ROLLOUT:
                    prompt, target = L.prompt, L.response
                else:
                    prompt, target = L.prompt + L.response, L.genrm
                rep.add(mv.seq_id, prompt, gen, target, costs.model.prefill_time(prompt + gen))
                if gen:
                    self.stats.reprefills += 1
            dirty[mv.replica_id] = None
        for rid in dirty:
            self._reschedule(rid)

    def _start_shift(self, act: StartShift) -> None:
        plan, pol = act.plan, self.cfg.models.policy
        down_s = 0.0
        for s in plan.down:
            if s.role == Role.TRAIN:
                down_s = max(down_s, pol.train_shift_down_s)
                continue
            rep = self.replicas.pop(s.slot_id, None)
            if rep is None:
                raise RuntimeError(f"shift down of {s.slot_id}: no such replica")
            if not rep.empty:
                raise RuntimeError(f"shift down of {s.slot_id} with {rep.n + len(rep.paused)} sequences on it")
            rep.advance(self.now)
            self.stats.retire(rep, self.role_of.pop(s.slot_id))
            down_s = max(down_s, self.s.costs[s.role].shift_down_s)
        up_s = 0.0
        for s in plan.up:
            up_s = max(up_s, pol.train_shift_up_s if s.role == Role.TRAIN else self.s.costs[s.role].shift_up_s)
        self.stats.shift(plan, self.now, down_s + up_s)
        self._push(self.now + down_s + up_s, "shift_done", (plan, down_s, up_s))

    def _on_shift_done(self, plan, down_s: float, up_s: float) -> None:
        caps = {}
        for s in plan.up:
            if s.role in INFERENCE_ROLES:
                c = self.s.costs[s.role]
                self.replicas[s.slot_id] = SimReplica(s.slot_id, c.model, c.tp, self.now,
                                                      LOW_FRACTION * self.peak[s.role], c.kv_capacity)
                self.role_of[s.slot_id] = s.role
                caps[s.slot_id] = c.kv_capacity
        self._handle(ShiftDone(self.now, plan=plan, kv_capacity=caps, seconds=(down_s, up_s),
                               progress=self._snapshot()))

    def _start_training(self, act: StartTraining) -> None:
        m = self.cfg.models
        secs = tm.training_time(m.policy, self.cfg.cluster.hardware, m.sim, act.tokens, len(act.devices))
        self.stats.train_start(self.now, len(act.devices))
        self._push(self.now + secs, "train_done", (act.batch, act.version + 1, secs))


def simulate(cfg: PivotConfig, allocation: dict[Role, int] | None = None, steps: int | None = None,
             tracker: Any = None, progress: bool = False) -> dict[str, Any]:
    """One simulated run with a given allocation; returns its summary."""
    setup = SimSetup.from_config(cfg, allocation, steps)
    return SimRuntime(setup, tracker, progress).run()


def run_sim(cfg: PivotConfig, run_dir: Path, tracker: Any) -> dict[str, Any]:
    """`cluster=sim` entry (pivotrl.run's registry): resolve the allocation (sweeping baselines to
    their best static split unless `deploy.allocation` is given), simulate, and return the summary."""
    from pivotrl.sim.sweep import resolve_allocation

    alloc, info = resolve_allocation(cfg, progress=bool(cfg.logging.progress))
    if tracker is not None:
        tracker.log_event("allocation_choice", **info)
    summary = simulate(cfg, alloc, tracker=tracker, progress=bool(cfg.logging.progress))
    summary.update(allocation_choice=info)
    return summary
