"""`build_timeline` on small hand-written timelines, value by value, and on a real simulated run."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from pivotrl.report.timeline import ROLES, Interval, build_timeline, slot_devices

ROOT = str(Path(__file__).resolve().parents[2])  # the repository, for subprocesses


def shift(now, role_up, up, down=(), penalty=0.0):
    return {"kind": "shift", "now": now, "role_up": role_up, "up": list(up), "down": list(down), "penalty": penalty}


def alloc(now, down_s, up_s):
    return {"kind": "allocation", "now": now, "allocation": {}, "shift_seconds": [down_s, up_s]}


def decision(now, role_up, up, benefit, applied=True, rt=None, thr=None):
    cand = {"role_up": role_up, "up": list(up), "down": [], "penalty": 0.0, "k": len(up), "benefit": benefit,
            "throughput": thr, "role_throughput": rt or {}}
    return {"kind": "decision", "now": now, "role_up": role_up, "reason": "r", "trigger": "tick",
            "chosen": {"role_up": role_up, "up": list(up), "down": [], "penalty": 0.0} if applied else None,
            "candidates": [cand, {**cand, "up": ["x@9x1"], "benefit": -1.0}], "applied": applied}


# 4 devices, local-style (no throughput records): start-up, a lend of the training home to rollout,
# a rollout->reward shift, training takes its home back, trains, and gives it up; a device dies.
RECORDS = [
    shift(0.0, "train", ["train@3x1"]),
    shift(0.0, "reward", ["reward@0x1"]),
    shift(0.0, "rollout", ["rollout@1x1", "rollout@2x1"]),
    alloc(1.0, 0.0, 1.0), alloc(1.0, 0.0, 1.0), alloc(1.0, 0.0, 1.0),
    decision(5.0, "rollout", ["rollout@3x1"], 100.0, rt={"rollout": 40.0, "reward": 9.0}, thr=12.0),
    shift(5.0, "rollout", ["rollout@3x1"], ["train@3x1"]),
    {"kind": "shift_timing", "now": 7.0, "role_up": "rollout"},
    alloc(7.0, 0.5, 1.5),
    decision(10.0, "reward", ["reward@1x1"], 50.0, rt={"rollout": 30.0, "reward": 20.0}, thr=15.0),
    shift(10.0, "reward", ["reward@1x1"], ["rollout@1x1"], penalty=12.5),
    alloc(12.0, 1.0, 1.0),
    shift(14.0, "train", ["train@3x1"], ["rollout@3x1"]),
    alloc(15.0, 0.5, 0.5),
    {"kind": "device_death", "now": 18.0, "device": 0, "role": "reward"},
    shift(20.0, "train", [], ["train@3x1"]),
    alloc(21.0, 1.0, 0.0),
    decision(22.0, "rollout", ["rollout@3x1"], -3.0, applied=False),
]
METRICS = [{"step": 1, "time_s": 20.0, "train_start": 15.0, "train_end": 20.0,
            "role_state": {"rollout": {"throughput_tokens_per_s": 33.0}, "reward": {"throughput_tokens_per_s": 7.0}}}]
EXPECTED = {
    0: [(0, 1, "shifting"), (1, 22, "reward")],
    1: [(0, 1, "shifting"), (1, 10, "rollout"), (10, 12, "shifting"), (12, 22, "reward")],
    2: [(0, 1, "shifting"), (1, 22, "rollout")],
    3: [(0, 1, "shifting"), (1, 5, "train"), (5, 7, "shifting"), (7, 14, "rollout"), (14, 15, "shifting"),
        (15, 20, "train"), (20, 21, "shifting"), (21, 22, "free")],
}


def covers(tl):
    """Each device's intervals tile [0, end]: no gap, no overlap, neighbours differ."""
    for d in range(tl.num_devices):
        ivs = tl.device_intervals(d)
        assert ivs[0].start == 0.0 and ivs[-1].end == pytest.approx(tl.end)
        for a, b in zip(ivs, ivs[1:]):
            assert a.end == pytest.approx(b.start) and a.role != b.role
        assert all(iv.end > iv.start for iv in ivs)


def test_intervals_value_by_value():
    tl = build_timeline(RECORDS, METRICS, 4)
    assert tl.end == 22.0 and tl.num_devices == 4
    got = {d: [(iv.start, iv.end, iv.role) for iv in tl.device_intervals(d)] for d in range(4)}
    assert got == EXPECTED
    covers(tl)
    secs = tl.device_seconds()
    assert sum(secs.values()) == pytest.approx(4 * 22.0)
    assert secs["shifting"] == pytest.approx(4 * 1 + 2 + 2 + 1 + 1)
    assert set(secs) == set(ROLES)


