"""A real run's own figures: event counts, device-seconds per role, the training busy time, the
driver's dispatch time, and the fields they give each metrics row and the summary (the common
ones are the `Recorder`'s)."""
from __future__ import annotations

from typing import Any, Iterable

from pivotrl.core.types import INFERENCE_ROLES, Role


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

    def step_fields(self, act: Any, drv: Any) -> dict[str, Any]:
        """Row fields of the step that trained `act.batch`; also its `sample_lengths` record (read by
        `pivotrl.report.records.RunRecords`): `[sample_id, prompt_tokens, response_tokens,
        genrm_tokens]`, one row per trained sample in id order."""
        led, s = drv.ledger, drv.s
        ids = [x for x in drv.training.trained_ids if s.batch_of(x) == act.batch]
        drv.record_event("sample_lengths", batch=int(act.batch), samples=[
            [int(sid), s.prompt_len(sid), len(led.responses.get(sid, ())), led.length(Role.REWARD, sid)]
            for sid in sorted(ids)])
        rw = [led.rewards[x] for x in ids if x in led.rewards]
        tm = drv.training.metrics.get(act.batch, {})
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
            "tau_shift": {r.value: v for r, v in drv.ctrl.tau_shift.items()},
            "role_state": {r.value: vars(drv.monitor.state(r, drv.ctrl.sched[r])) for r in INFERENCE_ROLES},
            "dispatch_s": self.dispatch_s, **self.counts,
        }

    def summary(self, drv: Any) -> dict[str, Any]:
        c = self.counts
        return {
            "ideal_efficiency": None,  # no per-device peak is measured on shared cores
            "num_shifts": c["shifts"], "shift_log": drv.ex.shift_log,
            "tau_shift": {r.value: v for r, v in drv.ctrl.tau_shift.items()},
            "train_busy_device_s": self.train_busy_s, "device_seconds_by_role": dict(self.held),
            "samples_trained": len(drv.training.trained_ids), "samples_trained_unique": len(set(drv.training.trained_ids)),
            "policy_version": drv.ctrl.pipe.version, "device_deaths": c["device_deaths"],
            # every death respawns the device once; a crash-looping one then leaves the pool
            "respawns": len(drv.ex.deaths), "lost_devices": sorted(drv.ex.retired),
            "training_recoveries": list(drv.ex.recoveries),
            "aborts": c["aborts"], "resumes": c["resumes"], "stale_completions_dropped": c["stale_completions"],
            "batches_without_behaviour_logprobs": c["logprobs_missing"], "wall_s": drv.now,
        }
