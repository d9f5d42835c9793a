"""Fit the simulator's E-tagged constants to the paper's *baseline* measurements (Fig. 9), pivot held out.

`python -m artifact.calibrate.run [--write] [--rounds 2] [--jobs 2] [--quick]`; trials, never written:
`--extra NAME` (fit a constant the committed fit leaves alone), `--trial-grid NAME=V1,V2,...` (fit
NAME over a grid outside its declared range, e.g. `flops_moe=6e12,9e12,13e12,18e12,25e12,40e12`).

What is fitted: only what no measurement fixes, each within a declared physical range
(../shared/calibration.md §4, §5, §7):
- once for the hardware (all four groups): `cluster.hardware.mfu`, the training MFU on H20 (range
  0.20-0.50: calibration §5 sweeps 0.25-0.5; issue 11 found 0.22 for the 7b baselines);
  `cluster.hardware.eager_layer_s`, the per-layer launch overhead of an iteration without CUDA graphs
  (range 0.05-0.6 ms, E): verl's GenRM engine runs `enforce_eager`, so every judge iteration pays it
  (docs/calibration_sources.md §6);
- once per GenRM (GLM-Z1-9B; Qwen3-30B-A3B, shared by the 7b and 32b groups; Qwen3.5-122B-A10B):
  `models.workload.genrm.median`, the thinking judge's median output length (range 800-8,000
  tokens: calibration §7), and once for all judges `models.workload.genrm.sigma` (0.8-1.2, §4/§7);
- once per group: `models.sim.step_offset`, where in training the measured window sits, which sets
  the policy's mean response length through the group's `response_mean_curve` (range 0-300 RL
  steps: the curve's span).

The engine constants are not fitted: `bw_kv`, `bw_experts`, `bw_weights`, `flops_moe`,
`flops_prefill`, `t_moe_layer` and the linear-attention kernels are fixed by calibration §7's
measurements and held there by `artifact.calibrate.engines` (V1-V7); `flops_dense` by verl's own
measured generation (`artifact.calibrate.verl_gen`). `--extra` / `--trial-grid` can still vary them
in a trial that is never written.

Against: the three baselines (colocated, disaggregated, rr_colocated) of each group at the paper's
Table 4 allocations, read from Fig. 9 (`artifact/expected/fig9.json`): 12 values, of which 1.5b's
colocated and rr_colocated are an unordered pair (the loss takes the better order). Loss: the sum
of squared log ratios sim/paper. Method: coordinate descent over a grid per constant (`CONSTANTS`),
`--rounds` passes, every evaluation cached in `<out>/cache.json` (resumable; keyed by the model's
config hash too, so a changed model never reuses an old result).

Pivot, the Fig. 11 ablations and Fig. 14 are never evaluated here: they are predictions
(`artifact.fig9`, `artifact.fig11`, `artifact.fig14` report their errors). With `--write` the
fitted values go into `conf/models/*.yaml` and `conf/cluster/sim.yaml`, each marked "fitted to
Fig. 9 baselines" with the residuals. The run settings are the Fig. 9 item's (`experiment=fig9`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifact.common import RESULTS, ROOT, write_csv

BASELINES = ["colocated", "disaggregated", "rr_colocated"]
GROUPS = ["qwen1.5b_glm9b", "qwen7b_qwen30b", "qwen32b_qwen30b", "qwen72b_qwen122b"]
GENRM_OF = {"qwen1.5b_glm9b": "GLM-Z1-9B", "qwen7b_qwen30b": "Qwen3-30B-A3B",
            "qwen32b_qwen30b": "Qwen3-30B-A3B", "qwen72b_qwen122b": "Qwen3.5-122B-A10B"}
MOE_GROUPS = {"qwen7b_qwen30b", "qwen32b_qwen30b", "qwen72b_qwen122b"}  # GenRM is MoE: flops_moe matters


@dataclass(frozen=True)
class Constant:
    """One fitted constant: its config key, declared range, grid, and scope (what shares a value:
    `hardware` = every group, `genrm` = groups with the same GenRM, `judges` = every GenRM,
    `group` = one group)."""

    name: str
    key: str
    lo: float
    hi: float
    grid: tuple[float, ...]
    start: float
    scope: str
    groups: frozenset = frozenset(GROUPS)  # groups it affects


CONSTANTS = [
    Constant("mfu", "cluster.hardware.mfu", 0.20, 0.50, (0.20, 0.26, 0.33, 0.41, 0.50), 0.35, "hardware"),
    Constant("eager_layer_s", "cluster.hardware.eager_layer_s", 0.05e-3, 0.6e-3, (0.05e-3, 0.15e-3, 0.3e-3, 0.6e-3),
             0.2e-3, "hardware"),
    Constant("genrm_median", "models.workload.genrm.median", 800.0, 8000.0, (800.0, 1600.0, 3000.0, 5000.0, 8000.0),
             3000.0, "genrm"),
    Constant("genrm_sigma", "models.workload.genrm.sigma", 0.8, 1.2, (0.8, 1.0, 1.2), 1.0, "judges"),
    Constant("step_offset", "models.sim.step_offset", 0.0, 300.0, (0.0, 75.0, 150.0, 225.0, 300.0), 0.0, "group"),
]
OPTIONAL = {  # --extra NAME: constants a measurement fixes, varied in a trial only (never written)
    "flops_dense": Constant("flops_dense", "cluster.hardware.flops_dense", 40e12, 130e12,
                            (40e12, 60e12, 80e12, 100e12, 120e12), 40e12, "hardware"),  # verl_gen (s12)
    "flops_moe": Constant("flops_moe", "cluster.hardware.flops_moe", 25e12, 90e12, (25e12, 40e12, 55e12, 70e12, 90e12),
                          40e12, "hardware", frozenset(MOE_GROUPS)),  # calibration §7 V4 (engines.py)
    "d0": Constant("d0", "cluster.hardware.d0", 1.4e-3, 20e-3, (1.4e-3, 5e-3, 10e-3, 15e-3, 20e-3), 1.4e-3,
                   "hardware"),
}
BY_NAME = {c.name: c for c in [*CONSTANTS, *OPTIONAL.values()]}
EXPECTED = ROOT / "artifact" / "expected" / "fig9.json"


def scope_key(c: Constant, group: str) -> str:
    return {"hardware": "H20", "genrm": GENRM_OF[group], "judges": "all judges", "group": group}[c.scope]


def paper_baselines() -> dict[str, dict[str, Any]]:
    return {g: {m: v for m, v in d.items() if m in BASELINES}
            for g, d in json.loads(EXPECTED.read_text())["tokens_per_s"].items()}


# --quick: the fit's machinery on a small batch (3 steps of 16 prompts x 4), seconds per simulation
QUICK_RUN = ["train.steps=3", "train.prompts_per_step=16", "train.group_size=4"]


def overrides(group: str, mode: str, values: dict[str, float], extra: tuple[str, ...] = ()) -> list[str]:
    ov = ["experiment=fig9", f"models={group}", f"deploy={mode}", "logging.wandb_mode=disabled",
          "logging.progress=false", *extra]
    for name, v in values.items():
        c = BY_NAME[name]
        ov.append(f"{c.key}={int(v) if name == 'step_offset' else v}")
    return ov


def simulate_one(args: tuple[str, str, tuple[tuple[str, float], ...], tuple[str, ...]]) -> float:
    """Throughput of one baseline at its Table 4 allocation (worker entry)."""
    from pivotrl.config import compose_config
    from pivotrl.sim.runtime import simulate
    from pivotrl.sim.sweep import paper_allocation

    group, mode, values, extra = args
    cfg = compose_config(overrides(group, mode, dict(values), extra))
    alloc = paper_allocation(cfg) if mode != "colocated" else {}
    return float(simulate(cfg, alloc)["throughput_tokens_per_s"])


def group_loss(sim: dict[str, float], paper: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """Sum of squared log ratios and the paper value each mode is compared with (the unordered
    1.5b pair is matched in the better order)."""
    pairs = [(m, paper[m]) for m in BASELINES]
    options = [dict(pairs)]
    if isinstance(paper["colocated"], list):
        a, b = paper["colocated"]
        options = [{**dict(pairs), "colocated": a, "rr_colocated": b},
                   {**dict(pairs), "colocated": b, "rr_colocated": a}]
    best = min(options, key=lambda o: sum(math.log(sim[m] / o[m]) ** 2 for m in BASELINES))
    return sum(math.log(sim[m] / best[m]) ** 2 for m in BASELINES), best


class Fitter:
    """Coordinate descent over `CONSTANTS`, every simulation cached by its exact settings."""

    def __init__(self, out: Path, jobs: int, groups: list[str], extra: tuple[str, ...] = ()) -> None:
        self.out, self.jobs, self.groups, self.extra = out, jobs, groups, tuple(extra)
        self.paper = paper_baselines()
        self.cache_path = out / "cache.json"
        self.cache: dict[str, float] = json.loads(self.cache_path.read_text()) if self.cache_path.exists() else {}
        self.params: dict[str, dict[str, float]] = {
            c.name: {scope_key(c, g): c.start for g in groups} for c in CONSTANTS}
        self.evals = 0
        self._model_keys: dict[tuple[str, str], str] = {}

    def values(self, g: str, override: tuple[str, float] | None = None) -> tuple[tuple[str, float], ...]:
        vals = {c.name: self.params[c.name][scope_key(c, g)] for c in CONSTANTS if g in c.groups}
        if override is not None and override[0] in vals:
            vals[override[0]] = override[1]
        return tuple(sorted(vals.items()))

    def model_key(self, group: str, mode: str) -> str:
        """Hash of everything but the fitted constants that sets a baseline's simulation (the
        group's other constants, the engine and phase settings, the simulator version), so a
        cache entry is never reused after the model changed."""
        if (group, mode) not in self._model_keys:
            from pivotrl.config import compose_config
            from pivotrl.sim.sweep import config_hash

            fixed = {c.name: c.start for c in CONSTANTS}
            self._model_keys[(group, mode)] = config_hash(compose_config(overrides(group, mode, fixed, self.extra)))
        return self._model_keys[(group, mode)]

    def throughputs(self, points: list[tuple[str, tuple]]) -> dict[tuple, dict[str, float]]:
        """Baseline throughputs of every (group, values) point, cached by the model's key too."""
        key = lambda g, m, v: json.dumps([g, m, v, self.model_key(g, m)])  # noqa: E731
        todo = list(dict.fromkeys((g, m, v) for g, v in points for m in BASELINES if key(g, m, v) not in self.cache))
        if todo:
            if self.jobs > 1:
                with ProcessPoolExecutor(self.jobs) as pool:
                    for a, r in zip(todo, pool.map(simulate_one, [(*a, self.extra) for a in todo])):
                        self.cache[key(*a)] = r
            else:
                for a in todo:
                    self.cache[key(*a)] = simulate_one((*a, self.extra))
            self.evals += len(todo)
            self.cache_path.write_text(json.dumps(self.cache, indent=0))
        return {(g, v): {m: self.cache[key(g, m, v)] for m in BASELINES} for g, v in points}

    def loss(self, groups: list[str], override: tuple[str, float] | None = None) -> float:
        pts = [(g, self.values(g, override)) for g in groups]
        res = self.throughputs(pts)
        return sum(group_loss(res[pt], self.paper[pt[0]])[0] for pt in pts)

    def fit(self, rounds: int) -> None:
        for r in range(rounds):
            for c in CONSTANTS:
                for sk in sorted(set(scope_key(c, g) for g in self.groups if g in c.groups)):
                    gs = [g for g in self.groups if g in c.groups and scope_key(c, g) == sk]
                    self.params[c.name][sk] = self._coord(c, gs, self.params[c.name][sk], first=(r == 0))
            print(f"round {r + 1}: {json.dumps(self.params)} loss={self.loss(self.groups):.4f} "
                  f"(sim runs so far {self.evals})", flush=True)

    def _coord(self, c: Constant, groups: list[str], current: float, first: bool) -> float:
        """Best value of one constant on its grid (round 1) or around the current value (later
        rounds: halfway to each grid neighbour), all within its declared range."""
        grid = list(c.grid)
        if not first:
            below = max([x for x in grid if x < current], default=c.lo)
            above = min([x for x in grid if x > current], default=c.hi)
            grid = sorted({current, (current + below) / 2, (current + above) / 2})
        grid = sorted({min(c.hi, max(c.lo, float(int(x)) if c.name == "step_offset" else x)) for x in grid})
        self.throughputs([(g, self.values(g, (c.name, v))) for v in grid for g in groups])  # one parallel batch
        return min(grid, key=lambda v: (self.loss(groups, (c.name, v)), abs(v - current)))

    def report(self) -> list[dict[str, Any]]:
        rows = []
        for g in self.groups:
            v = self.values(g)
            sim = self.throughputs([(g, v)])[(g, v)]
            _, matched = group_loss(sim, self.paper[g])
            for m in BASELINES:
                rows.append({"models": g, "deploy": m, "sim_tokens_per_s": round(sim[m]),
                             "paper_tokens_per_s": matched[m], "ratio": round(sim[m] / matched[m], 3),
                             **{k: x for k, x in v}})
        return rows


