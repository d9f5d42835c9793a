"""`RealStats`: a real run's row and summary fields from what the driver hands it (no driver needed)."""
from pivotrl.core.types import Role
from pivotrl.rl.rewards import RewardBreakdown
from pivotrl.runtime.monitor import RoleState
from pivotrl.runtime.outcomes import Death
from pivotrl.runtime.stats import RealStats, RunFacts


def test_step_fields_average_the_rewards_and_carry_the_trainer_metrics():
    st = RealStats()
    st.counts["aborts"] = 3
    st.dispatch_s = 1.5
    rewards = [RewardBreakdown(1.0, 1.0, 0.5), RewardBreakdown(0.0, 0.0, 0.25, genrm_ok=False)]
    row = st.step_fields(rewards=rewards, train_metrics={"loss": 0.7, "grad_norm": 2.0},
                         tau_shift={Role.ROLLOUT: 4.0, Role.TRAIN: 9.0},
                         role_state={Role.ROLLOUT: RoleState("rollout", replicas=2, running=5),
                                     Role.REWARD: RoleState("reward")})
    assert row["reward_mean"] == 0.5 and row["train_accuracy"] == 0.5 and row["genrm_score_mean"] == 0.375
    assert row["genrm_parse_failures"] == 1
    assert row["loss"] == 0.7 and row["grad_norm"] == 2.0 and row["clipfrac"] is None
    assert row["tau_shift"] == {"rollout": 4.0, "train": 9.0}
    assert list(row["role_state"]) == ["rollout", "reward"] and row["role_state"]["rollout"]["running"] == 5
    assert row["aborts"] == 3 and row["dispatch_s"] == 1.5


def test_a_step_without_rewards_reports_zeros_not_a_division_error():
    row = RealStats().step_fields(rewards=[], train_metrics={}, tau_shift={}, role_state={})
    assert row["reward_mean"] == 0.0 and row["genrm_parse_failures"] == 0 and row["loss"] is None


def test_summary_reports_the_run_facts_with_its_own_counts():
    st = RealStats()
    st.counts.update(shifts=4, device_deaths=2, logprobs_missing=1)
    st.hold([Role.ROLLOUT, None], 2.0)
    st.train_busy_s = 6.0
    death = Death(device=1, role=Role.REWARD, slot=None, why="test", generation=1)
    s = st.summary(RunFacts(shift_log=[{"plan": 1}], tau_shift={Role.REWARD: 3.0}, samples_trained=3,
                            samples_trained_unique=2,
                            policy_version=2, deaths=[death, death], lost_devices=[3, 1],
                            recoveries=[{"version": 1}], wall_s=12.5))
    assert s["num_shifts"] == 4 and s["shift_log"] == [{"plan": 1}] and s["tau_shift"] == {"reward": 3.0}
    assert s["samples_trained"] == 3 and s["samples_trained_unique"] == 2 and s["policy_version"] == 2
    assert s["respawns"] == 2 and s["device_deaths"] == 2 and s["lost_devices"] == [1, 3]
    assert s["device_seconds_by_role"] == {"rollout": 2.0, "reward": 0.0, "train": 0.0, "free": 2.0}
    assert s["train_busy_device_s"] == 6.0 and s["batches_without_behaviour_logprobs"] == 1 and s["wall_s"] == 12.5