def test_each_shift_once_with_its_end():
    tl = build_timeline(RECORDS, METRICS, 4)
    assert [(s.start, s.end, s.role_up, s.devices) for s in tl.shifts] == [
        (0.0, 1.0, "train", (3,)), (0.0, 1.0, "reward", (0,)), (0.0, 1.0, "rollout", (1, 2)),
        (5.0, 7.0, "rollout", (3,)), (10.0, 12.0, "reward", (1,)), (14.0, 15.0, "train", (3,)),
        (20.0, 21.0, "train", (3,))]
    assert tl.shifts[4].penalty == 12.5
    assert len(tl.shifts) == sum(1 for r in RECORDS if r["kind"] == "shift")


def test_steps_training_decisions_deaths_and_series():
    tl = build_timeline(RECORDS, METRICS, 4)
    assert tl.steps == [(1, 20.0)] and tl.training == [(1, 15.0, 20.0)]
    assert tl.deaths == [(18.0, 0)]
    assert [(d.now, d.applied, d.k, d.benefit) for d in tl.decisions] == [
        (5.0, True, 1, 100.0), (10.0, True, 1, 50.0), (22.0, False, 0, -1.0)]
    assert [d.now for d in tl.largest_decisions(5)] == [5.0, 10.0]  # applied only, largest first
    th = tl.throughput
    assert (th["rollout"]["actual"].t, th["rollout"]["actual"].v) == ([20.0], [33.0])
    assert (th["overall"]["actual"].t, th["overall"]["actual"].v) == ([20.0], [40.0])
    # local runs: modelled = the planner's model of each applied decision's chosen plan
    assert (th["rollout"]["modelled"].t, th["rollout"]["modelled"].v) == ([5.0, 10.0], [40.0, 30.0])
    assert th["overall"]["modelled"].v == [12.0, 15.0]


def test_overlapping_plans_match_by_their_durations():
    """A long plan started first and a short one after: each allocation closes the right one."""
    recs = [shift(0.0, "rollout", ["rollout@0x1"]), shift(1.0, "reward", ["reward@1x1"]),
            alloc(2.0, 0.0, 1.0), alloc(5.0, 1.0, 4.0)]
    tl = build_timeline(recs, [], 2)
    assert [(s.role_up, s.start, s.end) for s in tl.shifts] == [("rollout", 0.0, 5.0), ("reward", 1.0, 2.0)]
    assert [(iv.start, iv.end, iv.role) for iv in tl.device_intervals(1)] == [
        (0.0, 1.0, "free"), (1.0, 2.0, "shifting"), (2.0, 5.0, "reward")]


def test_plans_started_together_are_told_apart_by_shift_timing():
    """Real runtimes: three start-up plans at t=0 end in another order than they started; the
    `shift_timing` record before each allocation names the plan's role and devices."""
    def timing(now, role, devs):
        return {"kind": "shift_timing", "now": now, "role_up": role,
                "devices": [{"device": d, "direction": "up", "seconds": now} for d in devs]}

    recs = [shift(0.0, "train", ["train@2x1"]), shift(0.0, "reward", ["reward@0x1"]),
            shift(0.0, "rollout", ["rollout@1x1"]),
            timing(3.0, "rollout", [1]), alloc(3.0, 0.0, 3.0),
            timing(4.0, "train", [2]), alloc(4.0, 0.0, 4.0),
            timing(9.0, "reward", [0]), alloc(9.0, 0.0, 9.0)]
    tl = build_timeline(recs, [], 3)
    assert [(s.role_up, s.end) for s in tl.shifts] == [("train", 4.0), ("reward", 9.0), ("rollout", 3.0)]
    assert [(iv.start, iv.end, iv.role) for iv in tl.device_intervals(1)] == [
        (0.0, 3.0, "shifting"), (3.0, 9.0, "rollout")]

def test_sim_throughput_records_are_the_series_and_a_cut_run_keeps_its_open_shift():
    recs = [shift(0.0, "rollout", ["rollout@0x2"]), alloc(1.0, 0.0, 1.0),
            decision(2.0, "reward", ["reward@0x1"], 5.0, rt={"rollout": 1.0, "reward": 2.0}, thr=1.5),
            {"kind": "throughput", "now": 2.0, "rollout": 10.0, "reward": 4.0, "overall": 6.0,
             "actual": {"rollout": 9.0, "reward": 3.5}, "actual_total": 12.5},
            shift(3.0, "reward", ["reward@0x1"], ["rollout@0x2"]),
            {"kind": "throughput", "now": 4.0, "rollout": 0.0, "reward": "inf", "overall": 2.0,
             "actual": {"rollout": 0.0, "reward": 1.0}, "actual_total": 1.0}]
    tl = build_timeline(recs, [], 2)
    th = tl.throughput
    assert (th["rollout"]["modelled"].t, th["rollout"]["modelled"].v) == ([2.0, 4.0], [10.0, 0.0])
    assert (th["reward"]["modelled"].t, th["reward"]["modelled"].v) == ([2.0], [4.0])  # "inf" is no point
    assert th["overall"]["actual"].v == [12.5, 1.0]
    assert tl.end == 4.0
    assert [(s.start, s.end) for s in tl.shifts] == [(0.0, 1.0), (3.0, None)]
    assert [(iv.start, iv.end, iv.role) for iv in tl.device_intervals(1)] == [
        (0.0, 1.0, "shifting"), (1.0, 3.0, "rollout"), (3.0, 4.0, "shifting")]
    covers(tl)


