"""`cluster=local`: real RL on virtual devices (Ray actors on this machine), driven by the same
deployment controllers, schedulers and planner as the simulator.

Owns the driver loop: it feeds the controller events that come from real engines (a sequence
finished, a shift or training step completed, a monitor tick), carries out its actions through the
executor (moves, shifts, training, weight publishes), keeps the truth about every sequence (its
tokens so far, which device runs it), scores responses (verifiable + GenRM), and writes the run's
records (metrics.jsonl, timeline.jsonl, summary.json through the `Tracker`).

Decisions:
- Shifts and training steps run in driver threads (they block on their devices); the main thread
  alone talks to the controller, so the controller never sees two events at once.
- A completion is accepted only from the device the runtime last placed that sequence on; a
  completion that raced an abort comes back with the abort and is delivered once, after the
  current actions (never re-submitted). Trained sample ids are checked for duplicates.
- A dead inference device is respawned, re-hosts its replica (cold), and its sequences go back to
  the queue with their last reported tokens (`scheduler.abort`), then the queue is dispatched. A
  dead training rank is fatal (its process group is gone): the run stops with that error.
- The throughput model starts from a prior and is refitted online from engine iteration samples
  (`monitor.py`); `tau_shift` starts at `runtime.tau_shift_prior_s` and follows measured shifts.
- Behaviour log-probs travel with the tokens. Every token the driver keeps for a sequence (poll
  deltas, abort results, completions) is a `protocol.TokensSoFar` carrying the engine's log-prob
  of each token under the distribution it was sampled from; a resume hands them back to the next
  engine, and a rollout's completed list becomes its `TrainBatch.old_log_probs`, with which the
  trainer corrects for staleness (`runtime.off_policy`, `TrainerConfig.off_policy`: decoupled PPO
  by default; before behaviour log-probs reached the trainer, stale samples were trained as
  on-policy and with staleness 2 the tiny policy degraded). A sample whose log-probs are unknown (a resume from tokens without them) makes its
  batch fall back to the trainer's recomputed ones (ratio 1), counted as `logprobs_missing`.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from pivotrl.config.runtime import RuntimeConfig
from pivotrl.core.types import INFERENCE_ROLES, Role, Slot
from pivotrl.deploy import make_controller
from pivotrl.engines.protocol import TokensSoFar, logprobs_of
from pivotrl.deploy.events import (
    Dispatch, Finish, PublishWeights, Record, SequenceFinished, ShiftDone, Start, StartShift, StartTraining,
    StepDone, Tick, TrainingDone,
)
from pivotrl.runtime.local_setup import LocalSetup
from pivotrl.runtime.monitor import Monitor

log = logging.getLogger(__name__)


def join_tokens(have: list[int] | None, delta: list[int]) -> TokensSoFar:
    """`have + delta` as a `TokensSoFar`; its log-probs are known only if both parts' are (an
    empty `have` is known: nothing generated yet)."""
    have = [] if have is None else have
    a = logprobs_of(have) if have else []
    b = logprobs_of(delta)
    return TokensSoFar([*have, *delta], None if a is None or b is None else [*a, *b])


class LocalRuntime:
    """One real run: controller + executor + device polls."""

    def __init__(self, setup: LocalSetup, tracker: Any = None) -> None:
        self.s = setup
        self.cfg = setup.cfg
        self.rt: RuntimeConfig = setup.rt
        self.tracker = tracker
        self.ex = setup.executor
        self.ctrl = make_controller(self.cfg.deploy.mode, setup.control_env())
        self.monitor = Monitor()
        self.tokens: dict[Role, dict[int, list[int]]] = {r: {} for r in INFERENCE_ROLES}
        self.placed: dict[Role, dict[int, int]] = {r: {} for r in INFERENCE_ROLES}
        self.judge_ids: dict[int, list[int]] = {}
        self.responses: dict[int, list[int]] = {}
        self.versions: dict[int, int] = {}
        self.logprobs: dict[int, list[float] | None] = {}  # rollout sid -> behaviour log-probs
        self.rewards: dict[int, Any] = {}
        self.trained_ids: list[int] = []
        self.train_metrics: dict[int, dict[str, float]] = {}
        self.results: queue.Queue = queue.Queue()
        self.polls: dict[int, Any] = {}
        self.poll_gen: dict[int, int] = {}
        self.threads: list[threading.Thread] = []
        self.deferred: list[Any] = []
        self.done = False
        self.t0 = time.monotonic()
        self.last_step_end = 0.0
        self.window0: float | None = None
        self.rows: list[dict[str, Any]] = []
        self.counts = {"aborts": 0, "resumes": 0, "shifts": 0, "device_deaths": 0, "stale_completions": 0,
                       "logprobs_missing": 0}
        self.busy = {r.value: 0.0 for r in (*INFERENCE_ROLES, Role.TRAIN)}
        self.held = {k: 0.0 for k in ("rollout", "reward", "train", "free")}
        # driver wall seconds (cumulative, in metrics rows as `driver_s`): in the controller's
        # `handle` (scheduling and planner decisions) and in carrying out dispatches (aborts and
        # submits on the devices). No completion is taken in and nothing is dispatched meanwhile:
        # the simulator, whose control plane takes no time, cannot see it.
        self.driver_s = {"control": 0.0, "dispatch": 0.0}

    @property
    def now(self) -> float:
        return time.monotonic() - self.t0

    # ------------------------------------------------------------------ main loop
    def _resume_controller(self) -> None:
        """Start the controller at the checkpoint's step: batches before it are trained.

        The deploy package has no resume entry yet, so this sets the three counters a fresh
        controller would have after `k` steps (pipeline version and next batch, step count)."""
        k = self.s.resume_version
        if not k:
            return
        pipe = self.ctrl.pipe
        pipe.version, pipe.next_release = k, k
        self.ctrl.step = k
        self._record("resume", version=k, checkpoint=str(self.s.resume_path))

    def run(self) -> dict[str, Any]:
        import ray

        self._resume_controller()
        self._handle(Start(self.now))
        tick_s = self.ctrl.tick_s
        next_tick = self.now + tick_s if tick_s else None
        next_fit = self.now + self.rt.fit_every_s
        last = self.now
        while not self.done:
            t = self.now
            for r in self.ex.role_of.values():  # device-seconds each role held (time per role)
                self.held[r.value if r is not None else "free"] += t - last
            last = t
            if self.now > self.rt.max_wall_s:
                raise RuntimeError(f"local run passed runtime.max_wall_s={self.rt.max_wall_s}s at step "
                                   f"{self.ctrl.step}/{self.s.steps} (state {self.ctrl.state()})")
            for d, role in self.ex.role_of.items():
                if role in INFERENCE_ROLES and d not in self.polls:
                    self.polls[d] = self.ex.actors[d].poll.remote(self.rt.poll_s)
                    self.poll_gen[d] = self.ex.generation[d]
            refs = list(self.polls.values())
            if refs:
                ready, _ = ray.wait(refs, num_returns=1, timeout=self.rt.poll_s)
                if ready:
                    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                by_ref = {r: d for d, r in self.polls.items()}
                for ref in ready:
                    d = by_ref[ref]
                    del self.polls[d]
                    self._on_poll(d, ref)
                    if self.done:
                        break
            else:
                time.sleep(self.rt.poll_s)
            while not self.done:
                try:
                    item = self.results.get_nowait()
                except queue.Empty:
                    break
                self._on_result(item)
            self._flush_deferred()
            if not self.done and next_tick is not None and self.now >= next_tick:
                self._handle(Tick(self.now, progress=self._progress()))
                next_tick = self.now + tick_s
            if not self.done and self.now >= next_fit:
                self._refit()
                next_fit = self.now + self.rt.fit_every_s
            self.threads = [t for t in self.threads if t.is_alive()]
            if not self.done and not self.polls and not self.threads and self.results.empty() \
                    and not any(self.placed[r] for r in INFERENCE_ROLES) and not self.deferred \
                    and not any(self.ex.role_of[d] in INFERENCE_ROLES for d in self.ex.role_of):
                raise RuntimeError(f"local run stalled at step {self.ctrl.step}/{self.s.steps}: no work "
                                   f"in flight (state {self.ctrl.state()})")
        for t in self.threads:
            t.join(timeout=60)
        return self._summary()

    def _progress(self) -> dict[Role, dict[int, int]]:
        return {r: {sid: len(self.tokens[r].get(sid, ())) for sid in self.placed[r]} for r in INFERENCE_ROLES}

    # ------------------------------------------------------------------ device events
    def _on_poll(self, d: int, ref: Any) -> None:
        import ray

        try:
            res = ray.get(ref)
        except Exception as e:
            if isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError)):
                self._on_death(d, f"poll: {type(e).__name__}", self.poll_gen.get(d))
                return
            raise
        if res.error is not None:
            self._on_death(d, f"engine error: {res.error}", self.poll_gen.get(d))
            return
        role = self.ex.role_of.get(d)
        if role not in INFERENCE_ROLES or res.role != role.value:
            return  # a poll that straddled a shift: nothing of this role is left on it
        new = 0
        for sid, toks in res.progress.items():
            if self.placed[role].get(sid) == d:
                self.tokens[role][sid] = join_tokens(self.tokens[role].get(sid), toks)
                new += len(toks)
        self.monitor.ingest(role, d, res.stats, new)
        for c in res.completions:
            self._complete(role, d, c)
            if self.done:
                return

    def _complete(self, role: Role, d: int, c: Any) -> None:
        if self.placed[role].get(c.seq_id) != d:
            self.counts["stale_completions"] += 1
            return
        del self.placed[role][c.seq_id]
        self.tokens[role][c.seq_id] = TokensSoFar(c.token_ids, c.logprobs)
        if role == Role.ROLLOUT:
            self.responses[c.seq_id] = list(c.token_ids)
            self.logprobs[c.seq_id] = None if c.logprobs is None else list(c.logprobs)
            self.versions[c.seq_id] = int(c.version)
            self.judge_ids[c.seq_id] = self.s.judge_prompt(c.seq_id, c.token_ids)
        else:
            self.rewards[c.seq_id] = self.s.score(c.seq_id, self.responses[c.seq_id], c.token_ids)
        self._handle(SequenceFinished(self.now, role=role, seq_id=c.seq_id, generated=len(c.token_ids),
                                      replica_id=Slot(role, d, self.s.tp[role]).slot_id))

    def _on_death(self, d: int, why: str, generation: int | None = None, respawned: bool = False) -> None:
        """Respawn `d`, re-host its replica, and send its sequences back to the queue with tokens.

        `generation` is that of the handle that failed: if someone already replaced the device (a
        shift thread, which re-hosts it as part of its shift), nothing more is done here."""
        import ray

        if not respawned and not self.ex.respawn(d, why, generation):
            return
        role = self.ex.lost_role.pop(d, None)
        self.counts["device_deaths"] += 1
        self.monitor.forget(d)
        self.polls.pop(d, None)
        lost = sorted(sid for sid, dd in self.placed[role].items() if dd == d) if role in INFERENCE_ROLES else []
        self._record("device_death", device=d, role=getattr(role, "value", None), why=why, sequences=lost,
                     tokens_kept={sid: len(self.tokens[role].get(sid, ())) for sid in lost})
        if role == Role.TRAIN:
            raise RuntimeError(f"device {d} (a training rank) died ({why}); its process group is lost")
        if role not in INFERENCE_ROLES:
            return
        slot = Slot(role, d, self.s.tp[role])
        if d not in self.ctrl.pending:  # mid-shift devices are re-hosted by their shift
            ref, version = self.ex.params.read(self.ex.model_of[role])
            ray.get(self.ex.actors[d].shift_up.remote(self.s.role_spec(slot, 0), ref, version))
            self.ex.role_of[d] = role
        for sid in lost:
            del self.placed[role][sid]
        sched = self.ctrl.sched[role]
        if slot.slot_id in sched.replicas:
            sched.abort(slot.slot_id, "all")  # bookkeeping only: the fresh engine holds nothing
        for act in self.ctrl.dispatch(role):
            self._execute(act)

    # ------------------------------------------------------------------ threads
    def _spawn(self, fn, *args: Any) -> None:
        def body() -> None:
            try:
                self.results.put(fn(*args))
            except BaseException as e:  # re-raised in the main thread
                self.results.put(("error", e))

        t = threading.Thread(target=body, daemon=True)
        t.start()
        self.threads.append(t)

    def _on_result(self, item: tuple) -> None:
        kind = item[0]
        if kind == "error":
            raise item[1]
        if kind == "shift":
            res = item[1]
            if res.error is not None:
                raise res.error
            for d in res.dead:
                self.counts["device_deaths"] += 1
            for s in res.plan.down:
                for d in s.devices:
                    self.monitor.forget(d)
            self._record("shift_timing", role_up=res.plan.role_up.value, down_s=res.seconds[0],
                         up_s=res.seconds[1], devices=res.timings, dead=sorted(res.dead),
                         tau_shift={r.value: v for r, v in self.ex.tau_shift.items()})
            self._handle(ShiftDone(self.now, plan=res.plan, kv_capacity=res.kv_capacity, seconds=res.seconds,
                                   progress=self._progress()))
        elif kind == "train":
            _, act, metrics, secs = item
            self.train_metrics[act.batch] = metrics
            self.busy["train"] += secs * len(act.devices)
            self._handle(TrainingDone(self.now, batch=act.batch, version=int(metrics["version"]), seconds=secs,
                                      progress=self._progress()))

    def _train(self, act: StartTraining) -> tuple:
        import ray

        dup = set(act.sample_ids) & set(self.trained_ids)
        if dup:
            raise RuntimeError(f"samples {sorted(dup)[:8]} would be trained twice")
        self.trained_ids.extend(act.sample_ids)
        batch = self.s.train_batch(act.sample_ids, {sid: self.rewards[sid].total for sid in act.sample_ids},
                                   self.responses, self.versions, self.logprobs)
        if batch.old_log_probs is None:
            self.counts["logprobs_missing"] += 1
            log.warning("batch %d: some samples have no behaviour log-probs; training them as on-policy",
                        act.batch)
        t0 = time.perf_counter()
        ref = ray.put(batch)
        metrics = self.ex.train_call(act.devices, "train_step", ref)[0]
        full = self.ex.train_call(act.devices, "full_state_dict")[0]
        secs = time.perf_counter() - t0
        self.ex.params.publish("policy", full)
        version = int(metrics["version"])
        if self.s.checkpoint_dir is not None and version % self.cfg.train.checkpoint_every == 0:
            from pivotrl.engines.trainer import checkpoint_dir

            path = str(checkpoint_dir(self.s.checkpoint_dir, version))
            self.ex.train_call(act.devices, "save_checkpoint", path, {"step": version, "batch": act.batch})
        return ("train", act, metrics, secs)

    # ------------------------------------------------------------------ actions
    def _handle(self, ev: Any) -> None:
        t0 = time.perf_counter()
        acts = self.ctrl.handle(ev)
        self.driver_s["control"] += time.perf_counter() - t0
        for act in acts:
            self._execute(act)
            if self.done:
                return

    def _execute(self, act: Any) -> None:
        if isinstance(act, Dispatch):
            self._dispatch(act)
        elif isinstance(act, StartShift):
            self.counts["shifts"] += len(act.plan.up) + len(act.plan.down)
            self._spawn(lambda p=act.plan: ("shift", self.ex.run_shift(p)))
        elif isinstance(act, StartTraining):
            self._spawn(self._train, act)
        elif isinstance(act, PublishWeights):
            ref, version = self.ex.params.read("policy")
            self._await_publish(self.ex.publish_to_rollout(ref, version), version)
        elif isinstance(act, Record):
            if self.tracker is not None:
                self.tracker.log_event(act.kind, **act.fields)
        elif isinstance(act, StepDone):
            self._step_done(act)
        elif isinstance(act, Finish):
            self.done = True
        else:
            raise TypeError(f"local runtime cannot carry out {type(act).__name__}")

    def _await_publish(self, refs: dict[int, Any], version: int) -> None:
        """Wait until every rollout replica holds `version` before the controller's next actions
        run. The device actors are threaded, so a `submit` sent right after an unawaited
        `load_weights` could be admitted first, under the old weights: its sample would then be
        older than the controller's staleness accounting assumes, the trainer would reject it,
        and a batch rejected whole leaves the trainer's version behind the pipeline's (seen:
        "runtime reports version 12, pipeline is at 13"). A dead device is left to its poll.

        Records one `weight_refresh` timeline record: `{"kind": "weight_refresh", "version": v,
        "devices": [{"device": d, "seconds": s}, ...], "wait_s": w}` where `s` is the time device
        `d`'s engine spent loading the weights (its decode stalls that long: `DeviceWorker.
        load_weights`; devices that were found dead or had no active engine are left out) and `w`
        the driver's wall time from sending the loads to the last one done."""
        import ray

        t0 = time.perf_counter()
        per: list[dict[str, Any]] = []
        for d, r in refs.items():
            try:
                secs = ray.get(r, timeout=120)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as e:
                log.warning("publish of policy version %d hit a dead device: %s", version, type(e).__name__)
                continue
            if secs is not None:
                per.append({"device": int(d), "seconds": float(secs)})
        self._record("weight_refresh", version=int(version), devices=per, wait_s=time.perf_counter() - t0)

    def _dispatch(self, act: Dispatch) -> None:
        role = act.role
        t0 = time.perf_counter()
        res = self.ex.execute_moves(role, act.moves, self._request)
        self.driver_s["dispatch"] += time.perf_counter() - t0
        for sid, toks in res.aborted.items():
            if len(toks) >= len(self.tokens[role].get(sid, ())):
                self.tokens[role][sid] = TokensSoFar(toks, logprobs_of(toks))
            self.placed[role].pop(sid, None)
            self.counts["aborts"] += 1
        finished = {c.seq_id for _, c in res.finished}
        for mv in act.moves:
            if mv.kind == "abort":
                self.placed[role].pop(mv.seq_id, None)
            elif mv.seq_id not in finished:
                self.placed[role][mv.seq_id] = self.ex.device_of(mv.replica_id)
                if self.tokens[role].get(mv.seq_id):
                    self.counts["resumes"] += 1
        for d, c in res.finished:  # raced its abort: deliver once, after the current actions
            self.placed[role][c.seq_id] = d
            self.deferred.append((role, d, c))
        for d in res.dead:
            self.deferred.append(("dead", d))

    def _flush_deferred(self) -> None:
        while self.deferred and not self.done:
            item = self.deferred.pop(0)
            if item[0] == "dead":
                self._on_death(item[1], "found dead while executing moves", respawned=True)
            else:
                self._complete(*item)

    def _request(self, role: Role, sid: int) -> Any:
        return self.s.request(role, sid, self.tokens[role].get(sid, []), self.judge_ids.get(sid))

    # ------------------------------------------------------------------ fits and records
    def _refit(self) -> None:
        for role in INFERENCE_ROLES:
            model = self.monitor.fit(role)
            if model is None:
                continue
            self.ctrl.env.models[role] = model
            sched = self.ctrl.sched[role]
            sched.model = model
            sched._rebuild_arrays()  # core has no public setter yet (reported)
            self._record("throughput_fit", role=role.value, A=model.A, B=model.B, C=model.C, D=model.D,
                         P0=model.P0, P1=model.P1, P2=model.P2, samples=len(self.monitor.samples(role)))

    def _record(self, kind: str, **fields: Any) -> None:
        if self.tracker is not None:
            self.tracker.log_event(kind, now=self.now, **fields)

    def _record_sample_lengths(self, batch: int, ids: list[int]) -> None:
        """One `sample_lengths` timeline record for a trained batch (read by `pivotrl.sim.replay`,
        `RunRecords.sample_lengths`): `{"kind": "sample_lengths", "batch": b, "samples":
        [[sample_id, prompt_tokens, response_tokens, genrm_tokens], ...]}`, one row per trained
        sample in id order: the rollout prompt's tokens, the response's tokens, and the tokens the
        GenRM generated judging it (the same counts the controller's pipeline saw)."""
        rows = []
        for sid in sorted(ids):
            prompt = len(self.s.prompt_ids[self.s.example_of(sid)])
            rows.append([int(sid), prompt, len(self.responses.get(sid, ())),
                         len(self.tokens[Role.REWARD].get(sid, ()))])
        self._record("sample_lengths", batch=int(batch), samples=rows)

    def _step_done(self, act: StepDone) -> None:
        f = dict(act.fields)
        now = self.now
        step_time = now - self.last_step_end
        ids = [s for s in self.trained_ids if self.s.batch_of(s) == act.batch]
        self._record_sample_lengths(act.batch, ids)
        rw = [self.rewards[s] for s in ids if s in self.rewards]
        tm = self.train_metrics.get(act.batch, {})
        row = {
            "step": act.step, "time_s": now, "step_time_s": step_time,
            "throughput_tokens_per_s": f.get("tokens", 0) / step_time if step_time > 0 else 0.0,
            "reward_mean": sum(r.total for r in rw) / max(1, len(rw)),
            "train_accuracy": sum(r.verifiable for r in rw) / max(1, len(rw)),
            "genrm_score_mean": sum(r.genrm for r in rw) / max(1, len(rw)),
            "genrm_parse_failures": sum(1 for r in rw if not r.genrm_ok),
            "loss": tm.get("loss"), "grad_norm": tm.get("grad_norm"),
            "samples_rejected_stale": tm.get("samples_rejected_stale"),
            # PPO ratio vs the clip reference (the behaviour policy, or with decoupled PPO the
            # step's proximal policy); behaviour_is_*: how far off-policy the batch was (decoupled)
            "ratio_mean": tm.get("ratio_mean"), "clipfrac": tm.get("clipfrac"), "approx_kl": tm.get("approx_kl"),
            "behaviour_is_mean": tm.get("behaviour_is_mean"), "behaviour_is_truncated": tm.get("behaviour_is_truncated"),
            "tau_shift": {r.value: v for r, v in self.ex.tau_shift.items()},
            "role_state": {r.value: vars(self.monitor.state(r, self.ctrl.sched[r])) for r in INFERENCE_ROLES},
            "driver_s": dict(self.driver_s),
            **self.counts, **f,
        }
        self.last_step_end = now
        self.rows.append(row)
        if act.step == self.s.warmup:
            self.window0 = now
        if self.tracker is not None:
            self.tracker.log_step(row)
        if self.s.progress:
            print(f"[pivotrl local {self.ctrl.name}] step {act.step}/{self.s.steps} "
                  f"{step_time:.1f}s reward={row['reward_mean']:.3f} acc={row['train_accuracy']:.3f} "
                  f"tok/s={row['throughput_tokens_per_s']:.0f} shifts={f.get('shifts', 0)}", flush=True)

    def _summary(self) -> dict[str, Any]:
        measured = [r for r in self.rows if r["step"] > self.s.warmup]
        t0 = self.window0 if self.window0 is not None else 0.0
        span = (self.rows[-1]["time_s"] - t0) if self.rows else 0.0
        tokens = sum(r["tokens"] for r in measured)
        return {
            "deploy": self.ctrl.name, "models": self.cfg.models.name, "cluster": "local",
            "devices": self.s.num_devices, "steps": len(self.rows), "warmup_steps": self.s.warmup,
            "measured_steps": len(measured),
            "prompts_per_step": self.s.P, "group_size": self.s.G,
            "throughput_tokens_per_s": tokens / span if span > 0 and measured else
            (sum(r["tokens"] for r in self.rows) / self.rows[-1]["time_s"] if self.rows else 0.0),
            "measured_tokens": tokens, "measured_time_s": span,
            "ideal_efficiency": None,  # no per-device peak is measured on shared cores (see report)
            "num_shifts": self.counts["shifts"],
            "shift_log": self.ex.shift_log,
            "tau_shift": {r.value: v for r, v in self.ex.tau_shift.items()},
            "train_busy_device_s": self.busy["train"],
            "device_seconds_by_role": dict(self.held),
            "samples_trained": len(self.trained_ids),
            "samples_trained_unique": len(set(self.trained_ids)),
            "policy_version": self.ctrl.pipe.version,
            "device_deaths": self.counts["device_deaths"],
            "aborts": self.counts["aborts"], "resumes": self.counts["resumes"],
            "stale_completions_dropped": self.counts["stale_completions"],
            "batches_without_behaviour_logprobs": self.counts["logprobs_missing"],
            "step_time_s": [r["step_time_s"] for r in self.rows],
            "reward_mean": [r["reward_mean"] for r in self.rows],
            "train_accuracy": [r["train_accuracy"] for r in self.rows],
            "wall_s": self.now,
        }


def run_real(cfg: Any, run_dir: Path, tracker: Any, accelerator: str = "cpu") -> dict[str, Any]:
    """Validate, run the RL loop on real devices, validate again; always tear down. Shared by
    `cluster=local` (CPU virtual devices) and `cluster=ray` (GPUs)."""
    from pivotrl.logging.teardown import close_all

    setup = LocalSetup(cfg, cfg.cluster.runtime, Path(run_dir), accelerator=accelerator)
    error: BaseException | None = None
    try:
        setup.start()
        before = setup.val_accuracy(None)
        summary = {"val_accuracy_before": before["sampled"], "val_accuracy_greedy_before": before["greedy"]}
        summary.update(LocalRuntime(setup, tracker).run())
        if accelerator == "cuda":
            summary["cluster"] = "ray"
        after = setup.val_accuracy("policy")
        summary.update(val_accuracy_after=after["sampled"], val_accuracy_greedy_after=after["greedy"])
        summary["bootstrap"] = setup.bootstrap_info
        return summary  # pivotrl.run prints the closing table (pivotrl.report.table)
    except BaseException as e:
        error = e
        raise
    finally:  # the run's own error stays the one raised; a teardown error is logged after it
        close_all(error, [("shutting down the devices and Ray", setup.close)])


def run_local(cfg: Any, run_dir: Path, tracker: Any) -> dict[str, Any]:
    """`cluster=local` entry (pivotrl.run's registry). Ray and the devices are always torn down."""
    return run_real(cfg, run_dir, tracker, accelerator="cpu")
