"""Replay a real run in the simulator: recorded workload, fitted constants, same control plane.

Owns the glue of issue 5 item 6 ("sim against real"), built only from the simulator's public pieces
(`SimSetup`, `SimDriver`, `RoleCosts`, `SampleLengths`) and the run folder's records:
- `ReplayWorkload`: a workload (the same interface as `sim.workload.Workload`) that yields recorded
  lengths instead of drawing them: each sample's own lengths where the run recorded them
  (`sample_lengths` timeline records, which `cluster=local`/`ray` runs write for every trained
  batch), else (older run folders) `from_step_totals`: every sample of a step gets that step's mean
  lengths, spread so the step's token totals match exactly.
- `ReplayConstants` + `constants_from_run`: the simulator's constants fitted from a real run:
  per-role `ThroughputModel` (the last online fit the monitor logged, `throughput_fit` records:
  fitted to what the replicas delivered, busy time between iterations included and scaled to the
  measured mean; see `pivotrl.runtime.monitor`),
  training seconds per step (median of the measured train_start..train_end spans), shift-up/down seconds per role
  (mean of the measured warm `shift_timing` device records; the first load of a role on a device,
  `cold`, is kept separately and charged the first time the replay shifts that device up to that
  role), the weight refresh of rollout replicas (median of the measured per-device loads,
  `weight_refresh` records; every publish stalls each rollout replica that long, as the sim does),
  KV capacity per replica and the initial allocation from the run's config and records.
- `ReplayRuntime`: `SimDriver` with training and shift times taken from `ReplayConstants` instead
  of the MFU and bandwidth models; everything else (controllers, schedulers, planner, decode clock)
  is the simulator's own code. Two optional machine corrections: `engine_slowdown` (wall seconds
  per modelled second of the engines; `fit_engine_slowdown` fits it on one run), and `cores`
  (shared-cores contention: with B devices busy on C cores, inference runs max(1, B/C) slower).
  The controller always sees the unslowed fitted models, as the real run's planner did.
- `engine_duty`: measured over modelled throughput per role from the run's `role_state` snapshots.
- Per-sample lengths: read from `sample_lengths` timeline records (`recorded_workload`; the run
  folder's one reader, `pivotrl.report.records.RunRecords`, documents the record;
  `pivotrl.runtime.stats` writes one per trained batch).

What the replay cannot see: how contention between virtual devices that share cores varies over
the run (the fitted models include the contention the run saw, at its average level over the
monitor's window), the driver's own latency (polls every `runtime.poll_s`, dispatch through Ray:
the sim hands a finished sequence's successor to a replica at once), the judge prompt's template
(the sim's GenRM prompt is prompt + response; the real one wraps them in the judge template, ~13 %
more prefill tokens on the tiny models), the spread of shift times (one mean per role and
direction; measured shift downs range over 10x under load), and engine start-up jitter. Older run
folders without `sample_lengths` or `weight_refresh` records replay with per-step mean lengths and
0 s refreshes (stated in the constants' notes).
"""
from __future__ import annotations

import copy
import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import INFERENCE_ROLES, Role
from pivotrl.report.records import RunRecords
from pivotrl.sim.runtime import SimDriver
from pivotrl.sim.setup import SimSetup
from pivotrl.sim.timemodel import RoleCosts
from pivotrl.sim.workload import BatchedLengths, SampleLengths

if TYPE_CHECKING:
    from pivotrl.config import PivotConfig
    from pivotrl.logging.tracker import Tracker


