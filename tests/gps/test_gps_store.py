"""The store on real bytes: exact reassembly, write/read identity across layouts, versions, leases,
bad input leaving the store unchanged, and no torn reads under a concurrent writer."""
from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pivotrl.config.gps import GPSConfig
from pivotrl.gps import (GlobalParameterStore, BudgetError, Device, FrozenModelError, Layout, ModelSpec, ShardMismatchError,
                         UnknownModelError, UnknownVersionError)
from pivotrl.gps.layout import device_shards
from tests.gps.gps_helpers import TINY, TINY_MOE, digest, random_state_dict

SPEC = ModelSpec.from_config(TINY)
SD = random_state_dict(SPEC, seed=1)


def expected_shard(spec: ModelSpec, sd, layout: Layout, rank: int) -> dict[str, torch.Tensor]:
    """What rank `rank` must hold, built independently of the planner: slice and concatenate."""
    out = {}
    for lt in device_shards(spec, layout)[rank]:
        parts = [sd[p.src][tuple(slice(a, b) for a, b in p.src_box)] for p in lt.pieces]
        out[lt.name] = torch.cat(parts, 0) if len(parts) > 1 else parts[0]
    return out


@st.composite
def layouts(draw, moe=False):
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2]))
    pp = draw(st.sampled_from([1, 2] if moe else [1, 2, 3]))
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if moe and (dp * tp) % e == 0] or [1]))
    return Layout(dp=dp, tp=tp, pp=pp, ep=ep, fused_qkv=draw(st.booleans()), fused_gate_up=draw(st.booleans()))


def _devices(draw, layout, nodes):
    return [Device(draw(st.integers(0, nodes - 1)), i) for i in range(layout.world_size)]


@contextlib.contextmanager
def _store_for(spec, nodes, k_hint):
    """A fresh store per hypothesis example; budget sized so placement shards `k_hint` ways (copies
    = 2 for a writable model)."""
    from pivotrl.gps.placement import node_bytes

    store = GlobalParameterStore(GPSConfig(node_memory_budget_bytes=2 * node_bytes(spec, k_hint, 64)), nodes)
    try:
        yield store
    finally:
        store.close()


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_read_reassembles_stored_tensors_exactly(data):
    moe = data.draw(st.booleans())
    spec = ModelSpec.from_config(TINY_MOE if moe else TINY)
    sd = random_state_dict(spec, seed=2)
    nodes = data.draw(st.sampled_from([1, 2, 4]))
    with _store_for(spec, nodes, data.draw(st.sampled_from([d for d in (1, 2, 4) if nodes % d == 0]))) as store:
        store.register("m", spec=spec, state_dict=sd)
        layout = data.draw(layouts(moe))
        devs = _devices(data.draw, layout, nodes)
        zero_copy = data.draw(st.booleans())
        version, shards = store.read("m", devs, layout, zero_copy=zero_copy)
        assert version == 0
        for rank, dev in enumerate(devs):
            want = expected_shard(spec, sd, layout, rank)
            assert shards[dev].keys() == want.keys()
            for name, t in want.items():
                assert shards[dev][name].dtype == t.dtype and torch.equal(shards[dev][name], t), name


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_write_then_read_under_another_layout_is_identity(data):
    nodes = data.draw(st.sampled_from([1, 2, 4]))
    with _store_for(SPEC, nodes, data.draw(st.sampled_from([d for d in (1, 2, 4) if nodes % d == 0]))) as store:
        store.register("m", spec=SPEC, state_dict=SD)
        new = random_state_dict(SPEC, seed=data.draw(st.integers(3, 10**6)))
        wl, rl = data.draw(layouts()), data.draw(layouts())
        wdev, rdev = _devices(data.draw, wl, nodes), _devices(data.draw, rl, nodes)
        v = store.write("m", wdev, wl, {d: expected_shard(SPEC, new, wl, r) for r, d in enumerate(wdev)})
        assert v == 1
        version, shards = store.read("m", rdev, rl)
        assert version == 1
        for r, d in enumerate(rdev):
            for name, t in expected_shard(SPEC, new, rl, r).items():
                assert torch.equal(shards[d][name], t), name
        full = store.read("m", [Device(0)], Layout()).shards[Device(0)]
        assert digest(full) == digest(new)


def test_versions_leases_and_freeing(make_store):
    store = make_store(1)
    store.register("policy", TINY, state_dict=SD)
    one = store.resident_bytes()
    held = store.read("policy", [Device(0)], Layout(), zero_copy=True)  # views: leases v0
    assert held.version == 0
    new = random_state_dict(SPEC, seed=7)
    assert store.write("policy", [Device(0)], Layout(), {Device(0): new}) == 1
    assert store.live_versions("policy") == [0, 1]  # v0 still leased
    assert digest(held.shards[Device(0)]) == digest(SD)  # and unchanged
    assert store.resident_bytes() == 2 * one
    assert store.read("policy", [Device(0)], Layout(), version=0).version == 0  # pinned read of old
    held.release()
    assert store.live_versions("policy") == [1]
    assert store.resident_bytes() == one
    assert store.current_version("policy") == 1
    assert one <= 1.05 * SPEC.nbytes  # one replica costs its bytes plus alignment


