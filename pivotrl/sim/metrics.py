"""Run figures of the simulator: per-step metrics rows and the run summary (DESIGN §4.6).

Owns: end-to-end throughput over the measured steps (after the warm-up), the ideal-utilisation bound
and `efficiency = ideal / actual`, per-role busy fractions, the fraction of device time below 20 %
of the role's peak per-device throughput, shifts per step and planner overhead.

Ideal bound: every device always busy at its role's best per-device throughput, shifts free:
`(W_rollout + W_reward + W_train) / devices`, where W_role is decode tokens / peak per-device
tokens/s plus prefill device-seconds, and W_train the training compute device-seconds (the fixed
per-step overhead T_fixed is left out: it is not work a device does, so the bound stays a bound).

Measurement window. With staleness s, up to s batches are generated during the warm-up step, and
their inference work is then missing from the measured window's wall time. Windows shorter than
about 2*(s+1) measured steps therefore overstate throughput (efficiency can even exceed 1 at s=5
with 6 measured steps); at s=2, 6 measured steps (train.steps=7) cover two whole cycles.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pivotrl.core.types import INFERENCE_ROLES, Role, ShiftPlan
from pivotrl.sim import timemodel as tm

if TYPE_CHECKING:
    from pivotrl.sim.engine import SimReplica
    from pivotrl.sim.runtime import SimDriver
    from pivotrl.sim.setup import SimSetup


class RunStats:
    """Accumulates a run's figures as the runtime goes."""

    def __init__(self, setup: "SimSetup", peak: dict[Role, float]) -> None:
        self.s = setup
        self.peak = peak
        self.retired = {r: [0.0, 0.0, 0.0] for r in INFERENCE_ROLES}  # busy, high (device-s), tokens
        self.train: list[list[float]] = []  # [start, end, gpus]
        self.shift_plans = 0
        self.replica_shifts = 0
        self.shift_device_s = 0.0
        self.decisions = 0
        self.planner_s = 0.0
        self.aborts = 0
        self.reprefills = 0
        self.samples: list[dict[str, Any]] = []  # `throughput` timeline records (pivotrl.sim.sampling)
        self.base: dict[str, Any] | None = None  # the totals at the end of the warm-up step
        self.peak_kv = {r: 0.0 for r in INFERENCE_ROLES}  # max K / capacity over replicas
        self.preemptions = 0  # of retired replicas; live ones are added in the summary

    # -- recording ---------------------------------------------------------------------------
    def note_kv(self, rep: "SimReplica", role: Role) -> None:
        cap = self.s.costs[role].kv_capacity
        self.peak_kv[role] = max(self.peak_kv[role], rep.peak_k / cap if cap else 0.0)

    def retire(self, rep: "SimReplica", role: Role) -> None:
        self.note_kv(rep, role)
        self.preemptions += rep.preemptions
        acc = self.retired[role]
        acc[0] += rep.busy_s * rep.tp
        acc[1] += rep.high_s * rep.tp
        acc[2] += rep.tokens

    def shift(self, plan: ShiftPlan, now: float, seconds: float) -> None:
        self.shift_plans += 1
        self.replica_shifts += len(plan.up) + len(plan.down)
        devs = {d for s in plan.up + plan.down for d in s.devices}
        self.shift_device_s += len(devs) * seconds

    def count_record(self, act) -> None:
        if act.kind == "decision" and act.fields.get("applied"):
            self.decisions += 1

    def train_start(self, now: float, gpus: int) -> None:
        self.train.append([now, now, float(gpus)])

    def train_end(self, now: float) -> None:
        self.train[-1][1] = now

    def _totals(self, rt: "SimDriver") -> dict[str, Any]:
        out = {r: list(v) for r, v in self.retired.items()}
        for rid, rep in rt.replicas.items():
            rep.advance(rt.now)
            self.note_kv(rep, rt.role_of[rid])
            acc = out[rt.role_of[rid]]
            acc[0] += rep.busy_s * rep.tp
            acc[1] += rep.high_s * rep.tp
            acc[2] += rep.tokens
        return {"roles": out, "replica_shifts": self.replica_shifts, "shift_plans": self.shift_plans,
                "shift_device_s": self.shift_device_s,
                "planner_s": getattr(rt.ctrl, "planner_seconds", 0.0),
                "planner_calls": getattr(rt.ctrl, "planner_calls", 0)}

    def step_done(self, rt: "SimDriver", act) -> dict[str, Any]:
        """The simulator's own fields of the row of step `act` (the `Recorder` adds the common
        ones: time, step time, throughput); the totals are taken at the end of the warm-up step."""
        f = act.fields
        now = rt.now
        if act.step == self.s.warmup:
            self.base = self._totals(rt)
        return {
            "rollout_s": (f["rollout_done_at"] or now) - f["released_at"],
            "reward_s": (f["reward_done_at"] or now) - (f["rollout_done_at"] or now),
            "train_wait_s": f["train_start"] - (f["reward_done_at"] or now),
            "planner_s_total": getattr(rt.ctrl, "planner_seconds", 0.0),
            "aborts_total": self.aborts, "reprefills_total": self.reprefills,
        }

    # -- summary -----------------------------------------------------------------------------
    def ideal_time(self, batches: list[int]) -> dict[str, float]:
        s = self.s
        m, hw = s.cfg.models, s.cfg.cluster.hardware
        c_ro, c_rm = s.costs[Role.ROLLOUT], s.costs[Role.REWARD]
        w = {"rollout": 0.0, "reward": 0.0, "train": 0.0}
        for b in batches:
            policy_tokens = 0
            for row in s.workload.batch_lengths(b):
                for x in row:
                    w["rollout"] += x.response / self.peak[Role.ROLLOUT] + c_ro.model.prefill_time(x.prompt) * c_ro.tp
                    w["reward"] += x.genrm / self.peak[Role.REWARD] \
                        + c_rm.model.prefill_time(x.prompt + x.response) * c_rm.tp
                    policy_tokens += x.prompt + x.response
            w["train"] += tm.training_work(m.policy, hw, m.sim, policy_tokens)
        w["total"] = (w["rollout"] + w["reward"] + w["train"]) / s.num_devices
        return w

    def summary(self, rt: "SimDriver", wall_s: float, rec: Any) -> dict[str, Any]:
        """The simulator's own summary figures over the `Recorder` `rec`'s measurement window (its
        rows and window start; it adds the common figures: throughput, steps, step times)."""
        s = self.s
        end = self._totals(rt)
        base = self.base or {"roles": {r: [0.0, 0.0, 0.0] for r in INFERENCE_ROLES}, "replica_shifts": 0,
                             "shift_plans": 0, "shift_device_s": 0.0, "planner_s": 0.0, "planner_calls": 0}
        t0 = rec.window0 if rec.window0 is not None else 0.0
        measured = [r for r in rec.rows if r["step"] > s.warmup]
        span = rt.now - t0
        ideal = self.ideal_time([r["batch"] for r in measured])
        dev_s = s.num_devices * span if span > 0 else 1.0
        busy = {r.value: (end["roles"][r][0] - base["roles"][r][0]) / dev_s for r in INFERENCE_ROLES}
        high = sum(end["roles"][r][1] - base["roles"][r][1] for r in INFERENCE_ROLES)
        train_dev_s = sum(max(0.0, min(e, rt.now) - max(st, t0)) * g for st, e, g in self.train)
        busy["train"] = train_dev_s / dev_s
        n_meas = max(len(measured), 1)
        return {
            "ideal_time_s": ideal["total"] * len(measured) / n_meas if measured else 0.0,
            "ideal_efficiency": (ideal["total"] / span) if span > 0 and measured else 0.0,
            "ideal_work_device_s": {k: v for k, v in ideal.items() if k != "total"},
            "peak_tokens_per_s_per_device": {r.value: v for r, v in self.peak.items()},
            "busy_fraction": busy,
            "below_20pct_fraction": max(0.0, 1.0 - (high + train_dev_s) / dev_s),
            "num_shifts": self.replica_shifts,  # replica moves (each replica shifted up or down), as the real runtimes count
            "replica_shifts_per_step": (end["replica_shifts"] - base["replica_shifts"]) / n_meas,
            # executed shift plans (one shift-down set + one shift-up set, the planner's or training's):
            # the paper's unit ("a single shift decision ... which resources to move", §3; Fig. 14)
            "shift_plans_per_step": (end["shift_plans"] - base["shift_plans"]) / n_meas,
            "shift_device_s_per_step": (end["shift_device_s"] - base["shift_device_s"]) / n_meas,
            "planner_overhead_s": end["planner_s"], "planner_calls": end["planner_calls"],
            "planner_decisions": self.decisions,
            "aborts": self.aborts, "reprefills": self.reprefills,
            "peak_kv_utilisation": {r.value: v for r, v in self.peak_kv.items()},
            "kv_preemptions": self.preemptions + sum(rep.preemptions for rep in rt.replicas.values()),
            "allocation": {r.value: v for r, v in s.allocation.items()},
            "sim_time_s": rt.now, "wall_s": wall_s,
        }
