"""Executor death bookkeeping without Ray actors (spawn_device replaced by a stub): each death is
recorded once whichever call finds it, a stale handle's second report is ignored, a device that
lost an inference role is unreachable until re-hosted, crash loops are flagged by the window, a
lost trainer state is recovered only from a checkpoint at the policy's version, its rebuild
drops every rank of the lost trainer (one a poll respawned in mid-shift included), and an actor
respawned between its shift up and the shift's booking is not counted as a rank."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

import pivotrl.runtime.executor as executor
from pivotrl.runtime.cluster import ClusterSpec
from pivotrl.runtime.outcomes import TrainingStateLost
from pivotrl.core.types import INFERENCE_ROLES, Role, ShiftPlan, Slot


class StubActor:
    def __init__(self, device, generation):
        self.device, self.generation = device, generation


@pytest.fixture
def ex(monkeypatch):
    import ray

    monkeypatch.setattr(executor, "spawn_device", lambda cluster, d, g=0: StubActor(d, g))
    monkeypatch.setattr(ray, "kill", lambda actor, **k: None)  # a stub has no process (and no Ray starts)
    cluster = SimpleNamespace(spec=ClusterSpec(kind="local", num_devices=3), devices={})
    e = executor.Executor(cluster, specs=None, params=None, model_of={}, max_respawns=2, respawn_window_s=100.0)
    e.role_of[0] = Role.ROLLOUT
    e.train_ranks.add(2)
    return e


def test_a_death_is_recorded_once_whoever_finds_it(ex):
    g = ex.generation[0]
    assert ex.respawn(0, "poll: ActorDiedError", g)
    assert not ex.respawn(0, "publish: ActorDiedError", g), "a second report of the same handle"
    (d,) = ex.take_deaths()
    assert (d.device, d.role, d.generation, d.crash_loop) == (0, Role.ROLLOUT, 1, False)
    assert ex.take_deaths() == [] and len(ex.deaths) == 1
    assert ex.actors[0].generation == 1 and ex.role_of[0] is None
    assert not ex.reachable(0), "no move may reach the fresh actor before its re-host"


def test_a_call_on_a_replaced_actor_never_kills_the_fresh_one(ex):
    """Two calls to device 0 read its handle; one finds it dead and respawns it; the other, failing
    on the same dead actor, reports the generation it called, so the fresh actor is left alone."""
    actor, g = ex.handle(0)
    assert (actor.generation, g) == (0, 0)
    assert ex.respawn(0, "poll: ActorDiedError", g)
    fresh, g1 = ex.handle(0)
    assert (fresh.generation, g1) == (1, 1) and ex.handles([0]) == {0: (fresh, 1)}
    assert not ex.respawn(0, "shift_up: ActorDiedError", g), "the stale call's report"
    assert ex.handle(0) == (fresh, 1) and len(ex.take_deaths()) == 1


def test_a_death_at_re_host_keeps_the_role_it_was_given(ex):
    """A respawned device holds no role; dying again while being re-hosted as rollout, its death
    carries rollout, so the runtime re-queues its sequences and re-hosts it once more."""
    ex.respawn(0, "poll", ex.handle(0)[1])
    ex.take_deaths()
    assert ex.role_of[0] is None
    slot = Slot(Role.ROLLOUT, 0, 1)
    assert ex.respawn(0, "re-host: ActorDiedError", ex.handle(0)[1], slot=slot)
    (d,) = ex.take_deaths()
    assert (d.role, d.slot, d.generation) == (Role.ROLLOUT, slot, 2) and not ex.reachable(0)


def test_a_death_carries_the_slot_its_device_served(ex):
    """A member of a two-device replica dies: its death names the replica's slot (the runtime
    re-joins it without touching the replica's sequences), and the device serves nothing now."""
    slot = Slot(Role.REWARD, 0, 2)
    ex.hosted.update({0: slot, 1: slot})
    assert ex.serving() == {0: Role.REWARD}, "only the first device runs the engine"
    ex.respawn(1, "poll", ex.handle(1)[1])
    (d,) = ex.take_deaths()
    assert d.slot == slot and d.device != slot.first_device
    assert ex.serving() == {0: Role.REWARD} and 1 not in ex.hosted
    ex.respawn(0, "poll", ex.handle(0)[1])  # now the engine's own device: nothing serves there
    assert ex.serving() == {} and ex.take_deaths()[0].slot == slot