def test_out_buffers_are_filled_in_place(make_store):
    store = make_store(1)
    store.register("policy", TINY, state_dict=SD)
    lay, devs = Layout(tp=2), [Device(0, 0), Device(0, 1)]
    out = {d: {lt.name: torch.zeros(lt.shape) for lt in device_shards(SPEC, lay)[r]} for r, d in enumerate(devs)}
    ptrs = {(d, n): t.data_ptr() for d in devs for n, t in out[d].items()}
    res = store.read("policy", devs, lay, out=out)
    for r, d in enumerate(devs):
        for n, t in expected_shard(SPEC, SD, lay, r).items():
            assert res.shards[d][n].data_ptr() == ptrs[(d, n)] and torch.equal(out[d][n], t)


def _state(store):
    return {m: (store.current_version(m), store.live_versions(m), store.table.readers(m),
                digest(store.read(m, [Device(0)], Layout()).shards[Device(0)]) if store.live_versions(m) else None)
            for m in store.models()}, store.resident_bytes(), list(store.table.reserved)


def test_bad_input_is_refused_and_store_unchanged(make_store):
    store = make_store(2, node_memory_budget_bytes=4 * SPEC.nbytes)
    store.register("policy", TINY, state_dict=SD)
    store.register("genrm", TINY, state_dict=random_state_dict(SPEC, seed=5), frozen=True)
    before = _state(store)
    dev2 = [Device(0, 0), Device(1, 0)]
    good = {d: expected_shard(SPEC, SD, Layout(tp=2), r) for r, d in enumerate(dev2)}

    def wrong(fn):
        bad = {d: dict(s) for d, s in good.items()}
        fn(bad[dev2[1]])
        return bad

    cases = [
        (UnknownModelError, "unknown model 'nope'", lambda: store.read("nope", [Device(0)], Layout())),
        (UnknownVersionError, "no live version 7", lambda: store.read("policy", [Device(0)], Layout(), version=7)),
        (ValueError, "tp=3 does not divide", lambda: store.read("policy", [Device(0, i) for i in range(3)], Layout(tp=3))),
        (ValueError, "tp=3 does not divide", lambda: store.write("policy", [Device(0, i) for i in range(3)], Layout(tp=3), {})),
        (ValueError, "got 1 devices for a layout of world size 2", lambda: store.read("policy", [Device(0)], Layout(tp=2))),
        (ValueError, "nodes are 0..1", lambda: store.read("policy", [Device(5)], Layout())),
        (ShardMismatchError, "has shape", lambda: store.write("policy", dev2, Layout(tp=2), wrong(
            lambda s: s.__setitem__("model.norm.weight", torch.zeros(31))))),
        (ShardMismatchError, "has dtype bfloat16, expected float32", lambda: store.write("policy", dev2, Layout(tp=2), wrong(
            lambda s: s.__setitem__("lm_head.weight", s["lm_head.weight"].bfloat16())))),
        (ShardMismatchError, r"missing \['model.norm.weight'\]", lambda: store.write("policy", dev2, Layout(tp=2), wrong(
            lambda s: s.pop("model.norm.weight")))),
        (ShardMismatchError, r"unexpected \['extra'\]", lambda: store.write("policy", dev2, Layout(tp=2), wrong(
            lambda s: s.__setitem__("extra", torch.zeros(1))))),
        (ShardMismatchError, "devices missing", lambda: store.write("policy", dev2, Layout(tp=2), {dev2[0]: good[dev2[0]]})),
        (FrozenModelError, "'genrm' is frozen", lambda: store.write("genrm", dev2, Layout(tp=2), good)),
        (FrozenModelError, "'genrm' is frozen", lambda: store.load_state_dict("genrm", SD)),
        (BudgetError, "node_memory_budget_bytes too small", lambda: store.register(
            "huge", dict(TINY, vocab_size=2**20), state_dict=None)),
        (ValueError, "already registered", lambda: store.register("policy", TINY)),
    ]
    for exc, match, call in cases:
        with pytest.raises(exc, match=match):
            call()
        assert _state(store) == before, match
    # a good write still works afterwards
    assert store.write("policy", dev2, Layout(tp=2), good) == 1