class ReplayWorkload(BatchedLengths):
    """Recorded lengths, `batches[b][p][i]` for batch b, prompt p, sample i (the sim's Workload API)."""

    def __init__(self, batches: list[list[list[SampleLengths]]]) -> None:
        if not batches or not batches[0] or not batches[0][0]:
            raise ValueError("ReplayWorkload needs at least one batch with one prompt and one sample")
        self.P, self.G = len(batches[0]), len(batches[0][0])
        for b, rows in enumerate(batches):
            if len(rows) != self.P or any(len(r) != self.G for r in rows):
                raise ValueError(f"ReplayWorkload batch {b} is not {self.P} prompts x {self.G} samples")
            for r in rows:
                if any(x.prompt != r[0].prompt for x in r):
                    raise ValueError(f"ReplayWorkload batch {b}: samples of one prompt differ in prompt length")
        self.batches = batches
        self.step_offset = 0

    @classmethod
    def from_step_totals(cls, steps: list[dict[str, float]], P: int, G: int) -> "ReplayWorkload":
        """One batch per entry of `steps` (keys `prompt_tokens`, `response_tokens`, `genrm_tokens`:
        that batch's totals over its P*G samples). Totals are spread as evenly as integers allow
        (prompt totals per prompt, the others per sample), so each batch's totals are exact."""
        n = P * G
        out = []
        for st in steps:
            prompts = _spread(int(round(st["prompt_tokens"] / G)), P)
            resp = _spread(int(round(st["response_tokens"])), n)
            gen = _spread(int(round(st["genrm_tokens"])), n)
            out.append([[SampleLengths(prompts[p], resp[p * G + i], gen[p * G + i]) for i in range(G)]
                        for p in range(P)])
        return cls(out)

    def batch_lengths(self, batch: int) -> list[list[SampleLengths]]:
        if not 0 <= batch < len(self.batches):
            raise IndexError(f"ReplayWorkload has batches 0..{len(self.batches) - 1}, asked for {batch}")
        return self.batches[batch]


def _spread(total: int, n: int) -> list[int]:
    """`n` integers >= 1 summing to max(total, n), differing by at most one."""
    total = max(total, n)
    q, r = divmod(total, n)
    return [q + 1 if k < r else q for k in range(n)]


# ---------------------------------------------------------------------------------- run records
def recorded_workload(rec: RunRecords) -> ReplayWorkload:
    """The run's workload: per-sample lengths where every batch has them, else per-step totals
    spread evenly (`RunRecords.step_totals`)."""
    batches = sorted(int(r["batch"]) for r in rec.metrics)
    n = rec.P * rec.G
    if rec.per_sample:
        per = rec.sample_lengths()
        lead = rec.shared_judgements()
        key = {**{x: x for x in lead.values()}, **lead}  # a judged sample and its sharers: one key
        return ReplayWorkload([[[SampleLengths(*per[b][sid], judge_key=key.get(sid, -1))
                                 for sid in range(b * n + p * rec.G, b * n + (p + 1) * rec.G)]
                                for p in range(rec.P)] for b in batches])
    return ReplayWorkload.from_step_totals(rec.step_totals(), rec.P, rec.G)


@dataclass
class ReplayConstants:
    """The simulator's constants, fitted from one real run."""

    models: dict[Role, ThroughputModel]
    kv_capacity: int
    shift_up_s: dict[Role, float]
    shift_down_s: dict[Role, float]
    cold_up_s: dict[Role, float]
    train_s: float
    allocation: dict[Role, int]
    publish_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    engine_slowdown: float = 1.0
    """Wall seconds per second of modelled decode/prefill on the real engines (>= 1): whatever the
    fitted model still misses of an engine's wall time (runs from before iteration samples covered
    the busy time between iterations needed ~5x; driver latency the sim does not model). 1 = the
    fitted iteration model as is; `fit_engine_slowdown` fits it."""
    cores: int | None = None
    """Shared-cores contention (None: off): with B devices busy at once (inference replicas with
    work, training devices while training) on `cores` cores, every inference replica's iteration
    and prefill times are multiplied by max(1, B / cores) from that moment on."""
    train_s_by_batch: dict[int, float] = field(default_factory=dict)
    """Measured training seconds per batch (`train_time="trace"`): replaces `train_s` where present."""

    def train_time(self, batch: int) -> float:
        return self.train_s_by_batch.get(int(batch), self.train_s)

    def as_dict(self) -> dict[str, Any]:
        return {"models": {r.value: {k: getattr(m, k) for k in ("A", "B", "C", "D", "P0", "P1", "P2")}
                           for r, m in self.models.items()},
                "kv_capacity": self.kv_capacity,
                "shift_up_s": {r.value: v for r, v in self.shift_up_s.items()},
                "shift_down_s": {r.value: v for r, v in self.shift_down_s.items()},
                "cold_up_s": {r.value: v for r, v in self.cold_up_s.items()},
                "train_s": self.train_s, "publish_s": self.publish_s,
                "train_s_by_batch": {str(b): v for b, v in self.train_s_by_batch.items()},
                "engine_slowdown": self.engine_slowdown, "cores": self.cores,
                "allocation": {r.value: v for r, v in self.allocation.items()}, "notes": self.notes}


