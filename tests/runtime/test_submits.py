"""Submits without waiting (`runtime/submits.py`), on the executor with stub actors and a stub Ray
(no processes): the assigns of several dispatches go out as one call per device; an abort waits
for every submit to its device first (a threaded actor does not order calls); a request made
for a device that died since is never sent to its fresh actor; a dead submit respawns its device
once, whoever finds the death; any other submit error is raised."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import pivotrl.runtime.executor as executor
from pivotrl.core.dispatch import Move
from pivotrl.core.types import Role, Slot
from pivotrl.runtime.cluster import ClusterSpec

R = Role.REWARD


class Ref:
    def __init__(self, log, what, value=None, error=None):
        self.log, self.what, self.value, self.error = log, what, value, error


class StubActor:
    """Records each call (and when its result is taken) into a log shared by all actors."""

    def __init__(self, device, generation, log, fail):
        self.device, self.generation, self.log, self.fail = device, generation, log, fail
        actor = self

        class Method:
            def __init__(self, name):
                self.name = name

            def remote(self, *args):
                actor.log.append(("call", actor.device, actor.generation, self.name, args))
                err = actor.fail.get((actor.device, actor.generation, self.name))
                value = SimpleNamespace(aborted={}, finished=[]) if self.name == "abort" else len(args[0])
                return Ref(actor.log, (actor.device, self.name), value, err)

        self.submit, self.abort = Method("submit"), Method("abort")


@pytest.fixture
def ex(monkeypatch):
    import ray
    import ray.exceptions

    log, fail = [], {}

    def get(ref, timeout=None):
        ref.log.append(("got",) + ref.what)
        if ref.error is not None:
            raise ref.error
        return ref.value

    monkeypatch.setattr(executor, "spawn_device", lambda cluster, d, g=0: StubActor(d, g, log, fail))
    monkeypatch.setattr(ray, "kill", lambda actor, **k: None)
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns=1, timeout=None: (list(refs), []))
    e = executor.Executor(SimpleNamespace(spec=ClusterSpec(kind="local", num_devices=2), devices={}), specs=None, params=None, model_of={})
    for d in (0, 1):
        slot = Slot(R, d, 1)
        e.slots[slot.slot_id], e.hosted[d], e.role_of[d] = slot, slot, R
    e.log, e.fail, e.dead_error = log, fail, ray.exceptions.ActorDiedError()
    return e


def _assign(e, d, *sids):
    return e.execute_moves(R, [Move("assign", sid, Slot(R, d, 1).slot_id) for sid in sids], lambda role, sid: sid)


def test_the_assigns_of_several_dispatches_go_out_as_one_call_per_device(ex):
    _assign(ex, 0, 1, 2)
    _assign(ex, 0, 3)
    _assign(ex, 1, 4)
    assert not [x for x in ex.log if x[0] == "call"], "nothing is sent while events are handled"
    assert ex.submits.pending()
    ex.submits.flush()
    calls = [(x[1], x[4][0]) for x in ex.log if x[0] == "call"]
    assert sorted(calls) == [(0, [1, 2, 3]), (1, [4])]
    ex.submits.check()
    assert not ex.submits.pending() and (ex.submits.calls, ex.submits.requests) == (2, 4)


def test_an_abort_waits_for_every_submit_to_its_device(ex):
    _assign(ex, 0, 1)
    ex.submits.flush()
    _assign(ex, 0, 2)  # buffered, not yet sent
    ex.execute_moves(R, [Move("abort", 1, Slot(R, 0, 1).slot_id)], lambda role, sid: sid)
    order = [(x[0], x[-2] if x[0] == "call" else x[2]) for x in ex.log]
    assert order.index(("got", "submit")) < order.index(("call", "abort")), order
    assert [x[4][0] for x in ex.log if x[0] == "call" and x[3] == "submit"] == [[1], [2]]
    assert not ex.submits.pending()


def test_a_request_for_a_device_that_died_since_is_never_sent_to_its_fresh_actor(ex):
    _assign(ex, 0, 5)
    assert ex.respawn(0, "poll: ActorDiedError", 0)  # a poll found it dead before the flush
    ex.submits.flush()
    assert not [x for x in ex.log if x[0] == "call"]
    assert not ex.submits.pending()
    _assign(ex, 0, 6)  # unhosted until re-hosted: moves to it are left out
    assert not ex.submits.pending()


def test_a_dead_submit_respawns_its_device_once(ex):
    ex.fail[(1, 0, "submit")] = ex.dead_error
    _assign(ex, 1, 7)
    ex.submits.flush()
    ex.submits.check()
    (death,) = ex.take_deaths()
    assert (death.device, death.why, death.generation) == (1, "submit: ActorDiedError", 1)
    assert not ex.respawn(1, "poll: ActorDiedError", 0), "the poll of the same actor finds it already replaced"
    assert not ex.reachable(1) and not ex.submits.pending()


def test_any_other_submit_error_is_raised(ex):
    ex.fail[(0, 0, "submit")] = ValueError("seq_id 8 is already live in engine cpu")
    _assign(ex, 0, 8)
    ex.submits.flush()
    with pytest.raises(ValueError, match="already live"):
        ex.submits.check()