# ---------------------------------------------------------------------- writing the yaml
def _set_line(text: str, pattern: str, new_line: str, path: Path) -> str:
    out, n = re.subn(pattern, new_line, text, count=1, flags=re.M)
    if n != 1:
        raise RuntimeError(f"{path}: no line matches {pattern!r}; edit it by hand")
    return out


def write_yaml(fit: Fitter, rows: list[dict[str, Any]]) -> list[Path]:
    resid = {g: ", ".join(f"{r['deploy']} x{r['ratio']:.2f}" for r in rows if r["models"] == g) for g in fit.groups}
    note = "fitted to Fig. 9 baselines (artifact/calibrate; sim/paper at Table 4:"
    P = fit.params
    written = []
    sigma = P["genrm_sigma"]["all judges"]
    for g in fit.groups:
        path = ROOT / "conf" / "models" / f"{g}.yaml"
        text = path.read_text()
        med = int(P["genrm_median"][GENRM_OF[g]])
        off = int(P["step_offset"][g])
        text = _set_line(text, r"^  genrm: \{median: [0-9.]+,.*$",
                         f"  genrm: {{median: {med}, sigma: {sigma:g}, max_len: 20480}}   # E, {note} {resid[g]}); "
                         f"median range 800-8K (calibration §7: thinking judges), shared by every group with this "
                         f"GenRM; sigma range 0.8-1.2 (calibration §4, §7), one for every judge; cap 20K = paper §8.1",
                         path)
        text = _set_line(text, r"^  step_offset: .*$",
                         f"  step_offset: {off}   # E, {note} {resid[g]}); range 0-300 steps "
                         f"(the response_mean_curve span)", path)
        path.write_text(text)
        written.append(path)
    path = ROOT / "conf" / "cluster" / "sim.yaml"
    allres = "; ".join(f"{g}: {resid[g]}" for g in fit.groups)
    text = path.read_text()
    shown = {"mfu": lambda v: f"{v:.3g}", "eager_layer_s": lambda v: f"{v * 1e3:.3g}e-3"}
    for name, fmt in shown.items():
        c = BY_NAME[name]
        text = _set_line(text, rf"^  {name}: .*$",
                         f"  {name}: {fmt(P[name]['H20'])}   # E, {note} {allres}); range {c.lo:g}-{c.hi:g}", path)
    path.write_text(text)
    written.append(path)
    return written


