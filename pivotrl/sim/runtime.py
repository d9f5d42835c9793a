"""`cluster=sim`: the discrete-event driver of the runtime loop on a simulated cluster.

Owns the simulated clock (its event queue is `pivotrl.sim.clock`), the replicas' ground truth
(`SimReplica`), and carrying out the controller's actions (dispatch/abort moves with prefill and
re-prefill, shifts with their durations, training steps, weight publishes). The loop, the action dispatch, ticks and the records
are the shared ones (`pivotrl.runtime.loop`, `pivotrl.runtime.recorder`); the control plane is the
real one: the same controllers, schedulers and planner the other runtimes use (DESIGN §1-2, §5).
Subclasses change the physics through hooks (`training_seconds`, `shift_seconds`,
`training_finished`, `after_event`), as the replay of real runs does (`pivotrl.sim.replay`).

Events: sequence completions (per replica, computed in closed form by `SimReplica`), shift
completions, training completions, monitor ticks and throughput samples. Between events nothing is
stepped.

Throughput samples (`models.sim.throughput_sample_s`, Fig. 10) are read-only records the controller
never sees (`pivotrl.sim.sampling`); the event queue is `pivotrl.sim.clock`.

Token counts reach the controller the way a real engine would report them: on completion, and as a
progress snapshot on ticks, shift and training completions (pivot only; the static modes never
abort a running sequence). Scheduler dispatch between snapshots sees K up to one tick stale.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterator

from pivotrl.config import PivotConfig
from pivotrl.config.resolve import resolve
from pivotrl.core.types import INFERENCE_ROLES, Role
from pivotrl.deploy import make_controller
from pivotrl.deploy.events import (
    Dispatch, PublishWeights, Record, SequenceFinished, ShiftDone, StartShift, StartTraining, StepDone, Tick,
    TrainingDone,
)
from pivotrl.sim import timemodel as tm
from pivotrl.sim.clock import PASSIVE, EventQueue
from pivotrl.sim.engine import SimReplica
from pivotrl.sim.metrics import RunStats
from pivotrl.sim.sampling import ThroughputSampler
from pivotrl.sim.setup import SimSetup

if TYPE_CHECKING:
    from pivotrl.core.types import ShiftPlan
    from pivotrl.deploy.events import Event
    from pivotrl.logging.tracker import Tracker
    from pivotrl.runtime.recorder import Recorder

PHASED_MODES = ("colocated", "rr_colocated")  # swap models on a shared pool at phase boundaries
STUCK_S = 3600.0  # simulated seconds with only ticks happening and nothing scheduled = deadlocked
LOW_FRACTION = 0.2  # "below 20 % of peak per-device throughput" (paper Fig. 3)


class SimDriver:
    """The simulator's `Driver` (`pivotrl.runtime.loop`): replicas, event queue and clock."""

    name = "simulation"
    fit_every_s = None  # the simulated engines run on the model the controller has

    def __init__(self, setup: SimSetup, tracker: Tracker | None = None, progress: bool = False) -> None:
        self.s = setup
        self.cfg = setup.cfg
        self.tracker = tracker
        self.ctrl = make_controller(self.cfg.deploy.mode, setup.control_env())
        self._first_judged: dict[tuple[int, int], int] = {}  # (batch, judge key) -> its first finished sample
        self.t = 0.0
        self.queue = EventQueue()
        self.replicas: dict[str, SimReplica] = {}
        self.role_of: dict[str, Role] = {}
        self.truth: dict[Role, dict[int, int]] = {r: {} for r in INFERENCE_ROLES}  # aborted: generated
        m = self.cfg.models
        self.publish_s = tm.publish_time(m.policy, m.sim)
        ctx = self._contexts()
        self.peak = {r: c.peak_per_device(ctx[r]) for r, c in setup.costs.items()}
        self.stats = RunStats(setup, self.peak)
        self.rec: Recorder | None = None  # the run's `Recorder` (rows, measurement window), set by `run`
        self.progress = progress
        self._bar = None
        self._last_progress = 0.0
        self.sampler = ThroughputSampler(self.cfg.models.sim.throughput_sample_s)
        self.wall_limit = ("models.sim.max_sim_time_s", float(self.cfg.models.sim.max_sim_time_s))
        self._wall0 = time.perf_counter()

    @property
    def now(self) -> float:
        return self.t

    def _contexts(self) -> dict[Role, float]:
        """Mean KV length of a running sequence per role, from the workload's first batch."""
        rows = [x for row in self.s.workload.batch_lengths(0) for x in row]
        n = max(len(rows), 1)
        p = sum(x.prompt for x in rows) / n
        r = sum(x.response for x in rows) / n
        g = sum(x.genrm for x in rows) / n
        return {Role.ROLLOUT: p + r / 2.0, Role.REWARD: p + r + g / 2.0}

    def reschedule(self, rid: str) -> None:
        """Queue replica `rid`'s next completion after a change to it (subclass hooks use this too)."""
        self.queue.watch(rid, self.replicas.get(rid))

    # ------------------------------------------------------------------ Driver: events
    def run(self) -> dict[str, Any]:
        """This simulation through the shared loop; returns the summary (records to `tracker`)."""
        from pivotrl.runtime.loop import RunLoop
        from pivotrl.runtime.recorder import Recorder

        r = resolve(self.cfg)
        rec = self.rec = Recorder(self.tracker, mode=self.ctrl.name, models=self.cfg.models.name, runtime="sim",
                                  devices=self.s.num_devices, steps=self.s.steps, warmup=self.s.warmup,
                                  prompts_per_step=r.prompts_per_step, group_size=r.group_size,
                                  load_every_s=float(self.cfg.models.sim.throughput_sample_s))
        if self.progress:
            from tqdm import tqdm

            self._bar = tqdm(total=self.s.steps, desc=f"sim {self.ctrl.name}", unit="step", leave=False)
        try:
            return RunLoop(self.ctrl, self, rec).run()
        finally:
            if self._bar is not None:
                self._bar.close()

    def schedule_tick(self, at: float) -> None:
        self.queue.push(at, "tick")

    def idle(self) -> bool:
        return self.queue.empty()

    def wait(self) -> Iterator[Event]:
        """The next event(s) of the queue; a generator, so a replica's finishes interleave with the
        controller's reactions to each (exactly as one engine step would deliver them)."""
        smp = self.sampler
        if smp.sample_s > 0 and not smp.started:  # after Start and the first tick are queued
            smp.started = True
            self._sample()
            self.queue.push(smp.sample_s, "sample")
        nxt = self.queue.pop(self.replicas)
        if nxt is None:
            raise RuntimeError(f"simulation of {self.ctrl.name} stalled at t={self.t:.1f}s: no events "
                               f"left before step {self.ctrl.step + 1}/{self.s.steps} (state {self.ctrl.state()})")
        t, kind, payload = nxt
        if kind not in PASSIVE:
            self._last_progress = t
        elif t - self._last_progress > STUCK_S and not self.queue.work_pending(self.replicas):
            raise RuntimeError(f"simulation of {self.ctrl.name} is stuck: nothing finished, shifted or "
                               f"trained for {STUCK_S:.0f} simulated seconds before t={t:.0f}s "
                               f"(state {self.ctrl.state()})")
        self.t = max(self.t, t)
        if kind == "finish":
            yield from self._on_replica(payload)
        elif kind == "tick":
            yield Tick(self.t, progress=self._snapshot())
        elif kind == "sample":
            self._sample()
            self.queue.push(self.t + smp.sample_s, "sample")
        elif kind == "shift_done":
            yield self._on_shift_done(*payload)
        elif kind == "train_done":
            self.training_finished()
            b, v, secs, reshard = payload
            yield TrainingDone(self.t, batch=b, version=v, seconds=secs - (reshard or 0.0), progress=self._snapshot(),
                               reshard_s=reshard)

    def _on_replica(self, rid: str) -> Iterator[Event]:
        rep = self.replicas[rid]
        rep.advance(self.t)
        role = self.role_of[rid]
        rep.relieve()  # KV full: the engine pauses its newest sequences
        while self.replicas.get(rid) is rep:
            got = rep.pop_finished()
            if got is None:
                break
            sid, gen = got
            self.truth[role].pop(sid, None)
            rep.resume()
            yield SequenceFinished(self.t, role=role, seq_id=sid, generated=gen, replica_id=rid,
                                   shares_judgement_of=self._shares_judgement(sid) if role == Role.ROLLOUT else -1)
        self.reschedule(rid)

    def _shares_judgement(self, sid: int) -> int:
        """The first finished sample of `sid`'s batch with the same judge prompt
        (`SampleLengths.judge_key`), whose judgement `sid` shares; -1 if none."""
        key = self.s.workload.lengths(sid).judge_key
        if key < 0:
            return -1
        first = self._first_judged.setdefault((self.ctrl.pipe.batch_of(sid), key), sid)
        return -1 if first == sid else first

    def _snapshot(self) -> dict[Role, dict[int, int]]:
        if not self.ctrl.tick_s:  # static modes never abort running sequences: skip the cost
            return {}
        out: dict[Role, dict[int, int]] = {r: {} for r in INFERENCE_ROLES}
        for rid, rep in self.replicas.items():
            rep.advance(self.t)
            out[self.role_of[rid]].update(rep.snapshot())
        return out

    def _sample(self) -> None:
        rec = self.sampler.sample(self.t, self.ctrl, self.replicas, self.role_of, self.stats)
        if self.tracker is not None:
            self.tracker.log_event("throughput", **rec)

    # ------------------------------------------------------------------ Driver: actions
    def publish(self, act: PublishWeights) -> None:
        for rid, rep in self.replicas.items():
            if self.role_of[rid] == Role.ROLLOUT:
                rep.advance(self.t)
                rep.stall(self.publish_s)
                self.reschedule(rid)

    def record(self, act: Record) -> None:
        self.stats.count_record(act)

    def refit(self) -> dict:
        return {}

    def step_fields(self, act: StepDone, now: float) -> dict[str, Any]:
        row = self.stats.step_done(self, act)
        if self._bar is not None:
            step_s = now - self.rec.last_step_end
            self._bar.update(1)
            self._bar.set_postfix(tok_s=f"{act.fields['tokens'] / step_s if step_s > 0 else 0.0:.0f}")
        return row

    def finish(self) -> dict[str, Any]:
        for rid in list(self.replicas):
            self.replicas[rid].advance(self.t)
        return self.stats.summary(self, time.perf_counter() - self._wall0, self.rec)

    def dispatch(self, act: Dispatch) -> None:
        role, costs, wl = act.role, self.s.costs[act.role], self.s.workload
        dirty: dict[str, None] = {}  # ordered: a str set's order varies with PYTHONHASHSEED
        for mv in act.moves:
            rep = self.replicas[mv.replica_id]
            rep.advance(self.t)
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
            self.reschedule(rid)

    def start_shift(self, act: StartShift) -> None:
        plan = act.plan
        for s in plan.down:
            if s.role == Role.TRAIN:
                continue
            rep = self.replicas.pop(s.slot_id, None)
            if rep is None:
                raise RuntimeError(f"shift down of {s.slot_id}: no such replica")
            if not rep.empty:
                raise RuntimeError(f"shift down of {s.slot_id} with {rep.n + len(rep.paused)} sequences on it")
            rep.advance(self.t)
            self.stats.retire(rep, self.role_of.pop(s.slot_id))
        down_s, up_s = self.shift_seconds(plan)
        self.stats.shift(plan, self.t, down_s + up_s)
        self.queue.push(self.t + down_s + up_s, "shift_done", (plan, down_s, up_s))

    def _on_shift_done(self, plan, down_s: float, up_s: float) -> ShiftDone:
        caps = {}
        for s in plan.up:
            if s.role in INFERENCE_ROLES:
                c = self.s.costs[s.role]
                self.replicas[s.slot_id] = SimReplica(s.slot_id, c.model, c.tp, self.t,
                                                      LOW_FRACTION * self.peak[s.role], c.kv_capacity,
                                                      c.max_num_seqs, c.seq_tokens)
                self.role_of[s.slot_id] = s.role
                caps[s.slot_id] = c.kv_capacity
        return ShiftDone(self.t, plan=plan, kv_capacity=caps, seconds=(down_s, up_s), progress=self._snapshot())

    def start_training(self, act: StartTraining) -> None:
        secs = self.training_seconds(act)
        reshard = self.reshard_seconds(act)
        self.stats.train_start(self.t, len(act.devices))
        self.queue.push(self.t + secs + (reshard or 0.0), "train_done", (act.batch, act.version + 1, secs + (reshard or 0.0),
                                                                        reshard))

    # ------------------------------------------------------------------ physics hooks (subclasses)
    def shift_seconds(self, plan: ShiftPlan) -> tuple[float, float]:
        """(down, up) seconds of `plan`: the slowest replica of each half (the time model's). The
        phased modes with `models.sim.phase_switch: sleep` swap inference models by vLLM
        sleep/wake (weights only, `RoleCosts.swap_s` each way), as verl's colocated engines do."""
        pol = self.cfg.models.policy
        swap = self.ctrl.name in PHASED_MODES and self.cfg.models.sim.phase_switch == "sleep"

        def inference(role: Role, up: bool) -> float:
            c = self.s.costs[role]
            return c.swap_s if swap else (c.shift_up_s if up else c.shift_down_s)

        down_s = max([pol.train_shift_down_s if s.role == Role.TRAIN else inference(s.role, False)
                      for s in plan.down] or [0.0])
        up_s = max([pol.train_shift_up_s if s.role == Role.TRAIN else inference(s.role, True)
                    for s in plan.up] or [0.0])
        return down_s, up_s

    def training_seconds(self, act: StartTraining) -> float:
        """Seconds of the training step `act` on its devices (the MFU model and the collectives
        across nodes: `timemodel.training_model`)."""
        m = self.cfg.models
        return tm.training_time(m.policy, self.cfg.cluster.hardware, m.sim, act.tokens, len(act.devices),
                                self.cfg.cluster.node_size, self.cfg.algo.ppo_mini_batches * self.cfg.algo.ppo_epochs)

    def reshard_seconds(self, act: StartTraining) -> float | None:
        """Seconds the step `act` spends moving the trainer's state from its home layout to its
        devices and back (`timemodel.reshard_time`); None when it runs on its home set."""
        if not act.home:
            return None
        return tm.reshard_time(self.cfg.models.policy, self.cfg.cluster.hardware, len(act.devices),
                               self.cfg.cluster.node_size)

    def training_finished(self) -> None:
        """A training step ends now (before its `TrainingDone` reaches the controller)."""
        self.stats.train_end(self.t)

    def after_event(self) -> None:
        """Called by the loop after each event's actions were carried out."""


def simulate(cfg: PivotConfig, allocation: dict[Role, int] | None = None, steps: int | None = None,
             tracker: Tracker | None = None, progress: bool = False) -> dict[str, Any]:
    """One simulated run with a given allocation; returns its summary."""
    return SimDriver(SimSetup.from_config(cfg, allocation, steps), tracker, progress).run()
