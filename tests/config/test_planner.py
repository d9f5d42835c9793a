"""`deploy.planner`: one schema per shift strategy, chosen by the nested group `deploy/planner`,
each with its own checks; the old flat keys fail naming the new ones (issue 9)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from pivotrl.config import compose_config
from pivotrl.config.base import ConfigError
from pivotrl.config.planner import (PLANNER_SCHEMAS, STRATEGIES, PivotPlannerConfig, PlannerConfig,
                                    RulePlannerConfig, VanillaPlannerConfig, planner_config)

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_each_strategy_has_its_yaml_and_composes_its_own_schema():
    options = sorted(p.stem for p in (CONF / "deploy" / "planner").glob("*.yaml"))
    assert options == sorted(PLANNER_SCHEMAS) == sorted(STRATEGIES)
    for name in options:
        planner = compose_config(["deploy=pivot", f"deploy/planner={name}"]).deploy.planner
        assert type(planner) is PLANNER_SCHEMAS[name] and planner.strategy == name
    assert type(compose_config([]).deploy.planner) is PivotPlannerConfig  # deploy=pivot's default


def test_a_strategys_own_settings_reach_its_schema_only():
    rule = compose_config(["deploy/planner=rule", "deploy.planner.up_kv=0.9", "deploy.planner.down_kv=0.2"])
    assert (rule.deploy.planner.up_kv, rule.deploy.planner.down_kv) == (0.9, 0.2)
    assert not hasattr(rule.deploy.planner, "horizon_s")  # the planner's H is pivot's and vanilla's
    van = compose_config(["deploy/planner=vanilla", "deploy.planner.horizon_s=30"]).deploy.planner
    assert type(van) is VanillaPlannerConfig and van.horizon_s == 30
    # another strategy's setting is not a key of this one: the error names whose it is
    with pytest.raises(ConfigError, match=r"^deploy\.planner\.up_kv='0\.9' is invalid; allowed: a key of "
                       r"deploy/planner=pivot \(.*\); up_kv is a setting of deploy/planner=rule"):
        compose_config(["deploy.planner.up_kv=0.9"])  # pivot: deploy=pivot's default strategy
    with pytest.raises(ConfigError, match=r"horizon_s is a setting of deploy/planner=pivot \| vanilla"):
        compose_config(["deploy/planner=static", "deploy.planner.horizon_s=30"])
    # where the strategy is not known before composing (an experiment overlay may choose it),
    # composition still refuses the key
    with pytest.raises(ConfigCompositionException, match="deploy.planner.up_kv"):
        compose_config(["experiment=quick", "deploy.planner.up_kv=0.9"])


@pytest.mark.parametrize("overrides, message", [
    (["deploy/planner=rule", "deploy.planner.up_kv=0.05"],
     "deploy.planner.down_kv=0.1 is invalid; allowed: in [0, up_kv=0.05)"),
    (["deploy/planner=rule", "deploy.planner.up_kv=1.5"], "deploy.planner.up_kv=1.5 is invalid; allowed: in (0, 1]"),
    (["deploy/planner=pivot", "deploy.planner.horizon_s=0"],
     "deploy.planner.horizon_s=0.0 is invalid; allowed: a finite"),
    (["deploy/planner=vanilla", "deploy.planner.evaluation=guess"], "deploy.planner.evaluation='guess' is invalid; "
     "allowed: migrate | summary"),
    (["deploy/planner=static", "deploy.planner.tick_s=0"], "deploy.planner.tick_s=0.0 is invalid; allowed: a finite"),
    (["deploy.planner.elastic_max_devices=0"], "deploy.planner.elastic_max_devices=0 is invalid; allowed: null or an "
     "int >= 1"),
    # the old flat keys: the new name and how to write it
    (["deploy.planner.strategy=rule"], "deploy.planner.strategy='rule' is invalid; allowed: the new key: "
     "deploy/planner=rule"),
    (["deploy.planner.rule_up_kv=0.9"], "deploy.planner.rule_up_kv='0.9' is invalid; allowed: the new key: "
     "deploy.planner.up_kv=0.9"),
    (["deploy.planner.rule_down_kv=0.2"], "deploy.planner.rule_down_kv='0.2' is invalid; allowed: the new key: "
     "deploy.planner.down_kv=0.2"),
])
def test_bad_values_and_old_keys_fail_naming_the_path(overrides, message):
    with pytest.raises(ConfigError) as ei:
        compose_config(overrides)
    assert str(ei.value).startswith(message), str(ei.value)


def test_elastic_training_is_the_pivot_planners_setting():
    """DESIGN §4.6: off by default (the paper's fixed home set); a setting of pivot and vanilla,
    an unknown key of the strategies that never price training candidates."""
    assert compose_config([]).deploy.planner.elastic_training is False
    on = compose_config(["deploy.planner.elastic_training=true", "deploy.planner.elastic_max_devices=3"])
    assert on.deploy.planner.elastic_training is True and on.deploy.planner.elastic_max_devices == 3
    with pytest.raises(ConfigError, match=r"elastic_training is a setting of deploy/planner=pivot \| vanilla"):
        compose_config(["deploy/planner=static", "deploy.planner.elastic_training=true"])


def test_a_schema_names_its_own_strategy_only():
    """`strategy` is set by the schema: a sweep or yaml writing another name into it (bypassing the
    command-line rename check) fails instead of running one strategy under another's settings."""
    with pytest.raises(ConfigError, match=r"^strategy='rule' is invalid; allowed: 'pivot', the strategy of "
                       r"PivotPlannerConfig.*deploy/planner=<strategy>"):
        PivotPlannerConfig(strategy="rule")
    with pytest.raises(ConfigError, match=r"^deploy\.planner\.strategy='bogus' is invalid; "
                       r"allowed: pivot \| rule \| static \| vanilla"):
        RulePlannerConfig(strategy="bogus")
    assert type(planner_config("rule", up_kv=0.7)) is RulePlannerConfig
    assert PlannerConfig().strategy == ""  # the modes without a planner: no strategy


def test_a_strategy_is_built_only_from_its_own_schema():
    from pivotrl.core.strategies import RuleStrategy, make_strategy

    assert isinstance(make_strategy(planner_config("rule")), RuleStrategy)
    for wrong in (PlannerConfig(strategy="rule"), PivotPlannerConfig()):
        wrong.strategy = "rule"  # a schema of another strategy (or the bare base) relabelled
        with pytest.raises(ConfigError, match=r"^deploy\.planner=.* is invalid; allowed: a RulePlannerConfig"):
            make_strategy(wrong)
    with pytest.raises(ConfigError, match=r"^deploy\.planner\.strategy='' is invalid"):
        make_strategy(PlannerConfig())