def test_a_resumed_run_continues_the_clock():
    first = [shift(0.0, "rollout", ["rollout@0x1"]), alloc(1.0, 0.0, 1.0), decision(9.0, "rollout", [], 1.0)]
    second = [{"kind": "resume", "now": 0.0, "version": 1}, shift(0.0, "reward", ["reward@0x1"]), alloc(2.0, 0.0, 2.0)]
    metrics = [{"step": 1, "time_s": 8.0, "train_start": 7.0, "train_end": 8.0},
               {"step": 2, "time_s": 3.0, "train_start": 2.5, "train_end": 3.0}]
    tl = build_timeline(first + second, metrics, 1)
    assert [(iv.start, iv.end, iv.role) for iv in tl.device_intervals(0)] == [
        (0.0, 1.0, "shifting"), (1.0, 9.0, "rollout"), (9.0, 11.0, "shifting"), (11.0, 12.0, "reward")]
    # the second segment starts where the first ended (its last record, t=9, after its last step at 8)
    assert tl.steps == [(1, 8.0), (2, 12.0)] and tl.training[1] == (2, 11.5, 12.0)


def test_slot_ids():
    assert slot_devices("train@16x16") == ("train", tuple(range(16, 32)))
    with pytest.raises(ValueError, match="role@FIRSTxTP"):
        slot_devices("rollout-3")


def test_real_sim_run_matches_its_allocation_samples(sim_run):
    """On a real `cluster=sim` pivot run: every throughput sample's allocation (devices per role,
    written by the controller) equals the device states rebuilt from shift/allocation records
    whenever no shift is in flight, and every shift record appears once."""
    tl_rows = [json.loads(x) for x in (sim_run / "timeline.jsonl").read_text().splitlines()]
    m_rows = [json.loads(x) for x in (sim_run / "metrics.jsonl").read_text().splitlines()]
    tl = build_timeline(tl_rows, m_rows, 8)
    covers(tl)
    assert len(tl.shifts) == sum(1 for r in tl_rows if r["kind"] == "shift") > 5
    assert all(s.end is not None for s in tl.shifts)
    checked = 0
    for r in tl_rows:
        if r["kind"] != "throughput":
            continue
        at = collections.Counter(iv.role for iv in tl.intervals if iv.start <= r["now"] + 1e-9 < iv.end)
        if at["shifting"]:
            continue
        assert {k: v for k, v in at.items() if v} == {k: v for k, v in r["allocation"].items() if v}, r["now"]
        checked += 1
    assert checked > 10
    # and each allocation record (the controller's devices per role right after a plan completes,
    # devices of plans still in flight counted for their target) agrees with the rebuilt states
    checked = 0
    for i, r in enumerate(tl_rows):
        t = r.get("now")
        if r["kind"] != "allocation" or any(x["kind"] == "shift" and x.get("now") == t for x in tl_rows[i + 1:i + 5]):
            continue  # a plan started at the same instant, after this record, would blur the check
        state = {iv.device: iv.role for iv in tl.intervals if iv.start <= t + 1e-9 < iv.end}
        for s in tl.shifts:
            if s.start < t - 1e-9 and (s.end is None or s.end > t + 1e-9):
                up = {d for u in s.up for d in slot_devices(u)[1]}
                state.update({d: (s.role_up if d in up else "free") for d in s.devices})
        got = collections.Counter(state.values())
        assert {k: v for k, v in got.items() if v} == {k: v for k, v in r["allocation"].items() if v}, t
        checked += 1
    assert checked > 5
    assert len(tl.training) == len(m_rows) and tl.steps[-1][1] == pytest.approx(tl.end)
    assert isinstance(tl.intervals[0], Interval)


def test_report_imports_no_torch_ray_or_vllm():
    """The report reads files only: usable on a laptop with a copied folder."""
    import os
    import subprocess
    import sys

    code = ("import sys, pivotrl.report.__main__, pivotrl.report.plot, pivotrl.report.table, pivotrl.report.accuracy\n"
            "import pivotrl.report.timeline\n"
            "print(sorted(m for m in ('torch', 'ray', 'vllm', 'omegaconf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT}).stdout.strip()
    assert out == "[]"
