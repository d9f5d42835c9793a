"""Throughput samples of a simulated run (`models.sim.throughput_sample_s`, every mode, paper Fig. 10).

Owns the read-only `throughput` timeline record the simulator writes every `sample_s` simulated
seconds; the controller never sees it. Each record has two views:
- `rollout`, `reward`, `overall`: what the planner sees: the schedulers' modelled throughput
  (`sum_i N_i / tau_i` over the scheduler's replica states) and paper Eq. 1 over them with
  `n_rollout`/`n_reward` = running + queued sequences. The static modes get no progress reports, so
  their schedulers' K lags the engines by the tokens generated since each dispatch (T is a little
  optimistic there).
- `actual`: tokens the simulated engines really emitted per role in the last interval / interval
  (ground truth, retired replicas included), and `actual_total` their sum.
Advancing a replica in pieces is exact (`SimReplica`), so sampling never changes the run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pivotrl.core.planner import eq1_throughput
from pivotrl.core.types import INFERENCE_ROLES, Role
from pivotrl.sim.engine import SimReplica
from pivotrl.sim.metrics import RunStats

if TYPE_CHECKING:
    from pivotrl.deploy.base import Controller


class ThroughputSampler:
    """Builds one `throughput` record per call from the controller's schedulers and the engines."""

    def __init__(self, sample_s: float) -> None:
        self.sample_s = float(sample_s or 0.0)
        self.started = False
        self._last: tuple[float, dict[Role, float]] = (0.0, {r: 0.0 for r in INFERENCE_ROLES})

    @staticmethod
    def role_tokens(now: float, replicas: Mapping[str, SimReplica], role_of: Mapping[str, Role],
                    stats: RunStats) -> dict[Role, float]:
        """Tokens emitted so far per role (retired replicas included), replicas advanced to `now`."""
        out = {r: stats.retired[r][2] for r in INFERENCE_ROLES}
        for rid, rep in replicas.items():
            rep.advance(now)
            out[role_of[rid]] += rep.tokens
        return out

    def sample(self, now: float, ctrl: Controller, replicas: Mapping[str, SimReplica], role_of: Mapping[str, Role],
               stats: RunStats) -> dict[str, Any]:
        """The record at `now` (appended to `stats.samples`; the caller logs it)."""
        sch = ctrl.sched
        n = {r: float(sch[r].num_sequences()) for r in INFERENCE_ROLES}
        T = {r: float(sch[r].throughput()) for r in INFERENCE_ROLES}
        tokens = self.role_tokens(now, replicas, role_of, stats)
        t0, tok0 = self._last
        dt = now - t0
        actual = {r.value: ((tokens[r] - tok0[r]) / dt if dt > 0 else 0.0) for r in INFERENCE_ROLES}
        self._last = (now, tokens)
        rec = {"now": now, "step": ctrl.step,
               "rollout": T[Role.ROLLOUT], "reward": T[Role.REWARD],
               "overall": eq1_throughput(n[Role.ROLLOUT], T[Role.ROLLOUT], n[Role.REWARD], T[Role.REWARD]),
               "n_rollout": n[Role.ROLLOUT], "n_reward": n[Role.REWARD],
               "actual": actual, "actual_total": sum(actual.values()),
               "allocation": ctrl.allocation(), "training": bool(ctrl.training)}
        stats.samples.append(rec)
        return rec
