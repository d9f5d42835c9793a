"""FSDP2 GRPO trainer on the tiny Qwen2 model: 2 ranks vs 1, offload, checkpoints, staleness.

One 2-rank run (spawned processes, gloo) is shared by the tests that need it, because starting
ranks dominates the cost on a 2-core machine; everything else hosts a single rank in-process.
"""
from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch

from pivotrl.config.trainer import TrainerSpec
from pivotrl.trainer.trainer import Trainer, TrainerError
from pivotrl.trainer.train_batch import TrainBatch
from pivotrl.trainer.trainer_checkpoint import checkpoint_dir, latest_checkpoint
from pivotrl.models.tiny import TinyModelConfig, create_tiny_model

torch.set_num_threads(1)

TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


def _cfg(**kw) -> TrainerSpec:
    base = dict(lr=1e-2, micro_batch_size=4, kl_coef=0.05, staleness=0, device="cpu", num_threads=1, timeout_s=120.0)
    base.update(kw)
    return TrainerSpec(**base)


def _batch(seed: int, n: int = 9, version: int = 0, versions: list[int] | None = None) -> TrainBatch:
    """Random prompts/responses with rewards in groups of 3 and behaviour log-probs that differ
    from the policy's, so ratios move off 1 and the loss depends on the weights."""
    rng = random.Random(seed)
    resp = [[rng.randrange(4, 100) for _ in range(rng.randint(1, 12))] for _ in range(n)]
    return TrainBatch(
        prompt_ids=[[rng.randrange(4, 100) for _ in range(rng.randint(1, 10))] for _ in range(n)],
        response_ids=resp,
        versions=versions if versions is not None else [version] * n,
        rewards=[float(rng.random() < 0.5) + rng.random() for _ in range(n)],
        group_ids=[i // 3 for i in range(n)],
        old_log_probs=[[-4.6 + rng.uniform(-0.3, 0.3) for _ in r] for r in resp],
    )


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "policy", TINY, seed=0)


def _assert_state_close(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0 if atol == 0 else 1e-5, msg=lambda m, k=k: f"{k}: {m}")


@pytest.fixture(scope="module")
def two_rank_run(model_path, tmp_path_factory):
    """Step 1 on batch A, checkpoint, offload/reload, then step 2 on batch B (one sample stale)
    with 2 ranks. 9 samples and micro-batch 4 give rank 1 an empty micro-batch to keep in step."""
    ckpt_root = tmp_path_factory.mktemp("ckpt2")
    published: list[tuple[int, dict]] = []
    out = {}
    with Trainer(_cfg(world_size=2), model_path, publish=lambda v, sd: published.append((v, sd))) as tr:
        out["m1"] = tr.step(_batch(1))
        out["sd1"] = tr.state_dict()
        out["ckpt"] = tr.save_checkpoint(checkpoint_dir(ckpt_root, tr.version), extra={"cursor": 9})
        out["bytes_before"] = tr.device_bytes()
        out["offload"] = tr.offload()
        out["bytes_offloaded"] = tr.device_bytes()
        tr.reload()
        out["m2"] = tr.step(_batch(2, versions=[0] + [1] * 8))
        out["sd2"] = tr.state_dict()
        # A rank that raises inside a collective: every rank's error comes back, the group stops.
        broken = ckpt_root / "broken"
        broken.mkdir()
        (broken / "trainer_state.json").write_text("{}")
        with pytest.raises(ValueError, match="no dcp/.metadata"):
            tr.load_checkpoint(broken)  # caught before any rank sees it
        with pytest.raises(TrainerError) as err:
            tr._call("load_checkpoint", str(broken))  # past the driver's check: DCP fails on the ranks
        out["error"] = str(err.value)
        with pytest.raises(TrainerError, match="closed"):
            tr.step(_batch(3, version=2))
    out["published"] = published
    return out


