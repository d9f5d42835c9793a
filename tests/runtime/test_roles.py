"""Role hosts on one device: sleep level per role and what a warm shift up reads, with the real CPU
engine; a failed wake drops the engine (the vLLM branch through the recording stand-in)."""
from __future__ import annotations

import pytest
import torch

from pivotrl.config.engine import EngineConfig, EngineSpec
from pivotrl.core.types import Role
from pivotrl.engines.errors import EngineWakeError
from pivotrl.engines.protocol import GenerationRequest, SamplingParams
from pivotrl.models.tiny import TinyModelConfig, create_tiny_model
from pivotrl.runtime import roles
from pivotrl.runtime.roles import InferenceHost, RoleSpec

TINY = TinyModelConfig(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                       max_position_embeddings=64, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return create_tiny_model(tmp_path_factory.mktemp("roles") / "m", TINY, seed=3)


def _host(role: Role, folder) -> InferenceHost:
    return InferenceHost(RoleSpec(role, "genrm" if role == Role.REWARD else "policy", str(folder),
                                  engine=EngineSpec.for_role(EngineConfig(name="cpu", num_threads=1), role.value)))


def _greedy(host: InferenceHost) -> list[int]:
    return host.engine.generate([GenerationRequest(0, [5, 6, 7], SamplingParams(temperature=0, max_tokens=6))])[0].token_ids


def test_genrm_keeps_its_weights_at_level1_and_reads_nothing_on_shift_up(folder):
    host = _host(Role.REWARD, folder)
    host.shift_up(None, 0)
    ref = _greedy(host)
    model = host.engine.model
    down = host.shift_down()
    assert down.detail["sleep_level"] == 1.0 and not host.needs_parameters()
    up = host.shift_up({"model.norm.weight": torch.zeros(64)}, 9)  # ignored: frozen weights were kept
    assert up.detail.get("weights_kept") == 1.0 and "read_folder_s" not in up.detail
    assert host.engine.model is model and _greedy(host) == ref and up.version == 0
    host.close()


def test_policy_sleeps_level2_and_takes_the_new_version(folder):
    host = _host(Role.ROLLOUT, folder)
    host.shift_up(None, 0)
    sd = {k: v.clone() for k, v in host.engine.model.state_dict().items()}
    assert host.shift_down().detail["sleep_level"] == 2.0 and host.engine.model is None
    assert host.needs_parameters()
    up = host.shift_up(sd, 4)
    # new weights follow: the model is rebuilt from config.json, its folder's weights never read
    assert up.version == 4 and "read_folder_s" not in up.detail and "build_s" in up.detail and "load_s" in up.detail
    host.close()


def test_a_cold_policy_engine_never_reads_its_folder_and_serves_the_weights_it_is_given(folder, tmp_path):
    """Cold shift up with weights to load: the engine is built from config.json alone (random
    values, vLLM's `load_format="dummy"`), then takes the given weights; without weights it reads
    its folder's."""
    ref_host = _host(Role.ROLLOUT, folder)
    up = ref_host.shift_up(None, 0)
    assert up.cold and up.detail["read_folder"] == 1.0
    ref, sd = _greedy(ref_host), {k: v.clone() for k, v in ref_host.engine.model.state_dict().items()}
    ref_host.close()
    host = _host(Role.ROLLOUT, folder)
    up = host.shift_up(sd, 3)
    assert up.cold and up.detail["read_folder"] == 0.0 and up.version == 3
    assert _greedy(host) == ref
    host.close()


def test_a_failed_wake_drops_the_engine_and_the_next_shift_up_builds_a_fresh_one(folder, monkeypatch):
    from tests.engines.test_vllm_handoff import RecordingLLM

    from pivotrl.engines.vllm_engine import VLLMEngine

    llms: list[RecordingLLM] = []

    def build(spec, read_weights=True):
        llm = RecordingLLM("wake_up:('kv_cache',)" if not llms else None)
        llms.append(llm)
        return VLLMEngine(spec.model_path, spec.engine.settings, client_factory=lambda e: llm, sleep_mode=True)

    monkeypatch.setattr(roles, "build_engine", build)
    host = InferenceHost(RoleSpec(Role.ROLLOUT, "policy", str(folder),
                                  engine=EngineSpec.for_role(EngineConfig(name="vllm"), "rollout")))
    host.shift_up(None, 0)
    host.shift_down()
    with pytest.raises(EngineWakeError):
        host.shift_up({"model.norm.weight": torch.ones(64)}, 1)
    assert host.engine is None and not host.active and ("shutdown",) in llms[0].calls
    up = host.shift_up(None, 1)
    assert up.cold and len(llms) == 2 and host.active
    host.close()


def test_a_member_of_a_replica_of_several_devices_holds_nothing(folder):
    """Device 1 of a two-device GenRM replica: its host is a member (no engine, no weights read);
    a member may not carry a placement, and train has no members."""
    cpu = EngineSpec.for_role(EngineConfig(name="cpu"), "reward")
    spec = RoleSpec(Role.REWARD, "genrm", str(folder), engine=cpu, leader=0)
    host = roles.make_host(spec)
    assert isinstance(host, roles.MemberHost) and host.CONTEXT.as_dict() == {c.value: [] for c in roles.Category}
    up = host.shift_up(None, 3)
    assert host.active and (up.direction, up.seconds, up.version, up.detail) == ("up", 0.0, 3, {"member_of": 0.0})
    assert not host.shift_down().seconds and not host.active
    with pytest.raises(ValueError, match="no engine placement"):
        RoleSpec(Role.REWARD, "genrm", str(folder), engine=cpu, leader=0,
                 placement=roles.EnginePlacement((0, 1)))
    assert isinstance(roles.make_host(RoleSpec(Role.REWARD, "genrm", str(folder), engine=cpu)),
                      InferenceHost)
