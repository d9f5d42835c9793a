"""Strategy registry and the ablation strategies' behaviour (static, rule, vanilla, pivot w/o migration)."""
import pytest

from pivotrl.config.planner import PlannerConfig, planner_config
from pivotrl.core.planner import PivotPlanner
from pivotrl.core.strategies import STRATEGIES, make_strategy
from pivotrl.core.types import Role, Slot

from .test_planner import view


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_registered_strategy_decides(name):
    s = make_strategy(planner_config(name))
    assert isinstance(s.migration, bool)
    for v in (view(num=16, ro=range(8), rm=[8], n_ro=30, n_rm=300, home=(12, 13, 14, 15), train="idle"),
              view(num=16, ro=range(8), n_ro=30, home=(12, 13, 14, 15), train="ready"),
              view(num=16)):
        d = s.decide(v)
        d.to_record()
        for p in d.plans:
            assert all(x.role == p.role_up for x in p.up)  # one role per plan


def test_unknown_strategy_names_allowed_values():
    with pytest.raises(ValueError, match=r"deploy.planner.strategy=.greedy. is invalid; allowed: pivot \| rule \| static \| vanilla"):
        make_strategy(PlannerConfig(strategy="greedy"))


def test_all_strategies_pull_training_up_when_ready():
    v = view(num=16, ro=range(16), n_ro=40, home=(8, 9, 10, 11, 12, 13, 14, 15), train="ready")
    for name in STRATEGIES:
        d = make_strategy(planner_config(name)).decide(v)
        assert d.chosen is not None and d.chosen.up == [Slot(Role.TRAIN, 8, 8)], name


def test_static_only_moves_idle_training_devices():
    st = make_strategy(planner_config("static"))
    home = tuple(range(8, 16))
    v = view(num=16, ro=range(4), rm=[4], n_ro=40, n_rm=400, home=home, train="idle")
    d = st.decide(v)
    assert d.chosen.up == [] and d.chosen.down == [Slot(Role.TRAIN, 8, 8)]
    v = view(num=16, ro=range(4), rm=[4], n_ro=40, n_rm=400, home=home, train="none")  # home now free
    d = st.decide(v)
    assert [(p.role_up, [s.first_device for s in p.up], p.down) for p in d.plans] == [
        (Role.ROLLOUT, [8, 9, 10, 11], []), (Role.REWARD, [12], [])]
    # training busy: nothing moves, whatever the demand
    v = view(num=16, ro=range(4), n_ro=40, n_rm=400, home=home, train="running")
    assert st.decide(v).chosen is None


def test_rule_uses_kv_thresholds():
    rule = make_strategy(planner_config("rule"))
    # reward KV full (queue beyond capacity), rollout nearly empty: reward takes rollout's devices
    v = view(num=16, ro=range(8), rm=[8], n_ro=1, n_rm=2000)
    d = rule.decide(v)
    assert d.role_up == Role.REWARD
    # rollout keeps the one replica its sequence runs on (rollout@0); its idle replicas 4..7 go
    assert {s.first_device for s in d.chosen.up} == {4, 12}
    assert [s.first_device for s in d.chosen.down] == [4, 5, 6, 7]
    assert v.schedulers[Role.ROLLOUT].where(0) == "rollout@0x1"
    # rollout busy (above rule_down_kv): its devices stay; only free ones move
    v = view(num=16, ro=range(8), rm=[8], n_ro=1000, n_rm=2000)
    d = rule.decide(v)
    assert d.role_up == Role.REWARD and [s.first_device for s in d.chosen.up] == [12] and d.chosen.down == []
    # nobody above rule_up_kv: no shift
    assert rule.decide(view(num=16, ro=range(8), rm=[8], n_ro=10, n_rm=10)).chosen is None


def test_vanilla_is_zero_one_without_migration():
    van = make_strategy(planner_config("vanilla", migration=True))
    assert isinstance(van, PivotPlanner) and van.zero_one and van.migration is False
    v = view(num=16, ro=range(8), rm=[8], n_ro=8, n_rm=400)
    d = van.decide(v)
    assert d.t_now <= 16  # throughputs are replica counts
    piv = make_strategy(planner_config("pivot", migration=False))
    assert piv.migration is False and not piv.zero_one


def test_rule_does_not_ping_pong():
    """Each role alone on the cluster with a trickle of work: the cold one keeps a replica, so the
    other never finds it replica-less ("full") on the next tick."""
    rule = make_strategy(planner_config("rule"))
    v = view(num=16, ro=range(16), n_ro=3, n_rm=5)  # reward has work and no replica: infinitely hot
    d = rule.decide(v)
    assert d.role_up == Role.REWARD and d.chosen is not None
    lost = {s.slot_id for s in d.chosen.down}
    kept = [s for s in v.active[Role.ROLLOUT] if s.slot_id not in lost]
    assert kept and all(v.schedulers[Role.ROLLOUT].where(i) in {s.slot_id for s in kept} for i in range(3))


def test_static_initial_plans_split_non_home_devices():
    st = make_strategy(planner_config("static"))
    plans = st.initial_plans(32, {Role.ROLLOUT: 1, Role.REWARD: 4}, tuple(range(24, 32)))
    assert [(p.role_up, len(p.up), sum(s.tp for s in p.up)) for p in plans] == [
        (Role.ROLLOUT, 12, 12), (Role.REWARD, 3, 12)]
    assert all(s.first_device < 24 for p in plans for s in p.up)