def test_two_ranks_match_one_rank(model_path, two_rank_run):
    with Trainer(_cfg(world_size=1), model_path) as tr:
        m1 = tr.step(_batch(1))
        sd1 = tr.state_dict()
        m2 = tr.step(_batch(2, versions=[0] + [1] * 8))
        sd2 = tr.state_dict()
    r = two_rank_run
    assert r["m1"]["micro_batches"] == 2 and m1["micro_batches"] == 3
    for key in ("loss", "pg_loss", "kl", "grad_norm", "clipfrac", "entropy", "tokens_trained"):
        assert r["m1"][key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
        assert r["m2"][key] == pytest.approx(m2[key], rel=1e-4, abs=1e-6), key
    assert m1["loss"] != m2["loss"]  # the weights moved, and the loss saw it
    # Adam turns a gradient near zero into an update of about +-lr, so a rounding difference in
    # the reduction order can move a weight by a sizeable fraction of lr (1e-2): allow 1 % of it.
    _assert_state_close(r["sd1"], sd1, atol=1e-4)
    _assert_state_close(r["sd2"], sd2, atol=1e-4)
    assert max((r["sd2"][k] - r["sd1"][k]).abs().max() for k in sd1) > 1e-3  # and they did move


def test_two_ranks_reject_stale_and_publish(two_rank_run):
    r = two_rank_run
    assert r["m1"]["samples_rejected_stale"] == 0 and r["m1"]["samples_trained"] == 9
    assert r["m2"]["samples_rejected_stale"] == 1 and r["m2"]["samples_trained"] == 8  # version 0 at step 2
    assert [v for v, _ in r["published"]] == [1, 2]
    _assert_state_close(r["published"][1][1], r["sd2"])
    # offload freed every storage on both ranks; the round trip did not change the next step
    # (checked against the 1-rank run above, which never offloaded)
    assert r["bytes_before"]["optimizer"] > 0 and r["bytes_before"]["params"] > 0
    assert r["bytes_offloaded"] == {"params": 0, "grads": 0, "optimizer": 0}


def test_log_probs_match_plain_transformers(model_path):
    from transformers import AutoModelForCausalLM

    b = _batch(3, n=5)
    with Trainer(_cfg(kl_coef=0.0), model_path) as tr:
        got = tr.compute_log_probs(b)
    ref = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    for p, r, lp in zip(b.prompt_ids, b.response_ids, got):
        with torch.no_grad():
            logits = ref(input_ids=torch.tensor([p + r])).logits[0]
        want = torch.log_softmax(logits[len(p) - 1 : len(p) + len(r) - 1], -1).gather(1, torch.tensor(r)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(lp), want, atol=1e-5, rtol=1e-5)


def test_one_step_equals_a_plain_pytorch_grpo_update(model_path):
    """An independent GRPO step written out with plain transformers + torch.optim, no FSDP: same
    loss, same grad norm, same updated weights."""
    from transformers import AutoModelForCausalLM

    from pivotrl.rl.advantages import compute_advantages
    from pivotrl.rl.losses import policy_loss

    cfg = _cfg(grad_clip=0.5)
    b = _batch(1)
    with Trainer(cfg, model_path) as tr:
        m = tr.step(b)
        got = tr.state_dict()

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).requires_grad_(False)

    def token_logp(mdl, p, r):
        logits = mdl(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1]
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(r)[:, None])[:, 0]

    R = max(len(r) for r in b.response_ids)
    logp, ref_lp, old, mask = (torch.zeros(len(b), R) for _ in range(4))
    for i, (p, r) in enumerate(zip(b.prompt_ids, b.response_ids)):
        logp[i, : len(r)] = token_logp(model, p, r)
        ref_lp[i, : len(r)] = token_logp(ref, p, r)
        old[i, : len(r)] = torch.tensor(b.old_log_probs[i])
        mask[i, : len(r)] = 1.0
    adv = torch.as_tensor(compute_advantages("grpo", b.rewards, b.group_ids))
    loss, _ = policy_loss("ppo_clip", logp, old, adv, mask, clip_ratio_low=cfg.clip_ratio_low,
                          clip_ratio_high=cfg.clip_ratio_high, ref_log_probs=ref_lp, kl_coef=cfg.kl_coef)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                      eps=cfg.adam_eps, weight_decay=cfg.weight_decay).step()
    assert m["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    assert m["grad_norm"] == pytest.approx(float(norm), rel=1e-4)
    _assert_state_close(got, {k: v for k, v in model.state_dict().items() if k in got}, atol=1e-4)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_size_does_not_change_the_update(model_path, mode):
    results = []
    for mbs in (1, 4, 9):
        with Trainer(_cfg(micro_batch_size=mbs, loss_agg_mode=mode), model_path) as tr:
            m = tr.step(_batch(1))
            results.append((m, tr.state_dict()))
    (m0, sd0) = results[0]
    assert [m["micro_batches"] for m, _ in results] == [9, 3, 1]
    for m, sd in results[1:]:
        assert m["loss"] == pytest.approx(m0["loss"], rel=1e-5) and m["grad_norm"] == pytest.approx(m0["grad_norm"], rel=1e-4)
        _assert_state_close(sd, sd0, atol=1e-4)


def test_mini_batches_equal_one_step_per_part(model_path):
    """`ppo_mini_batches=2, ppo_epochs=2` is four plain steps: on each part of the seeded
    shuffle, with the advantages of the whole batch, in order, twice. The version moves by one."""
    import dataclasses

    import numpy as np

    from pivotrl.rl.advantages import compute_advantages

    b = _batch(1)
    with Trainer(_cfg(ppo_mini_batches=2, ppo_epochs=2), model_path) as tr:
        m = tr.step(b)
        got = tr.state_dict()
        assert tr.version == 1
    assert m["optimizer_steps"] == 4 and m["samples_trained"] == len(b)

    adv = compute_advantages("grpo", b.rewards, b.group_ids)
    order = np.random.default_rng((0, 0)).permutation(np.arange(len(b)))
    parts = [np.sort(p) for p in np.array_split(order, 2)]
    with Trainer(_cfg(staleness=10), model_path) as plain:
        for _ in range(2):
            for part in parts:
                pick = lambda xs: [xs[i] for i in part]  # noqa: E731
                plain.step(dataclasses.replace(
                    b, prompt_ids=pick(b.prompt_ids), response_ids=pick(b.response_ids),
                    versions=pick(b.versions), rewards=None, group_ids=None,
                    advantages=[float(adv[i]) for i in part], old_log_probs=pick(b.old_log_probs)))
        _assert_state_close(got, plain.state_dict(), atol=1e-5)


def test_mini_batches_without_old_log_probs_use_the_policy_before_the_first_step(model_path):
    """With several updates per batch and no behaviour log-probs, the ratio's denominator is the
    policy at the start of the step (recomputed once), not the policy each update starts from."""
    import dataclasses

    b = dataclasses.replace(_batch(2), old_log_probs=None)
    with Trainer(_cfg(ppo_mini_batches=3), model_path) as tr:
        before = tr.compute_log_probs(b)
        tr.step(b)
        implicit = tr.state_dict()
    with Trainer(_cfg(ppo_mini_batches=3), model_path) as tr:
        tr.step(b.with_old_log_probs(before))
        explicit = tr.state_dict()
    _assert_state_close(implicit, explicit, atol=1e-6)


def test_decoupled_ppo_is_a_truncated_importance_weighted_policy_gradient(model_path):
    """`off_policy=decoupled`, one update: the clip reference is the current policy (ratio 1), so
    the loss is -mean(A * min(pi/pi_behaviour, cap)) per token; checked against plain torch."""
    from transformers import AutoModelForCausalLM

    from pivotrl.rl.advantages import compute_advantages

    cap = 0.8  # the tiny random model's log-probs sit near -4.85, the batch's behaviour near -4.6
    cfg = _cfg(kl_coef=0.0, off_policy="decoupled", behaviour_is_cap=cap, grad_clip=0.0)
    b = _batch(3)
    with Trainer(cfg, model_path) as tr:
        m = tr.step(b)
        got = tr.state_dict()
    assert 0 < m["behaviour_is_truncated"] < 1  # random behaviour log-probs: some weights hit the cap

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    adv = compute_advantages("grpo", b.rewards, b.group_ids)
    total, n_tok = 0.0, sum(len(r) for r in b.response_ids)
    for i, (p, r) in enumerate(zip(b.prompt_ids, b.response_ids)):
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1]
        logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(r)[:, None])[:, 0]
        w = torch.clamp(torch.exp(logp.detach() - torch.tensor(b.old_log_probs[i])), max=cap)
        total = total + (-float(adv[i]) * w * torch.exp(logp - logp.detach())).sum()
    (total / n_tok).backward()
    torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                      eps=cfg.adam_eps, weight_decay=cfg.weight_decay).step()
    assert m["loss"] == pytest.approx(float(total / n_tok), rel=1e-4)
    _assert_state_close(got, {k: v for k, v in model.state_dict().items() if k in got}, atol=1e-4)


