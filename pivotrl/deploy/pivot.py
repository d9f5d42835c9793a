"""`pivot`: any device may hold any role; a planner shifts devices at run time (paper §7).

Owns the pivot mode's hooks on top of the shared pipeline: building the planner's `ClusterView`
snapshot, calling the configured strategy (`deploy.planner.strategy`, core's registry) on every
monitor tick, on batch-ready, on training-done and when a shift frees devices, and applying the
chosen plan through the base controller (shift down -> scheduler migration -> shift up).

Training has a fixed home device set (the last `deploy.allocation.train` devices; its optimizer
state lives in their host memory). The strategy plans the training shift up when a batch is ready;
when a step finishes the controller shifts training down and the freed devices go back to
inference at the next planner call (penalty 0). Every decision is recorded to the timeline.

Elastic training (`deploy.planner.elastic_training`, DESIGN §4.6): the planner may instead train
on a bigger slot ending at the home set's last device, of `home + j * align` devices (`align` the
largest replica size, so the slot takes whole replicas; at most `deploy.planner.
elastic_max_devices`). The controller tells it the sizes, the ready batch's tokens, the training-
time model fitted online from the steps (`Controller.train_fit`), the measured reshard seconds,
the inference work already released and the run's tokens per second (`deploy/elastic.py`). The
grown slot is shifted down as a whole after the step, like the home set; with a batch already
waiting the planner prices keeping it against re-forming it at another size.
"""
from __future__ import annotations

import time

from pivotrl.core.types import INFERENCE_ROLES, Role, ShiftPlan, Slot
from pivotrl.deploy.base import ControlEnv, Controller, role_slots
from pivotrl.deploy.elastic import ElasticTraining, elastic_sizes

from pivotrl.deploy.events import Action, BatchReady, Dispatch, Record, ShiftDone, Tick, TrainingDone


