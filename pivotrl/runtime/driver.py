"""The real devices' `Driver` of the runtime loop (`cluster=local` and `cluster=ray`).

Owns what happens on real devices between the controller's decisions: polls, moves, shifts and
training steps (driver threads; `training.TrainingSteps`), weight publishes through the executor
(each rollout device reads its node's GPS copy itself), device deaths, and the run's own figures
(`RealStats`). The truth about every sequence is the `SequenceLedger`; requests, judge prompts,
rewards and batches are `Samples`'; the devices themselves are the `Launch`'s.

Decisions:
- Shifts and training steps run in driver threads (they block on their devices); their results
  come back through a queue and become events in `wait`: the controller sees one event at a time.
- A completion is accepted only from the device the ledger placed that sequence on; one that
  raced an abort is delivered once, after the current actions.
- Submits are not waited for: the assigns of one batch of events go out together, one call per
  device, when `wait` next turns to the devices (`submits.Submits`: aborts and shifts wait for
  them first; deaths and errors surface at the next `wait`).
- Deaths: whichever call finds a device dead respawns it (`Executor.respawn`, one `Death` each);
  the driver takes each death once (`Executor.take_deaths`, the run's one count): a dead
  inference device re-hosts its replica (cold) unless a shift holds it, and its sequences go back
  to the queue with their tokens (`ReplicaLost`). Until then no move reaches its fresh actor. A
  dead training rank stops the run saying how to resume; a lost offloaded trainer state (a
  training-home device lent to inference) is rebuilt from the checkpoint at the policy's version
  on the next training shift up (`Launch.recover_training`), or the run stops saying why.
- Crash loops: a device that died more than `cluster.max_respawns` times within
  `cluster.respawn_window_s` leaves the pool (`DeviceLost`, once no shift holds it); the run goes
  on with fewer devices, or stops once a role can no longer run (`DeviceLostError`).
- Behaviour log-probs travel with the tokens (`ledger.Tokens`) into `TrainBatch.old_log_probs`
  (`algo.off_policy` corrects staleness); a batch with unknown ones falls back to recomputed
  log-probs, counted as `logprobs_missing`.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import INFERENCE_ROLES, Role, Slot
from pivotrl.deploy.events import (
    DeviceLost, Dispatch, Event, PublishWeights, Record, ReplicaLost, SequenceFinished, ShiftDone, StartShift, StartTraining,
    StepDone, Tick, TrainingDone,
)
from pivotrl.runtime.outcomes import Death, ShiftResult, ThreadFailed, TrainingResult
from pivotrl.runtime.faults import point
from pivotrl.runtime.ledger import SequenceLedger, Tokens
from pivotrl.runtime.monitor import Monitor
from pivotrl.runtime.stats import RealStats, RunFacts
from pivotrl.runtime.training import TrainingSteps

if TYPE_CHECKING:
    import ray

    from pivotrl.config import PivotConfig
    from pivotrl.config.resolve import Resolved
    from pivotrl.deploy.base import Controller
    from pivotrl.engines.protocol import Completion, GenerationRequest
    from pivotrl.logging.tracker import Tracker
    from pivotrl.runtime.launch import Launch
    from pivotrl.runtime.samples import Samples


class DeviceDriver:
    """Runs controller `ctrl`'s actions on the devices of `launch`, for samples `samples`."""

    def __init__(self, cfg: PivotConfig, resolved: Resolved, ctrl: Controller, launch: Launch, samples: Samples,
                 tracker: Tracker | None = None) -> None:
        self.cfg, self.r, self.ctrl, self.launch, self.s = cfg, resolved, ctrl, launch, samples
        self.tracker = tracker
        self.ex = launch.executor
        self.cl = cfg.cluster
        self.name = f"{resolved.runtime} run"
        self.wall_limit = None if self.cl.max_wall_s is None else ("cluster.max_wall_s", float(self.cl.max_wall_s))
        self.fit_every_s = float(self.cl.fit_every_s)
        self.monitor = Monitor()
        # token rows as wide as each role's longest sequence (`ledger.py`: never widened mid-run)
        self.ledger = SequenceLedger(widths={Role.ROLLOUT: samples.max_response,
                                             Role.REWARD: samples.judge.max_tokens})
        self.results: queue.Queue[ShiftResult | TrainingResult | ThreadFailed] = queue.Queue()
        self.polls: dict[int, Any] = {}
        self.poll_gen: dict[int, int] = {}
        self.poll_since: dict[int, float] = {}  # when each outstanding poll was sent (its time limit)
        self.threads: list[threading.Thread] = []
        self.deferred: list[tuple[Role, int, Completion]] = []  # (role, device, completion)
        self.recorded_recoveries: list[dict[str, Any]] = []
        self.to_retire: set[int] = set()  # crash-looping devices, retired once no shift holds them
        self.next_tick: float | None = None
        self.t0 = time.monotonic()
        self._last = 0.0
        self.stats = RealStats()
        self.counts = self.stats.counts
        self.training = TrainingSteps(cfg, self.ex, samples, self.ledger, launch, self.stats, self.record_event)

    @property
    def now(self) -> float:
        return time.monotonic() - self.t0

    # ------------------------------------------------------------------ Driver: events
    def schedule_tick(self, at: float) -> None:
        self.next_tick = at

    def wait(self) -> Iterator[Event]:
        """Completions of the inference devices (waiting up to `cluster.poll_s`), then finished
        shifts and training steps, then deliveries deferred by the last actions, then a due tick."""
        import ray

        t = self.now
        self.stats.hold(self.ex.role_of.values(), t - self._last)
        self._last = t
        t0 = time.perf_counter()
        self.ex.submits.flush()  # the last batch's submits, one call per device
        self.ex.submits.check()
        self.stats.dispatch_s += time.perf_counter() - t0
        for d in self.ex.serving():
            if d not in self.polls:
                actor, self.poll_gen[d] = self.ex.handle(d)
                self.polls[d] = actor.poll.remote(self.cl.poll_s)
                self.poll_since[d] = time.monotonic()
        refs = list(self.polls.values())
        if refs:
            ready, _ = ray.wait(refs, num_returns=1, timeout=self.cl.poll_s)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            by_ref = {r: d for d, r in self.polls.items()}
            for ref in ready:
                d = by_ref[ref]
                del self.polls[d]
                yield from self._on_poll(d, ref)
        else:
            time.sleep(self.cl.poll_s)
        self._overdue_polls()
        while True:
            try:
                item = self.results.get_nowait()
            except queue.Empty:
                break
            yield from self._on_result(item)
        while self.deferred:
            yield from self._complete(*self.deferred.pop(0))
        yield from self._deaths()
        if self.next_tick is not None and self.now >= self.next_tick:
            self.next_tick = None
            yield Tick(self.now, progress=self.ledger.counts())

    def idle(self) -> bool:
        self.threads = [t for t in self.threads if t.is_alive()]
        return (not self.polls and not self.threads and self.results.empty() and not self.ledger.running()
                and not self.ex.submits.pending()
                and not self.deferred and not self.to_retire and not any(r in INFERENCE_ROLES for r in self.ex.role_of.values()))

    def _overdue_polls(self) -> None:
        """A poll not back within `cluster.poll_s + cluster.limits.call_s` means a hung device
        (its engine stuck inside a call): it is replaced like a dead one (`Executor.respawn`), and
        its sequences go back to the queue when that death is taken."""
        limit = float(self.cl.poll_s) + float(self.cl.limits.call_s)
        now = time.monotonic()
        for d in [d for d in self.polls if now - self.poll_since.get(d, now) > limit]:
            del self.polls[d]
            self.ex.respawn(d, f"poll: no reply within cluster.poll_s + cluster.limits.call_s = {limit:g}s "
                               f"(ran {now - self.poll_since.pop(d):.1f}s)", self.poll_gen.get(d))

    def _on_poll(self, d: int, ref: ray.ObjectRef) -> Iterator[Event]:
        import ray

        try:
            res = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as e:
            self.ex.respawn(d, f"poll: {type(e).__name__}", self.poll_gen.get(d))
            return
        if res.error is not None:
            self.ex.respawn(d, f"engine error: {res.error}", self.poll_gen.get(d))
            return
        role = self.ex.role_of.get(d)
        if role not in INFERENCE_ROLES or res.role != role.value or self.poll_gen.get(d) != self.ex.handle(d)[1]:
            return  # a poll that straddled a shift or a respawn: nothing of this role is left on it
        new = take_poll(self.ledger, self.monitor, role, d, res)
        for c in res.completions:
            yield from self._complete(role, d, c)
        if new or res.completions:
            point("poll", d, self.ex.handle(d)[0])

    def _complete(self, role: Role, d: int, c: Completion) -> Iterator[Event]:
        toks = Tokens.of(c.token_ids, c.logprobs)
        if not self.ledger.accept(role, c.seq_id, d, toks):
            self.counts["stale_completions"] += 1
            return
        led, sid, lead = self.ledger, c.seq_id, -1
        if role == Role.ROLLOUT:
            led.responses[sid] = toks
            led.versions[sid] = int(c.version)
            led.judge_ids[sid] = self.s.judge_prompt(sid, toks)
            lead = self.s.shared.leader(self.s.batch_of(sid), sid, led.judge_ids[sid])
            if lead >= 0 and lead in led.rewards:
                self._take_judgement(sid, led.so_far(Role.REWARD, lead))
            elif lead >= 0:
                self.s.shared.wait(lead, sid)
        else:
            led.rewards[sid] = self.s.score(sid, led.responses[sid], toks)
            for other in self.s.shared.done(sid):
                self._take_judgement(other, toks)
        yield SequenceFinished(self.now, role=role, seq_id=sid, generated=len(toks),
                               replica_id=Slot(role, d, self.r.tp[role.value]).slot_id, shares_judgement_of=lead)

    def _take_judgement(self, sid: int, judgement: Tokens) -> None:
        """Sample `sid` shares an identical judge prompt's `judgement` (`Samples.shared`): scored
        against its own response and example, never run."""
        self.ledger.share(Role.REWARD, sid, judgement)
        self.ledger.rewards[sid] = self.s.score(sid, self.ledger.responses[sid], judgement)

    def _deaths(self) -> Iterator[Event]:
        """Each death the executor found since the last call, once; then the crash-looping
        devices no shift holds any more leave the pool."""
        for death in self.ex.take_deaths():
            yield from self._on_death(death)
        for d in sorted(self.to_retire - self.ctrl.pending_devices()):
            self.to_retire.discard(d)
            self.ex.retire(d)
            self.counts["lost_devices"] += 1
            self.polls.pop(d, None)
            self.monitor.forget(d)
            yield DeviceLost(self.now, device=d)

    def _on_death(self, death: Death) -> Iterator[Event]:
        """Send the sequences of a respawned device back to the queue with their tokens and
        re-host its replica (mid-shift devices are re-hosted by their shift). A member of a
        replica of several devices held no sequences: it re-joins, and the replica goes on."""
        d, role, slot = death.device, death.role, death.slot
        self.monitor.forget(d)
        self.polls.pop(d, None)
        lost = self.ledger.lost(role, d) if slot is not None else []
        self.record_event("device_death", device=d, role=getattr(role, "value", None), why=death.why,
                          sequences=lost, generation=death.generation, held_train_state=death.held_train,
                          crash_loop=death.crash_loop,
                          tokens_kept={sid: self.ledger.length(role, sid) for sid in lost})
        self.counts["device_deaths"] += 1
        # role TRAIN here: found dead while shifting training down; its state is rebuilt from the
        # checkpoint on the next training shift up (a death during a step raises in `_train`)
        if death.crash_loop:  # a training device among them stops the run in the controller
            self.to_retire.add(d)
        if slot is None:
            return
        if d not in self.ctrl.pending_devices() and not death.crash_loop:
            self.ex.rehost(slot, d)  # dying again here is one more death, taken next round
        if d != slot.first_device:
            return
        yield ReplicaLost(self.now, role=role, replica_id=slot.slot_id)

    # ------------------------------------------------------------------ threads
    def _spawn(self, fn: Callable[..., ShiftResult | TrainingResult], *args: Any) -> None:
        def body() -> None:
            try:
                self.results.put(fn(*args))
            except BaseException as e:  # re-raised in the main thread
                self.results.put(ThreadFailed(e))

        t = threading.Thread(target=body, daemon=True)
        t.start()
        self.threads.append(t)

    def _on_result(self, item: ShiftResult | TrainingResult | ThreadFailed) -> Iterator[Event]:
        if isinstance(item, ThreadFailed):
            raise item.error
        if isinstance(item, ShiftResult):
            res = item
            if res.error is not None:
                raise res.error
            for s in res.plan.down:
                for d in s.devices:
                    self.monitor.forget(d)
            for rec in self.ex.recoveries[len(self.recorded_recoveries):]:
                self.recorded_recoveries.append(rec)
                self.record_event("training_recovered", **rec)
            self.training.shifted(res)
            self.record_event("shift_timing", role_up=res.plan.role_up.value, down_s=res.seconds[0],
                              up_s=res.seconds[1], devices=res.timings, dead=sorted(res.dead),
                              measured={r.value: v for r, v in res.measured.items()})
            # a rollout replica that read GPS while a publish committed a newer policy, and so missed
            # that publish's refresh (it served nothing yet), takes it now, before any sequence
            current = self.ex.params.version("policy")
            if any(t["role"] == Role.ROLLOUT.value and t["direction"] == "up" and t.get("version") is not None
                   and t["version"] < current for t in res.timings):
                self.publish(PublishWeights(current))
            yield ShiftDone(self.now, plan=res.plan, kv_capacity=res.kv_capacity, seconds=res.seconds,
                            progress=self.ledger.counts(), measured=res.measured)
        elif isinstance(item, TrainingResult):
            act, secs = item.act, item.seconds
            self.stats.train_busy_s += secs * (item.world or len(act.devices))
            yield TrainingDone(self.now, batch=act.batch, version=int(item.metrics["version"]), seconds=secs,
                               progress=self.ledger.counts(), world=item.world, reshard_s=item.reshard_s)
        else:
            raise TypeError(f"a driver thread returned {type(item).__name__}")

    # ------------------------------------------------------------------ Driver: actions
    def dispatch(self, act: Dispatch) -> None:
        role, led = act.role, self.ledger
        t0 = time.perf_counter()
        res = self.ex.execute_moves(role, act.moves, self._request)
        self.stats.dispatch_s += time.perf_counter() - t0
        for sid, toks in res.aborted.items():
            led.aborted(role, sid, Tokens.of(toks))
            self.counts["aborts"] += 1
        finished = {c.seq_id for _, c in res.finished}
        for mv in act.moves:
            if mv.kind == "abort":
                led.unplace(role, mv.seq_id)
            elif mv.seq_id not in finished:
                if led.place(role, mv.seq_id, self.ex.device_of(mv.replica_id)):
                    self.counts["resumes"] += 1
        for d, c in res.finished:  # raced its abort: deliver once, after the current actions
            led.place(role, c.seq_id, d)
            self.deferred.append((role, d, c))

    def _request(self, role: Role, sid: int) -> GenerationRequest:
        return self.s.request(role, sid, self.ledger.so_far(role, sid), self.ledger.judge_ids.get(sid))

    def start_shift(self, act: StartShift) -> None:
        self.ex.submits.settle(d for s in act.plan.down for d in s.devices)  # none may land mid-shift
        self.counts["shifts"] += len(act.plan.up) + len(act.plan.down)
        self._spawn(self.ex.run_shift, act.plan)

    def start_training(self, act: StartTraining) -> None:
        self._spawn(self.training.run, act)

    def publish(self, act: PublishWeights) -> None:
        """The new policy into every rollout replica, waited for (`Executor.publish_policy`)."""
        t0 = time.perf_counter()
        version, per = self.ex.publish_policy()
        self.record_event("weight_refresh", version=int(version), devices=per, wait_s=time.perf_counter() - t0)

    def record(self, act: Record) -> None:
        """Nothing to do: the recorder writes controller records to the timeline."""

    def refit(self) -> dict[Role, tuple[ThroughputModel, int]]:
        out = {}
        for role in INFERENCE_ROLES:
            model = self.monitor.fit(role)
            if model is not None:
                out[role] = (model, len(self.monitor.samples(role)))
        return out

    def after_event(self) -> None:
        """Nothing to do after an event on real devices."""

    # ------------------------------------------------------------------ records
    def record_event(self, kind: str, **fields: Any) -> None:
        """A driver record into the timeline (`now` added)."""
        if self.tracker is not None:
            self.tracker.log_event(kind, now=self.now, **fields)

    def step_fields(self, act: StepDone, now: float) -> dict[str, Any]:
        """Row fields of the step that trained `act.batch`; also its `sample_lengths` record (read by
        `pivotrl.report.records.RunRecords`): `[sample_id, prompt_tokens, response_tokens,
        genrm_tokens]`, one row per trained sample in id order, and `shared`: `[sample_id,
        the sample whose judgement it shared]` (`Samples.shared`)."""
        led, s = self.ledger, self.s
        ids, train_metrics = self.training.take(act.batch)
        self.record_event("sample_lengths", batch=int(act.batch), samples=[
            [int(sid), s.prompt_len(sid), len(led.responses.get(sid, ())), led.length(Role.REWARD, sid)]
            for sid in sorted(ids)], shared=s.shared.close(act.batch))
        rewards = [led.rewards[x] for x in ids if x in led.rewards]
        fields = self.stats.step_fields(
            rewards=rewards, train_metrics=train_metrics, tau_shift=self.ctrl.tau_shift,
            role_state={r: self.monitor.state(r, self.ctrl.sched[r]) for r in INFERENCE_ROLES})
        judged = len(rewards) if s.reward_fn.uses_genrm else 0  # warns past the judge's threshold
        fields["genrm_parse_failure_rate"] = s.parse_watch.step(act.step, fields["genrm_parse_failures"], judged)
        led.forget(ids)  # the batch is trained and written: nothing reads its samples again
        return fields

    def finish(self) -> dict[str, Any]:
        for t in self.threads:
            t.join(timeout=60)
        self.training.finish()
        ex = self.ex
        return {**self.stats.summary(RunFacts(
            shift_log=ex.shift_log, tau_shift=self.ctrl.tau_shift, samples_trained=self.training.trained.count,
            samples_trained_unique=self.training.trained.unique,
            policy_version=self.ctrl.pipe.version, deaths=ex.deaths, lost_devices=sorted(ex.retired),
            recoveries=ex.recoveries, wall_s=self.now)), "genrm_parse": self.s.parse_watch.summary()}


def take_poll(ledger: SequenceLedger, monitor: Monitor, role: Role, device: int, res: DevicePoll) -> int:
    """The bookkeeping of one poll of `device` serving `role`: its new tokens appended to the
    ledger, its load and timing samples to the monitor; returns the new tokens counted. Its
    completions are the caller's (`DeviceDriver._complete`). What `python -m pivotrl.bench
    bookkeeping` measures at paper scale."""
    new = ledger.fold(role, device, res.progress)
    monitor.ingest(role, device, res.stats, new)
    return new