def test_decoupled_equals_behaviour_on_fresh_samples(model_path):
    """Samples whose behaviour log-probs are the current policy's: both corrections are the same
    update (weights 1, the same clip reference), also over several mini-batches."""
    import dataclasses

    b = dataclasses.replace(_batch(4), old_log_probs=None)
    results = []
    for mode in ("behaviour", "decoupled"):
        with Trainer(_cfg(off_policy=mode, ppo_mini_batches=3), model_path) as tr:
            fresh = b.with_old_log_probs(tr.compute_log_probs(b))
            m = tr.step(fresh)
            results.append((m, tr.state_dict()))
    assert results[1][0]["behaviour_is_mean"] == pytest.approx(1.0, abs=1e-5)
    assert results[1][0]["behaviour_logprob_diff"] < 1e-5, "the trainer's own log-probs: no mismatch"
    # the decoupled first update's clip reference is its own forward's log-probs, the behaviour
    # path's the recomputed ones: the same policy's, up to float rounding. Adam at lr 1e-2 turns a
    # near-zero gradient's rounding into up to ~1e-5 (3e-6 on one 2-core machine, 1.05e-5 on an
    # AVX-512 one); a different update moves weights by the order of lr, a thousand times more.
    _assert_state_close(results[0][1], results[1][1], atol=5e-5)


