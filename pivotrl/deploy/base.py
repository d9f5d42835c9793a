"""The deployment controller base: an event-driven state machine over the sample pipeline.

Owns what every mode shares: the two shift-aware schedulers (rollout, reward), the device
allocation (which role holds which device, active replicas, devices mid-shift), shift bookkeeping,
the sample pipeline and policy versions, and training start/finish. Modes are short subclasses that
override hooks (verl style): `initial_plans`, `may_release`, `on_response`, `on_rollouts_complete`,
`on_batch_ready`, `on_training_done`, `on_shift_done`, `on_tick`, `training_devices`.

Pure: imports only the standard library and the project's control-plane types. It never learns a
sequence's length before an event says it finished, so the `local` and `ray` runtimes can drive the
same controllers from real engines.

One RL step as a sequence of events (`deploy/events.py`) and actions, with the handler of each. The
runtime loop (`pivotrl/runtime/loop.py`) feeds every event to `handle` and hands every action to
the driver (`pivotrl/runtime/driver.py` on real devices, `pivotrl/sim/runtime.py` simulated):

  1. dispatch: `release` lets batch b out of the pipeline (staleness bound, hook `may_release`,
     `ControlEnv.batch_barrier`) into the rollout scheduler; `dispatch` returns `Dispatch` moves;
     the driver starts (or aborts and resumes) the sequences on their replicas (`Driver.dispatch`).
  2. sequence finished (rollout): `SequenceFinished` -> `_on_finished`: the scheduler frees its KV,
     `pipe.response_done` makes the sample's GenRM sequence (none if its judge prompt repeats an
     earlier one of the batch, `shares_judgement_of`: it takes that one's judgement in 4), and the
     freed rollout capacity is dispatched again. Once every response of b is done: hook
     `on_rollouts_complete` (the phased modes switch the pool to reward there).
  3. judge: hook `on_response` (default `submit_reward`) submits the GenRM sequence to the reward
     scheduler and dispatches it (`ControlEnv.reward_batch_barrier` holds them until the batch's
     rollouts are all done). The judge prompt itself is the driver's: it renders it from the
     finished response (`runtime/samples.py: Samples.judge_prompt`), and scores the judgement.
  4. batch ready: the reward `SequenceFinished` -> `_on_finished` -> `pipe.reward_done` (also for
     the samples sharing that judgement); when it is b's last, a `BatchReady` goes straight to hook
     `on_batch_ready` (default `try_train`; pivot also plans; colocated switches the pool to
     training).
  5. train: `try_train` emits `StartTraining` once the batch is ready, no step runs and training
     holds devices (hook `training_devices`); the driver trains it (`Driver.start_training`) and
     answers `TrainingDone` -> `_on_training_done`, which moves the pipeline to version v+1.
  6. publish: `_on_training_done` emits `PublishWeights(v+1)`; the driver brings the rollout
     replicas to the new version (`Driver.publish`).
  7. step done: `_on_training_done` emits `StepDone` (the loop writes the metrics row with the
     driver's `step_fields`), then `Finish` after the last step, else hook `on_training_done`
     (pivot: keep or shift down the training devices, plan) and `release` for the batches the new
     version allows: back to 1.
Alongside: `Start` -> `_on_start` (hook `initial_plans` -> `start_shift` -> `StartShift`, then
`release`); `ShiftDone` -> `_on_shift_done` (replicas up, migration, `tau_shift`; hook
`on_shift_done`, default `try_train`); `Tick` -> hook `on_tick` (pivot: rebalance and plan);
progress reports on `Tick`/`ShiftDone`/`TrainingDone` -> `_apply_progress`; `ReplicaLost` ->
`replica_lost`; `DeviceLost` -> `device_lost`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pivotrl.config.planner import PivotPlannerConfig, PlannerConfig
from pivotrl.core.scheduler import ShiftAwareScheduler
from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.training_time import TrainTimeFit, TrainTimeModel
from pivotrl.core.types import INFERENCE_ROLES, Role, Sequence, ShiftPlan, Slot
from pivotrl.deploy.events import (
    Action, BatchReady, DeviceLost, Dispatch, Event, Finish, PublishWeights, Record, ReplicaLost, SequenceFinished,
    ShiftDone, Start, StartShift, StartTraining, StepDone, Tick, TrainingDone,
)
from pivotrl.deploy.pipeline import PromptSource, SamplePipeline


@dataclass
class ControlEnv:
    """What a runtime tells a controller at construction (all plain values)."""

    num_devices: int
    node_size: int
    tp: dict[Role, int]
    """Replica size of rollout and reward."""
    models: dict[Role, ThroughputModel]
    """Throughput model of a rollout and a reward replica (fitted or derived by the runtime)."""
    tau_shift: dict[Role, float]
    """Estimated seconds for one shift (up + down) of a replica of each role, TRAIN included."""
    prompts: PromptSource
    prompts_per_step: int
    group_size: int
    steps: int
    staleness: int
    allocation: dict[Role, int] = field(default_factory=dict)
    """Devices per role for static modes (rr_colocated: ROLLOUT is the shared pool), TRAIN for pivot."""
    planner: PlannerConfig = field(default_factory=PivotPlannerConfig)
    kv_reserve: int = 0
    kv_capacity: dict[Role, int] = field(default_factory=dict)
    """The runtime's estimate of one new replica's KV capacity (tokens) per role, for planning."""
    batch_barrier: bool = False
    """Release batch b+1 only once every response of batch b is done (verl's batch-synchronous
    rollout: `generate_sequences` returns a whole batch), on top of the staleness bound. The sim
    sets it from `models.sim.rollout_batch_barrier`; real runtimes stream (False)."""
    reward_batch_barrier: bool = False
    """Hold a batch's GenRM sequences until every response of the batch is done, then submit them
    together (verl scores a batch after its rollout: `reward.compute_reward(batch)`). The sim
    sets it for deploy=disaggregated from `models.sim.reward_batch_barrier`; False = streaming."""
    max_num_seqs: dict[Role, int] = field(default_factory=dict)
    """Sequences one replica's engine runs at once per role (vLLM `max_num_seqs`); the schedulers
    admit no more per replica. Absent = no cap."""
    train_model: TrainTimeModel | None = None
    """Seconds of a training step on W devices before any is measured (None: none; the first
    measured step starts the online fit). With `train_model_fixed` it is the truth (the
    simulator's own clock) and is never refitted."""
    train_model_fixed: bool = False
    reshard_s: float = 0.0
    """Seconds to move the trainer's state to another layout and back, before one is measured."""


class DeviceLostError(RuntimeError):
    """A device left the pool and a role can no longer run without it."""


#: Weight of a new measurement in the `tau_shift` average (recent shifts matter most).
TAU_EMA = 0.5


def role_slots(role: Role, first: int, devices: int, tp: int) -> list[Slot]:
    """Slots of `role` covering `devices` devices from `first`, one replica per `tp` devices."""
    if devices % tp or first % tp:
        raise ValueError(f"{role.value}: {devices} devices from device {first} are not whole aligned "
                         f"replicas of tp={tp}")
    return [Slot(role, d, tp) for d in range(first, first + devices, tp)]


class Controller:
    """Base controller. Subclasses pick the allocation and when to shift; the pipeline is shared."""

    name = "base"
    tick_s: float | None = None  # monitor ticks wanted (None = none)
    replans = False  # whether the mode shifts devices at run time (a role may regain devices)

    def __init__(self, env: ControlEnv) -> None:
        if env.num_devices < 1:
            raise ValueError(f"cluster.num_devices must be >= 1, got {env.num_devices}")
        self.env = env
        self.pipe = SamplePipeline(env.prompts_per_step, env.group_size, env.steps, env.staleness)
        self.sched: dict[Role, ShiftAwareScheduler] = {
            r: ShiftAwareScheduler(r, env.models[r], kv_reserve=env.kv_reserve,
                                   max_num_seqs=env.max_num_seqs.get(r)) for r in INFERENCE_ROLES}
        self.owner: list[Role | None] = [None] * env.num_devices
        self.active: dict[Role, dict[str, Slot]] = {r: {} for r in INFERENCE_ROLES}
        self.pending: set[int] = set()
        self.in_flight: list[ShiftPlan] = []
        self.train_slot: Slot | None = None      # the training unit's slot while it holds devices
        self.training: bool = False
        self.lost: set[int] = set()
        """Devices that left the pool for good (`device_lost`): pending forever, in no plan."""
        self.step = 0
        self.num_shifts = 0
        self.step_shifts = 0
        self.migrate = env.planner.migration
        self.kv_capacity: dict[Role, int] = dict(env.kv_capacity)
        self._held: dict[int, list[Sequence]] = {}  # batch -> GenRM sequences (reward_batch_barrier)
        self.tau_shift: dict[Role, float] = dict(env.tau_shift)
        """Seconds one shift (up + down) of a replica of each role takes: the runtime's prior,
        then an exponential average of `ShiftDone.measured` (weight `TAU_EMA`)."""
        self.train_fit = TrainTimeFit(env.train_model, node_size=env.node_size, fixed=env.train_model_fixed)
        """Seconds of a training step vs world size and tokens, fitted from `TrainingDone`."""
        self.reshard_s = float(env.reshard_s)
        """Seconds to reshard the trainer's state there and back: the prior, then an exponential
        average of `TrainingDone.reshard_s` (weight `TAU_EMA`)."""
        self._train_run: tuple[int, int] = (0, 0)  # (world, tokens) of the step in flight

    # ------------------------------------------------------------------ public API for runtimes
    def resume(self, version: int) -> None:
        """Start at policy `version` (a checkpoint's): batches before it are trained. Call
        before `Start`."""
        self.pipe.resume(version)
        self.step = int(version)

    def set_throughput_model(self, role: Role, model: ThroughputModel) -> None:
        """A refitted throughput model of `role`'s replicas, for the scheduler and the planner."""
        self.env.models[role] = model
        self.sched[role].set_model(model)

    def pending_devices(self) -> frozenset[int]:
        """Devices mid-shift (their replica is re-hosted by the shift itself)."""
        return frozenset(self.pending)

    def replica_lost(self, role: Role, replica_id: str, now: float) -> list[Action]:
        """The engine of an active replica was replaced by a fresh, empty one (its device died and
        was respawned): its sequences go back to the queue with the tokens the scheduler knows,
        and the queue is dispatched. The runtime keeps each sequence's true tokens for its resume."""
        s = self.sched[role]
        acts: list[Action] = [Record("replica_lost", {"now": now, "role": role.value, "replica": replica_id,
                                                      "sequences": len(s.replicas[replica_id].running)
                                                      if replica_id in s.replicas else 0})]
        if replica_id in s.replicas:
            s.abort(replica_id, "all")  # bookkeeping only: the fresh engine holds nothing to abort
        return acts + self.dispatch(role)

    def device_lost(self, device: int, now: float) -> list[Action]:
        """Device `device` left the pool for good (it crashed too often). Its replica is shifted down
        (its sequences go back to the queue and are dispatched to the other replicas), and no plan
        uses it again: it stays pending (the planner skips pending devices) and plans that name it
        drop its slots. Raises `DeviceLostError` when a role can no longer run: the device belongs
        to the training unit, or its role has no replica left and the mode never shifts devices."""
        if not 0 <= device < self.env.num_devices:
            raise ValueError(f"device {device} is not one of this controller's {self.env.num_devices} devices")
        if self.train_slot is not None and device in self.train_slot.devices:
            raise DeviceLostError(f"device {device} left the pool, and it is a training device: training "
                                  f"cannot run without it (deploy={self.name})")
        self.lost.add(device)
        self.pending.add(device)
        self.owner[device] = None
        acts: list[Action] = [Record("device_lost", {"now": now, "device": device})]
        for role in INFERENCE_ROLES:
            gone = [rid for rid, s in self.active[role].items() if device in s.devices]
            if not gone:
                continue
            for rid in gone:
                del self.active[role][rid]
            coming = any(s.role == role for p in self.in_flight for s in p.up)
            if not self.active[role] and not coming and not self.replans:
                raise DeviceLostError(f"device {device} left the pool with the last {role.value} replica, and "
                                      f"deploy={self.name} does not shift devices at run time: {role.value} "
                                      f"can no longer run")
            moves = self.sched[role].shift_down(gone)
            if moves:
                acts.append(Dispatch(role, moves))
        return acts

    def _without_lost(self, plan: ShiftPlan) -> ShiftPlan:
        """`plan` without the slots of lost devices (a training slot on one cannot run: an error)."""
        def ok(s: Slot) -> bool:
            return not any(d in self.lost for d in s.devices)

        for s in plan.up + plan.down:
            if s.role == Role.TRAIN and not ok(s):
                raise DeviceLostError(f"the {self.name} plan needs training slot {s.slot_id}, but device(s) "
                                      f"{sorted(d for d in s.devices if d in self.lost)} left the pool: training "
                                      f"can no longer run")
        up = [s for s in plan.up if ok(s)]
        if plan.up and not up and plan.role_up in INFERENCE_ROLES and not self.active[plan.role_up] \
                and not self.replans:
            raise DeviceLostError(f"every device of the {plan.role_up.value} slots of this {self.name} plan left "
                                  f"the pool: {plan.role_up.value} can no longer run")
        return ShiftPlan(plan.role_up, up=up, down=[s for s in plan.down if ok(s)], penalty=plan.penalty)

    # ------------------------------------------------------------------ event entry
    def handle(self, ev: Event) -> list[Action]:
        """React to one event; return the actions to carry out, in order."""
        if isinstance(ev, (Tick, ShiftDone, TrainingDone)):
            self._apply_progress(ev.progress)
        if isinstance(ev, Start):
            return self._on_start(ev)
        if isinstance(ev, SequenceFinished):
            return self._on_finished(ev)
        if isinstance(ev, ShiftDone):
            return self._on_shift_done(ev)
        if isinstance(ev, TrainingDone):
            return self._on_training_done(ev)
        if isinstance(ev, Tick):
            return self.on_tick(ev)
        if isinstance(ev, BatchReady):
            return self.on_batch_ready(ev)
        if isinstance(ev, ReplicaLost):
            return self.replica_lost(ev.role, ev.replica_id, ev.now)
        if isinstance(ev, DeviceLost):
            return self.device_lost(ev.device, ev.now)
        raise TypeError(f"unknown event {type(ev).__name__}")

    def _apply_progress(self, progress: dict[Role, dict[int, int]]) -> None:
        """Engines' token counts into the schedulers. Every sequence of a replica advanced by the
        same count since the last report except those that joined since, so one `advance` per
        replica covers the common part and only the rest need a per-sequence `progress`.
        (The pivot controller needs current counts for its planner; static modes get no reports.)"""
        for role, counts in progress.items():
            if not counts:
                continue
            s = self.sched[role]
            for rid, rep in s.replicas.items():
                if not rep.running:
                    continue
                deltas = [(seq, counts.get(sid, seq.generated) - seq.generated) for sid, seq in rep.running.items()]
                common = min(d for _, d in deltas)
                if common > 0:
                    s.advance(rid, common)
                base = max(common, 0)
                # a one-token lag is noise (engines report mid-iteration); it is caught up on the
                # next report, so counts stay within a token of the truth and never drop
                ahead = {seq.seq_id: seq.generated + d - base for seq, d in deltas if d > base + 1}
                if ahead:
                    s.progress_replica(rid, ahead)

    # ------------------------------------------------------------------ pipeline
    def _on_start(self, ev: Start) -> list[Action]:
        acts: list[Action] = []
        for plan in self.initial_plans():
            acts += self.start_shift(plan, ev.now)
        acts += self.release(ev.now)
        return acts

    def release(self, now: float) -> list[Action]:
        """Release every batch the staleness bound and the mode allow, and dispatch."""
        released = False
        while (self.pipe.can_release() and self.may_release(self.pipe.next_release)
               and (not self.env.batch_barrier or self.pipe.next_release <= self.pipe.version
                    or self.pipe.rollouts_complete(self.pipe.next_release - 1))):
            b = self.pipe.next_release
            self.sched[Role.ROLLOUT].submit(self.pipe.release(self.env.prompts.prompts(b), now))
            released = True
        return self.dispatch(Role.ROLLOUT) if released else []

    def dispatch(self, role: Role) -> list[Action]:
        moves = self.sched[role].dispatch()
        return [Dispatch(role, moves)] if moves else []

    def _on_finished(self, ev: SequenceFinished) -> list[Action]:
        s = self.sched[ev.role]
        if s.where(ev.seq_id) is None:
            raise RuntimeError(f"{ev.role.value} seq {ev.seq_id} finished but is not in the scheduler")
        s.finish(ev.seq_id)  # frees exactly the KV the scheduler booked; the true count is ev.generated
        acts: list[Action] = []
        if ev.role == Role.ROLLOUT:
            rseq = self.pipe.response_done(ev.seq_id, ev.generated, ev.now, ev.shares_judgement_of)
            b = self.pipe.batch_of(ev.seq_id)
            if rseq is not None:  # None: it shares an earlier sample's judgement, no GenRM sequence
                if self.env.reward_batch_barrier:
                    self._held.setdefault(b, []).append(rseq)
                else:
                    acts += self.on_response(rseq, ev.now)
            acts += self.dispatch(Role.ROLLOUT)
            if self.pipe.rollouts_complete(b):
                for held in self._held.pop(b, []):
                    acts += self.on_response(held, ev.now)
                acts += self.on_rollouts_complete(b, ev.now)
                if self.env.batch_barrier:
                    acts += self.release(ev.now)
            if rseq is None and self.pipe.batch_ready(b):  # its shared judgement was the batch's last
                acts += self.on_batch_ready(BatchReady(ev.now, b))
        else:
            complete = self.pipe.reward_done(ev.seq_id, ev.generated, ev.now)
            acts += self.dispatch(Role.REWARD)
            if complete:
                acts += self.on_batch_ready(BatchReady(ev.now, self.pipe.batch_of(ev.seq_id)))
        return acts

    def held_judgements(self) -> int:
        """GenRM sequences held back until their batch's rollouts are done (`reward_batch_barrier`)."""
        return sum(map(len, self._held.values()))

    def submit_reward(self, seq: Sequence) -> list[Action]:
        self.sched[Role.REWARD].submit([seq])
        return self.dispatch(Role.REWARD)

    def try_train(self, now: float) -> list[Action]:
        """Start the next training step if its batch is ready and training devices are held."""
        if self.training or not self.pipe.train_ready():
            return []
        devices = self.training_devices()
        if not devices:
            return []
        b, ids, tokens = self.pipe.start_training(now)
        self.training = True
        self._train_run = (len(devices), tokens)
        home = self.training_home()
        return [StartTraining(b, self.pipe.version, ids, tokens, devices,
                              home=home if home and tuple(devices) != home else ())]

    def _on_training_done(self, ev: TrainingDone) -> list[Action]:
        fig = self.pipe.training_done(ev.batch, ev.now)
        self.training = False
        if ev.version != self.pipe.version:
            raise RuntimeError(f"runtime reports version {ev.version}, pipeline is at {self.pipe.version}")
        world = ev.world or self._train_run[0]
        self.train_fit.observe(world, self._train_run[1], ev.seconds)
        if ev.reshard_s is not None:
            self.reshard_s = (1 - TAU_EMA) * self.reshard_s + TAU_EMA * ev.reshard_s if self.reshard_s else ev.reshard_s
        fig.update(train_s=ev.seconds, train_world=world, reshard_s=ev.reshard_s or 0.0, shifts=self.step_shifts,
                   allocation=self.allocation())
        self.step += 1
        self.step_shifts = 0
        acts: list[Action] = [PublishWeights(self.pipe.version), StepDone(self.step, ev.batch, self.pipe.version, fig)]
        if self.pipe.finished:
            return acts + [Finish()]
        acts += self.on_training_done(ev)
        acts += self.release(ev.now)
        return acts

    # ------------------------------------------------------------------ allocation
    def allocation(self) -> dict[str, int]:
        """Devices per role now (pending devices count for the role they are shifting to)."""
        out = {r.value: 0 for r in (Role.ROLLOUT, Role.REWARD, Role.TRAIN)}
        out["free"] = 0
        for o in self.owner:
            out[o.value if o is not None else "free"] += 1
        return out

    def start_shift(self, plan: ShiftPlan, now: float) -> list[Action]:
        """Begin a plan: move sequences off down replicas now, mark devices pending, ask the runtime.
        Slots on lost devices are left out (`device_lost`)."""
        if self.lost:
            plan = self._without_lost(plan)
            if plan.empty:
                return []
        acts: list[Action] = []
        for role in INFERENCE_ROLES:
            ids = [s.slot_id for s in plan.down if s.role == role]
            if ids:
                for i in ids:
                    del self.active[role][i]
                moves = self.sched[role].shift_down(ids)
                if moves:
                    acts.append(Dispatch(role, moves))
        for s in plan.down:
            if s.role == Role.TRAIN:
                if self.training:
                    raise RuntimeError("a plan shifts down training while it runs a step")
                self.train_slot = None
        for s in plan.down + plan.up:
            for d in s.devices:
                self.pending.add(d)
                self.owner[d] = None
        for s in plan.up:
            for d in s.devices:
                self.owner[d] = plan.role_up
        self.in_flight.append(plan)
        acts.append(Record("shift", {"now": now, "role_up": plan.role_up.value,
                                     "up": [x.slot_id for x in plan.up], "down": [x.slot_id for x in plan.down],
                                     "penalty": plan.penalty}))
        self.num_shifts += len(plan.up) + len(plan.down)
        self.step_shifts += len(plan.up) + len(plan.down)
        acts.append(StartShift(plan))
        return acts

    def _on_shift_done(self, ev: ShiftDone) -> list[Action]:
        plan = ev.plan
        if plan is None or plan not in self.in_flight:
            raise RuntimeError("ShiftDone for a plan this controller did not start")
        self.in_flight.remove(plan)
        for role, secs in ev.measured.items():
            old = self.tau_shift.get(role)
            self.tau_shift[role] = secs if old is None else (1 - TAU_EMA) * old + TAU_EMA * secs
        for s in plan.down + plan.up:
            self.pending.difference_update(s.devices)
        self.pending |= self.lost
        acts: list[Action] = []
        ups = [s for s in plan.up if s.role in INFERENCE_ROLES]
        if ups:
            role = ups[0].role
            for s in ups:
                self.active[role][s.slot_id] = s
                self.kv_capacity[role] = ev.kv_capacity[s.slot_id]
            moves = self.sched[role].shift_up([(s.slot_id, ev.kv_capacity[s.slot_id]) for s in ups],
                                              migrate=self.migrate)
            if moves:
                acts.append(Dispatch(role, moves))
        for s in plan.up:
            if s.role == Role.TRAIN:
                self.train_slot = s
        acts.append(Record("allocation", {"now": ev.now, "allocation": self.allocation(),
                                          "shift_seconds": list(ev.seconds)}))
        return acts + self.on_shift_done(ev)

    def training_devices(self) -> tuple[int, ...]:
        """Devices training may use now (empty = not held)."""
        return self.train_slot.devices if self.train_slot is not None else ()

    def training_home(self) -> tuple[int, ...]:
        """The training home set, where its state lives between steps (empty: the mode trains on
        whatever `training_devices` says, always the same set)."""
        return ()

    # ------------------------------------------------------------------ hooks
    def initial_plans(self) -> list[ShiftPlan]:
        return []

    def may_release(self, batch: int) -> bool:
        """Mode-specific gate on top of the staleness bound."""
        return True

    def on_response(self, reward_seq: Sequence, now: float) -> list[Action]:
        """A response finished; default: stream its GenRM sequence to the reward scheduler."""
        return self.submit_reward(reward_seq)

    def on_rollouts_complete(self, batch: int, now: float) -> list[Action]:
        return []

    def on_batch_ready(self, ev: BatchReady) -> list[Action]:
        return self.try_train(ev.now)

    def on_training_done(self, ev: TrainingDone) -> list[Action]:
        return self.try_train(ev.now)

    def on_shift_done(self, ev: ShiftDone) -> list[Action]:
        return self.try_train(ev.now)

    def on_tick(self, ev: Tick) -> list[Action]:
        return []

    # ------------------------------------------------------------------ introspection
    def state(self) -> dict[str, Any]:
        return {"version": self.pipe.version, "released": self.pipe.next_release,
                "training": self.training, "allocation": self.allocation(),
                "queued": {r.value: self.sched[r].queued() for r in INFERENCE_ROLES}}
