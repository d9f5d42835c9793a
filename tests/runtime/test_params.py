"""`ParamSource`: the runtime's GPS handle. A trainer's fp32 state dict publishes into a bf16
checkpoint's store (issue 14: "weights keep their dtype"), tied heads and all."""
from __future__ import annotations

import torch

from pivotrl.config.rl import TinyModelConfig


def test_fp32_trainer_publishes_into_a_bf16_store(tmp_path):
    from pivotrl.models.tiny import create_tiny_model, load_tiny_model
    from pivotrl.runtime.params import ParamSource

    path = create_tiny_model(tmp_path / "bf16", TinyModelConfig(dtype="bfloat16"))
    model, _ = load_tiny_model(path, dtype="float32")  # the trainer computes in fp32
    params = ParamSource.create()
    try:
        assert params.register_hf("policy", str(path), frozen=False) == 0
        spec = params.store.spec("policy")
        assert {t.dtype for t in spec.tensors} == {"bfloat16"}
        sd = {k: v + 1.0 for k, v in model.state_dict().items()}  # a trained step, fp32, lm_head tied
        assert params.publish("policy", sd) == 1
        from pivotrl.gps.state_dict import to_store

        stored = to_store(sd, spec)
        name = spec.tensors[0].name
        assert stored[name].dtype == torch.bfloat16
        assert torch.equal(stored[name], sd[name].to(torch.bfloat16))
    finally:
        params.close()