def test_linear_lr_decay_per_version(model_path):
    with Trainer(_cfg(lr=1e-2, lr_decay_steps=4, lr_min_ratio=0.25, staleness=10), model_path) as tr:
        lrs = [tr.step(_batch(k))["lr"] for k in range(6)]
    assert lrs == pytest.approx([1e-2, 8.125e-3, 6.25e-3, 4.375e-3, 2.5e-3, 2.5e-3])


def test_lr_warmup_ramps_then_decays(model_path):
    """Warm-up over 2 versions on top of the decay over 4: (v + 1) / 2 of the decayed rate."""
    with Trainer(_cfg(lr=1e-2, lr_decay_steps=4, lr_min_ratio=0.25, lr_warmup_steps=2, staleness=10), model_path) as tr:
        lrs = [tr.step(_batch(k))["lr"] for k in range(5)]
    assert lrs == pytest.approx([5e-3, 8.125e-3, 6.25e-3, 4.375e-3, 2.5e-3])
    with Trainer(_cfg(lr=1e-2, lr_warmup_steps=3, staleness=10), model_path) as tr:  # no decay: up to lr, and there
        lrs = [tr.step(_batch(k))["lr"] for k in range(4)]
    assert lrs == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2])


def test_offload_reload_round_trips_exactly(model_path):
    with Trainer(_cfg(), model_path) as tr:
        tr.step(_batch(1))
        w = tr.worker
        before = [t.clone() for _, t in w.offloadable()]
        assert len(w.optimizer.state) > 0 and tr.device_bytes()["optimizer"] > 0
        info = tr.offload()
        assert info["offloaded_bytes"] > 0
        assert tr.device_bytes() == {"params": 0, "grads": 0, "optimizer": 0}
        for st in w.optimizer.state.values():
            for v in st.values():
                assert v.to_local().untyped_storage().nbytes() == 0 if hasattr(v, "to_local") else v.untyped_storage().nbytes() == 0
        with pytest.raises(RuntimeError, match="reload"):
            tr.step(_batch(2, version=1))
        tr.reload()
        after = [t for _, t in w.offloadable()]
        assert len(after) == len(before)
        for x, y in zip(before, after):
            assert torch.equal(x, y)
        m = tr.step(_batch(2, version=1))
        assert m["trained"] == 1.0 and m["version"] == 2
        # The host buffers of the first offload are reused: no new host allocation the second time.
        assert info["host_allocations"] > 0 and info["cache_emptied"] == 0.0  # CPU: no CUDA cache
        again = tr.offload()
        assert again["host_allocations"] == 0.0 and again["offloaded_bytes"] == info["offloaded_bytes"]
        tr.reload()
        assert tr.step(_batch(3, version=2))["version"] == 3


