"""A real run's own figures: event counts, device-seconds per role, the training busy time, the
driver's dispatch time, and the fields they give each metrics row and the summary (the common
ones are the `Recorder`'s).

Takes what it reports as arguments (`step_fields`, `summary`): the driver gathers them from its
ledger, trainer, monitor, executor and controller through their public interfaces, so this file
knows none of those.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from pivotrl.core.types import Role

if TYPE_CHECKING:
    from pivotrl.rl.rewards import RewardBreakdown
    from pivotrl.runtime.monitor import RoleState
    from pivotrl.runtime.outcomes import Death


@dataclass(frozen=True)
class RunFacts:
    """What the summary of a real run reports beyond this file's own counts."""

    shift_log: list[dict[str, Any]]
    """Every shift the executor carried out (`Executor.shift_log`)."""
    tau_shift: Mapping[Role, float]
    """The controller's shift-time estimate per role at the end."""
    samples_trained: int
    """Samples trained (`TrainedOnce.count`)."""
    samples_trained_unique: int
    """Distinct samples among them (`TrainedOnce.unique`: a repeat would be a bug)."""
    policy_version: int
    deaths: list[Death]
    """Every device death (each respawned the device once)."""
    lost_devices: list[int]
    """Devices that left the pool (crash loops)."""
    recoveries: list[dict[str, Any]]
    """Trainer rebuilds from a checkpoint."""
    wall_s: float


class RealStats:
    """Accumulated by the `DeviceDriver` as the run goes."""

    def __init__(self) -> None:
        self.counts = {"aborts": 0, "resumes": 0, "shifts": 0, "device_deaths": 0, "lost_devices": 0,
                       "stale_completions": 0,
                       "logprobs_missing": 0}
        self.held = {k: 0.0 for k in ("rollout", "reward", "train", "free")}
        self.train_busy_s = 0.0  # device-seconds of training steps
        # driver wall seconds carrying out dispatches (aborts and submits on the devices): nothing
        # is taken in meanwhile; the simulator, whose control plane takes no time, cannot see it
        self.dispatch_s = 0.0

    def hold(self, roles: Iterable[Role | None], seconds: float) -> None:
        """Each device held its role (None: free) for `seconds` more."""
        for r in roles:
            self.held[r.value if r is not None else "free"] += seconds

    def step_fields(self, rewards: list[RewardBreakdown], train_metrics: Mapping[str, float],
                    tau_shift: Mapping[Role, float], role_state: Mapping[Role, RoleState]) -> dict[str, Any]:
        """Row fields of one trained step: the rewards of its samples (in training order), the
        trainer's metrics of the step, the controller's shift-time estimates and each inference
        role's state now."""
        rw, tm = rewards, train_metrics
        n = max(1, len(rw))
        return {
            "reward_mean": sum(r.total for r in rw) / n, "train_accuracy": sum(r.verifiable for r in rw) / n,
            "genrm_score_mean": sum(r.genrm for r in rw) / n,
            "genrm_parse_failures": sum(1 for r in rw if not r.genrm_ok),
            "loss": tm.get("loss"), "grad_norm": tm.get("grad_norm"),
            "samples_rejected_stale": tm.get("samples_rejected_stale"),
            # PPO ratio vs the clip reference (the behaviour policy, or with decoupled PPO the
            # step's proximal policy); behaviour_is_*: how far off-policy the batch was (decoupled)
            "ratio_mean": tm.get("ratio_mean"), "clipfrac": tm.get("clipfrac"), "approx_kl": tm.get("approx_kl"),
            "behaviour_is_mean": tm.get("behaviour_is_mean"), "behaviour_is_truncated": tm.get("behaviour_is_truncated"),
            "behaviour_logprob_diff": tm.get("behaviour_logprob_diff"),
            "tau_shift": {r.value: v for r, v in tau_shift.items()},
            "role_state": {r.value: vars(s) for r, s in role_state.items()},
            "dispatch_s": self.dispatch_s, **self.counts,
        }

    def summary(self, facts: RunFacts) -> dict[str, Any]:
        c, f = self.counts, facts
        return {
            "ideal_efficiency": None,  # no per-device peak is measured on shared cores
            "num_shifts": c["shifts"], "shift_log": f.shift_log,
            "tau_shift": {r.value: v for r, v in f.tau_shift.items()},
            "train_busy_device_s": self.train_busy_s, "device_seconds_by_role": dict(self.held),
            "samples_trained": f.samples_trained, "samples_trained_unique": f.samples_trained_unique,
            "policy_version": f.policy_version, "device_deaths": c["device_deaths"],
            # every death respawns the device once; a crash-looping one then leaves the pool
            "respawns": len(f.deaths), "lost_devices": sorted(f.lost_devices),
            "training_recoveries": list(f.recoveries),
            "aborts": c["aborts"], "resumes": c["resumes"], "stale_completions_dropped": c["stale_completions"],
            "batches_without_behaviour_logprobs": c["logprobs_missing"], "wall_s": f.wall_s,
        }
