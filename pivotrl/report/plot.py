"""The timeline picture of one run (`timeline.png`), drawn from a `Timeline`.

Owns three steps, kept apart so tests can check what is drawn without reading PNG bytes:
`timeline_figure(tl, title) -> TimelineFigure` (pure: every bar, line, marker and table cell the
picture will show), `render(fig)` (the matplotlib figure, Agg) and `draw_timeline(fig, path)`.
The picture, top to bottom:
- a strip with each training step's interval (hatched) and a tick at every shift start;
- devices x time, coloured by state (rollout, reward, train = held by training, free, shifting),
  RL step ends dashed; device labels thin out so 128 devices stay readable;
- rollout, reward and overall throughput over time, actual (solid) and modelled (dotted: what the
  planner sees), as the artifact's Fig. 10; applied planner decisions are markers on the overall
  panel, the largest numbered;
- a table of those largest decisions (time, role up, replicas, penalty, benefit in tokens).
Example: `docs/figures/timeline_local_4dev.png`, `docs/figures/timeline_sim_128dev.png`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pivotrl.report.timeline import ROLES, Timeline

COLORS = {"rollout": "#e07b91", "reward": "#7fb55a", "train": "#f2c14e", "free": "#e6e6e6",
          "shifting": "#303030"}
LABELS = {"rollout": "rollout", "reward": "reward (GenRM)", "train": "held by training", "free": "free",
          "shifting": "shifting"}
SERIES_COLORS = {"rollout": "#c0395a", "reward": "#3f7f25", "overall": "#2f5fa8"}
TOP_DECISIONS = 6
SPARSE = 40  # a series with fewer points is drawn with markers


@dataclass
class Line:
    label: str
    t: list[float]
    v: list[float]
    color: str
    style: str  # "-" actual, ":" modelled
    drawstyle: str = "default"
    """actual: `steps-pre` (a sample is the rate over the interval it ends); modelled: `steps-post`
    (the model's value holds until the next sample)."""
    marker: str = ""
    """Sparse series (real runs: one point per step or decision) get markers."""


@dataclass
class Panel:
    ylabel: str
    lines: list[Line] = field(default_factory=list)


@dataclass
class TimelineFigure:
    """Everything the picture shows, in drawing units (time scaled by `time_unit`)."""

    title: str
    time_label: str
    num_devices: int
    end: float
    bars: dict[str, dict[int, list[tuple[float, float]]]]
    """state -> device -> [(start, width)]."""
    training: list[tuple[float, float]]
    shift_starts: list[float]
    step_ends: list[float]
    panels: list[Panel]
    decisions: list[tuple[float, float]]
    """(time, benefit) of every applied decision with a known benefit."""
    numbered: list[tuple[int, float, int]]
    """(table row number, time, label row) of the largest decisions; labels closer than 3 % of
    the time axis to an earlier one go one row up, so close numbers do not print over each other."""
    table: list[list[str]]
    """Header row first."""
    deaths: list[tuple[float, int]]
    device_ticks: list[int]


def _time_unit(end: float) -> tuple[float, str]:
    if end > 4 * 3600:
        return 3600.0, "time (h)"
    if end > 1200:
        return 60.0, "time (min)"
    return 1.0, "time (s)"


def _rate_unit(lines: list[Line]) -> tuple[float, str]:
    top = max((max(ln.v) for ln in lines if ln.v), default=0.0)
    return (1e3, "K tokens/s") if top >= 1e4 else (1.0, "tokens/s")


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    a = abs(x)
    if a >= 1e6:
        return f"{x / 1e6:.2f}M"
    if a >= 1e3:
        return f"{x / 1e3:.1f}K"
    return f"{x:.1f}"


def label_rows(marks: list[tuple[int, float]], end: float) -> list[tuple[int, float, int]]:
    gap = 0.03 * max(end, 1e-9)
    placed: list[tuple[int, float, int]] = []
    for i, t in sorted(marks, key=lambda m: m[1]):
        taken = {row for _, t2, row in placed if abs(t - t2) < gap}
        row = min(r for r in range(len(marks) + 1) if r not in taken)
        placed.append((i, t, row))
    return sorted(placed)


def timeline_figure(tl: Timeline, title: str = "") -> TimelineFigure:
    """The picture's content (module docstring); pure."""
    u, tlabel = _time_unit(tl.end)
    bars: dict[str, dict[int, list[tuple[float, float]]]] = {r: {} for r in ROLES}
    for iv in tl.intervals:
        bars[iv.role].setdefault(iv.device, []).append((iv.start / u, iv.seconds / u))
    panels = []
    for role, name in (("rollout", "rollout"), ("reward", "reward"), ("overall", "overall (Eq. 1)")):
        views = tl.throughput[role]
        raw = [Line(f"{role} actual", views["actual"].t, views["actual"].v, SERIES_COLORS[role], "-"),
               Line(f"{role} modelled", views["modelled"].t, views["modelled"].v, SERIES_COLORS[role], ":")]
        k, unit = _rate_unit(raw)
        lines = [Line(ln.label, [t / u for t in ln.t], [v / k for v in ln.v], ln.color, ln.style,
                      "steps-pre" if ln.style == "-" else "steps-post", "o" if len(ln.t) < SPARSE else "")
                 for ln in raw if ln.t]
        panels.append(Panel(f"{name}\n{unit}", lines))
    top = tl.largest_decisions(TOP_DECISIONS)
    table = [["#", "t " + tlabel.split(" ", 1)[1], "role up", "replicas", "penalty (tok)", "benefit (tok)"]]
    for i, d in enumerate(top, 1):
        table.append([str(i), f"{d.now / u:.1f}", str(d.role_up), str(d.k), _fmt(d.penalty), _fmt(d.benefit)])
    n = tl.num_devices
    step = max(1, -(-n // 16))
    return TimelineFigure(
        title=title, time_label=tlabel, num_devices=n, end=tl.end / u, bars=bars,
        training=[(a / u, (b - a) / u) for _, a, b in tl.training],
        shift_starts=[s.start / u for s in tl.shifts],
        step_ends=[t / u for _, t in tl.steps],
        panels=panels,
        decisions=[(d.now / u, d.benefit) for d in tl.decisions if d.applied and d.benefit is not None],
        numbered=label_rows([(i, d.now / u) for i, d in enumerate(top, 1)], tl.end / u),
        table=table,
        deaths=[(t / u, d) for t, d in tl.deaths],
        device_ticks=list(range(0, n, step)),
    )


def draw_timeline(spec: TimelineFigure, path: Path, dpi: int = 110) -> Path:
    """Write `spec` as a PNG at `path`; returns the path."""
    import matplotlib.pyplot as plt

    fig = render(spec)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def render(spec: TimelineFigure):
    """The matplotlib figure of `spec` (Agg; the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    n = spec.num_devices
    dev_h = 2.2 + min(n, 128) * 0.035
    ratios = [0.45, dev_h, 1.1, 1.1, 1.1, 1.25 if len(spec.table) > 1 else 0.3]
    fig, axes = plt.subplots(len(ratios), 1, figsize=(12, sum(ratios) + 0.8), layout="constrained",
                             gridspec_kw={"height_ratios": ratios})
    strip, dev, *thr, tab = axes
    for ax in (strip, dev, *thr):
        ax.set_xlim(0, spec.end)
    for ax in (strip, dev, *thr[:-1]):
        ax.sharex(thr[-1])

    # strip: training steps and shift starts
    strip.broken_barh(spec.training, (0.55, 0.4), facecolors=COLORS["train"], edgecolor="#a07810",
                      hatch="///", lw=0.5)
    if spec.shift_starts:
        strip.eventplot([spec.shift_starts], lineoffsets=0.25, linelengths=0.35, colors=COLORS["shifting"],
                        linewidths=0.6)
    strip.set_ylim(0, 1)
    strip.set_yticks([0.25, 0.75], [f"shifts ({len(spec.shift_starts)})", "training step"], fontsize=8)
    strip.tick_params(axis="x", labelbottom=False)
    if spec.title:
        strip.set_title(spec.title, fontsize=10)

    # devices x time
    h = 0.9 if n <= 8 else 1.0  # many devices: rows touch, stripes would only add noise
    for role in ROLES:  # one collection per state: 128 devices stay a handful of artists
        verts = [[(a, d - h / 2), (a + w, d - h / 2), (a + w, d + h / 2), (a, d + h / 2)]
                 for d, spans in spec.bars[role].items() for a, w in spans]
        if verts:
            dev.add_collection(PolyCollection(verts, facecolors=COLORS[role], linewidths=0, label=role))
    for t in spec.step_ends:
        dev.axvline(t, color="#555", lw=0.6, ls="--")
    if spec.deaths:
        dev.plot([t for t, _ in spec.deaths], [d for _, d in spec.deaths], "x", color="red", ms=7,
                 label="device died")
    dev.set_ylim(n - 0.5, -0.5)
    dev.set_yticks(spec.device_ticks)
    dev.tick_params(axis="y", labelsize=7 if n > 32 else 8)
    dev.set_ylabel("device")
    dev.tick_params(axis="x", labelbottom=False)
    dev.legend(handles=[Patch(color=COLORS[r], label=LABELS[r]) for r in ROLES]
               + ([Patch(color="none", label="- - step end")] if spec.step_ends else []),
               fontsize=8, ncol=6, loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False)

    # throughput panels
    for ax, panel in zip(thr, spec.panels):
        for ln in panel.lines:
            ax.plot(ln.t, ln.v, ls=ln.style, color=ln.color, lw=1.0 if ln.style == "-" else 1.2, label=ln.label,
                    drawstyle=ln.drawstyle, marker=ln.marker or None, ms=4)
        for a, w in spec.training:
            ax.axvspan(a, a + w, color=COLORS["train"], alpha=0.18, lw=0)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if panel.lines:
            ax.legend(fontsize=7, loc="upper right", ncol=2)
        else:
            ax.text(0.5, 0.5, "no throughput records", transform=ax.transAxes, ha="center", fontsize=8,
                    color="#777")
    over = thr[-1]
    if spec.decisions:
        ylo, yhi = over.get_ylim()
        y = ylo + 0.06 * (yhi - ylo)
        over.plot([t for t, _ in spec.decisions], [y] * len(spec.decisions), "v", color="#555", ms=4,
                  label="planner decision")
        for i, t, row in spec.numbered:
            over.annotate(str(i), (t, y), xytext=(0, 7 + 9 * row), textcoords="offset points", ha="center",
                          fontsize=8, fontweight="bold")
        over.legend(fontsize=7, loc="upper right", ncol=3)
    for ax in thr[:-1]:
        ax.tick_params(axis="x", labelbottom=False)
    over.set_xlabel(spec.time_label)

    # table of the largest decisions
    tab.axis("off")
    if len(spec.table) > 1:
        t = tab.table(cellText=spec.table[1:], colLabels=spec.table[0], cellLoc="center",
                      bbox=(0.0, 0.0, 1.0, 0.86))
        t.auto_set_font_size(False)
        t.set_fontsize(8)
        tab.text(0.0, 0.93, "largest applied planner decisions (numbered on the overall panel; "
                 "benefit = H*(T_cand - T_now) - penalty, in tokens)", fontsize=9, transform=tab.transAxes)
    else:
        tab.text(0.5, 0.5, "no planner decisions with a benefit (static deployment or no planner calls)",
                 ha="center", va="center", fontsize=9, color="#555")
    return fig