def test_budget_too_small_for_any_placement(make_store):
    store = make_store(2, node_memory_budget_bytes=SPEC.nbytes // 4)
    with pytest.raises(BudgetError, match="even fully sharded over 2 nodes"):
        store.register("policy", TINY, state_dict=SD)
    assert store.models() == [] and store.resident_bytes() == 0


def test_placement_replicates_first_then_smallest_group():
    from pivotrl.gps.placement import choose_placement, node_bytes

    full = node_bytes(SPEC, 1, 64)
    assert choose_placement(SPEC, 4, full, 1, 64).k == 1
    assert choose_placement(SPEC, 4, full - 1, 1, 64).k == 2
    assert choose_placement(SPEC, 4, node_bytes(SPEC, 2, 64) - 1, 1, 64).k == 4


def test_concurrent_writer_never_tears_reads(make_store):
    """Version v has every element of every tensor equal to v: a torn read would mix values."""
    spec = ModelSpec.from_config(dict(TINY, hidden_size=128, intermediate_size=512, vocab_size=512))
    store = make_store(2)

    def sd_of(v):
        return {t.name: torch.full(t.shape, float(v)) for t in spec.tensors}

    store.register("policy", spec=spec, state_dict=sd_of(0))
    wl, wdev = Layout(dp=2, tp=2), [Device(n, i) for n in range(2) for i in range(2)]
    # readers on node 0: its freed buffers are the ones the pool keeps (one per size)
    rl, rdev = Layout(tp=4, fused_qkv=True), [Device(0, i) for i in range(4)]
    stop, errors, seen = threading.Event(), [], []

    def writer():
        try:
            for v in range(1, 40):
                shards = {d: {lt.name: torch.full(lt.shape, float(v)) for lt in device_shards(spec, wl)[r]}
                          for r, d in enumerate(wdev)}
                assert store.write("policy", wdev, wl, shards) == v
        except BaseException as e:  # surfaced below
            errors.append(e)
        finally:
            stop.set()

    def check(res):
        sums = {(float(t.min()), float(t.max())) for s in res.shards.values() for t in s.values()}
        assert sums == {(float(res.version), float(res.version))}, (res.version, sums)

    kept = []  # zero-copy results, rechecked at the end: views outlive their lease and must still
    # show their own version (a freed buffer still in view must never be reused by a write)

    def reader(zero_copy):
        try:
            while not stop.is_set():
                res = store.read("policy", rdev, rl, zero_copy=zero_copy)
                check(res)
                seen.append(res.version)
                res.release()
                if zero_copy:
                    kept.append(res)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(z,)) for z in (False, True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    assert len(set(seen)) > 3  # readers really interleaved with the writer
    for res in kept:
        check(res)
    kept.clear()
    assert store.live_versions("policy") == [39]  # every old version freed once readers let go


def test_write_async_publishes_in_background(make_store):
    store = make_store(2)
    store.register("policy", TINY, state_dict=SD)
    new = random_state_dict(SPEC, seed=21)
    devs = [Device(0, 0), Device(1, 0)]
    with pytest.raises(ShardMismatchError):  # validation is synchronous
        store.write_async("policy", devs, Layout(tp=2), {devs[0]: {}})
    fut = store.write_async("policy", devs, Layout(tp=2),
                            {d: expected_shard(SPEC, new, Layout(tp=2), r) for r, d in enumerate(devs)})
    assert fut.result(timeout=60) == 1
    assert digest(store.read("policy", [Device(1)], Layout()).shards[Device(1)]) == digest(new)


def test_frozen_model_takes_one_initial_load(make_store):
    store = make_store(1)
    store.register("genrm", TINY, frozen=True)
    with pytest.raises(UnknownVersionError, match="has no version yet"):
        store.read("genrm", [Device(0)], Layout())
    with pytest.raises(FrozenModelError):
        store.write("genrm", [Device(0)], Layout(), {Device(0): SD})
    assert store.load_state_dict("genrm", SD) == 0
    with pytest.raises(FrozenModelError):
        store.load_state_dict("genrm", SD)
    assert store.live_versions("genrm") == [0]


def test_plan_cache_by_signature(make_store):
    store = make_store(2, plan_cache_size=2)
    store.register("policy", TINY, state_dict=SD)
    devs = [Device(0, 0), Device(1, 0)]
    p = store.plan("read", "policy", devs, Layout(tp=2))
    assert store.plan("read", "policy", list(devs), Layout(tp=2)) is p  # same signature: cached
    assert store.plan("read", "policy", devs[::-1], Layout(tp=2)) is not p  # other device order
    assert store.plan("write", "policy", devs, Layout(tp=2)) is not p
    assert store.plan("read", "policy", devs, Layout(tp=2)) is not p  # evicted (cache of 2)


def test_freed_buffers_back_the_next_write_unless_a_view_holds_them(make_store):
    store = make_store(1)
    store.register("policy", TINY, state_dict=SD)
    one = store.resident_bytes()
    a, b = random_state_dict(SPEC, seed=31), random_state_dict(SPEC, seed=32)
    store.write("policy", [Device(0)], Layout(), {Device(0): a})  # v0 freed, nothing holds it
    assert store.transport.pooled_bytes() == one and store.resident_bytes() == one
    held = store.read("policy", [Device(0)], Layout(), zero_copy=True)  # views of v1
    held.release()  # lease gone, views still alive
    store.write("policy", [Device(0)], Layout(), {Device(0): b})  # v2 reuses v0's buffer
    assert store.transport.pooled_bytes() == 0  # v1 was not pooled: a view still uses it
    assert digest(held.shards[Device(0)]) == digest(a)  # and the view still shows v1
    assert digest(store.read("policy", [Device(0)], Layout()).shards[Device(0)]) == digest(b)


# --- row writes (trainer ranks write their own FSDP2 rows) and file manifests ---------------------
def _fsdp_rows(n: int, world: int, rank: int) -> tuple[int, int]:
    size = -(-n // world)
    a = min(n, rank * size)
    return a, min(n, a + size)


@pytest.mark.parametrize("num_nodes,budget,world", [(1, 64 * 2**30, 3), (2, 64 * 2**30, 2), (2, None, 3)])
def test_row_writes_from_every_rank_reassemble_the_model(num_nodes, budget, world):
    """Each 'rank' writes torch.chunk's dim-0 rows of every tensor; reads equal the full model, on a
    replicated and on a row-sharded (k = 2) placement."""
    if budget is None:  # room for a bit more than half the model per node: forces k = 2
        budget = int(SPEC.nbytes * 3 * 0.6)
    store = GlobalParameterStore(GPSConfig(node_memory_budget_bytes=budget), num_nodes=num_nodes)
    try:
        store.register("m", spec=SPEC)
        if budget < SPEC.nbytes * 3:
            assert store.placement("m").k == 2
        w = store.begin_row_write("m")
        rows: dict[str, int] = {}
        for rank in range(world):
            for t in SPEC.tensors:
                a, b = _fsdp_rows(t.shape[0], world, rank)
                if b > a:
                    rows[t.name] = rows.get(t.name, 0) + store.write_rows(w, t.name, a, SD[t.name][a:b])
        v = store.commit_row_write(w, rows)
        assert v == store.current_version("m") == 0
        got = store.read("m", [Device(num_nodes - 1, 0)], Layout()).shards[Device(num_nodes - 1, 0)]
        assert digest(got) == digest(SD)
    finally:
        store.close()


def test_row_write_casts_to_the_stored_dtype():
    spec16 = ModelSpec.from_config(TINY, dtype="bfloat16")
    store = GlobalParameterStore(GPSConfig())
    try:
        store.register("m", spec=spec16)
        w = store.begin_row_write("m")
        rows = {t.name: store.write_rows(w, t.name, 0, SD[t.name]) for t in spec16.tensors}  # float32 in
        store.commit_row_write(w, rows)
        got = store.read("m", [Device(0, 0)], Layout()).shards[Device(0, 0)]
        assert all(got[k].dtype == torch.bfloat16 and torch.equal(got[k], SD[k].to(torch.bfloat16)) for k in got)
    finally:
        store.close()


def test_an_incomplete_or_bad_row_write_changes_nothing():
    store = GlobalParameterStore(GPSConfig())
    try:
        store.register("m", spec=SPEC, state_dict=SD)
        w = store.begin_row_write("m")
        name = SPEC.tensors[0].name
        with pytest.raises(ShardMismatchError, match="do not fit"):
            store.write_rows(w, name, 1, SD[name])  # one row past the end
        with pytest.raises(ShardMismatchError, match="not a stored tensor"):
            store.write_rows(w, "nope.weight", 0, SD[name])
        rows = {name: store.write_rows(w, name, 0, torch.zeros_like(SD[name]))}
        with pytest.raises(ShardMismatchError, match="incomplete"):
            store.commit_row_write(w, rows)
        assert store.current_version("m") == 0
        assert digest(store.read("m", [Device(0, 0)], Layout()).shards[Device(0, 0)]) == digest(SD)
        w2 = store.begin_row_write("m")  # the model's write lock was released by the abort
        v = store.commit_row_write(w2, {t.name: store.write_rows(w2, t.name, 0, SD[t.name]) for t in SPEC.tensors})
        assert v == 1
    finally:
        store.close()


def test_file_manifest_is_none_for_the_in_process_transport():
    store = GlobalParameterStore(GPSConfig())
    try:
        store.register("m", spec=SPEC, state_dict=SD)
        assert store.file_manifest("m", 0) is None  # shm files are unlinked at once
        assert store.live_versions("m") == [0]
    finally:
        store.close()