def test_checkpoint_is_a_hugging_face_model_and_resume_repeats_the_next_step(model_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path / "ckpts"
    with Trainer(_cfg(), model_path) as tr:
        tr.step(_batch(1))
        path = tr.save_checkpoint(checkpoint_dir(root, tr.version), extra={"cursor": 9, "epoch": 0})
        sd1 = tr.state_dict()
        m2 = tr.step(_batch(2, version=1))
        sd2 = tr.state_dict()
    assert path.name == "step_00000001" and latest_checkpoint(root) == path
    hf = AutoModelForCausalLM.from_pretrained(str(path / "hf"))
    _assert_state_close({k: v for k, v in hf.state_dict().items() if k in sd1}, sd1)
    assert set(sd1) <= set(hf.state_dict())
    assert AutoTokenizer.from_pretrained(str(path / "hf")).eos_token_id is not None
    assert json.loads((path / "trainer_state.json").read_text())["version"] == 1

    with Trainer(_cfg(), model_path) as tr:
        extra = tr.load_checkpoint(root)  # a root: the latest checkpoint under it
        assert extra == {"cursor": 9, "epoch": 0} and tr.version == 1
        _assert_state_close(tr.state_dict(), sd1)
        m2b = tr.step(_batch(2, version=1))
        assert m2b["loss"] == m2["loss"] and m2b["grad_norm"] == m2["grad_norm"]
        _assert_state_close(tr.state_dict(), sd2)  # optimizer moments came back too


def test_resume_two_rank_checkpoint_on_one_rank(model_path, two_rank_run):
    with Trainer(_cfg(), model_path) as tr:
        assert tr.load_checkpoint(two_rank_run["ckpt"]) == {"cursor": 9}
        assert tr.version == 1
        m2 = tr.step(_batch(2, versions=[0] + [1] * 8))
        assert m2["loss"] == pytest.approx(two_rank_run["m2"]["loss"], rel=1e-4)
        _assert_state_close(tr.state_dict(), two_rank_run["sd2"], atol=1e-4)


def test_staleness_bound_per_sample(model_path):
    published = []
    with Trainer(_cfg(staleness=1, kl_coef=0.0), model_path, publish=lambda v, sd: published.append(v)) as tr:
        tr.step(_batch(1, version=0))
        tr.step(_batch(2, version=1))
        assert tr.version == 2
        m = tr.step(_batch(3, versions=[0, 1, 2, 0, 1, 2, 2, 2, 1]))  # age 2 > 1 for the two 0s
        assert m["samples_rejected_stale"] == 2 and m["samples_trained"] == 7 and m["max_age_trained"] == 1
        assert m["samples_rejected_stale_total"] == 2 and tr.version == 3
        m = tr.step(_batch(4, version=1))  # every sample is 2 versions old
        assert m["trained"] == 0.0 and m["samples_rejected_stale"] == 9 and tr.version == 3
        assert published == [1, 2, 3]  # nothing published for the rejected batch
        with pytest.raises(ValueError, match="versions has version 7 > trainer version 3"):
            tr.step(_batch(5, version=7))


def test_on_policy_batch_without_old_log_probs(model_path):
    b = _batch(1)
    b.old_log_probs = None
    b.rewards, b.group_ids, b.advantages = None, None, [1.0, -1.0, 0.5] * 3
    with Trainer(_cfg(kl_coef=0.0), model_path) as tr:
        m = tr.step(b)
    # ratio == 1 everywhere: loss is minus the token-weighted mean advantage, nothing clipped
    tok = [len(r) for r in b.response_ids]
    assert m["loss"] == pytest.approx(-sum(a * t for a, t in zip(b.advantages, tok)) / sum(tok), rel=1e-5)
    assert m["clipfrac"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0)


def test_bfloat16_compute_keeps_float32_master_weights(model_path):
    with Trainer(_cfg(), model_path) as tr:
        m32 = tr.step(_batch(1))
    with Trainer(_cfg(param_dtype="bfloat16"), model_path) as tr:
        m16 = tr.step(_batch(1))
        sd = tr.state_dict()
    assert m16["loss"] == pytest.approx(m32["loss"], rel=5e-2, abs=1e-2)
    assert 0.0 < m16["entropy"] <= math.log(TINY.vocab_size) + 1e-3
    assert all(v.dtype == torch.float32 for v in sd.values())


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(lr=0.0), "lr"),
        (dict(micro_batch_size=0), "micro_batch_size"),
        (dict(loss="dpo"), "loss"),
        (dict(advantage_estimator="ppo"), "advantage_estimator"),
        (dict(loss_agg_mode="sum"), "loss_agg_mode"),
        (dict(clip_ratio_low=1.5), "clip_ratio_low"),
        (dict(staleness=-1), "staleness"),
        (dict(world_size=0), "world_size"),
        (dict(backend="mpi"), "backend"),
        (dict(device="cpu", backend="nccl"), "backend"),
        (dict(kl_estimator="k7"), "kl_estimator"),
        (dict(param_dtype="int8"), "param_dtype"),
        (dict(ppo_mini_batches=0), "ppo_mini_batches"),
        (dict(ppo_epochs=0), "ppo_epochs"),
        (dict(off_policy="vtrace"), "off_policy"),
        (dict(lr_decay_steps=-1), "lr_decay_steps"),
        (dict(lr_min_ratio=1.5), "lr_min_ratio"),
        (dict(lr_warmup_steps=-2), "lr_warmup_steps"),
        (dict(behaviour_is_cap=0.0), "behaviour_is_cap"),
    ],
)
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match=f"^{field}="):  # the loader prefixes the path (algo.)
        TrainerSpec(**kw)


