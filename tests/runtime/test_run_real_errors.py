"""`run_real` keeps the run's first error when tearing the devices down fails too (issue 12)."""
from __future__ import annotations

import logging

import pytest

from tests.e2e.conftest import make_local_cfg


class FailingLaunch:
    closed = 0

    def __init__(self, *a, **k):
        pass

    def start(self):
        raise RuntimeError("device 2 (a training rank) died")

    def close(self):
        FailingLaunch.closed += 1
        raise PermissionError("cannot remove the run folder's .pg_init file")


def test_start_error_is_raised_and_the_teardown_error_logged(monkeypatch, tiny_assets, tmp_path, caplog):
    import pivotrl.runtime.launch as launch
    from pivotrl.runtime.real import run_real

    monkeypatch.setattr(launch, "Launch", FailingLaunch)
    cfg = make_local_cfg(tiny_assets, "pivot")
    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError, match="training rank") as ei:
        run_real(cfg, tmp_path, None)
    assert FailingLaunch.closed == 1
    assert ei.value.__notes__ == ["teardown: shutting down the devices and Ray also failed: PermissionError: "
                                  "cannot remove the run folder's .pg_init file"]
    assert "shutting down the devices and Ray failed after an earlier error" in caplog.text


#: The tiny judge template's tokens in the tiny GenRM's (character-level) tokenizer, rendered by its
#: chat template: '<|user|>' 'Q: \nA: \nCheck A.' (16 characters) '<|eos|>' '<|assistant|>'.
TINY_JUDGE_ROOM = 3 + 16


@pytest.mark.parametrize("kv, role", [(1, "rollout"), (139, "rollout"), (140, "reward"),
                                      (140 + TINY_JUDGE_ROOM + 32 - 1, "reward")])
def test_kv_capacity_below_one_request_is_refused_before_ray(kv, role, tiny_assets, tmp_path):
    """A KV budget below one prompt plus its response cap (rollout: 128 + 12) or below one judge
    request (140 + the judge template's 19 measured tokens + models.genrm.judge.max_tokens=32 =
    191) would queue that sequence forever."""
    import ray

    from pivotrl.config.base import ConfigError
    from pivotrl.runtime.real import run_real

    cfg = make_local_cfg(tiny_assets, "pivot", [f"engine.kv_capacity_tokens={kv}"])
    with pytest.raises(ConfigError) as ei:
        run_real(cfg, tmp_path, None)
    msg = str(ei.value)
    assert msg.startswith(f"engine.kv_capacity_tokens={kv} is invalid; allowed: >= {140 + TINY_JUDGE_ROOM + 32}")
    assert f"one {role} request needs" in msg
    assert ("= 140 tokens" if role == "rollout" else f"{TINY_JUDGE_ROOM} tokens of the judge template 'tiny'") in msg
    assert not ray.is_initialized()


def test_kv_capacity_of_exactly_one_judge_request_passes_the_check():
    from pivotrl.runtime.real import check_kv_capacity

    cfg = make_local_cfg({k: k for k in ("policy", "genrm", "train", "val")}, "pivot",
                         [f"engine.kv_capacity_tokens={140 + TINY_JUDGE_ROOM + 32}"])
    check_kv_capacity(cfg, TINY_JUDGE_ROOM)


@pytest.mark.parametrize("overrides", [
    ["models.genrm.chat.system_prompt=" + "Grade strictly. " * 20],  # a long system prompt: 320 characters
    ["models.genrm.judge.template=score_out_of_10", "models.genrm.judge.parser=score_out_of_10"],  # a rubric
])
def test_a_long_judge_template_is_caught_before_ray(overrides, tiny_assets, tmp_path):
    """Issue 9: the judge's room was a guessed 64 tokens, so a budget of 140 + 64 + 32 = 236 passed
    whatever the template; a rubric or a long system prompt is hundreds of tokens. The room is now
    measured with the GenRM's tokenizer at start."""
    import ray

    from pivotrl.config.base import ConfigError
    from pivotrl.runtime.real import run_real

    cfg = make_local_cfg(tiny_assets, "pivot", ["engine.kv_capacity_tokens=236", *overrides])
    with pytest.raises(ConfigError) as ei:
        run_real(cfg, tmp_path, None)
    msg = str(ei.value)
    need = int(msg.split("allowed: >= ")[1].split(":")[0])
    assert need > 140 + 300 + 32 and "one reward request needs" in msg and not ray.is_initialized()


def test_a_replica_of_several_devices_needs_the_vllm_engine(tmp_path):
    import ray

    from pivotrl.config.base import ConfigError
    from pivotrl.runtime.real import run_real

    fake = {k: tmp_path / k for k in ("policy", "genrm", "train", "val")}
    cfg = make_local_cfg(fake, "disaggregated", ["models.genrm.tp=2", "engine=cpu"])
    with pytest.raises(ConfigError) as ei:
        run_real(cfg, tmp_path, None)
    assert str(ei.value).startswith("models.genrm.tp=2 is invalid; allowed: 1 with engine.name='cpu'")
    assert "needs engine=vllm" in str(ei.value) and not ray.is_initialized()


def test_each_device_of_a_replica_gets_its_place(tmp_path):
    """A two-device GenRM slot: the first device runs the engine with tensor_parallel_size=2, the
    second is a member of it; training ranks are unchanged."""
    from pivotrl.config import compose_config
    from pivotrl.config.resolve import resolve
    from pivotrl.core.types import Role, Slot
    from pivotrl.runtime.launch import Launch

    cfg = compose_config(["deploy=disaggregated", "cluster=local", "models.genrm.tp=2", "engine=vllm"])
    la = Launch(cfg, resolve(cfg), tmp_path / "p", tmp_path / "g", tmp_path)
    slot = Slot(Role.REWARD, 2, 2)
    lead, member = la.role_spec(slot, 0), la.role_spec(slot, 1)
    assert (lead.leader, lead.engine.tensor_parallel_size, lead.engine.sleep_level) == (None, 2, 1)
    assert lead.engine.settings == resolve(cfg).engine(cfg, "reward").settings, "the role's settings (Resolved.engine)"
    assert lead.engine.settings.shared().items() >= {"max_num_seqs": cfg.engine.max_num_seqs}.items()
    assert (member.leader, member.role) == (2, Role.REWARD)
    rollout = la.role_spec(Slot(Role.ROLLOUT, 0, 1), 0).engine
    assert (rollout.tensor_parallel_size, rollout.sleep_level) == (1, 2)
    with pytest.raises(ValueError, match="spans 1 device"):
        la.role_spec(Slot(Role.REWARD, 2, 1), 0)  # a slot that is not the role's replica size