def trial_constant(item: str) -> Constant:
    """`NAME=V1,V2,...` (`--trial-grid`): the fitted constant NAME over that grid, its range the
    grid's span (a trial outside the declared range: never written to conf/)."""
    name, _, vals = item.partition("=")
    c = BY_NAME.get(name)
    try:
        grid = tuple(sorted(float(v) for v in vals.split(",")))
    except ValueError:
        grid = ()
    if c is None or not grid:
        raise ValueError(f"--trial-grid {item!r}: expected NAME=V1,V2,... with NAME one of "
                         f"{', '.join(BY_NAME)}")
    return dataclasses.replace(c, lo=grid[0], hi=grid[-1], grid=grid, start=min(max(c.start, grid[0]), grid[-1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS / "calibrate")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--groups", nargs="*", default=GROUPS)
    p.add_argument("--write", action="store_true", help="write the fitted values into conf/")
    p.add_argument("--extra", nargs="*", default=[], choices=sorted(OPTIONAL),
                   help="also fit these constants (a trial: --write refuses them)")
    p.add_argument("--trial-grid", nargs="*", default=[], metavar="NAME=V1,V2,...",
                   help="a trial outside a constant's declared range: fit NAME over this grid (its range "
                        "becomes the grid's span; --write refuses it)")
    p.add_argument("--quick", action="store_true",
                   help="one group, one round on 3-point grids, a small batch (about a minute; never --write)")
    args = p.parse_args(argv)
    if args.quick and args.write:
        p.error("--quick fits on a small batch: its values are not the paper's; run without --write")
    if args.extra and args.write:
        p.error("--extra constants have no yaml line to write: run the trial without --write")
    if args.trial_grid and args.write:
        p.error("--trial-grid leaves the declared ranges: run the trial without --write")
    trials = []
    for item in args.trial_grid:
        try:
            trials.append(trial_constant(item))
        except ValueError as e:
            p.error(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.quick:  # one group, one round, the grid's ends and middle
        args.groups, args.rounds = ["qwen1.5b_glm9b"], 1
        for i, c in enumerate(CONSTANTS):
            CONSTANTS[i] = dataclasses.replace(c, grid=(c.grid[0], c.grid[len(c.grid) // 2], c.grid[-1]))
    CONSTANTS.extend(OPTIONAL[name] for name in args.extra)
    for c in trials:
        names = [x.name for x in CONSTANTS]
        if c.name in names:
            CONSTANTS[names.index(c.name)] = c
        else:
            CONSTANTS.append(c)
        BY_NAME[c.name] = c
    t0 = time.perf_counter()
    fit = Fitter(args.out, args.jobs, args.groups, tuple(QUICK_RUN) if args.quick else ())
    fit.fit(args.rounds)
    rows = fit.report()
    write_csv(rows, args.out / "calibrate.csv")
    ranges = {c.name: (c.lo, c.hi) for c in CONSTANTS}
    (args.out / "fit.json").write_text(json.dumps({"params": fit.params, "ranges": ranges, "rows": rows,
                                                   "loss": fit.loss(fit.groups), "sim_runs": fit.evals,
                                                   "wall_s": time.perf_counter() - t0}, indent=1))
    for r in rows:
        print(f"{r['models']:18s} {r['deploy']:14s} sim {r['sim_tokens_per_s']:>8,} paper {r['paper_tokens_per_s']:>8,} "
              f"x{r['ratio']:.2f}")
    if args.write:
        for path in write_yaml(fit, rows):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
