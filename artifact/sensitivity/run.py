"""Sensitivity of the pivot speed-ups to the estimated (E) calibration constants.

`python -m artifact.sensitivity.run [--quick] [--jobs 2] [--groups ...]`

calibration.md's rule: every estimate row is a config value and goes into a sensitivity sweep; the
default config is never retuned to a result. This item varies one E constant at a time around its
default, over the ranges calibration.md gives, and reports colocated, best-swept disaggregated and
pivot throughput with the ratios pivot/colocated and pivot/disaggregated:

- training MFU 0.25-0.5 (calibration §5)
- GenRM output median 0.8K-5K tokens (calibration §4)
- policy response sigma 0.8-1.2 (calibration §4; default 1.0)
- `models.sim.step_offset` 0/150/300: where the simulated window sits on the DAPO response-length
  curve (the paper does not say at which RL step it measured; calibration §4)
- staleness 1/2/4 (paper §8.1 uses 2; 1 and 4 show the effect)

The default point is the config as committed: since issue 11 its MFU, FLOP/s, GenRM medians and
step offsets are fitted to the paper's baselines (`artifact.calibrate`; 0.20 MFU, per-group GenRM
medians and offsets), so the `default` numbers in `PARAMS` below are reference labels from before
the fit, not the values the default point runs with.

Disaggregated gets its best static allocation by the simulator's sweep for every point (cached by
config hash), pivot runs with Table 4's training home set (the default). Runs go through
`artifact.common.run_one` (the `python train.py` path), cells in `--jobs` processes.
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from artifact.common import item_parser, plt, read_csv, read_jsonl, run_one, save_figure, write_csv

MODES = ["colocated", "disaggregated", "pivot"]
# (parameter, default, values, override template)
PARAMS: list[tuple[str, float, list[float], str]] = [
    ("train_mfu", 0.35, [0.25, 0.5], "cluster.hardware.mfu={v}"),
    ("genrm_median", 2000, [800, 5000], "models.workload.genrm.median={v}"),
    ("response_sigma", 1.0, [0.8, 1.2], "models.workload.response.sigma={v}"),
    ("step_offset", 0, [150, 300], "models.sim.step_offset={v}"),
    ("staleness", 2, [1, 4], "deploy.staleness={v}"),
]
# all-in-range combinations that favour pivot (one row each; not plotted): high MFU + long GenRM
# outputs make training a smaller share of the work; both values are inside calibration's ranges.
CORNERS: list[tuple[str, list[str]]] = [
    ("corner:mfu=0.5,genrm_median=5000", ["cluster.hardware.mfu=0.5", "models.workload.genrm.median=5000"]),
]
# points that also run pivot with its training home set swept like the baselines' allocations
SWEPT_HOME_AT = {"default"} | {c[0] for c in CORNERS}
QUICK_PARAMS = [("train_mfu", 0.35, [0.5], "cluster.hardware.mfu={v}"),
                ("staleness", 2, [1], "deploy.staleness={v}")]
# kick the tires: 8 devices, 3 steps, a small batch (models.sim.* wins over train.* in the sim)
QUICK_BASE = ["experiment=quick", "train.prompts_per_step=16", "train.group_size=4",
              "models.sim.sweep_units=4"]


def _fmt(v: float) -> str:
    return f"{v:g}"


def points(quick: bool, only: list[str] | None = None) -> list[tuple[str, float, list[str]]]:
    """(parameter, value, overrides); the shared default point comes first as parameter 'default'.
    `only` keeps the named parameters (and corners when it names `corner`)."""
    out: list[tuple[str, float, list[str]]] = [("default", 0.0, [])]
    for name, _, values, tmpl in (QUICK_PARAMS if quick else PARAMS):
        if only is None or name in only:
            out += [(name, v, [tmpl.format(v=_fmt(v))]) for v in values]
    if not quick and (only is None or "corner" in only):
        out += [(name, 0.0, ov) for name, ov in CORNERS]
    return out


def training_ceiling(run_dir: Path, summary: dict) -> float:
    """Measured tokens / the measured steps' training seconds: the throughput pivot would reach if
    its training home set trained back to back (its ceiling: training never leaves the home set)."""
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["step"] > int(summary.get("warmup_steps", 0))]
    train_s = sum(float(r["train_s"]) for r in rows)
    return sum(float(r["tokens"]) for r in rows) / train_s if train_s > 0 else 0.0


def _tag(name: str, v: float) -> str:
    if name == "default" or name.startswith("corner"):
        return name.replace(":", "_").replace(",", "_")
    return f"{name}={_fmt(v)}"


def _cell(args: tuple[list[str], str]) -> dict:
    overrides, run_dir = args
    t0 = time.perf_counter()
    s = run_one(overrides, Path(run_dir))
    s["_cell_wall_s"] = time.perf_counter() - t0
    return s


def collect(out: Path, quick: bool, groups: list[str], jobs: int = 1,
            only: list[str] | None = None) -> list[dict]:
    base = QUICK_BASE if quick else ["cluster=sim", "train.steps=7", "train.warmup_steps=1"]
    cells = []
    for g in groups:
        for name, v, ov in points(quick, only):
            tag = _tag(name, v)
            for m in MODES:
                cells.append(((g, name, v, m), ([*base, f"models={g}", f"deploy={m}", *ov],
                                                 str(out / "runs" / f"{g}_{tag}_{m}"))))
            if name in SWEPT_HOME_AT and not quick:
                cells.append(((g, name, v, "pivot_swept_home"),
                              ([*base, f"models={g}", "deploy=pivot", "models.sim.pivot_home=sweep", *ov],
                               str(out / "runs" / f"{g}_{tag}_pivot_swept_home"))))
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            res = list(pool.map(_cell, [c[1] for c in cells]))
    else:
        res = [_cell(c[1]) for c in cells]
    by = {key: s for (key, _), s in zip(cells, res)}
    defaults = {p[0]: p[1] for p in PARAMS}
    rows = []
    for g in groups:
        for name, v, _ in points(quick, only):
            r = {"models": g, "parameter": name, "value": v if name != "default" else "",
                 "is_default": name == "default"}
            for m in MODES:
                s = by[(g, name, v, m)]
                r[f"{m}_tokens_per_s"] = s["throughput_tokens_per_s"]
                r[f"{m}_ideal_efficiency"] = s["ideal_efficiency"]
                r[f"{m}_wall_s"] = round(s.get("_cell_wall_s", 0.0), 1)
            alloc = by[(g, name, v, "disaggregated")].get("allocation_choice", {}).get("allocation", "")
            r["disaggregated_allocation"] = alloc
            ps = by[(g, name, v, "pivot")]
            r["pivot_shift_plans_per_step"] = ps["shift_plans_per_step"]
            r["pivot_train_busy_of_home"] = ps["busy_fraction"]["train"] * ps["devices"] / max(
                int(ps["allocation"].get("train", 0)), 1)
            r["pivot_training_ceiling"] = training_ceiling(out / "runs" / f"{g}_{_tag(name, v)}_pivot", ps)
            sw = by.get((g, name, v, "pivot_swept_home"))
            r["pivot_swept_home_tokens_per_s"] = sw["throughput_tokens_per_s"] if sw else ""
            r["pivot_swept_home_train"] = sw["allocation"].get("train", "") if sw else ""
            piv = r["pivot_tokens_per_s"]
            r["pivot_over_colocated"] = piv / r["colocated_tokens_per_s"] if r["colocated_tokens_per_s"] else ""
            r["pivot_over_disaggregated"] = (piv / r["disaggregated_tokens_per_s"]
                                             if r["disaggregated_tokens_per_s"] else "")
            if name == "default":
                r["default_of"] = ""
            else:
                r["default_of"] = defaults.get(name, "")
            rows.append(r)
    return rows


def plot(csv_path: Path, png_path: Path) -> None:
    rows = read_csv(csv_path)
    known = {p[0] for p in PARAMS}
    params = list(dict.fromkeys(r["parameter"] for r in rows if r["parameter"] in known))
    groups = list(dict.fromkeys(r["models"] for r in rows))
    dflt = {p[0]: p[1] for p in PARAMS}
    p = plt()
    if not params:  # only the default point and corners (`--params corner`): one bar chart
        fig, ax = p.subplots(figsize=(1.8 * len(rows) + 3, 3.6))
        w = 0.8 / len(MODES)
        for i, m in enumerate(MODES):
            ax.bar([j + i * w for j in range(len(rows))], [float(r[f"{m}_tokens_per_s"]) / 1e3 for r in rows], w,
                   label=m)
        for j, r in enumerate(rows):
            ax.text(j + (len(MODES) - 1) * w, float(r["pivot_tokens_per_s"]) / 1e3, f"x{float(r['pivot_over_disaggregated']):.2f} disagg",
                    ha="center", va="bottom", fontsize=7)
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(rows))],
                      [f"{r['models']}\n{r['parameter']}" for r in rows], fontsize=7)
        ax.set_ylabel("throughput (K tokens/s)")
        ax.legend(fontsize=7)
        save_figure(fig, png_path)
        return
    fig, axes = p.subplots(2, max(len(params), 1), figsize=(3.2 * max(len(params), 1) + 0.6, 6.2),
                           squeeze=False)
    colors = {"colocated": "#888", "disaggregated": "#37c", "pivot": "#d52"}
    for j, name in enumerate(params):
        top, bot = axes[0][j], axes[1][j]
        for gi, g in enumerate(groups):
            d = next(r for r in rows if r["models"] == g and r["parameter"] == "default")
            pts = [(dflt.get(name, 0.0), d)] + [(float(r["value"]), r) for r in rows
                                                 if r["models"] == g and r["parameter"] == name]
            pts.sort(key=lambda x: x[0])
            xs = [x for x, _ in pts]
            ls = "-" if gi == 0 else "--"
            for m in MODES:
                top.plot(xs, [float(r[f"{m}_tokens_per_s"]) / 1e3 for _, r in pts], ls, marker="o", ms=3,
                         color=colors[m], label=f"{m} ({g})" if j == 0 else None)
            bot.plot(xs, [float(r["pivot_over_disaggregated"]) for _, r in pts], ls, marker="o", ms=3,
                     color=colors["disaggregated"], label=f"pivot/disagg ({g})" if j == 0 else None)
            bot.plot(xs, [float(r["pivot_over_colocated"]) for _, r in pts], ls, marker="s", ms=3,
                     color=colors["colocated"], label=f"pivot/colocated ({g})" if j == 0 else None)
        for ax in (top, bot):
            ax.axvline(dflt.get(name, 0.0), color="k", lw=0.6, ls=":")
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
        bot.axhline(1.5, color=colors["disaggregated"], lw=0.7, ls=":")
        bot.axhline(1.8, color=colors["colocated"], lw=0.7, ls=":")
        top.set_title(name, fontsize=9)
        bot.set_xlabel(f"{name} (dotted: default)", fontsize=8)
    axes[0][0].set_ylabel("throughput (K tokens/s)", fontsize=8)
    axes[1][0].set_ylabel("pivot speed-up (targets 1.5 / 1.8)", fontsize=8)
    axes[0][0].legend(fontsize=6)
    axes[1][0].legend(fontsize=6)
    fig.suptitle("Sensitivity to the estimated (E) constants, one at a time", fontsize=10)
    save_figure(fig, png_path)


def main(argv=None) -> int:
    ap = item_parser("sensitivity", __doc__)
    ap.add_argument("--groups", nargs="*", default=None,
                    help="model groups (default: qwen7b_qwen30b; --quick: qwen1.5b_glm9b)")
    ap.add_argument("--jobs", type=int, default=1, help="processes running cells in parallel")
    known = [p[0] for p in PARAMS] + ["corner"]
    ap.add_argument("--params", nargs="*", choices=known, default=None,
                    help="only these parameters (default: all, corners included)")
    args = ap.parse_args(argv)
    groups = args.groups or (["qwen1.5b_glm9b"] if args.quick else ["qwen7b_qwen30b"])
    csv_path = args.out / "sensitivity.csv"
    if not args.plot_only:
        t0 = time.perf_counter()
        rows = collect(args.out, args.quick, groups, args.jobs, args.params)
        write_csv(rows, csv_path)
        print(f"sensitivity: {len(rows)} points x {len(MODES)} modes in {time.perf_counter() - t0:.0f} s")
        for r in rows:
            print(f"  {r['models']:15s} {r['parameter']:15s} {str(r['value']):>6s}  colo {r['colocated_tokens_per_s']:9.0f}"
                  f"  disagg {r['disaggregated_tokens_per_s']:9.0f} ({r['disaggregated_allocation']})"
                  f"  pivot {r['pivot_tokens_per_s']:9.0f}  x{r['pivot_over_colocated']:.2f} colo"
                  f"  x{r['pivot_over_disaggregated']:.2f} disagg  (train ceiling {r['pivot_training_ceiling']:.0f},"
                  f" home busy {r['pivot_train_busy_of_home']:.2f}"
                  + (f"; swept home {r['pivot_swept_home_train']}: {r['pivot_swept_home_tokens_per_s']:.0f}"
                     if r["pivot_swept_home_tokens_per_s"] != "" else "") + ")")
    plot(csv_path, args.out / "sensitivity.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
