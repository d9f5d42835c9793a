"""Best static allocation of the baselines, found by a sweep (as the paper tuned its baselines).

Owns: enumerating valid static allocations at replica granularity, running each one short in the
simulator, picking the best by measured throughput, and caching results by config hash so repeated
runs (multirun sweeps, the Fig. 9 benchmark) do not redo them. Also resolves the allocation every
mode runs with (`resolve_allocation`), including pivot's training home set.

Grid: the cluster is cut into `models.sim.sweep_units` equal units (each a multiple of the largest
replica size, so every role's replicas stay aligned); `disaggregated` tries every split of the
units into rollout/reward/train (each >= 1 unit), `rr_colocated` every split into pool/train. The
paper's Table 4 allocation lies on this grid for every group, and is always tried. `pivot` has one
static choice, its training home set; with `models.sim.pivot_home=sweep` it is swept the same way.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pivotrl.config import PivotConfig
from pivotrl.config.resolve import resolve
from pivotrl.core.types import Role

CACHE_VERSION = "sim-sweep-v10"  # bump when the simulator's behaviour changes


def default_cache_dir() -> Path:
    return Path(os.environ.get("PIVOTRL_CACHE", Path.home() / ".cache" / "pivotrl")) / "sim_sweep"


def _mode(cfg: PivotConfig) -> str:
    return cfg.deploy.mode.value if hasattr(cfg.deploy.mode, "value") else str(cfg.deploy.mode)


def sweep_unit(cfg: PivotConfig) -> int:
    n = resolve(cfg).num_devices
    align = max(cfg.models.policy.tp, cfg.models.genrm.tp)
    unit = max(align, n // cfg.models.sim.sweep_units)
    unit = -(-unit // align) * align
    if n % unit:
        raise ValueError(f"cannot cut cluster.num_devices={n} into units of {unit} devices (replica size {align}); "
                         f"change models.sim.sweep_units")
    return unit


def candidates(cfg: PivotConfig) -> list[dict[Role, int]]:
    """Valid static allocations of a baseline mode on the sweep grid (+ the paper's Table 4)."""
    n = resolve(cfg).num_devices
    unit = sweep_unit(cfg)
    U = n // unit
    mode = _mode(cfg)
    out: list[dict[Role, int]] = []
    if mode == "disaggregated":
        for ro in range(1, U - 1):
            for rm in range(1, U - ro):
                out.append({Role.ROLLOUT: ro * unit, Role.REWARD: rm * unit, Role.TRAIN: (U - ro - rm) * unit})
    elif mode == "rr_colocated":
        for pool in range(1, U):
            out.append({Role.ROLLOUT: pool * unit, Role.REWARD: 0, Role.TRAIN: (U - pool) * unit})
    elif mode == "pivot":  # only the training home set is static in pivot
        for tr in range(1, U):
            out.append({Role.TRAIN: tr * unit})
    else:
        raise ValueError(f"the allocation sweep is for disaggregated, rr_colocated and pivot, not deploy={mode}")
    paper = paper_allocation(cfg)
    if paper and paper not in out and sum(paper.values()) == n:
        out.append(paper)
    return out


def paper_allocation(cfg: PivotConfig) -> dict[Role, int] | None:
    pa, mode = cfg.models.sim.paper_allocation, _mode(cfg)
    if mode == "disaggregated" and len(pa.disaggregated) == 3:
        return dict(zip((Role.ROLLOUT, Role.REWARD, Role.TRAIN), map(int, pa.disaggregated)))
    if mode == "rr_colocated" and len(pa.rr_colocated) == 2:
        return {Role.ROLLOUT: int(pa.rr_colocated[0]), Role.REWARD: 0, Role.TRAIN: int(pa.rr_colocated[1])}
    if mode == "pivot" and pa.pivot_train:
        return {Role.TRAIN: int(pa.pivot_train)}
    return None


def _key(alloc: dict[Role, int]) -> str:
    return f"{alloc.get(Role.ROLLOUT, 0)}/{alloc.get(Role.REWARD, 0)}/{alloc.get(Role.TRAIN, 0)}"


def config_hash(cfg: PivotConfig) -> str:
    """Hash of everything that changes a sweep result (not the allocation or logging)."""
    from pivotrl.logging.tracker import to_jsonable

    models = to_jsonable(cfg.models)
    models.get("sim", {}).pop("throughput_sample_s", None)  # records only: results do not change
    d = {"v": CACHE_VERSION, "models": models, "cluster": to_jsonable(cfg.cluster),
         "mode": _mode(cfg), "staleness": cfg.deploy.staleness,
         "planner": to_jsonable(resolve(cfg).planner), "seed": cfg.seed,
         "train": {k: getattr(cfg.train, k) for k in ("warmup_steps", "prompts_per_step", "group_size")},
         # the sweep's run length changes its measurements (a 4-step sweep must not reuse 7-step results)
         "sweep_steps": cfg.models.sim.sweep_steps or cfg.train.steps}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _throughput(cfg: PivotConfig, alloc: dict[Role, int], steps: int) -> float:
    from pivotrl.sim.runtime import simulate

    return float(simulate(cfg, alloc, steps=steps)["throughput_tokens_per_s"])


def sweep(cfg: PivotConfig, cache_dir: Path | None = None, progress: bool = False,
          jobs: int = 1) -> dict[str, Any]:
    """Run every candidate allocation; returns {"best": alloc, "results": {key: throughput}}.
    `jobs > 1` runs candidates in that many processes."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{_mode(cfg)}_{cfg.models.name}_{config_hash(cfg)}.json"
    cached: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}
    cands = candidates(cfg)
    steps = cfg.models.sim.sweep_steps or cfg.train.steps
    short = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, warmup_steps=1))
    it = cands
    if progress:
        from tqdm import tqdm

        it = tqdm(cands, desc=f"sweep {_mode(cfg)} {cfg.models.name}", unit="alloc", leave=False)
    todo = [a for a in cands if _key(a) not in cached]
    if jobs > 1 and len(todo) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futs = {_key(a): pool.submit(_throughput, short, a, steps) for a in todo}
            for k, f in futs.items():
                cached[k] = f.result()
                path.write_text(json.dumps(cached, indent=1))
    else:
        for alloc in it:
            k = _key(alloc)
            if k not in cached:
                cached[k] = _throughput(short, alloc, steps)
                path.write_text(json.dumps(cached, indent=1))  # keep partial progress
    fresh = len(todo)
    scores = {_key(a): cached[_key(a)] for a in cands}
    best = max(cands, key=lambda a: (scores[_key(a)], -a.get(Role.TRAIN, 0)))
    return {"best": best, "results": scores, "runs": fresh, "cached": len(cands) - fresh,
            "steps": steps, "cache": str(path)}


def resolve_allocation(cfg: PivotConfig, cache_dir: Path | None = None, progress: bool = False,
                       jobs: int = 1) -> tuple[dict[Role, int], dict[str, Any]]:
    """The allocation a run uses, and a JSON-able note of where it came from."""
    mode = _mode(cfg)
    n = resolve(cfg).num_devices
    a = cfg.deploy.allocation
    if mode == "colocated":
        return {}, {"source": "all devices serve every role", "devices": n}
    if mode == "pivot" and not a.train and cfg.models.sim.pivot_home == "sweep":
        res = sweep(cfg, cache_dir, progress, jobs)
        tr = res["best"][Role.TRAIN]
        paper = paper_allocation(cfg)
        return {Role.TRAIN: tr}, {"source": "sweep (best training home set)", "train_home": tr,
                                  "allocation": _key(res["best"]), "sweep_throughput": res["results"],
                                  "paper_allocation": _key(paper) if paper else None,
                                  "sweep_runs": res["runs"], "sweep_cached": res["cached"]}
    if mode == "pivot":
        paper_tr = cfg.models.sim.paper_allocation.pivot_train
        if n != cfg.models.devices:  # Table 4 is for the paper's cluster size: keep its share
            paper_tr = max(1, round(paper_tr * n / cfg.models.devices)) if paper_tr else 0
        tr = a.train or paper_tr or max(1, n // 4)
        src = "deploy.allocation.train" if a.train else (
            "paper Table 4" if paper_tr else "default: a quarter of the devices")
        return {Role.TRAIN: int(tr)}, {"source": src, "train_home": int(tr)}
    if a.given():
        alloc = {Role.ROLLOUT: a.rollout or 0, Role.REWARD: a.reward or 0, Role.TRAIN: a.train or 0}
        return alloc, {"source": "deploy.allocation", "allocation": _key(alloc)}
    res = sweep(cfg, cache_dir, progress, jobs)
    paper = paper_allocation(cfg)
    info = {"source": "sweep (best static allocation)", "allocation": _key(res["best"]),
            "sweep_throughput": res["results"], "sweep_steps": res["steps"],
            "paper_allocation": _key(paper) if paper else None,
            "paper_allocation_throughput": res["results"].get(_key(paper)) if paper else None,
            "sweep_runs": res["runs"], "sweep_cached": res["cached"]}
    return res["best"], info
