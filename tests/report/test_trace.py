"""The run's Perfetto trace (`trace.json`, Chrome trace event format): its schema on a real sim run
and on a real local run folder, and what each kind of record becomes."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from pivotrl.report.timeline import ROLES, build_timeline
from pivotrl.report.trace import PID_LOAD, PID_OPS, PID_ROLES, PID_RUN, RUN_TRACKS, chrome_trace, write_trace

LOCAL = Path(__file__).parent / "data" / "local_pivot_4steps"


def check_trace(trace: dict) -> dict[str, list[dict]]:
    """Assert the Chrome trace schema Perfetto reads (every event has ph/name/ts/pid/tid; slices
    have a duration > 0 and never overlap on one track; async spans are balanced; counters carry
    numbers; every track used is named); return the events by phase."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    by: dict[str, list[dict]] = defaultdict(list)
    for e in trace["traceEvents"]:
        assert {"ph", "name", "ts", "pid", "tid"} <= set(e), e
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        by[e["ph"]].append(e)
    assert set(by) <= {"M", "X", "i", "b", "e", "C"}, set(by)
    tracks = defaultdict(list)
    for e in by["X"]:
        assert e["dur"] > 0, e
        tracks[(e["pid"], e["tid"])].append(e)
    for evs in tracks.values():
        evs.sort(key=lambda e: e["ts"])
        for a, b in zip(evs, evs[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (a, b)
    opened = {}
    for e in sorted(by["b"] + by["e"], key=lambda e: (e["ts"], e["ph"] == "b")):
        key = (e["cat"], e["id"])
        if e["ph"] == "b":
            assert key not in opened, e
            opened[key] = e
        else:
            b = opened.pop(key)
            assert b["name"] == e["name"] and b["ts"] <= e["ts"], (b, e)
    assert not opened, "every async span ends"
    for e in by["C"]:
        assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
    named = {(e["pid"], e["tid"]) for e in by["M"] if e["name"] == "thread_name"}
    assert set(tracks) <= named, set(tracks) - named
    assert {e["pid"] for e in by["M"] if e["name"] == "process_name"} >= {e["pid"] for e in trace["traceEvents"]}
    return by


def test_a_sim_run_writes_its_trace(sim_run):
    """`pivotrl.run` wrote trace.json: a track per device with its role over time, each device's
    shift halves, the training steps, one async span per shift plan and per-role counters."""
    cfg = json.loads(json.dumps(__import__("yaml").safe_load((sim_run / "config.yaml").read_text())))
    trace = json.loads((sim_run / "trace.json").read_text())
    by = check_trace(trace)
    role_tracks = {e["tid"] for e in by["X"] if e["pid"] == PID_ROLES}
    n = json.loads((sim_run / "summary.json").read_text())["devices"]
    assert role_tracks == set(range(n)) and {e["name"] for e in by["X"] if e["pid"] == PID_ROLES} <= set(ROLES)
    ops = {e["name"] for e in by["X"] if e["pid"] == PID_OPS}
    assert any(x.startswith("up ") for x in ops) and any(x.startswith("down ") for x in ops)
    train = [e for e in by["X"] if (e["pid"], e["tid"]) == (PID_RUN, RUN_TRACKS["training"])]
    assert len(train) == cfg["train"]["steps"]
    assert by["b"] and len(by["b"]) == len(by["e"])
    counters = {e["name"] for e in by["C"] if e["pid"] == PID_LOAD}
    assert counters == {"rollout sequences", "rollout KV tokens", "reward sequences", "reward KV tokens"}
    assert max(e["args"]["running"] for e in by["C"] if e["name"] == "rollout sequences") > 0
    # the role over time adds up: every device is covered from its first to its last event
    span = max(e["ts"] + e["dur"] for e in by["X"] if e["pid"] == PID_ROLES)
    for d in role_tracks:
        assert sum(e["dur"] for e in by["X"] if (e["pid"], e["tid"]) == (PID_ROLES, d)) == pytest.approx(span, rel=1e-6)


def test_a_local_run_folder_gives_a_valid_trace(tmp_path):
    """A real `cluster=local` run's folder (checked in): shift halves as each device measured them
    (cold builds marked), and each device's weight loads."""
    by = check_trace(json.loads(write_trace(LOCAL, tmp_path / "trace.json").read_text()))
    ops = [e for e in by["X"] if e["pid"] == PID_OPS]
    assert any(e["name"] == "up rollout (cold)" and e["args"]["cold"] for e in ops)
    assert any(e["name"].startswith("load v") and e["args"]["seconds"] > 0 for e in ops)


def test_each_record_kind_becomes_its_span():
    rows = [
        {"kind": "validation", "now": 0.0, "which": "before", "seconds": 2.0, "accuracy": 0.5, "greedy": 0.6},
        {"kind": "shift", "now": 1.0, "role_up": "rollout", "up": ["rollout@0x2"], "down": ["train@0x2"]},
        {"kind": "shift_timing", "now": 4.0, "role_up": "rollout", "devices": [
            {"device": 0, "role": "train", "direction": "down", "seconds": 0.5, "cold": False},
            {"device": 0, "role": "rollout", "direction": "up", "seconds": 2.0, "cold": True},
            {"device": 1, "role": "rollout", "direction": "up", "seconds": 1.0, "cold": False}]},
        {"kind": "allocation", "now": 4.0, "allocation": {"rollout": 2}, "shift_seconds": [0.5, 2.0]},
        {"kind": "weight_publish", "now": 6.0, "version": 1, "seconds": 0.25},
        {"kind": "weight_refresh", "now": 7.0, "version": 1, "wait_s": 0.5,
         "devices": [{"device": 1, "seconds": 0.2, "bytes": 10, "path": "file"}]},
        {"kind": "role_load", "now": 5.0, "rollout": {"running": 3, "queued": 2, "kv_used": 40, "kv_capacity": 100}},
        {"kind": "device_death", "now": 8.0, "device": 1, "role": "rollout"},
    ]
    trace = chrome_trace(build_timeline(rows, [{"step": 1, "time_s": 9.0, "train_start": 7.5, "train_end": 8.5}], 2))
    by = check_trace(trace)
    x = {(e["pid"], e["tid"], e["name"]): e for e in by["X"]}
    val = x[(PID_RUN, RUN_TRACKS["validation"], "validation before")]  # ended at the clock's 0: shifted to 0
    assert (val["ts"], val["dur"], val["args"]["accuracy"]) == (0.0, 2e6, 0.5)
    assert x[(PID_OPS, 0, "down train")]["ts"] == 3e6 and x[(PID_OPS, 0, "down train")]["dur"] == 0.5e6
    assert x[(PID_OPS, 0, "up rollout (cold)")]["ts"] == 3.5e6 and x[(PID_OPS, 1, "up rollout")]["dur"] == 1e6
    assert x[(PID_RUN, RUN_TRACKS["weights"], "publish v1")]["ts"] == 7.75e6
    assert x[(PID_RUN, RUN_TRACKS["weights"], "refresh v1")]["dur"] == 0.5e6
    assert x[(PID_OPS, 1, "load v1")]["ts"] == 8.5e6
    assert x[(PID_RUN, RUN_TRACKS["training"], "train step 1")]["ts"] == 9.5e6
    assert [e["name"] for e in by["i"] if e["pid"] == PID_ROLES] == ["device death"]
    assert {(e["name"], tuple(sorted(e["args"].items()))) for e in by["C"]} == {
        ("rollout sequences", (("queued", 2), ("running", 3))), ("rollout KV tokens", (("capacity", 100), ("used", 40)))}
