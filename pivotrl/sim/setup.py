"""`SimSetup`: what one simulated run resolves from its config before it starts: the replicas'
cost models per role, the seeded workload, the run length and the starting allocation, and the
controller's construction values (`control_env`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from pivotrl.config import PivotConfig
from pivotrl.config.resolve import resolve
from pivotrl.core.types import INFERENCE_ROLES, Role
from pivotrl.deploy import ControlEnv
from pivotrl.sim import timemodel as tm
from pivotrl.sim.workload import Workload


@dataclass
class SimSetup:
    """Everything resolved from the config for one simulated run."""

    cfg: PivotConfig
    costs: dict[Role, tm.RoleCosts]
    workload: Workload
    steps: int
    warmup: int
    allocation: dict[Role, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: PivotConfig, allocation: dict[Role, int] | None = None,
                    steps: int | None = None) -> "SimSetup":
        m, hw, sim = cfg.models, cfg.cluster.hardware, cfg.models.sim
        r = resolve(cfg)
        costs = {role: tm.role_costs(m, hw, role) for role in INFERENCE_ROLES}
        wl = Workload(m.workload, cfg.seed, r.prompts_per_step, r.group_size, sim.step_offset)
        st = steps if steps is not None else r.steps
        warm = min(cfg.train.warmup_steps, st - 1)
        return cls(cfg, costs, wl, st, warm, dict(allocation or {}))

    @property
    def num_devices(self) -> int:
        return resolve(self.cfg).num_devices

    def control_env(self) -> ControlEnv:
        cfg, m = self.cfg, self.cfg.models
        tau = {r: c.shift_up_s + c.shift_down_s for r, c in self.costs.items()}
        tau[Role.TRAIN] = m.policy.train_shift_up_s + m.policy.train_shift_down_s
        res = resolve(cfg)
        node, hw = cfg.cluster.node_size, cfg.cluster.hardware
        # the simulator's own training clock, never refitted (as its decode models are not), and
        # the reshard of a trainer twice its home size as the prior the measured ones replace
        train = tm.training_model(m.policy, hw, m.sim, node, cfg.algo.ppo_mini_batches * cfg.algo.ppo_epochs)
        home = self.allocation.get(Role.TRAIN) or res.allocation.get("train") or 1
        return ControlEnv(
            num_devices=self.num_devices, node_size=cfg.cluster.node_size,
            tp={r: c.tp for r, c in self.costs.items()},
            models={r: c.model for r, c in self.costs.items()},
            tau_shift=tau, prompts=self.workload,
            prompts_per_step=self.workload.P, group_size=self.workload.G, steps=self.steps,
            staleness=res.staleness, allocation=self.allocation, planner=res.planner,
            kv_reserve=m.sim.kv_reserve_tokens,
            kv_capacity={r: c.kv_capacity for r, c in self.costs.items()},
            max_num_seqs={r: c.max_num_seqs for r, c in self.costs.items()},
            batch_barrier=bool(m.sim.rollout_batch_barrier),
            reward_batch_barrier=bool(m.sim.reward_batch_barrier) and res.mode == "disaggregated",
            train_model=train, train_model_fixed=True,
            reshard_s=tm.reshard_time(m.policy, hw, 2 * home, node))