def test_bad_batches_and_folders(model_path, tmp_path):
    with pytest.raises(ValueError, match="not a Hugging Face model folder"):
        Trainer(_cfg(), tmp_path)
    good = _batch(1)
    cases = [
        (dict(response_ids=good.response_ids[:-1]), "response_ids has 8 entries"),
        (dict(rewards=None, advantages=None), "either advantages, or rewards and group_ids"),
        (dict(prompt_ids=[[]] + good.prompt_ids[1:]), r"prompt_ids\[0\] is empty"),
        (dict(old_log_probs=[[0.0] * 99] + good.old_log_probs[1:]), r"old_log_probs\[0\] has 99"),
        (dict(response_ids=[[TINY.vocab_size]] + good.response_ids[1:]), r"response_ids\[0\] has a token id outside"),
    ]
    with Trainer(_cfg(), model_path) as tr:
        for change, msg in cases:
            b = TrainBatch(**{**good.__dict__, **change})
            with pytest.raises(ValueError, match=msg):
                tr.step(b)
        assert tr.version == 0
        with pytest.raises(ValueError, match="no trainer checkpoint"):
            tr.load_checkpoint(tmp_path)


def test_a_failing_rank_raises_with_its_traceback(two_rank_run):
    assert "failed in load_checkpoint()" in two_rank_run["error"]
    assert "Traceback" in two_rank_run["error"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(model_path):
    """Same code on GPU (NCCL when world size > 1): one rank on cuda:0 vs the CPU result, and
    two ranks when two GPUs are present."""
    with Trainer(_cfg(device="cpu"), model_path) as tr:
        m_cpu = tr.step(_batch(1))
        sd_cpu = tr.state_dict()
    sizes = [1, 2] if torch.cuda.device_count() >= 2 else [1]
    for ws in sizes:
        with Trainer(_cfg(device="cuda", world_size=ws), model_path) as tr:
            m = tr.step(_batch(1))
            assert m["loss"] == pytest.approx(m_cpu["loss"], rel=1e-3)
            _assert_state_close(tr.state_dict(), sd_cpu, atol=1e-4)
            tr.offload()
            assert tr.device_bytes() == {"params": 0, "grads": 0, "optimizer": 0}
            tr.reload()
            assert tr.step(_batch(2, version=1))["trained"] == 1.0


# --- the memory-sane path (meta init, chunked log-probs, token micro-batches, checkpointing) ------
ORIGINAL = dict(init_on_meta=False, logprob_chunk_tokens=0, gradient_checkpointing=False, micro_batch_tokens=0)


@pytest.mark.parametrize("new", [
    dict(init_on_meta=True, logprob_chunk_tokens=5, gradient_checkpointing=True, micro_batch_tokens=40),
    dict(init_on_meta=True, logprob_chunk_tokens=1024, gradient_checkpointing=False, micro_batch_tokens=0),
], ids=["all", "defaults"])
def test_memory_sane_path_matches_the_original_in_float32(model_path, new):
    """Same initial weights, loss, gradient norm and gradients. AdamW with a huge epsilon makes the
    first update lr * g / eps (linear in the gradient), so the weight change *is* the gradient."""
    kw = dict(lr=1.0, adam_eps=1e4, grad_clip=0.0)
    out = {}
    for name, path in (("old", ORIGINAL), ("new", new)):
        with Trainer(_cfg(**kw, **path), model_path) as tr:
            w0 = tr.state_dict()
            m = tr.step(_batch(1))
            out[name] = (w0, m, {k: v - w0[k] for k, v in tr.state_dict().items()})
    (w0_old, m_old, d_old), (w0_new, m_new, d_new) = out["old"], out["new"]
    _assert_state_close(w0_old, w0_new)  # meta-device init + rank-0 load = the eager load, bit for bit
    for key in ("loss", "pg_loss", "kl", "entropy", "ratio_mean", "clipfrac"):
        assert m_new[key] == pytest.approx(m_old[key], rel=1e-5, abs=1e-7), key
    assert m_new["grad_norm"] == pytest.approx(m_old["grad_norm"], rel=1e-5)
    assert m_old["grad_norm"] > 0
    scale = max(float(d.abs().max()) for d in d_old.values())
    assert scale > 0
    for k in d_old:
        torch.testing.assert_close(d_new[k], d_old[k], rtol=1e-3, atol=1e-4 * scale, msg=lambda s, k=k: f"{k}: {s}")


def test_two_ranks_on_the_memory_sane_path_match_one_rank(model_path):
    new = dict(init_on_meta=True, logprob_chunk_tokens=7, gradient_checkpointing=True, micro_batch_tokens=30)
    res = {}
    for ws in (1, 2):
        with Trainer(_cfg(world_size=ws, **new), model_path) as tr:
            m = tr.step(_batch(3))
            res[ws] = (m, tr.state_dict())
    assert res[2][0]["loss"] == pytest.approx(res[1][0]["loss"], rel=1e-5)
    _assert_state_close(res[1][1], res[2][1], atol=1e-5)


def test_publish_dtype_matches_a_bfloat16_store(model_path):
    """A bf16 GPS store rejects float32 tensors (ShardMismatchError); the trainer publishes in the
    store's dtype when told, and the store takes the weights."""
    from pivotrl.gps.errors import ShardMismatchError
    from pivotrl.gps.store import GlobalParameterStore

    cfg_json = json.loads((model_path / "config.json").read_text())
    with Trainer(_cfg(publish_dtype="bfloat16"), model_path) as tr:
        sd16 = tr.state_dict()
        sd32 = tr.worker.full_state_dict("float32")
    assert all(v.dtype == torch.bfloat16 for v in sd16.values())
    store = GlobalParameterStore()
    try:
        store.register("policy", cfg_json, dtype="bfloat16")
        keep = lambda sd: {k: v for k, v in sd.items() if k in store.spec("policy")}  # noqa: E731
        with pytest.raises(ShardMismatchError, match="dtype"):
            store.load_state_dict("policy", keep(sd32))
        assert store.load_state_dict("policy", keep(sd16)) == 0
    finally:
        store.close()


def test_memory_config_errors_name_the_field():
    for kw, field in ((dict(micro_batch_tokens=-1), "micro_batch_tokens"),
                      (dict(logprob_chunk_tokens=-5), "logprob_chunk_tokens"),
                      (dict(publish_dtype="float16"), "publish_dtype")):
        with pytest.raises(ValueError, match=f"^{field}="):  # relative to TrainerSpec; the loader adds `algo.`
            TrainerSpec(**kw)


@pytest.mark.parametrize("minis", [1, 3])
def test_decoupled_first_update_takes_its_proximal_from_its_own_forward(model_path, monkeypatch, minis):
    """Decoupled PPO: the first mini-batch's proximal log-probs are its update forward's own
    (the policy is the one the step starts from), not a recompute; the losses, importance weights
    and update equal those of recomputing every sample first, up to float rounding."""
    from pivotrl.trainer.trainer_worker import TrainerWorker

    cfg = _cfg(kl_coef=0.0, off_policy="decoupled", ppo_mini_batches=minis, behaviour_is_cap=0.8)
    b = _batch(5)
    skipped, runs = [], []
    real = TrainerWorker._all_log_probs
    monkeypatch.setattr(TrainerWorker, "_all_log_probs", lambda self, batch, skip=None: (
        skipped.append(0 if skip is None else len(skip)), real(self, batch, skip))[1])
    for recompute_all in (False, True):
        if recompute_all:  # as before: every sample's proximal log-probs recomputed first
            monkeypatch.setattr(TrainerWorker, "_own_proximal", lambda self, minis: np.asarray([], dtype=np.int64))
        with Trainer(cfg, model_path) as tr:
            runs.append((tr.step(b), tr.state_dict()))
    assert skipped[0] == len(b) // minis + (len(b) % minis > 0) and skipped[-1] == 0
    for key in ("loss", "pg_loss", "clipfrac", "approx_kl", "ratio_mean", "behaviour_is_mean", "behaviour_is_truncated"):
        assert runs[0][0][key] == pytest.approx(runs[1][0][key], rel=1e-5, abs=1e-7), key
    assert 0 < runs[0][0]["behaviour_is_truncated"] < 1
    # Adam's first step at lr 1e-2 moves a parameter whose gradient is near zero by up to lr times
    # a ratio of tiny numbers: their rounding shows there (up to ~2e-5, 0.2 % of a step)
    _assert_state_close(runs[0][1], runs[1][1], atol=5e-5)


def test_two_ranks_decoupled_match_one_rank(model_path):
    """Decoupled PPO over two ranks: each rank's share of the first update's importance weights
    (from its own forward) is reduced with the other's, so the figures equal one rank's."""
    cfg = dict(kl_coef=0.0, off_policy="decoupled", ppo_mini_batches=2, behaviour_is_cap=0.8)
    out = []
    for ranks in (1, 2):
        with Trainer(_cfg(world_size=ranks, **cfg), model_path) as tr:
            out.append((tr.step(_batch(6)), tr.state_dict()))
    for key in ("loss", "pg_loss", "behaviour_is_mean", "behaviour_is_truncated", "ratio_mean", "tokens_trained"):
        assert out[1][0][key] == pytest.approx(out[0][0][key], rel=1e-4, abs=1e-6), key
    assert 0 < out[0][0]["behaviour_is_truncated"] < 1
    _assert_state_close(out[1][1], out[0][1], atol=1e-4)  # Adam at lr 1e-2: see test_two_ranks_match_one_rank


def test_meta_init_of_a_bfloat16_checkpoint_reads_it_mapped_in_its_own_dtype(tmp_path):
    """Rank 0 never casts the checkpoint to float32: it hands the broadcast mapped bf16 views, and
    each rank's float32 shard is the bf16 value upcast (as the eager float32 load gives), with 1
    rank and with 2 (rank 1 receives bf16 tensors and casts them into its own shard)."""
    from dataclasses import replace

    from pivotrl.trainer.model_init import read_mapped_state_dict

    path = create_tiny_model(tmp_path / "bf16", replace(TINY, dtype="bfloat16"), seed=3)
    mapped = read_mapped_state_dict(path)
    assert mapped and all(t.dtype == torch.bfloat16 for t in mapped.values())
    # views of one mapping of the one weight file (no tensor of its own: nothing read or cast yet)
    assert len({t.untyped_storage().data_ptr() for t in mapped.values()}) == 1
    with Trainer(_cfg(init_on_meta=False), path) as tr:
        eager = tr.state_dict()
    assert all(v.dtype == torch.float32 for v in eager.values())
    for ws in (1, 2):
        with Trainer(_cfg(init_on_meta=True, world_size=ws), path) as tr:
            _assert_state_close(eager, tr.state_dict())