class PivotController(Controller):
    """Planner-driven shifting between rollout, reward and training."""

    name = "pivot"
    replans = True

    def __init__(self, env: ControlEnv) -> None:
        super().__init__(env)
        from pivotrl.core.strategies import make_strategy  # core's registry (pure)

        tr = env.allocation.get(Role.TRAIN, 0)
        n = env.num_devices
        if not 1 <= tr <= n:
            raise ValueError(f"deploy.allocation.train (pivot's training home set) must be in [1, {n}], got {tr}")
        self.home = Slot(Role.TRAIN, n - tr, tr)
        self.strategy = make_strategy(env.planner)
        # vanilla runs without migration whatever the config says: the strategy knows
        self.migrate = bool(getattr(self.strategy, "migration", env.planner.migration))
        self.tick_s = env.planner.tick_s
        pc = env.planner
        align = max(env.tp[Role.ROLLOUT], env.tp[Role.REWARD])
        self.elastic = ElasticTraining(elastic_sizes(n, tr, align, getattr(pc, "elastic_max_devices", None))
                                       if getattr(pc, "elastic_training", False) else (tr,))
        """Elastic training's sizes and its estimates (the home size alone without it)."""
        self.planner_seconds = 0.0
        self.planner_calls = 0
        self.decisions = 0

    def initial_plans(self) -> list[ShiftPlan]:
        """Start state: training holds its home set (idle: no batch is ready), and the other
        devices are split evenly between reward and rollout in whole aligned blocks (one block
        only: rollout, where the work starts). Idle training is a zero-penalty blocker, so the
        pivot strategy hands the home set out at its first tick; strategies that move only some
        devices (`static`, `rule`) need this split, or a role would never get a device."""
        tp_ro, tp_rm = self.env.tp[Role.ROLLOUT], self.env.tp[Role.REWARD]
        align = max(tp_ro, tp_rm)
        rest = self.home.first_device  # devices [0, rest) are outside the home set
        rest -= rest % tp_ro
        half = (rest // 2) // align * align
        plans = [ShiftPlan(Role.TRAIN, up=[self.home])]
        if half:
            plans.append(ShiftPlan(Role.REWARD, up=role_slots(Role.REWARD, 0, half, tp_rm)))
        if rest > half:
            plans.append(ShiftPlan(Role.ROLLOUT, up=role_slots(Role.ROLLOUT, half, rest - half, tp_ro)))
        return plans

    def training_home(self) -> tuple[int, ...]:
        return self.home.devices

    def disable_elastic(self) -> None:
        """Keep training on its home set from now on (the runtime cannot hold its state in host
        memory: it says why in the log)."""
        self.elastic.sizes = (self.home.tp,)

    # ------------------------------------------------------------------ planner
    def view(self, now: float):
        from pivotrl.core.planner import ClusterView, TrainView

        train_up = [s for p in self.in_flight for s in p.up if s.role == Role.TRAIN]
        held = self.train_slot or (train_up[0] if train_up else None)
        return ClusterView(
            now=now, num_devices=self.env.num_devices, node_size=self.env.node_size,
            tp={r: self.env.tp[r] for r in INFERENCE_ROLES},
            owner=list(self.owner),
            active={r: list(self.active[r].values()) for r in INFERENCE_ROLES},
            schedulers=dict(self.sched),
            train=TrainView(home=self.home.devices,
                            holds_devices=held is not None,
                            running=self.training,
                            batch_ready=self.pipe.train_ready(),
                            devices=held.devices if held is not None and held != self.home else (),
                            elastic=self.elastic.view(self, now)),
            tau_shift=dict(self.tau_shift),
            pending=frozenset(self.pending),
            kv_capacity=dict(self.kv_capacity),
        )

    def plan(self, now: float, trigger: str) -> list[Action]:
        t0 = time.perf_counter()
        decision = self.strategy.decide(self.view(now))
        dt = time.perf_counter() - t0
        self.elastic.decided(decision, self)
        self.planner_seconds += dt
        self.planner_calls += 1
        acts: list[Action] = []
        plans = [p for p in decision.plans if not p.empty]
        if plans or decision.candidates:  # no-op ticks with nothing to weigh stay out of the timeline
            rec = decision.to_record()
            rec.update(trigger=trigger, planner_s=dt, applied=bool(plans))
            acts.append(Record("decision", rec))
        if plans:
            self.decisions += 1
            for p in plans:  # static's second role comes as an extra plan
                acts += self.start_shift(p, now)
        return acts

    # ------------------------------------------------------------------ hooks
    def on_tick(self, ev: Tick) -> list[Action]:
        acts: list[Action] = []
        pc = self.env.planner
        if pc.rebalance and self.migrate:  # beyond the paper (deploy.planner.rebalance)
            for role in INFERENCE_ROLES:
                moves = self.sched[role].rebalance(pc.rebalance_min_gain)
                if moves:
                    acts.append(Dispatch(role, moves))
        return acts + self.plan(ev.now, "tick")

    def on_batch_ready(self, ev: BatchReady) -> list[Action]:
        self.elastic.batch_ready(ev.batch, ev.now)
        return self.try_train(ev.now) + self.plan(ev.now, "batch_ready")

    def on_training_done(self, ev: TrainingDone) -> list[Action]:
        # training done -> its home devices go back to the pool (shift down, then free)
        if self.train_slot is not None and self.pipe.train_ready():
            if self.elastic.on:  # elastic: the planner may re-form the trainer first (else it trains on),
                # once the batch the new version lets out is released: its work is what the devices
                # the trainer would take are needed for
                acts = self.release(ev.now)
                return acts + self.plan(ev.now, "training_done") + self.try_train(ev.now)
            return self.try_train(ev.now)  # the next batch is already waiting: keep the devices
        acts: list[Action] = []
        if self.train_slot is not None:
            acts += self.start_shift(ShiftPlan(Role.TRAIN, up=[], down=[self.train_slot]), ev.now)
        return acts + self.plan(ev.now, "training_done")

    def on_shift_done(self, ev: ShiftDone) -> list[Action]:
        acts = self.try_train(ev.now)
        if ev.plan is not None and not ev.plan.up:  # devices were freed: hand them out now
            acts += self.plan(ev.now, "devices_freed")
        return acts
