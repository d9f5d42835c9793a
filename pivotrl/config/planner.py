"""Schema of the planner and shift strategy (nested under `deploy.planner`)."""
from __future__ import annotations

from dataclasses import dataclass

from pivotrl.config.base import ConfigError


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

    def __post_init__(self) -> None:
        if isinstance(self.strategy, str):
            from pivotrl.core.strategies import STRATEGIES  # core's registry (pure; no cycle at call time)

            if self.strategy not in STRATEGIES:
                raise ConfigError("strategy", f"one of {', '.join(sorted(STRATEGIES))} (core/strategies.py)",
                                  self.strategy)
        if isinstance(self.horizon_s, (int, float)) and not self.horizon_s > 0:
            raise ValueError(f"deploy.planner.horizon_s (H) must be > 0 seconds, got {self.horizon_s}")
        if isinstance(self.tick_s, (int, float)) and not self.tick_s > 0:
            raise ValueError(f"deploy.planner.tick_s must be > 0 seconds, got {self.tick_s}")
        if isinstance(self.evaluation, str) and self.evaluation not in ("migrate", "summary"):
            raise ValueError(f"deploy.planner.evaluation={self.evaluation!r}: allowed values are "
                             f"'migrate', 'summary'")
        if (isinstance(self.rule_up_kv, (int, float)) and isinstance(self.rule_down_kv, (int, float))
                and not 0.0 <= self.rule_down_kv < self.rule_up_kv <= 1.0):
            raise ValueError(f"deploy.planner.rule_down_kv ({self.rule_down_kv}) and rule_up_kv "
                             f"({self.rule_up_kv}) must satisfy 0 <= down < up <= 1")
