"""Carry out the control plane's decisions on device actors: scheduler moves, shift plans, weights.

Owns (parameters for shift up come from `params.ParamSource`, the GPS):
- `Executor.execute_moves(role, moves)`: a scheduler's `Move`s, in order: `abort` = the engine's
  abort, which returns each sequence's tokens (kept by the runtime, so it resumes from them);
  `assign` = submit a fresh request, or a resume carrying the tokens generated so far (buffered,
  coalesced per device and not waited for: `submits.Submits`).
- `Executor.run_shift(plan)`: shift down every replica in `plan.down` (or the training unit), then
  shift up every slot in `plan.up`, each half run on all its devices at once and timed. The measured
  durations go to the controller (`ShiftDone.measured`), which folds them into the planner's
  `tau_shift`.
- Device death: any call that finds a device actor dead respawns it on the same bundle (it comes
  back holding no role) and records one `Death` (`take_deaths`, each death once, whichever call
  found it). Every call reads its actor and that actor's generation together (`handle`) and passes
  the generation to `respawn`, so a call that failed on an actor already replaced (the other call
  found the death first) never kills the fresh one; the runtime puts that device's sequences back in
  the queue with their last reported tokens. Until the runtime re-hosts it (`rehost`) or a shift
  brings it up, no move reaches the fresh actor (it is `unhosted`; its sequences are the runtime's
  to re-queue). A dead device during a shift is shifted up again on its fresh actor.
- Training state: the devices whose actors hold a trainer rank, active or offloaded (`train_ranks`:
  a device counts only if its actor is the one its shift up went to). If one of them dies, the
  trainer's state is gone from that rank; the next training shift up drops every rank it may still
  hold and rebuilds them from the checkpoint at the policy's current version (`train_recovery`, the
  launch's), or fails naming the checkpoint it lacks: never a silent start from the base model.
- Crash loops: a device that died more than `max_respawns` times within `respawn_window_s` is
  flagged (`Death.crash_loop`); the runtime then `retire`s it (it leaves the pool).
- Time limits (`limits.py`): an inference device past its call's limit is replaced as a dead one is;
  a training call past it, or a device past it twice in one shift, raises `TimeLimitExceeded`.
- Replicas of several devices (`tp` > 1): the slot's first device runs the engine across the slot
  (`roles.EnginePlacement`, read from the device actors' cores and accelerator ids at shift up), the
  others host a `roles.MemberHost`. Moves, polls and weight loads go to the first device
  (`serving`); a member that dies is respawned and re-joins its replica, whose engine goes on.

Knows nothing about the deployment modes: it executes what the controller decided.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pivotrl.core.dispatch import Move
from pivotrl.core.types import INFERENCE_ROLES, Role, ShiftPlan, Slot
from pivotrl.runtime.device import spawn_device
from pivotrl.runtime.faults import point
from pivotrl.runtime.limits import TRAIN_CALL_LIMITS, Limit, Limits
from pivotrl.runtime.outcomes import (Death, MoveResult, ShiftResult, TimeLimitExceeded, TrainingRankDied,
                                      TrainingStateLost, death_reason, is_dead, measured_shift_seconds,
                                      must_replace)
from pivotrl.runtime.roles import EnginePlacement, RoleSpec, ShiftTiming
from pivotrl.runtime.submits import Submits

if TYPE_CHECKING:
    from pivotrl.runtime.cluster import Cluster
    from pivotrl.runtime.params import ParamSource

log = logging.getLogger(__name__)

#: Seconds a collective training call waits for the other ranks once one rank's actor is dead.
PEER_GRACE_S = 30.0


class Executor:
    """Executes moves and shift plans on the device actors of one cluster."""

    def __init__(self, cluster: Cluster, specs: Callable[[Slot, int], RoleSpec], params: ParamSource,
                 model_of: dict[Role, str], max_respawns: int = 3, respawn_window_s: float = 600.0,
                 train_recovery: Callable[[int], None] | None = None, limits: Limits | None = None) -> None:
        self.cluster = cluster
        self.limits = limits if limits is not None else Limits()  # of every call into a device actor
        # devices sharing GPUs (`cluster.devices_per_gpu`): every shift call (of any plan, and
        # re-hosts) runs alone, so no two engines start on a GPU at once (cluster.py says why)
        self.one_at_a_time = cluster.spec.devices_per_gpu > 1
        self._one_shift_at_a_time = threading.Lock()
        self.max_respawns, self.respawn_window_s = int(max_respawns), float(respawn_window_s)
        # called with the policy's version when a trainer rank's state was lost: point the role
        # specs at the checkpoint of that version (or raise `TrainingStateLost`)
        self.train_recovery = train_recovery
        self.specs = specs
        self.params = params
        self.model_of = model_of
        self.actors: dict[int, Any] = {}
        self.generation: dict[int, int] = {}
        for d in range(cluster.spec.num_devices):  # a kept cluster's actors, else new ones
            actor, gen = cluster.devices.get(d, (None, -1))
            self.actors[d] = actor if actor is not None else spawn_device(cluster, d, gen + 1)
            self.generation[d] = gen if actor is not None else gen + 1
        self.role_of: dict[int, Role | None] = {d: None for d in self.actors}
        self.slots: dict[str, Slot] = {}  # replica id -> its slot (every slot ever shifted up)
        self.hosted: dict[int, Slot] = {}  # device -> the inference slot it serves now
        self.shift_log: list[dict[str, Any]] = []
        self.deaths: list[Death] = []  # every death, in order (the run's one count)
        self._new_deaths: list[Death] = []  # not yet taken by the runtime
        self._death_times: dict[int, list[float]] = {}
        self.unhosted: set[int] = set()  # lost an inference role; not re-hosted yet
        self.retired: set[int] = set()  # left the pool (crash loop)
        self.train_ranks: set[int] = set()  # actors holding a trainer rank (active or offloaded)
        self.train_state_lost = False
        self.recoveries: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.submits = Submits(self, lambda e: is_dead(e) or isinstance(e, TimeLimitExceeded))

    # ------------------------------------------------------------------ devices
    def wait_ready(self) -> list[dict[str, Any]]:
        """Every device actor's `info`, once all have started (within a shift's limit)."""
        return self.limits.get([a.info.remote() for a in self.actors.values()], "shift", "device actors starting",
                               list(self.actors))

    def handle(self, device: int) -> tuple[Any, int]:
        """`device`'s current actor and its generation, read together (a respawn on another thread
        replaces both at once): a call that fails on that actor passes this generation to `respawn`."""
        return self.handles([device])[device]

    def handles(self, devices: Iterable[int]) -> dict[int, tuple[Any, int]]:
        """`handle` of each of `devices`, all read at one instant."""
        with self._lock:
            return {d: (self.actors[d], self.generation[d]) for d in devices}

    def respawn(self, device: int, why: str, generation: int | None = None, slot: Slot | None = None) -> bool:
        """Replace a dead actor by a fresh one on the same bundle (holding no role). With
        `generation` (of the handle that failed), a device someone already replaced is left alone;
        returns whether this call replaced it. `slot`: the inference slot it was being re-hosted
        into when it died, if it served none."""
        import ray

        with self._lock:
            if device in self.retired or (generation is not None and generation != self.generation[device]):
                return False
            old = self.actors[device]
            with contextlib.suppress(Exception):
                ray.kill(old)
            slot = self.hosted.pop(device, None) or slot
            role = self.role_of[device] or (slot.role if slot is not None else None)
            now = time.monotonic()
            times = [t for t in self._death_times.get(device, []) if now - t <= self.respawn_window_s] + [now]
            self._death_times[device] = times
            held_train = device in self.train_ranks
            if held_train:
                self.train_ranks.discard(device)
                self.train_state_lost = True
            self.generation[device] += 1
            self.actors[device] = spawn_device(self.cluster, device, self.generation[device])
            self.role_of[device] = None
            if role in INFERENCE_ROLES:
                self.unhosted.add(device)
            death = Death(device, role, slot, why, self.generation[device], held_train, len(times) > self.max_respawns)
            self.deaths.append(death)
            self._new_deaths.append(death)
        log.warning("device %d died (%s); respawned with no role%s", device, why,
                    " (crash loop: it leaves the pool)" if death.crash_loop else "")
        return True

    def take_deaths(self) -> list[Death]:
        """The deaths found since the last call (each death is taken once)."""
        with self._lock:
            out, self._new_deaths = self._new_deaths, []
        return out

    def retire(self, device: int) -> None:
        """`device` leaves the pool for good: its actor is stopped and no call reaches it again."""
        import ray

        with self._lock:
            self.retired.add(device)
            self.unhosted.discard(device)
            self.hosted.pop(device, None)
            self.role_of[device] = None
            with contextlib.suppress(Exception):
                ray.kill(self.actors[device])
        log.warning("device %d left the pool (it died more than cluster.max_respawns=%d times within "
                    "cluster.respawn_window_s=%gs)", device, self.max_respawns, self.respawn_window_s)

    def reachable(self, device: int) -> bool:
        """Whether moves may reach `device` (not unhosted after a death, not retired)."""
        return device not in self.unhosted and device not in self.retired

    def serving(self) -> dict[int, Role]:
        """The first device of every inference replica hosted now (it runs the engine) -> its role."""
        with self._lock:
            return {d: s.role for d, s in self.hosted.items() if d == s.first_device}

    def device_of(self, replica_id: str) -> int:
        """The device whose actor runs replica `replica_id` (its slot's first device)."""
        slot = self.slots.get(replica_id)
        if slot is None:
            raise ValueError(f"replica {replica_id!r} was never shifted up on this cluster")
        return slot.first_device

    def rehost(self, slot: Slot, device: int) -> bool:
        """Shift respawned, roleless `device` up to its place in `slot` again (the replica's cold
        engine, weights from GPS, if it is the slot's first device, else a member). False when it
        died again on the way: its death carries `slot`, so taking it re-hosts once more (bounded)."""
        actor, gen = self.handle(device)
        call = self._ups(slot, only=device)[device]
        point("rehost", device, actor)
        try:
            with self._one_shift_at_a_time if self.one_at_a_time else contextlib.nullcontext():
                self.limits.wait(call(actor), self._shift_limit(slot.role), "re-host (shift up)", device)
        except Exception as e:
            if not must_replace(e):
                raise
            self.respawn(device, death_reason("re-host", e), gen, slot=slot)
            return False
        with self._lock:
            self.role_of[device] = slot.role
            self.unhosted.discard(device)
            self.hosted[device] = slot
        return True

    # ------------------------------------------------------------------ moves
    def execute_moves(self, role: Role, moves: list[Move], request_for: Callable[[Role, int], Any]) -> MoveResult:
        """Aborts (batched per replica, in parallel, waited for within `cluster.limits.call_s`),
        then assigns: buffered per replica and sent by the next `submits.flush` without waiting
        (`submits.py`); a dead or overdue device is replaced."""
        res = MoveResult()
        aborts: dict[int, list[int]] = {}
        assigns: dict[int, list[int]] = {}
        for mv in moves:
            d = self.device_of(mv.replica_id)
            (aborts if mv.kind == "abort" else assigns).setdefault(d, []).append(mv.seq_id)
        h = self.handles(set(aborts) | set(assigns))
        # a respawned device not re-hosted yet (or retired) holds nothing to abort and must take
        # no submit: its sequences are re-queued by the runtime when it takes that death
        reach = [d for d in aborts if self.reachable(d)]
        self.submits.settle(reach)  # an abort must not overtake a submit (`submits.py`: Order)
        refs = {d: h[d][0].abort.remote(aborts[d]) for d in reach}
        t0, limit = time.monotonic(), self.limits.of("call")
        for d, ref in refs.items():
            try:
                out = self.limits.wait(ref, limit, "abort", d, t0)
            except Exception as e:
                if not (is_dead(e) or isinstance(e, TimeLimitExceeded)):
                    raise
                self.respawn(d, death_reason("abort", e), h[d][1])
                res.dead.add(d)
                continue
            res.aborted.update(out.aborted)
            res.finished.extend((d, c) for c in out.finished)
        done = {c.seq_id for _, c in res.finished}
        for d, ids in assigns.items():
            reqs = [request_for(role, sid) for sid in ids if sid not in done]
            if reqs and d not in res.dead and self.reachable(d):
                self.submits.add(d, h[d][1], reqs)  # sent at the next flush, not waited for
        return res

    # ------------------------------------------------------------------ shifts
    def _params_for(self, slot: Slot) -> tuple[Any, int]:
        """(what the device reads, the version) for shifting `slot` up: a `GPSWeights` naming the
        current version (its node's copy; a frozen GenRM that kept its weights reads none); training: none."""
        if slot.role == Role.TRAIN:
            return None, 0
        return self.params.weights(self.model_of[slot.role])

    def _ups(self, s: Slot, only: int | None = None) -> dict[int, Callable[[Any], Any]]:
        """device -> the shift up call (on a given actor) of each device of slot `s` (or of `only`),
        specs and parameters read now; a replica's first device reads them and gets its placement."""
        out: dict[int, Callable[[Any], Any]] = {}
        for i, d in enumerate(s.devices):
            if only is not None and d != only:
                continue
            spec = self.specs(s, i)
            ref, version = (None, 0) if spec.leader is not None else self._params_for(s)
            if i == 0 and s.tp > 1 and s.role in INFERENCE_ROLES:
                spec = replace(spec, placement=self._placement(s))
            out[d] = lambda actor, spec=spec, w=ref, version=version: actor.shift_up.remote(spec, w, version)
        return out

    def _placement(self, s: Slot) -> EnginePlacement:
        """The cores and accelerator ids of every device of `s`, as their actors report them (a
        dead one adds none: its shift up finds it dead and respawns it)."""
        cores: set[int] = set()
        ids: list[str] = []
        for d, (actor, _) in self.handles(s.devices).items():
            try:
                info = self.limits.get(actor.info.remote(), "call", "info", d)
            except Exception as e:  # a hung one: its shift up runs past its limit and replaces it
                if not (is_dead(e) or isinstance(e, TimeLimitExceeded)):
                    raise
                continue
            cores.update(info.get("cores") or ())
            ids.extend(info.get("accelerators") or ())
        return EnginePlacement(tuple(s.devices), tuple(sorted(cores)) or None, tuple(ids))

    def _recover_training(self, slot: Slot) -> None:
        """A trainer rank's state died: rebuild every rank of `slot` from the checkpoint at the
        policy's current version (the launch's `train_recovery` points the specs at it, or raises).
        First every survivor and every device of `slot` drops its rank (a poll may have respawned
        one after the up call read its handle); a dead one holds nothing (its next call respawns it)."""
        version = self.params.version("policy")
        if self.train_recovery is None:
            raise TrainingStateLost(f"a trainer rank's state was lost with its device at policy version "
                                    f"{version}, and this executor has no checkpoint to rebuild it from")
        self.train_recovery(version)
        with self._lock:
            holders = sorted(self.train_ranks | set(slot.devices))
        refs = {d: actor.drop_role.remote(Role.TRAIN.value) for d, (actor, _) in self.handles(holders).items()}
        for d, ref in refs.items():
            try:
                self.limits.get(ref, "call", "dropping the lost trainer's rank", d)
            except Exception as e:
                if not is_dead(e):
                    raise
        with self._lock:
            self.train_ranks.clear()
            self.role_of.update({d: None for d in slot.devices if self.role_of.get(d) == Role.TRAIN})
            self.train_state_lost = False
        self.recoveries.append({"version": int(version), "devices": list(slot.devices), "dropped": holders})
        log.warning("training state lost: rebuilding ranks %s from the checkpoint at version %d", list(slot.devices), version)

    def _shift_limit(self, role: Role | None) -> Limit:
        """A shift half's limit on a device of `role` (its model's size; None: the policy's)."""
        return self.limits.of("shift", self.model_of.get(role, "policy") if role is not None else "policy")

    def _call_all(self, calls: dict[int, Callable[[Any], Any]], what: str, res: ShiftResult,
                  retry: Callable[[int], bool] | None, roles: dict[int, Role | None],
                  called: dict[int, int] | None = None) -> dict[int, Any]:
        """One remote call per device (`calls[d](actor)`) at once (sharing GPUs: one at a time),
        each within the shift limit of `roles[d]`; replace dead, failed and overdue inference
        devices, calling again on the fresh actor where `retry(d)` holds; `called` gets the
        generation of the actor each call went to."""
        h, called = self.handles(calls), {} if called is None else called
        called.update({d: g for d, (_, g) in h.items()})
        t0 = time.monotonic()
        refs = {} if self.one_at_a_time else {d: f(h[d][0]) for d, f in calls.items()}
        out: dict[int, Any] = {}
        for d, f in calls.items():
            limit = self._shift_limit(roles.get(d))
            try:
                if d in refs:
                    out[d] = self.limits.wait(refs[d], limit, what, d, t0)
                else:
                    with self._one_shift_at_a_time:
                        out[d] = self.limits.wait(f(h[d][0]), limit, what, d)
            except Exception as e:
                if not must_replace(e) or (isinstance(e, TimeLimitExceeded) and roles.get(d) not in INFERENCE_ROLES):
                    raise
                self.respawn(d, death_reason(what, e), h[d][1])
                res.dead.add(d)
                if retry is not None and retry(d):
                    actor, called[d] = self.handle(d)
                    out[d] = self.limits.wait(calls[d](actor), limit, f"{what} (again, on a fresh actor)", d)
        return out

    def run_shift(self, plan: ShiftPlan) -> ShiftResult:
        """Shift down `plan.down`, then shift up `plan.up`; both halves timed (blocking)."""
        res = ShiftResult(plan)
        try:
            t0 = time.perf_counter()
            downs = {d: (lambda actor: actor.shift_down.remote()) for s in plan.down for d in s.devices}
            for d in downs:
                point("shift_down", d, self.handle(d)[0])
            timings = self._call_all(downs, "shift_down", res, retry=None,
                                     roles={d: s.role for s in plan.down for d in s.devices})
            t1 = time.perf_counter()
            with self._lock:
                for d in downs:
                    self.role_of[d] = None
                    self.hosted.pop(d, None)
            train_up = [s for s in plan.up if s.role == Role.TRAIN]
            if train_up and self.train_state_lost:
                self._recover_training(train_up[0])
            ups: dict[int, Callable[[Any], Any]] = {}
            for s in plan.up:
                self.slots[s.slot_id] = s
                for d in s.devices:
                    point("shift_up", d, self.handle(d)[0])
                ups.update(self._ups(s))
            inference = {d for s in plan.up if s.role in INFERENCE_ROLES for d in s.devices}
            dead_before_up = set(res.dead)  # those died in the shift down: respawned, then shifted up whole
            up_roles = {d: s.role for s in plan.up for d in s.devices}
            called: dict[int, int] = {}  # the generation each up went to
            up_t = self._call_all(ups, "shift_up", res, inference.__contains__, up_roles, called)
            for s in train_up:
                if any(d in res.dead - dead_before_up for d in s.devices):
                    self.train_state_lost = True  # also a cold first build: its group is incomplete
                if self.train_state_lost:  # a rank died in this shift: rebuild all from the checkpoint
                    self._recover_training(s)
                    up_t.update(self._call_all(self._ups(s), "shift_up", res, None, up_roles, called))
            t2 = time.perf_counter()
            for s in plan.up:
                with self._lock:  # an actor respawned since its up (a stale poll found it dead) holds nothing
                    gone = {d for d in s.devices if self.generation[d] != called[d]}
                    for d in set(s.devices) - gone:
                        self.role_of[d] = s.role
                        self.unhosted.discard(d)
                        if s.role in INFERENCE_ROLES:
                            self.hosted[d] = s
                    if s.role == Role.TRAIN:  # the trainer lost that rank
                        self.train_ranks.update(set(s.devices) - gone)
                        self.train_state_lost |= bool(gone)
                for d in sorted(gone) if s.role in INFERENCE_ROLES else ():
                    self.rehost(s, d)  # into its place again (dying again, its death carries `s`)
                if s.role != Role.TRAIN:
                    for d in s.devices:
                        if d in self.train_ranks:  # a training-home device lent to inference
                            point("lent_home", d, self.handle(d)[0])
                if s.role in INFERENCE_ROLES:  # the capacity the engine reports (vLLM: blocks x block size)
                    t = up_t.get(s.first_device)
                    reported = t.detail.get("kv_capacity_tokens") if isinstance(t, ShiftTiming) else None
                    res.kv_capacity[s.slot_id] = int(reported or self.specs(s, 0).engine.settings.kv_capacity_tokens)
            res.seconds = (t1 - t0, t2 - t1)
            res.timings = [{"device": d, "role": t.role, "direction": t.direction, "seconds": t.seconds,
                            "cold": t.cold, "version": t.version, **t.detail}
                           for d, t in [*timings.items(), *up_t.items()] if isinstance(t, ShiftTiming)]
            res.measured = measured_shift_seconds(res.timings)
            self.shift_log.append({"role_up": plan.role_up.value, "down_s": res.seconds[0], "up_s": res.seconds[1],
                                   "timings": res.timings})
        except BaseException as e:  # reported to the main loop, which re-raises it there
            res.error = e
        return res

    # ------------------------------------------------------------------ weights
    def publish_policy(self) -> tuple[int, list[dict[str, Any]]]:
        """Load GPS's current policy into every rollout replica and wait until each holds it (a `submit` sent
        right after an unawaited load could be admitted first, under the old weights). Each device reads its
        node's GPS copy itself; the driver sends only the version. Returns (version, one measured load per
        device: `{"device", "seconds", "bytes", "path", "gps_version"}`, `seconds` the time its decoding stood
        still). A device that died, failed the load (its engine shut itself down) or ran past the load's limit
        is respawned and skipped: its sequences go back to the queue when the runtime takes that death."""
        weights, version = self.params.weights("policy")
        h = self.handles(d for d, r in self.serving().items() if r == Role.ROLLOUT)
        for d, (actor, _) in h.items():
            point("publish", d, actor)
        t0, limit = time.monotonic(), self.limits.of("load", "policy")
        refs = {d: (actor.load_weights.remote(weights, version, Role.ROLLOUT), gen) for d, (actor, gen) in h.items()}
        per: list[dict[str, Any]] = []
        for d, (r, gen) in refs.items():
            try:
                ev = self.limits.wait(r, limit, "weight load (publish)", d, t0)
            except Exception as e:
                if not must_replace(e):
                    raise
                log.warning("publish of policy version %d: device %d %s", version, d,
                            "died" if is_dead(e) else f"failed the load ({e})")
                self.respawn(d, death_reason("publish", e), gen)
                continue
            if ev is not None:
                per.append({"device": int(d), **ev})
        return version, per

    # ------------------------------------------------------------------ training (collective)
    def train_call(self, devices: tuple[int, ...], method: str, *args: Any) -> list[Any]:
        """One collective call on every training rank. A dead rank, or one respawned (its new actor
        holds no rank), raises `TrainingRankDied` naming its device, whatever the other ranks raised
        (waiting at most `PEER_GRACE_S` more for them); past its time limit `TimeLimitExceeded`."""
        import ray

        if lost := sorted(set(devices) - self.train_ranks):  # respawned since training shifted up
            raise TrainingRankDied(lost, method)
        h = self.handles(devices)
        limit = self.limits.of(TRAIN_CALL_LIMITS.get(method, "train"), "policy")
        t0 = time.monotonic()
        pending = {getattr(h[d][0], method).remote(*args): d for d in devices}
        out, dead, failed, grace = {}, [], [], None
        while pending:
            end = t0 + limit.seconds if grace is None else min(grace, t0 + limit.seconds)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, end - time.monotonic()))
            if not ready:
                if grace is not None:  # the survivors are stuck in a collective with the dead: no more waiting
                    break
                raise TimeLimitExceeded(f"training {method}", list(devices), time.monotonic() - t0, limit.seconds, limit.key)
            d = pending.pop(ready[0])
            try:
                out[d] = ray.get(ready[0])
            except Exception as e:
                if is_dead(e) or d not in self.train_ranks:  # or respawned while the call was in flight
                    dead.append(d)
                    grace = grace or time.monotonic() + PEER_GRACE_S
                else:
                    failed.append(e)
        if dead:  # the survivors' errors (their collectives lost a peer) follow from it
            raise TrainingRankDied(sorted(dead), method)
        if failed:
            raise failed[0]
        return [out[d] for d in devices]

    def close(self) -> None:
        """Close every device actor at once and wait up to 10 s (a vLLM engine takes seconds to go),
        then kill them; a kept cluster (`cluster.keep_devices`) gets back each one reset in time."""
        import ray

        keep, refs, ready = self.cluster.spec.keep_devices, {}, set()
        with contextlib.suppress(Exception):  # Ray itself gone: the kills below are all that is left
            refs = {d: a.reset.remote() if keep else a.close.remote() for d, a in self.actors.items()
                    if d not in self.retired}
            ready = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=10)[0]) if refs else set()
        for d, a in self.actors.items():
            kept = False
            if keep and refs.get(d) in ready:
                with contextlib.suppress(Exception):  # a dead actor's call raises: not kept
                    kept = ray.get(refs[d]) is True
            if not kept:
                with contextlib.suppress(Exception):
                    ray.kill(a)
            if keep:
                self.cluster.devices[d] = (a if kept else None, self.generation[d])

