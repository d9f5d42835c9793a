"""Elastic training on real devices: the trainer's groups and state store (`runtime/elastic.py`),
and a trainer rank that changes group (`roles.TrainHost`) rebuilt from host memory, in this process."""
from __future__ import annotations

import pytest
import torch

from pivotrl.config.gps import GPSConfig
from pivotrl.core.types import Role, Slot
from pivotrl.gps.store import GlobalParameterStore
from pivotrl.models.tiny import create_tiny_model
from pivotrl.runtime.elastic import STATE_MODEL, TrainerGroups, restart_slot
from pivotrl.runtime.roles import RoleSpec, TrainHost
from pivotrl.trainer.state_store import StateHandle, register_state, stored_version
from tests.trainer.test_trainer import TINY, _batch, _cfg

HOME = Slot(Role.TRAIN, 3, 1)


def test_a_group_per_training_slot():
    asked = []

    def fresh(rank0):  # the launch asks rank 0's actor for its node and a free port
        asked.append(rank0)
        return f"tcp://10.0.0.{rank0}:{29500 + len(asked)}"

    g = TrainerGroups(HOME)
    home = g.url(HOME, fresh)
    assert g.url(HOME, fresh) == home and asked == [3]  # the same slot keeps its group (and its ranks their trainer)
    grown = g.url(Slot(Role.TRAIN, 2, 2), fresh)
    assert asked[-1] == 2  # rank 0 of the grown group is its first device
    assert grown != home and g.url(HOME, fresh) not in (home, grown)  # back home: a new group
    again = g.url(HOME, fresh)
    g.reset()
    assert g.url(HOME, fresh) != again
    assert g.preserve(HOME)  # no state store: every rank keeps its trainer, as without elastic training
    g.state = object()
    assert g.preserve(HOME) and not g.preserve(Slot(Role.TRAIN, 2, 2))
    assert not g.holds_version(0)  # nothing written by a step yet


def test_restart_slot_is_the_longest_run_of_survivors():
    assert restart_slot((4, 5, 6, 7), [5]) == Slot(Role.TRAIN, 6, 2)
    assert restart_slot((4, 5, 6, 7), [7]) == Slot(Role.TRAIN, 4, 3)
    assert restart_slot((4, 5, 6, 7), [4, 6]) == Slot(Role.TRAIN, 7, 1)  # a tie: nearer the home set
    assert restart_slot((2, 3), [2, 3]) is None


def test_a_state_that_does_not_fit_turns_elastic_training_off(tmp_path, caplog):
    folder = create_tiny_model(tmp_path / "m", TINY, seed=1)

    class Params:
        store = GlobalParameterStore(GPSConfig(node_memory_budget_bytes=1 << 16))

    g = TrainerGroups(HOME)
    g.register(Params, folder)
    assert g.state is None and "does not fit GPS's host memory" in g.off and "home set" in g.off
    assert "does not fit" in caplog.text
    Params.store.close()


def test_a_rank_joining_another_group_is_rebuilt_from_host_memory(tmp_path):
    """Home group: built from the folder, its first state written; a step, the state written.
    Another group (a grown trainer's): the rank drops its trainer and process group, joins the
    new one and reads the state (`reshard_s`, cold); outside the home set it drops it on shift down."""
    import torch.distributed as dist

    folder = create_tiny_model(tmp_path / "m", TINY, seed=0)
    store = GlobalParameterStore(GPSConfig())
    register_state(store, STATE_MODEL, folder)
    st = StateHandle(store, STATE_MODEL)

    def spec(url, preserve):
        return RoleSpec(Role.TRAIN, "policy", str(folder), trainer=_cfg(kl_coef=0.0), rank=0, world_size=1,
                        init_method=url, state=st, preserve=preserve)

    host = TrainHost(spec(f"file://{tmp_path}/g1", True))
    try:
        up = host.shift_up(None, 0)
        assert up.cold and "reshard_s" not in up.detail and "state_write_s" in up.detail
        assert stored_version(store, STATE_MODEL) == 0  # the first state, for the groups that come next
        host.worker.step(_batch(1))
        host.worker.save_state(store, STATE_MODEL)
        want = {n: p.detach().clone() for n, p in host.worker.model.named_parameters()}
        down = host.shift_down()
        assert "offloaded_bytes" in down.detail and host.worker is not None  # home: kept, offloaded
        warm = host.shift_up(None, 0)
        assert not warm.cold and "reloaded_bytes" in warm.detail
        host.shift_down()

        host.retarget(spec(f"file://{tmp_path}/g2", False))
        up = host.shift_up(None, 0)
        assert up.cold and up.detail["reshard_s"] > 0 and up.detail["state_read_bytes"] > 0
        assert host.worker.version == 1 and host.group.endswith("g2")
        for n, p in host.worker.model.named_parameters():
            assert torch.equal(p.detach(), want[n]), n
        down = host.shift_down()
        assert down.detail == {"dropped": 1.0} and host.worker is None and not dist.is_initialized()
    finally:
        host.close()
        store.close()
    assert not dist.is_initialized()
