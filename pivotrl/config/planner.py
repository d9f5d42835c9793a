"""Schema of the planner and shift strategy (nested under `deploy.planner`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from pivotrl.registry import Registry

#: `deploy.planner.strategy` -> the strategy class (pure control plane, imported on first use).
STRATEGIES: Registry[type] = Registry("deploy.planner.strategy", {
    "pivot": "pivotrl.core.strategies:PivotStrategy",
    "static": "pivotrl.core.strategies:StaticStrategy",
    "rule": "pivotrl.core.strategies:RuleStrategy",
    "vanilla": "pivotrl.core.strategies:VanillaStrategy",
})
#: `deploy.planner.evaluation` -> how the planner evaluates a candidate (pivotrl/core/whatif.py).
EVALUATIONS: Registry[type] = Registry("deploy.planner.evaluation", {
    "migrate": "pivotrl.core.whatif:MigrateWhatIf",
    "summary": "pivotrl.core.whatif:SummaryWhatIf",
})


@dataclass
class PlannerConfig:
    """How and when the pivot deployment shifts devices (DESIGN §4.3)."""

    strategy: str = "pivot"
    """Shift strategy by registry name: pivot | static | rule | vanilla."""
    migration: bool = True
    """Shift-time sequence migration (off = the 'pivot without migration' ablation)."""
    horizon_s: float = 60.0
    """H: seconds a throughput gain is expected to last; benefit = H*(T_cand - T_now) - phi."""
    tick_s: float = 5.0
    """Monitor tick interval in seconds; the planner also runs on batch-ready and training-done."""
    rule_up_kv: float = 0.8
    """`rule` strategy: shift a role up when its KV utilisation is above this."""
    rule_down_kv: float = 0.1
    """`rule` strategy: shift a role down when its KV utilisation is below this."""
    evaluation: str = "summary"
    """How the planner evaluates a candidate's post-shift throughput (pivotrl/core/whatif.py):
    `migrate` runs the real scheduler migration on clones (exact, slow at scale); `summary` is
    its closed-form counterpart on a per-role summary (fast; error bounded in tests/core)."""

    rebalance: bool = True
    """Rebalance on monitor ticks (beyond the paper, which migrates only at shift up): when a role's
    queue is empty and its replicas are unevenly loaded, move sequences (abort + dispatch, Alg. 4's
    improvement loop) if that raises the role's modelled throughput by `rebalance_min_gain`. Only
    with `migration` on (so `vanilla` and "pivot w/o migration" never rebalance); `false` is the
    paper's behaviour."""
    rebalance_min_gain: float = 0.05
    """Relative throughput gain a tick rebalance must reach to be carried out (each moved sequence
    pays an abort and a re-prefill)."""

    def __post_init__(self) -> None:
        for f in fields(self):  # non-finite numbers (inf, nan) are refused everywhere
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"deploy.planner.{f.name} must be a finite number, got {v}")
        if isinstance(self.rebalance_min_gain, (int, float)) and self.rebalance_min_gain < 0:
            raise ValueError(f"deploy.planner.rebalance_min_gain must be >= 0, got {self.rebalance_min_gain}")
        STRATEGIES.check(self.strategy)
        if isinstance(self.horizon_s, (int, float)) and not self.horizon_s > 0:
            raise ValueError(f"deploy.planner.horizon_s (H) must be > 0 seconds, got {self.horizon_s}")
        if isinstance(self.tick_s, (int, float)) and not self.tick_s > 0:
            raise ValueError(f"deploy.planner.tick_s must be > 0 seconds, got {self.tick_s}")
        EVALUATIONS.check(self.evaluation)
        if (isinstance(self.rule_up_kv, (int, float)) and isinstance(self.rule_down_kv, (int, float))
                and not 0.0 <= self.rule_down_kv < self.rule_up_kv <= 1.0):
            raise ValueError(f"deploy.planner.rule_down_kv ({self.rule_down_kv}) and rule_up_kv "
                             f"({self.rule_up_kv}) must satisfy 0 <= down < up <= 1")