def _model_from_fit(rec: dict[str, Any]) -> ThroughputModel:
    return ThroughputModel(A=rec["A"], B=rec["B"], C=rec["C"], D=rec["D"], P0=rec["P0"], P1=rec["P1"], P2=rec["P2"])


TRAIN_TIMES = ("median", "trace")


def constants_from_run(rec: RunRecords, kv_capacity: int, allocation: dict[Role, int],
                       train_time: str = "median") -> ReplayConstants:
    """Fit the replay's constants from a run's records (see the module docstring). `allocation` is
    the initial allocation the run's controller got (the local runtime's default or `deploy.allocation`).
    `train_time`: "median" = one fitted constant (a prediction); "trace" = each batch's measured
    training seconds (isolates the error of the inference, shift and control part of the replay)."""
    if train_time not in TRAIN_TIMES:
        raise ValueError(f"train_time={train_time!r}; allowed: {list(TRAIN_TIMES)}")
    notes: list[str] = []
    fits = {r: [x for x in rec.timeline if x.get("kind") == "throughput_fit" and x.get("role") == r.value]
            for r in INFERENCE_ROLES}
    models: dict[Role, ThroughputModel] = {}
    for r in INFERENCE_ROLES:
        if fits[r]:
            models[r] = _model_from_fit(fits[r][-1])
    if not models:
        raise ValueError(f"{rec.run_dir}: no throughput_fit records: the run never fitted a throughput model")
    for r in INFERENCE_ROLES:  # a role that never ran long enough to fit borrows the other's fit
        if r not in models:
            other = next(iter(models.values()))
            models[r] = other
            notes.append(f"{r.value}: no online fit in the run; used the other role's fit")
    warm: dict[tuple[Role, str], list[float]] = {}
    cold: dict[Role, list[float]] = {}
    for x in rec.timeline:
        if x.get("kind") != "shift_timing":
            continue
        for d in x.get("devices", []):
            role, direction = Role(d["role"]), d["direction"]
            if d.get("cold") and direction == "up":
                cold.setdefault(role, []).append(float(d["seconds"]))
            else:
                warm.setdefault((role, direction), []).append(float(d["seconds"]))
    roles = (*INFERENCE_ROLES, Role.TRAIN)
    up = {r: statistics.mean(warm.get((r, "up")) or cold.get(r) or [0.0]) for r in roles}
    down = {r: statistics.mean(warm.get((r, "down")) or [0.0]) for r in roles}
    cold_up = {r: statistics.mean(cold[r]) for r in cold}
    # the training phase as the pipeline saw it (train_start..train_end: the trainer call plus
    # checkpoint and publish), not the trainer's own `train_s`, which leaves those out
    span = {int(s["batch"]): float(s["train_end"]) - float(s["train_start"]) for s in rec.steps
            if s.get("train_end") is not None and s.get("train_start") is not None}
    trains = list(span.values())
    if not trains:
        raise ValueError(f"{rec.run_dir}: metrics.jsonl has no train_start/train_end: cannot fit the training time")
    refresh = [float(d["seconds"]) for x in rec.timeline if x.get("kind") == "weight_refresh"
               for d in x.get("devices", [])]
    publish_s = statistics.median(refresh) if refresh else 0.0
    if refresh:
        notes.append(f"weight refresh of rollout replicas: median of {len(refresh)} measured loads "
                     f"({publish_s:.3f} s) stalls every rollout replica per publish")
    else:
        notes.append("weight refresh of rollout replicas is not timed in the records: charged 0 s")
    if rec.per_sample:
        notes.append("per-sample lengths replayed from the run's sample_lengths records")
    else:
        notes.append("per-sample lengths are not recorded: every sample of a step gets that step's mean lengths")
    by_batch = dict(span) if train_time == "trace" else {}
    return ReplayConstants(models, kv_capacity, up, down, cold_up, statistics.median(trains),
                           dict(allocation), publish_s, notes, train_s_by_batch=by_batch)


