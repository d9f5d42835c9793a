"""Schemas of the planner (`deploy.planner`, deploy=pivot): one dataclass per shift strategy, each
with its own checks.

`PlannerConfig` holds what the pivot controller reads whatever the strategy (monitor tick,
migration, tick rebalance); each strategy's subclass adds its own settings. `conf/deploy/planner/
<strategy>.yaml` selects its strategy's schema (`PLANNER_SCHEMAS`, the config string is the key):
`deploy/planner=rule` composes a `RulePlannerConfig`, and `deploy=pivot` selects `pivot`. A
setting of another strategy (e.g. `deploy.planner.up_kv` under `deploy/planner=pivot`) is then
an unknown key, refused at start. `strategy` is set by the schema (as `deploy.mode` is by the
deploy option) and checked against it. Non-finite numbers are the loader's one check
(`pivotrl.config.loader`); the checks here are ranges, through `pivotrl.config.base.finite`.
"""
from __future__ import annotations

from dataclasses import dataclass

from pivotrl.config.base import check, finite
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
    """What the pivot controller reads whatever the strategy (DESIGN §4.3). The base alone names
    no strategy: it is the planner settings of the modes without one (colocated, disaggregated,
    rr_colocated), and building a strategy from it fails (`pivotrl.core.strategies.make_strategy`)."""

    strategy: str = ""
    """Shift strategy, by registry name: pivot | static | rule | vanilla. Set by the schema that
    `deploy/planner=<strategy>` selects; not a setting of its own."""
    migration: bool = True
    """Shift-time sequence migration (off = the 'pivot without migration' ablation; vanilla never
    migrates, whatever this says)."""
    tick_s: float = 5.0
    """Monitor tick interval in seconds; the planner also runs on batch-ready and training-done."""
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
        check(finite(self.tick_s) and self.tick_s > 0, "tick_s", "a finite number of seconds > 0", self.tick_s)
        check(finite(self.rebalance_min_gain) and self.rebalance_min_gain >= 0, "rebalance_min_gain", ">= 0",
              self.rebalance_min_gain)
        if type(self) is not PlannerConfig:  # a strategy's schema: its name is its registry key
            STRATEGIES.check(self.strategy)
            own = next((k for k, v in PLANNER_SCHEMAS.items() if v is type(self)), None)
            check(self.strategy == own, "strategy", f"{own!r}, the strategy of {type(self).__name__}: another "
                  f"strategy is another schema, chosen with deploy/planner=<strategy>", self.strategy)


@dataclass
class PivotPlannerConfig(PlannerConfig):
    """`deploy/planner=pivot`: the five-step planner (pivotrl/core/planner.py), benefit
    `H * (T_cand - T_now) - phi` over the fitted throughput model."""

    strategy: str = "pivot"
    horizon_s: float = 60.0
    """H: seconds a throughput gain is expected to last; benefit = H*(T_cand - T_now) - phi."""
    evaluation: str = "summary"
    """How the planner evaluates a candidate's post-shift throughput (pivotrl/core/whatif.py):
    `migrate` runs the real scheduler migration on clones (exact, slow at scale); `summary` is
    its closed-form counterpart on a per-role summary (fast; error bounded in tests/core)."""
    elastic_training: bool = False
    """Elastic training (DESIGN §4.6, beyond the paper): when a batch is ready the planner may
    train on the home set plus borrowed devices (whole replicas next to it) and give them back
    after the step, if that ends the step and the released inference work sooner
    (pivotrl/core/elastic.py). The trainer's state is kept in host memory between steps and
    resharded there (pivotrl/trainer/state_store.py). Costs: a host-memory copy of the state
    (fp32 weights + AdamW moments, 12 bytes per parameter) written after every step, and a
    rebuild of the trainer on each size change. false: the paper's fixed home set."""
    elastic_max_devices: int | None = None
    """The most devices a grown trainer may hold (null: every device of the cluster)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(finite(self.horizon_s) and self.horizon_s > 0, "horizon_s", "a finite number of seconds > 0 (H)",
              self.horizon_s)
        EVALUATIONS.check(self.evaluation)
        check(self.elastic_max_devices is None or (isinstance(self.elastic_max_devices, int)
                                                   and self.elastic_max_devices >= 1),
              "elastic_max_devices", "null or an int >= 1 (devices)", self.elastic_max_devices)


@dataclass
class VanillaPlannerConfig(PivotPlannerConfig):
    """`deploy/planner=vanilla`: the pivot planner with a 0/1 throughput model (a replica with any
    running sequence counts 1, an idle one 0) and no migration (paper Fig. 11's "Vanilla")."""

    strategy: str = "vanilla"


@dataclass
class StaticPlannerConfig(PlannerConfig):
    """`deploy/planner=static`: only the devices idle training frees move, split evenly between
    rollout and reward. No settings of its own."""

    strategy: str = "static"


@dataclass
class RulePlannerConfig(PlannerConfig):
    """`deploy/planner=rule`: KV-utilisation thresholds (pivotrl/core/strategies.py)."""

    strategy: str = "rule"
    up_kv: float = 0.8
    """Shift a role up when its KV utilisation is above this."""
    down_kv: float = 0.1
    """Take devices from the other role only while its KV utilisation is below this."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(finite(self.up_kv) and 0.0 < self.up_kv <= 1.0, "up_kv", "in (0, 1]", self.up_kv)
        check(finite(self.down_kv) and 0.0 <= self.down_kv < self.up_kv, "down_kv",
              f"in [0, up_kv={self.up_kv})", self.down_kv)


#: strategy -> its schema (the config string is the key; `conf/deploy/planner/<strategy>.yaml`
#: selects it). The same names as `STRATEGIES` (tests/test_registry.py).
PLANNER_SCHEMAS: Registry[type[PlannerConfig]] = Registry("deploy.planner.strategy", {
    "pivot": PivotPlannerConfig,
    "static": StaticPlannerConfig,
    "rule": RulePlannerConfig,
    "vanilla": VanillaPlannerConfig,
})


def planner_config(strategy: str = "pivot", **settings) -> PlannerConfig:
    """The schema of `strategy` with `settings` (library and test use; Hydra composes the same)."""
    return PLANNER_SCHEMAS[strategy](**settings)
