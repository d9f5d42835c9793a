"""The timeline picture: what `timeline_figure` hands to matplotlib, and that `render` draws exactly
that (the test reads the figure's artists, not PNG bytes)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from pivotrl.report.plot import draw_timeline, render, timeline_figure  # noqa: E402
from pivotrl.report.timeline import build_timeline  # noqa: E402
from tests.report.test_timeline import EXPECTED, METRICS, RECORDS, alloc, shift  # noqa: E402


@pytest.fixture()
def spec():
    return timeline_figure(build_timeline(RECORDS, METRICS, 4), "hand-written")


def test_figure_content(spec):
    assert spec.time_label == "time (s)" and spec.end == 22.0
    # bars: one (start, width) per interval, by state and device
    for d, ivs in EXPECTED.items():
        for a, b, role in ivs:
            assert (a, b - a) in spec.bars[role][d]
    assert sum(len(v) for per in spec.bars.values() for v in per.values()) == sum(map(len, EXPECTED.values()))
    assert spec.training == [(15.0, 5.0)] and spec.step_ends == [20.0]
    assert spec.shift_starts == [0.0, 0.0, 0.0, 5.0, 10.0, 14.0, 20.0]
    assert spec.decisions == [(5.0, 100.0), (10.0, 50.0)] and spec.numbered == [(1, 5.0, 0), (2, 10.0, 0)]
    assert spec.table == [["#", "t (s)", "role up", "replicas", "penalty (tok)", "benefit (tok)"],
                          ["1", "5.0", "rollout", "1", "0.0", "100.0"],
                          ["2", "10.0", "reward", "1", "0.0", "50.0"]]
    ro = {ln.label: ln for ln in spec.panels[0].lines}
    assert (ro["rollout actual"].t, ro["rollout actual"].v) == ([20.0], [33.0])
    assert (ro["rollout modelled"].t, ro["rollout modelled"].v) == ([5.0, 10.0], [40.0, 30.0])
    assert ro["rollout modelled"].drawstyle == "steps-post" and ro["rollout actual"].drawstyle == "steps-pre"
    assert ro["rollout actual"].marker == "o"  # sparse: one point per step
    assert spec.panels[0].ylabel.endswith("tokens/s") and "K" not in spec.panels[0].ylabel
    assert spec.deaths == [(18.0, 0)]


def test_render_draws_the_spec(spec):
    fig = render(spec)
    try:
        strip, dev, ro, rm, over, tab = fig.axes[:6]
        # device chart: one rectangle per interval, at its device row, with the spec's span
        drawn = {}
        for coll in dev.collections:
            paths = coll.get_paths()
            for p in paths:
                (x0, y0), (x1, y1) = p.vertices.min(axis=0), p.vertices.max(axis=0)
                drawn.setdefault(round((y0 + y1) / 2), []).append((round(x0, 6), round(x1 - x0, 6)))
        for d, ivs in EXPECTED.items():
            assert sorted(drawn[d]) == sorted((a, b - a) for a, b, _ in ivs)
        lines = {ln.get_label(): ln for ln in ro.get_lines()}
        assert list(lines["rollout modelled"].get_xdata()) == [5.0, 10.0]
        assert list(lines["rollout modelled"].get_ydata()) == [40.0, 30.0]
        assert lines["rollout modelled"].get_drawstyle() == "steps-post"
        marks = {ln.get_label(): ln for ln in over.get_lines()}["planner decision"]
        assert list(marks.get_xdata()) == [5.0, 10.0]
        assert [t.get_text() for t in over.texts] == ["1", "2"]
        cells = tab.tables[0].get_celld()
        assert cells[(1, 5)].get_text().get_text() == "100.0" and cells[(0, 2)].get_text().get_text() == "role up"
        assert [t.get_text() for t in dev.get_yticklabels()] == ["0", "1", "2", "3"]
    finally:
        plt.close(fig)


def test_close_decision_labels_stack():
    from pivotrl.report.plot import label_rows

    assert label_rows([(1, 0.5), (2, 0.2), (3, 0.6), (4, 50.0)], 100.0) == [
        (1, 0.5, 1), (2, 0.2, 0), (3, 0.6, 2), (4, 50.0, 0)]


def test_128_devices_stay_legible(tmp_path):
    """128 devices: 16 device labels (every 8th), rows that touch, and a long run in hours/minutes."""
    recs = [shift(0.0, "rollout", [f"rollout@{d}x1" for d in range(64)]),
            shift(0.0, "train", ["train@64x64"]), alloc(30.0, 0.0, 30.0), alloc(40.0, 0.0, 40.0),
            shift(5000.0, "reward", [f"reward@{d}x2" for d in range(0, 64, 2)], [f"rollout@{d}x1" for d in range(64)]),
            alloc(5010.0, 4.0, 6.0)]
    tl = build_timeline(recs, [{"step": 1, "time_s": 6000.0, "train_start": 5500.0, "train_end": 6000.0}], 128)
    spec = timeline_figure(tl, "128")
    assert spec.device_ticks == list(range(0, 128, 8))
    assert spec.time_label == "time (min)" and spec.end == 100.0
    assert spec.bars["reward"][0] == [(5010.0 / 60, (6000.0 - 5010.0) / 60)]
    path = draw_timeline(spec, tmp_path / "t.png")
    assert path.stat().st_size > 10_000