def test_crash_loop_is_flagged_within_the_window(ex, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(executor.time, "monotonic", lambda: clock[0])
    flags = []
    for dt in (0, 10, 200, 10, 10):  # the third death falls outside the first two's window
        clock[0] += dt
        ex.respawn(1, "poll", None)
        flags.append(ex.take_deaths()[0].crash_loop)
    assert flags == [False, False, False, False, True]
    ex.retire(1)
    assert not ex.reachable(1) and not ex.respawn(1, "poll", None), "a retired device is never respawned"


def test_lost_trainer_state_needs_its_checkpoint(ex):
    ex.respawn(2, "poll", None)
    (d,) = ex.take_deaths()
    assert d.held_train and ex.train_state_lost and 2 not in ex.train_ranks


def _launch(tmp_path, resume_version=0):
    from pivotrl.config import compose_config
    from pivotrl.config.resolve import resolve
    from pivotrl.runtime.launch import Launch

    cfg = compose_config(["deploy=pivot", "cluster=local", "train.checkpoint_every=5"])
    la = Launch(cfg, resolve(cfg), tmp_path / "p", tmp_path / "g", tmp_path)
    la.resume_version = resume_version
    return la


def test_recovery_without_a_checkpoint_at_the_version_stops_saying_how_to_resume(tmp_path):
    la = _launch(tmp_path)
    with pytest.raises(TrainingStateLost) as ei:
        la.recover_training(3)
    msg = str(ei.value)
    assert "policy version 3" in msg and "train.checkpoint_every=5" in msg
    assert f"train.resume=true hydra.run.dir={tmp_path}" in msg


def test_recovery_points_the_trainer_at_the_checkpoint_of_its_version(tmp_path):
    from pivotrl.core.types import Slot
    from pivotrl.trainer.trainer_checkpoint import checkpoint_dir

    la = _launch(tmp_path)
    ck = checkpoint_dir(tmp_path / "checkpoints", 3)
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text('{"version": 3}')
    asked = []
    slot = Slot(Role.TRAIN, 3, 1)
    lost = la.groups.url(slot, lambda rank0: asked.append(rank0) or "tcp://10.0.0.1:29500")  # the lost trainer's
    la.recover_training(3)
    again = la.groups.url(slot, lambda rank0: asked.append(rank0) or "tcp://10.0.0.1:29501")
    assert la.resume_path == ck and again != lost and asked == [3, 3], "a fresh rendezvous: rank 0 picks a fresh port"
    la.rendezvous = lambda rank0: asked.append(rank0) or f"tcp://10.0.0.1:{29500 + len(asked)}"
    spec = la.role_spec(Slot(Role.TRAIN, 3, 1), 0)
    assert spec.resume_from == str(ck) and spec.init_method == again, "the same slot: the same group"


def test_every_training_slot_change_is_a_new_group_also_through_one_rank(tmp_path):
    """Found in an elastic run: the trainer grown to 2 devices, back on its 1-device home set, then
    grown to the same 2 devices again was handed the first grown group's rendezvous (the one-rank
    home set never asked for one), and its ranks hung in the process group's rendezvous."""
    la = _launch(tmp_path)
    asked = []
    la.rendezvous = lambda rank0: asked.append(rank0) or f"tcp://10.0.0.{rank0}:{29500 + len(asked)}"
    home, grown = Slot(Role.TRAIN, 3, 1), Slot(Role.TRAIN, 2, 2)
    urls = [la.role_spec(s, 0).init_method for s in (home, grown, home, grown)]
    assert len(set(urls)) == 4 and asked == [3, 2, 3, 2]
    assert la.role_spec(grown, 1).init_method == urls[-1], "both ranks of a group meet at one address"


def test_recovery_at_the_start_version_rebuilds_the_start_state(tmp_path):
    la = _launch(tmp_path)
    la.recover_training(0)  # version 0 of a fresh run is the base policy: no checkpoint needed
    assert la.resume_path is None


def test_a_failed_weight_load_replaces_the_device_and_the_others_report_their_load(ex, monkeypatch):
    """Publish: every serving rollout device reads the version the executor names (it never sends
    weights); one whose engine fails the load (it shut itself down) is respawned like a death, so
    its sequences go back to the queue and no half-loaded engine serves; a reward replica is not
    touched; the others' loads come back as measured events."""
    import ray

    from pivotrl.engines.errors import EngineLoadError

    calls = []

    class Loader(StubActor):
        class _Method:
            def __init__(self, actor):
                self.actor = actor

            def remote(self, weights, version, role):
                assert role == Role.ROLLOUT, "a load names the role it is for: the device refuses another's"
                calls.append((self.actor.device, weights, version))
                if self.actor.device == 1:
                    def fail():
                        raise EngineLoadError("load failed: bad tensor", phase="load")
                    return fail
                return lambda: {"seconds": 0.25, "version": 7, "bytes": 100, "path": "file", "gps_version": 2}

        @property
        def load_weights(self):
            return Loader._Method(self)

    monkeypatch.setattr(ray, "get", lambda ref, **k: ref())
    for d in range(3):
        ex.actors[d] = Loader(d, 0)
    ex.params = SimpleNamespace(weights=lambda model: (("gps", model, 2), 7))
    ex.hosted.update({0: Slot(Role.ROLLOUT, 0, 1), 1: Slot(Role.ROLLOUT, 1, 1), 2: Slot(Role.REWARD, 2, 1)})
    ex.role_of.update({0: Role.ROLLOUT, 1: Role.ROLLOUT, 2: Role.REWARD})
    version, per = ex.publish_policy()
    assert version == 7 and sorted(c[0] for c in calls) == [0, 1]
    assert all(c[1:] == (("gps", "policy", 2), 7) for c in calls), "the device reads the named version itself"
    assert per == [{"device": 0, "seconds": 0.25, "version": 7, "bytes": 100, "path": "file", "gps_version": 2}]
    (d,) = ex.take_deaths()
    assert (d.device, d.role, d.slot) == (1, Role.ROLLOUT, Slot(Role.ROLLOUT, 1, 1)) and "publish" in d.why
    assert not ex.reachable(1) and 1 not in ex.serving()


def test_a_training_call_on_a_respawned_rank_is_that_ranks_death(ex, monkeypatch):
    """Device 2 held the trainer's only rank. Respawned (by a poll that found it dead), its new actor
    holds no rank: the next collective call names it as a dead rank instead of sending the call;
    and a respawn while the call is in flight turns the new actor's "no trainer rank" error into
    the same death (the chaos soak met both as an unhandled RuntimeError)."""
    import ray

    from pivotrl.runtime.outcomes import TrainingRankDied

    ex.limits = SimpleNamespace(of=lambda *a: SimpleNamespace(seconds=5.0, key="train"))
    monkeypatch.setattr(StubActor, "train_step", SimpleNamespace(remote=lambda *a: "ref"), raising=False)
    monkeypatch.setattr(ray, "wait", lambda refs, **k: (refs[:1], refs[1:]))

    def respawned_meanwhile(ref):
        ex.respawn(2, "poll: ActorDiedError", None)
        raise RuntimeError("device 2 holds no trainer rank (shift training up first)")

    monkeypatch.setattr(ray, "get", respawned_meanwhile)
    with pytest.raises(TrainingRankDied) as e:
        ex.train_call((2,), "train_step", "batch")
    assert e.value.devices == [2]
    monkeypatch.setattr(ray, "get", lambda ref: pytest.fail("a call reached the respawned actor"))
    with pytest.raises(TrainingRankDied) as e:
        ex.train_call((2,), "train_step", "batch")
    assert e.value.devices == [2]


class _Call:
    """An actor method of `DeviceStub`: `.remote(...)` runs it at once; its "ref" is the result (an
    exception instance: the call failed, and `ray.get` raises it: `_get`)."""

    def __init__(self, fn):
        self.remote = fn


class DeviceStub:
    """A device actor's role bookkeeping as `DeviceWorker` keeps it: the roles it holds, the active
    one, and its refusal to shift a role up that is already active."""

    def __init__(self, device, generation):
        self.device, self.generation = device, generation
        self.held: set[Role] = set()
        self.active: Role | None = None
        self.shift_up = _Call(self._shift_up)
        self.shift_down = _Call(self._shift_down)
        self.drop_role = _Call(self._drop_role)
        self.info = _Call(lambda: {"cores": [device], "accelerators": []})
        self.specs: list = []  # the spec of each shift up it took

    def _shift_up(self, spec, weights, version):
        self.specs.append(spec)
        if self.active == spec.role:
            raise RuntimeError(f"device {self.device}: shift_up({spec.role.value}) while "
                               f"{spec.role.value} is active; shift it down first")
        self.held.add(spec.role)
        self.active = spec.role

    def _shift_down(self):
        if self.active in INFERENCE_ROLES:
            self.held.discard(self.active)
        self.active = None

    def _drop_role(self, role):
        r = Role(role)
        if r not in self.held:
            return False
        self.held.discard(r)
        self.active = None if self.active == r else self.active
        return True



def _get(ref, timeout=None):
    if isinstance(ref, BaseException):
        raise ref
    return ref


@pytest.fixture
def stub_ex(monkeypatch):
    return _stub_executor(monkeypatch, 3)


def _stub_executor(monkeypatch, num_devices):
    """An executor over `num_devices` `DeviceStub`s; device 1 is a training home lent to rollout (it
    keeps its offloaded rank), and a lost trainer is rebuilt (from a checkpoint at version 0)."""
    import ray

    monkeypatch.setattr(executor, "spawn_device", lambda cluster, d, g=0: DeviceStub(d, g))
    monkeypatch.setattr(ray, "kill", lambda actor, **k: None)
    monkeypatch.setattr(ray, "get", _get)
    cluster = SimpleNamespace(spec=ClusterSpec(kind="local", num_devices=num_devices), devices={})
    e = executor.Executor(cluster, specs=lambda slot, i: SimpleNamespace(role=slot.role, leader=None),
                          params=SimpleNamespace(version=lambda model: 0), model_of={},
                          train_recovery=lambda version: None)
    lent = e.actors[1]
    lent.held, lent.active = {Role.TRAIN, Role.ROLLOUT}, Role.ROLLOUT
    e.role_of[1], e.hosted[1] = Role.ROLLOUT, Slot(Role.ROLLOUT, 1, 1)
    e.train_ranks.add(1)
    return e


def test_a_rank_respawned_by_a_poll_during_its_shift_up_is_rebuilt_once(stub_ex, monkeypatch):
    """Chaos kills the lent home as it shifts back to training and the poll thread respawns it
    (flagging the trainer's state lost) before the shift reads its handle: the fresh actor takes
    the rank, so the rebuild from the checkpoint drops that rank before shifting up again (the
    chaos soak once stopped here: `shift_up(train) while train is active`)."""
    ex = stub_ex

    def poll_finds_it_dead(phase, device, actor):
        if phase == "shift_up":
            assert ex.respawn(device, "poll: ActorDiedError", ex.handle(device)[1])

    monkeypatch.setattr(executor, "point", poll_finds_it_dead)
    res = ex.run_shift(ShiftPlan(Role.TRAIN, up=[Slot(Role.TRAIN, 1, 1)], down=[Slot(Role.ROLLOUT, 1, 1)]))
    assert res.error is None, res.error
    fresh = ex.actors[1]
    assert fresh.generation == 1 and fresh.active == Role.TRAIN and fresh.held == {Role.TRAIN}
    assert ex.recoveries == [{"version": 0, "devices": [1], "dropped": [1]}]
    assert ex.train_ranks == {1} and ex.role_of[1] == Role.TRAIN and not ex.train_state_lost


def test_a_rebuild_passes_over_a_dead_rank(stub_ex, monkeypatch):
    """A surviving rank found dead while the rebuild drops the lost trainer's ranks holds nothing to
    drop: the rebuild goes on (that device's next call respawns it)."""
    ex = stub_ex
    ex.train_ranks.add(2)

    ex.actors[2].drop_role = _Call(lambda role: ray_actor_died())
    ex.respawn(0, "poll", None)
    ex.train_state_lost = True
    res = ex.run_shift(ShiftPlan(Role.TRAIN, up=[Slot(Role.TRAIN, 0, 1)]))
    assert res.error is None, res.error
    assert ex.recoveries[-1]["dropped"] == [0, 1, 2] and ex.actors[1].held == {Role.ROLLOUT}
    assert ex.actors[0].active == Role.TRAIN


def ray_actor_died():
    import ray

    return ray.exceptions.ActorDiedError()


def _dies_right_after_its_shift_up(ex, device, monkeypatch):
    """`device`'s shift up succeeds; as `ray.get` hands back its result, a stale poll (a thread of
    its own in the runtime) finds the actor dead and respawns it."""
    import ray

    up = ex.actors[device].shift_up.remote
    ex.actors[device].shift_up = _Call(lambda *a: up(*a) or "up")

    def get(ref, timeout=None):
        if ref == "up":
            assert ex.respawn(device, "poll: ActorDiedError", 0)
            return None
        return _get(ref)

    monkeypatch.setattr(ray, "get", get)


def test_a_rank_respawned_right_after_its_shift_up_is_not_counted(stub_ex, monkeypatch):
    """A cold training build on device 2: its shift up succeeds, then the poll thread finds the actor
    dead and respawns it before the shift books the rank (that respawn saw no rank to lose). The
    fresh actor holds no rank, so it is not one: the trainer's state is lost, and the next
    collective call names device 2 as a dead rank (it used to reach the fresh actor, whose "no
    trainer rank" error stopped the run)."""
    from pivotrl.runtime.outcomes import TrainingRankDied

    ex = stub_ex
    _dies_right_after_its_shift_up(ex, 2, monkeypatch)
    res = ex.run_shift(ShiftPlan(Role.TRAIN, up=[Slot(Role.TRAIN, 2, 1)]))
    assert res.error is None, res.error
    (d,) = ex.take_deaths()
    assert d.device == 2 and not d.held_train, "the respawn came before the shift booked the rank"
    assert ex.actors[2].generation == 1 and ex.actors[2].held == set()
    assert 2 not in ex.train_ranks and ex.train_state_lost
    with pytest.raises(TrainingRankDied) as e:
        ex.train_call((2,), "train_step", "batch")
    assert e.value.devices == [2]


def _serving(ex):
    """`ex` as a runtime gives it: the rollout model in GPS, and role specs whose `leader` is None on a
    replica's first device and that device on the others (its members)."""
    @dataclasses.dataclass(frozen=True)
    class Spec:
        role: Role
        leader: int | None
        placement: Any = None
        engine: Any = dataclasses.field(default_factory=lambda: SimpleNamespace(
            settings=SimpleNamespace(kv_capacity_tokens=64)))

    ex.model_of = {Role.ROLLOUT: "policy"}
    ex.params = SimpleNamespace(version=lambda model: 0, weights=lambda model: ("gps", 0))
    ex.specs = lambda slot, i: Spec(slot.role, None if i == 0 else slot.first_device)
    return ex


def test_a_replica_device_respawned_right_after_its_shift_up_is_re_hosted(stub_ex, monkeypatch):
    """The same window on an inference slot: a stale poll finds device 2's actor dead right after its
    rollout shift up, and the respawn (outside any hosted slot then) carries no slot for the runtime
    to re-host. The shift re-hosts the fresh actor itself instead of booking it as serving (submits
    to it used to fail with "no active inference role" and stop the run)."""
    ex = _serving(stub_ex)
    _dies_right_after_its_shift_up(ex, 2, monkeypatch)
    slot = Slot(Role.ROLLOUT, 2, 1)
    res = ex.run_shift(ShiftPlan(Role.ROLLOUT, up=[slot]))
    assert res.error is None, res.error
    (d,) = ex.take_deaths()
    assert d.device == 2 and d.slot is None, "the respawn came before the shift booked the replica"
    fresh = ex.actors[2]
    assert fresh.generation == 1 and fresh.active == Role.ROLLOUT, "the fresh actor was shifted up"
    assert ex.hosted[2] == slot and ex.role_of[2] == Role.ROLLOUT and ex.reachable(2)


def test_a_tensor_parallel_lead_respawned_right_after_its_shift_up_is_re_hosted_as_the_lead(monkeypatch):
    """The same window on the first device of a 2-device replica: the fresh actor is shifted up as
    the replica's lead again (its engine spans both devices: the placement names both), and the
    member keeps the member role it took, shifted up once."""
    ex = _serving(_stub_executor(monkeypatch, 4))
    _dies_right_after_its_shift_up(ex, 2, monkeypatch)
    slot = Slot(Role.ROLLOUT, 2, 2)
    res = ex.run_shift(ShiftPlan(Role.ROLLOUT, up=[slot]))
    assert res.error is None, res.error
    (d,) = ex.take_deaths()
    assert d.device == 2 and d.slot is None
    lead, member = ex.actors[2], ex.actors[3]
    assert lead.generation == 1 and lead.active == Role.ROLLOUT
    (spec,) = lead.specs
    assert spec.leader is None and spec.placement.devices == (2, 3) and spec.placement.cores == (2, 3)
    assert member.generation == 0 and [s.leader for s in member.specs] == [2], "the member was shifted up once"
    assert ex.hosted[2] == ex.hosted[3] == slot and ex.reachable(2) and ex.reachable(3)
    assert ex.serving() == {1: Role.ROLLOUT, 2: Role.ROLLOUT}  # 1: the lent training home


def test_a_kept_cluster_keeps_only_the_actors_that_reset_in_time(monkeypatch):
    """`close` on a kept cluster (`cluster.keep_devices`): an actor whose reset says True is handed
    back; one that says False (a role it could not drop), one that died and one that did not answer
    within the wait are killed, and the next run spawns their devices afresh (generation + 1)."""
    import ray

    answers = {0: True, 1: False, 2: ray_actor_died(), 3: "late"}

    class Resettable(StubActor):
        @property
        def reset(self):
            return SimpleNamespace(remote=lambda: (self.device, answers[self.device]))

    killed = []
    monkeypatch.setattr(executor, "spawn_device", lambda cluster, d, g=0: Resettable(d, g))
    monkeypatch.setattr(ray, "kill", lambda actor, **k: killed.append(actor.device))
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns, timeout: ([r for r in refs if r[1] != "late"], []))

    def get(ref):
        if isinstance(ref[1], BaseException):
            raise ref[1]
        return ref[1]

    monkeypatch.setattr(ray, "get", get)
    cluster = SimpleNamespace(spec=ClusterSpec(kind="local", num_devices=4, keep_devices=True), devices={})
    executor.Executor(cluster, specs=None, params=None, model_of={}).close()
    assert sorted(killed) == [1, 2, 3]
    assert cluster.devices[0][0].device == 0 and all(cluster.devices[d] == (None, 0) for d in (1, 2, 3))
    again = executor.Executor(cluster, specs=None, params=None, model_of={})
    assert again.actors[0] is cluster.devices[0][0] and again.generation == {0: 0, 1: 1, 2: 1, 3: 1}
