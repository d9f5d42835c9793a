"""`pivotrl.registry.Registry`: one lookup rule for every name a config may choose, and every
registry of the project is one."""
from __future__ import annotations

import pytest

from pivotrl.config import ConfigError
from pivotrl.registry import Registry


def test_lookup_register_and_errors_name_the_config_key():
    reg: Registry = Registry("deploy.planner.strategy", {"pivot": 1}, aliases=("auto",))
    reg.register("rule", 2)

    @reg.register("static")
    def static():
        return 3

    assert reg["rule"] == 2 and reg["static"] is static and sorted(reg) == ["pivot", "rule", "static"]
    assert "pivot" in reg and "auto" not in reg and reg.names() == ["auto", "pivot", "rule", "static"]
    reg.check("auto")  # an alias is a name the config may give
    with pytest.raises(ConfigError) as e:
        reg["nope"]
    assert e.value.path == "deploy.planner" and e.value.field == "strategy"
    assert "deploy.planner.strategy='nope' is invalid; allowed: auto | pivot | rule | static" == str(e.value)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("rule", 4)


def test_lazy_entries_import_on_first_use():
    reg: Registry = Registry("x.y", {"join": "os.path:join"})
    assert reg["join"]("a", "b") == "a/b"
    assert reg.build("join", "c", "d") == "c/d"


def test_every_project_registry_is_a_registry():
    from pivotrl.config.deploy import DEPLOY_SCHEMAS
    from pivotrl.config.engine import ENGINES
    from pivotrl.config.gps import TRANSPORTS
    from pivotrl.config.planner import EVALUATIONS, PLANNER_SCHEMAS, STRATEGIES
    from pivotrl.deploy import CONTROLLERS
    from pivotrl.rl.advantages import ADVANTAGE_ESTIMATORS
    from pivotrl.rl.genrm import JUDGE_TEMPLATES, SCORE_PARSERS
    from pivotrl.rl.losses import POLICY_LOSSES
    from pivotrl.run import PREFLIGHT, RUNTIMES

    regs = (DEPLOY_SCHEMAS, CONTROLLERS, ADVANTAGE_ESTIMATORS, POLICY_LOSSES, RUNTIMES, PREFLIGHT, ENGINES,
            TRANSPORTS, STRATEGIES, PLANNER_SCHEMAS, EVALUATIONS, JUDGE_TEMPLATES, SCORE_PARSERS)
    for reg in regs:
        assert isinstance(reg, Registry), reg
        for name in reg:  # every lazy entry resolves (contract: the config string reaches a real object)
            assert reg[name] is not None, (reg.config_key, name)
    assert sorted(CONTROLLERS) == sorted(DEPLOY_SCHEMAS)  # one mode, one schema, one controller
    assert sorted(STRATEGIES) == sorted(PLANNER_SCHEMAS)  # one strategy, one schema
    from pivotrl.config import ClusterKind

    assert sorted(RUNTIMES) == sorted(k.value for k in ClusterKind)
