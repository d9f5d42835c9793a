"""Planner invariants: exact coverage, greedy load balance, locality, write symmetry (pure, no bytes)."""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from pivotrl.gps.layout import Layout, ModelSpec, box_numel
from pivotrl.gps.placement import Placement
from pivotrl.gps.planner import Device, LinkProfile, plan_read, plan_write
from tests.gps.gps_helpers import TINY, TINY_MOE

SPEC = ModelSpec.from_config(TINY)
MOE = ModelSpec.from_config(TINY_MOE)
EQUAL = LinkProfile(1e9, 1e9, 0.0)
HOPPER = LinkProfile(63e9, 50e9, 2e-5)


@st.composite
def cases(draw):
    moe = draw(st.booleans())
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2]))
    pp = draw(st.sampled_from([1, 2] if moe else [1, 2, 3]))
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if moe and (dp * tp) % e == 0] or [1]))
    layout = Layout(dp=dp, tp=tp, pp=pp, ep=ep, fused_qkv=draw(st.booleans()), fused_gate_up=draw(st.booleans()))
    nodes = draw(st.sampled_from([1, 2, 3, 4]))
    k = draw(st.sampled_from([d for d in range(1, nodes + 1) if nodes % d == 0]))
    devs = [Device(draw(st.integers(0, nodes - 1)), i) for i in range(layout.world_size)]
    return (MOE if moe else SPEC), layout, Placement(nodes, k), devs, draw(st.booleans())


@settings(max_examples=40, deadline=None)
@given(cases())
def test_read_plan_covers_each_device_element_once(case):
    spec, layout, placement, devs, local = case
    plan = plan_read(spec, devs, layout, placement, HOPPER, prefer_local=local)
    got = Counter()
    for t in plan.transfers:
        assert t.holder in placement.holders(t.chunk)
        r0, r1 = placement.row_range(spec[t.src].shape[0], t.chunk)
        assert r0 <= t.src_box[0][0] < t.src_box[0][1] <= r1  # inside the holder's chunk
        assert [b - a for a, b in t.src_box] == [b - a for a, b in t.dst_box]
        got[(t.device, t.dst)] += box_numel(t.dst_box)
        if local and placement.chunk_of(devs[t.device].node) == t.chunk:
            assert t.holder == devs[t.device].node
    want = {(di, lt.name): box_numel(tuple((0, s) for s in lt.shape))
            for di in range(len(devs)) for lt in plan.tensors[di]}
    assert dict(got) == want
    # no overlaps: destination boxes of one device tensor are disjoint (sum == size and all inside)
    seen = {}
    for t in plan.transfers:
        seen.setdefault((t.device, t.dst), []).append(t.dst_box)
    for key, boxes in seen.items():
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert any(max(x0, y0) >= min(x1, y1) for (x0, x1), (y0, y1) in zip(a, b)), key


@settings(max_examples=40, deadline=None)
@given(cases())
def test_write_plan_fills_every_holder_chunk_once(case):
    spec, layout, placement, devs, local = case
    plan = plan_write(spec, devs, layout, placement, HOPPER, prefer_local=local)
    got = Counter()
    for t in plan.transfers:
        got[(t.holder, t.src)] += box_numel(t.src_box)
    for node in range(placement.num_nodes):
        for ts in spec.tensors:
            r0, r1 = placement.row_range(ts.shape[0], placement.chunk_of(node))
            assert got[(node, ts.name)] == (r1 - r0) * box_numel(tuple((0, s) for s in ts.shape[1:]))


@settings(max_examples=40, deadline=None)
@given(cases(), st.sampled_from([0.0, 1e-6]))
def test_greedy_balance_within_fair_share_plus_one_slice(case, overhead):
    """Equal links: every holder serves at most total/holders + the largest single transfer."""
    spec, layout, _, devs, _ = case
    nodes = 4
    placement = Placement(nodes, 1)  # every node holds everything: all holders are candidates
    links = LinkProfile(1e9, 1e9, overhead)
    # all devices on a node that holds nothing is impossible here; use prefer_local=False so every
    # holder competes for every demand
    plan = plan_read(spec, devs, layout, placement, links, prefer_local=False)
    costs = [links.cost(t.nbytes, True) for t in plan.transfers]
    fair = sum(costs) / nodes
    assert max(plan.load.values()) <= fair + max(costs) + 1e-12
    # and the per-holder accumulated load is what the transfers add up to
    per = Counter()
    for t, c in zip(plan.transfers, costs):
        per[t.holder] += c
    for h, v in per.items():
        assert abs(v - plan.load[h]) < 1e-9


def test_greedy_gives_fast_links_more_data():
    devs = [Device(0, 0)]
    placement = Placement(2, 1)
    plan = plan_read(SPEC, devs, Layout(), placement, LinkProfile(4e9, 1e9, 0.0), prefer_local=False)
    by = plan.bytes_by_route()
    assert by["local"] > 2 * by["remote"] > 0  # local link 4x faster: ~4/5 of the bytes stay local


def test_prefer_local_keeps_replicated_reads_node_local():
    devs = [Device(n, i) for n in range(4) for i in range(2)]
    plan = plan_read(SPEC, devs, Layout(dp=2, tp=4), Placement(4, 1), HOPPER)
    assert plan.bytes_by_route()["remote"] == 0
    hybrid = plan_read(SPEC, devs, Layout(dp=8), Placement(4, 2), HOPPER)
    by = hybrid.bytes_by_route()
    # sharded over groups of k=2 nodes: each whole-model read pulls about (k-1)/k = 1/2 remotely
    assert 0.45 < by["remote"] / (by["local"] + by["remote"]) < 0.55


def test_write_dedups_dp_replicas_and_prefers_local_senders():
    devs = [Device(0, 0), Device(1, 0)]  # DP=2, one replica per node
    plan = plan_write(SPEC, devs, Layout(dp=2), Placement(2, 1), HOPPER)
    assert all(devs[t.device].node == t.holder for t in plan.transfers)
    assert sum(t.nbytes for t in plan.transfers) == 2 * SPEC.nbytes  # each node gets one full copy