# ---------------------------------------------------------------------------------- the replay runtime
class ReplayRuntime(SimDriver):
    """`SimDriver` whose training, shift and publish times come from `ReplayConstants` (through
    the simulator's physics hooks), with the shared-cores contention model when `consts.cores`."""

    def __init__(self, setup: SimSetup, consts: ReplayConstants, tracker: Tracker | None = None) -> None:
        import weakref

        super().__init__(setup, tracker)
        self.consts = consts
        self.publish_s = consts.publish_s
        self._warm: set[tuple[int, Role]] = set()  # (device, role) pairs that have loaded once
        self._train_devices = 0
        self._factor: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # replica -> slowdown (new: 1)

    # -- shared-cores contention (ReplayConstants.cores) ----------------------------------------
    def training_finished(self) -> None:
        super().training_finished()
        self._train_devices = 0

    def after_event(self) -> None:
        if self.consts.cores:
            self._contend()

    def _contend(self) -> None:
        busy = self._train_devices + sum(
            rep.tp for rep in self.replicas.values() if rep.n or rep.stall_until > self.now)
        f = max(1.0, busy / float(self.consts.cores))
        for rid, rep in self.replicas.items():
            if self._factor.get(rep, 1.0) == f:
                continue
            self._factor[rep] = f
            rep.set_model(slowed(self.s.costs[self.role_of[rid]].model, f), self.now)
            self.reschedule(rid)

    def training_seconds(self, act) -> float:
        self._train_devices = len(act.devices)
        return self.consts.train_time(act.batch)

    def shift_seconds(self, plan) -> tuple[float, float]:
        """The sim's shift without cold starts, plus the measured cold-load time where this replay
        loads a role on a device for the first time (the real engines did the same)."""
        down_s, up_s = super().shift_seconds(plan)
        extra = 0.0
        for s in plan.up:
            key = (s.first_device, s.role)
            if key not in self._warm:
                self._warm.add(key)
                if s.role in self.consts.cold_up_s:
                    extra = max(extra, self.consts.cold_up_s[s.role] - self.consts.shift_up_s[s.role])
        return down_s, up_s + max(extra, 0.0)


def slowed(model: ThroughputModel, factor: float) -> ThroughputModel:
    """`model` with every iteration and prefill time multiplied by `factor`."""
    if not factor > 0:
        raise ValueError(f"engine slowdown must be > 0, got {factor}")
    return dataclasses.replace(model, **{k: getattr(model, k) * factor
                                         for k in ("A", "B", "C", "D", "P0", "P1", "P2")})


class ReplaySetup(SimSetup):
    """`SimSetup` whose controller sees `control_models` (what the real run's planner had: the
    monitor's fits) while the simulated engines run on `costs` (slowed to the real engines' pace)."""

    control_models: dict[Role, ThroughputModel] = {}

    def control_env(self):  # type: ignore[override]
        env = super().control_env()
        if self.control_models:
            env.models = dict(self.control_models)
        return env


