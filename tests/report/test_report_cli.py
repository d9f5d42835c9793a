"""`python -m pivotrl.report` on real run folders (a stored `cluster=local` run and fresh sim runs):
both runs' figures printed side by side, timelines redrawn, accuracy per step and per second.
Also the local runtime's record format rebuilt against its own allocation records."""
from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path

import pytest

from pivotrl.report.__main__ import main
from pivotrl.report.accuracy import accuracy_curves
from pivotrl.report.records import RunRecords
from pivotrl.report.table import closing_rows
from pivotrl.report.timeline import slot_devices

LOCAL = Path(__file__).parent / "data" / "local_pivot_4steps"


@pytest.fixture()
def local_copy(tmp_path):
    """A copy of the folder (the report reads only its files: a folder from another machine)."""
    return Path(shutil.copytree(LOCAL, tmp_path / "local_run"))


def test_two_runs_side_by_side(local_copy, sim_run, tmp_path, capsys):
    out_dir = tmp_path / "pictures"
    assert main([str(local_copy), str(sim_run), "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    lines = {ln.split("  ")[0].strip(): ln for ln in out.splitlines()}
    loc, sim = RunRecords.read(local_copy).summary, RunRecords.read(sim_run).summary
    assert "pivot/tiny/local" in lines["run"] and "pivot/qwen1.5b_glm9b/sim" in lines["run"]
    assert f"{loc['throughput_tokens_per_s']:.1f}" in lines["throughput tokens/s"]
    assert f"{sim['throughput_tokens_per_s']:.1f}" in lines["throughput tokens/s"]
    assert f"{loc['val_accuracy_before']:.3f} -> {loc['val_accuracy_after']:.3f}" in lines["val accuracy before -> after"]
    assert f"{sim['ideal_efficiency']:.3f}" in lines["ideal efficiency"]
    assert str(loc["num_shifts"]) in lines["shifts (replica moves)"] and str(sim["num_shifts"]) in lines["shifts (replica moves)"]
    assert lines["device time per state"].count("reward=") == 2
    assert (out_dir / "local_run_timeline.png").exists() and (out_dir / f"{sim_run.name}_timeline.png").exists()
    assert (out_dir / "accuracy.png").exists()


def test_one_run_writes_into_its_folder(local_copy, capsys):
    assert main([str(local_copy)]) == 0
    assert (local_copy / "timeline.png").exists() and (local_copy / "accuracy.png").exists()


def test_not_a_run_folder(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no timeline.jsonl or metrics.jsonl" in capsys.readouterr().err


def test_closing_rows_and_accuracy_of_the_local_run(local_copy):
    rec = RunRecords.read(local_copy)
    rows = dict(closing_rows(rec))
    held = rec.timeline_view().device_seconds()
    assert rows["status"] == "finished" and rows["devices"] == "4"
    assert sum(held.values()) == pytest.approx(4 * rec.timeline_view().end)
    (c,) = accuracy_curves([rec])
    assert c.steps == [r["step"] for r in rec.metrics]
    assert c.accuracy == [r["train_accuracy"] for r in rec.metrics]
    assert c.time_s == [r["time_s"] for r in rec.metrics]
    assert (c.val_before, c.val_after) == (rec.summary["val_accuracy_before"], rec.summary["val_accuracy_after"])


def test_local_records_agree_with_their_allocation_records(local_copy):
    """After each plan completes, the controller's devices per role (devices of plans still in
    flight counted for their target) equal the states rebuilt from the records."""
    rec = RunRecords.read(local_copy)
    tl = rec.timeline_view()
    assert len(tl.shifts) == sum(1 for r in rec.timeline if r["kind"] == "shift") and all(s.end for s in tl.shifts)
    checked = 0
    for i, r in enumerate(rec.timeline):
        t = r.get("now")
        if r["kind"] != "allocation" or any(x["kind"] == "shift" and x.get("now") == t for x in rec.timeline[i + 1:i + 5]):
            continue
        state = {iv.device: iv.role for iv in tl.intervals if iv.start <= t + 1e-9 < iv.end}
        for s in tl.shifts:
            if s.start < t - 1e-9 and s.end > t + 1e-9:
                up = {d for u in s.up for d in slot_devices(u)[1]}
                state.update({d: (s.role_up if d in up else "free") for d in s.devices})
        got = {k: v for k, v in collections.Counter(state.values()).items() if v}
        assert got == {k: v for k, v in r["allocation"].items() if v}, t
        checked += 1
    assert checked >= 5
    assert [st for st, _ in tl.steps] == [1, 2, 3, 4] and len(tl.training) == 4


def test_a_cut_folder_reads_as_partial(local_copy, capsys):
    (local_copy / "summary.json").unlink()
    with open(local_copy / "timeline.jsonl", "a") as f:
        f.write('{"kind": "shift", "now": 99.0, "role_up"')  # killed mid-write
    assert main([str(local_copy), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "partial (4 steps recorded, no summary)" in out
    n = len((local_copy / "timeline.jsonl").read_text().splitlines())
    assert f"timeline.jsonl: line {n} cut mid-write (skipped)" in out
    rows = dict(closing_rows(RunRecords.read(local_copy)))
    assert rows["shift plans"] != "?" and not rows["shift plans"].startswith("?"), "a cut last line keeps the figures"


def test_a_folder_without_its_timeline_shows_unknown_not_zero(local_copy, capsys):
    """Issue 22: with no timeline.jsonl the report showed 0 plans, 0 decisions and free=100%."""
    (local_copy / "timeline.jsonl").unlink()
    assert main([str(local_copy)]) == 0
    out = capsys.readouterr().out
    rows = dict(closing_rows(RunRecords.read(local_copy)))
    for label in ("shift plans", "planner decisions applied", "device time per state", "run clock s (timeline)"):
        assert rows[label] == "? (timeline.jsonl missing)", label
    assert rows["records"] == "timeline.jsonl missing" and rows["status"] == "finished"
    assert f"note: {local_copy / 'timeline.jsonl'}: missing; the figures read from it are shown as unknown" in out
    assert "free=100%" not in out and "timeline: not drawn" in out and not (local_copy / "timeline.png").exists()


def test_damaged_files_are_named_and_their_figures_unknown(local_copy, capsys):
    lines = (local_copy / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]  # a line in the middle, not the last: damage, not a cut
    (local_copy / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (local_copy / "summary.json").write_text('{"steps": 4, "throughput')
    (local_copy / "config.yaml").unlink()
    rec = RunRecords.read(local_copy)
    rows = dict(closing_rows(rec))
    assert rows["train accuracy first -> last step"] == "? (metrics.jsonl damaged)"
    assert rows["status"].startswith("summary.json damaged: not a JSON object")
    assert rows["records"] == ("config.yaml missing; metrics.jsonl damaged: line(s) 2 not JSON; "
                               "summary.json damaged: not a JSON object")
    assert main([str(local_copy), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert f"note: {local_copy / 'metrics.jsonl'}: damaged: line(s) 2 not JSON; the figures" in out


@pytest.mark.parametrize("steps", [[1, 2, 1, 2], [1, 3, 2]])
def test_a_folder_with_repeated_or_out_of_order_steps_is_refused(local_copy, capsys, steps):
    """Issue 22: two runs' rows in one metrics.jsonl: the report names the line and shows nothing."""
    rows = [json.loads(x) for x in (local_copy / "metrics.jsonl").read_text().splitlines()]
    (local_copy / "metrics.jsonl").write_text("".join(json.dumps({**rows[0], "step": s}) + "\n" for s in steps))
    bad = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
    assert main([str(local_copy), "--no-plots"]) == 2
    captured = capsys.readouterr()
    assert (f"metrics.jsonl line {bad + 1}: step {steps[bad]} after step {steps[bad - 1]} (line {bad})"
            in captured.err)
    assert "throughput tokens/s" not in captured.out


def test_the_judges_parse_failures_are_in_the_closing_table(local_copy):
    """Issue 22: the rate a run's summary.json records (`genrm_parse`) is a row of the table."""
    summary = json.loads((local_copy / "summary.json").read_text())
    summary["genrm_parse"] = {"total": 40, "failures": 30, "failure_rate": 0.75, "max_parse_failure_rate": 0.5,
                              "steps_over": [2, 3, 4], "template": "tiny", "parser": "score_line"}
    (local_copy / "summary.json").write_text(json.dumps(summary))
    assert dict(closing_rows(RunRecords.read(local_copy)))["judge parse failures"] == "30/40 (75%), 3 step(s) over 50%"
    del summary["genrm_parse"]
    (local_copy / "summary.json").write_text(json.dumps(summary))
    assert dict(closing_rows(RunRecords.read(local_copy)))["judge parse failures"] == "-"