def replay_setup(cfg: PivotConfig, consts: ReplayConstants, workload: ReplayWorkload, steps: int,
                 warmup: int, num_devices: int) -> SimSetup:
    """A `SimSetup` for `cfg` (a composed `cluster=sim` config of the same mode) with the fitted
    constants: role costs from the fitted models and measured shift times, the recorded workload."""
    cfg = copy.deepcopy(cfg)
    cfg.cluster.num_devices = int(num_devices)
    cfg.models.policy.train_shift_up_s = consts.shift_up_s[Role.TRAIN]
    cfg.models.policy.train_shift_down_s = consts.shift_down_s[Role.TRAIN]
    cfg.models.sim.kv_reserve_tokens = 0
    cfg.models.sim.throughput_sample_s = 0.0
    costs = {r: RoleCosts(model=slowed(consts.models[r], consts.engine_slowdown), tp=1, kv_capacity=int(consts.kv_capacity),
                          shift_up_s=consts.shift_up_s[r], shift_down_s=consts.shift_down_s[r])
             for r in INFERENCE_ROLES}
    if steps > len(workload.batches):
        raise ValueError(f"replay of {steps} steps needs {steps} recorded batches, the run has {len(workload.batches)}")
    setup = ReplaySetup(cfg, costs, workload, int(steps), int(warmup), dict(consts.allocation))
    setup.control_models = dict(consts.models)
    return setup


def replay(cfg: PivotConfig, consts: ReplayConstants, workload: ReplayWorkload, steps: int, warmup: int,
           num_devices: int, tracker: Tracker | None = None) -> dict[str, Any]:
    """Run the replay; returns the sim's summary (its `step_time_s` is the predicted step times)
    plus `step_rows`, the sim's per-step records (phase times: rollout_done_at, reward_done_at, ...)."""
    rt = ReplayRuntime(replay_setup(cfg, consts, workload, steps, warmup, num_devices), consts, tracker)
    out = rt.run()
    out["step_rows"] = list(rt.rec.rows)
    return out


def inference_phase_s(rows: list[dict[str, Any]], warmup: int) -> float:
    """Sum over the measured steps (after `warmup`) of each batch's rollout + reward phase seconds
    (release to last judgement): the part of a step the engines' pace sets."""
    tot = 0.0
    for r in rows:
        if r["step"] > warmup and r.get("reward_done_at") is not None:
            tot += float(r["reward_done_at"]) - float(r["released_at"])
    return tot


def fit_engine_slowdown(cfg: PivotConfig, consts: ReplayConstants, workload: ReplayWorkload, rec: RunRecords,
                        lo: float = 1.0, hi: float = 64.0, iters: int = 12) -> float:
    """The `engine_slowdown` at which the replay's inference phases (release to last judgement,
    summed over the measured steps) take as long as the run's: bisection on a log scale (the
    phase time grows with the slowdown). Clamped to [lo, hi]."""
    import math

    warm = int(rec.summary["warmup_steps"])
    target = inference_phase_s(rec.steps, warm)
    steps, n = len(rec.steps), int(rec.summary["devices"])

    def phase(f: float) -> float:
        c = dataclasses.replace(consts, engine_slowdown=f)
        return inference_phase_s(replay(cfg, c, workload, steps, warm, n)["step_rows"], warm)

    if phase(lo) >= target:
        return lo
    if phase(hi) <= target:
        return hi
    a, b = math.log(lo), math.log(hi)
    for _ in range(iters):
        m = (a + b) / 2
        if phase(math.exp(m)) < target:
            a = m
        else:
            b = m
    return math.exp((a + b) / 2)


def engine_duty(rec: RunRecords, models: dict[Role, ThroughputModel]) -> dict[Role, float | None]:
    """Measured tokens/s over modelled tokens/s per role, from the per-step `role_state` snapshots
    (running sequences and KV tokens per replica, and the monitor's windowed tokens/s): how much of
    the fitted iteration model's throughput the real engines delivered. None: no snapshot with work.
    The window (10 s) can include idle or shifting time, so this is a lower bound on the duty."""
    out: dict[Role, float | None] = {}
    for r in INFERENCE_ROLES:
        meas = model = 0.0
        for s in rec.steps:
            st = (s.get("role_state") or {}).get(r.value) or {}
            reps, n = int(st.get("replicas") or 0), int(st.get("running") or 0)
            if reps and n:
                meas += float(st.get("throughput_tokens_per_s") or 0.0)
                model += reps * models[r].throughput(max(1, n // reps), int(st.get("kv_tokens", 0)) // reps)
        out[r] = meas / model if model > 0 else None
    return out
