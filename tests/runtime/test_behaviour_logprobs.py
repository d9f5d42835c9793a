"""Behaviour log-probs through the real runtime: a device's poll deltas and abort results carry
them, the driver's ledger (`Tokens`) and resume requests keep them, and the train batch
(`Samples.train_batch`) turns them into `TrainBatch.old_log_probs` that equal the trainer's own
log-probs of the same on-policy samples. Real CPU engine, real device worker (its body, without
Ray), real trainer; tiny random models."""
from __future__ import annotations

import time

import pytest
import torch

from pivotrl.core.types import Role
from pivotrl.engines.protocol import TokensSoFar
from pivotrl.runtime.ledger import SequenceLedger, Tokens

from tests.e2e.conftest import make_local_cfg

torch.set_num_threads(1)

TEMP = 0.8


@pytest.fixture
def setup(tiny_assets, tmp_path):
    """The run's `Samples` (prompts encoded), as `run_real` builds them before Ray is needed; the
    response cap is long enough that sequences are still in flight at the first polls."""
    from pivotrl.models.tokenizer import load_tokenizer
    from pivotrl.rl.data import load_examples
    from pivotrl.runtime.samples import Samples

    cfg = make_local_cfg(tiny_assets, "pivot", [f"algo.rollout_temperature={TEMP}", "data.max_response_length=160"])
    tok = load_tokenizer(tiny_assets["policy"])
    return Samples(cfg, tok, tok, load_examples(tiny_assets["train"]),
                   cfg.train.prompts_per_step, cfg.train.group_size, 160)


def test_tokens_keep_logprobs_only_when_all_known():
    a = Tokens().join(Tokens.of(TokensSoFar([1, 2], [-0.1, -0.2])))
    b = a.join(Tokens.of(TokensSoFar([3], [-0.3])))
    assert b.ids == (1, 2, 3) and b.logprobs == (-0.1, -0.2, -0.3)
    assert b.join(Tokens.of([4])).logprobs is None  # a delta without log-probs: unknown, never partial
    assert Tokens.of([5]).join(Tokens.of(TokensSoFar([6], [-1.0]))).logprobs is None
    assert Tokens().join(Tokens.of(TokensSoFar([6], [-1.0]))).logprobs == (-1.0,)
    assert b.for_engine() == [1, 2, 3] and b.for_engine().logprobs == [-0.1, -0.2, -0.3]
    with pytest.raises(ValueError, match="2 log-probs for 1 tokens"):
        Tokens((1,), (-0.1, -0.2))


def test_ledger_accepts_completions_only_from_where_it_placed_them():
    led = SequenceLedger()
    assert not led.place(Role.ROLLOUT, 7, device=1)  # fresh: no tokens to resume from
    assert led.progress(Role.ROLLOUT, 7, Tokens((4, 5), (-0.1, -0.2)), device=1) == 2
    assert led.progress(Role.ROLLOUT, 7, Tokens((6,), (-0.3,)), device=2) == 0  # not placed there
    led.aborted(Role.ROLLOUT, 7, Tokens((4,), (-0.1,)))  # a shorter abort result never shrinks it
    assert led.tokens[Role.ROLLOUT][7].ids == (4, 5) and led.counts()[Role.ROLLOUT] == {}
    assert led.place(Role.ROLLOUT, 7, device=3)  # resumes with its tokens
    assert not led.accept(Role.ROLLOUT, 7, 1, Tokens((4, 5, 9), None))  # raced from the old device
    assert led.accept(Role.ROLLOUT, 7, 3, Tokens((4, 5, 9), (-0.1, -0.2, -0.5)))
    assert not led.running()


def test_device_poll_and_abort_carry_logprobs_into_train_batch(setup, tiny_assets):
    """Drive a real device worker the way `local.py` does: submit, poll deltas, abort, resume on
    the same device, complete; the assembled batch's old_log_probs equal the trainer's."""
    from pivotrl.config.engine import EngineConfig, EngineSpec
    from pivotrl.config.trainer import TrainerSpec
    from pivotrl.trainer.trainer import Trainer
    from pivotrl.runtime.device import DeviceWorker
    from pivotrl.runtime.roles import RoleSpec

    # The device steps on its own thread: on an overloaded machine every sequence can finish before
    # the first poll shows one in flight. Retry on a fresh device rather than flake.
    for _attempt in range(3):
        dev = DeviceWorker(0, threads=1)
        try:
            dev.shift_up(RoleSpec(Role.ROLLOUT, "policy", str(tiny_assets["policy"]),
                                  engine=EngineSpec.for_role(EngineConfig(name="cpu", num_threads=1), "rollout")))
            n = setup.P * setup.G
            tokens: dict[int, Tokens] = {}
            responses, versions = {}, {}
            dev.submit([setup.request(Role.ROLLOUT, sid, Tokens(), None) for sid in range(n)])
            deadline = time.monotonic() + 60
            aborted_once = False
            while len(responses) < n and time.monotonic() < deadline:
                res = dev.poll(0.002)  # short: on a quiet machine a whole batch can finish within a 50 ms poll
                for sid, delta in res.progress.items():
                    assert isinstance(delta, TokensSoFar) and len(delta.logprobs) == len(delta)
                    tokens[sid] = tokens.get(sid, Tokens()).join(Tokens.of(delta))
                for c in res.completions:
                    responses[c.seq_id], versions[c.seq_id] = Tokens.of(c.token_ids, c.logprobs), c.version
                live = [sid for sid in tokens if sid not in responses and len(tokens[sid]) >= 1]
                if not aborted_once and live:
                    out = dev.abort(live)
                    for c in out.finished:
                        responses[c.seq_id], versions[c.seq_id] = Tokens.of(c.token_ids, c.logprobs), c.version
                    for sid, toks in out.aborted.items():
                        assert toks.logprobs is not None and len(toks.logprobs) == len(toks)
                        assert tuple(toks[:len(tokens[sid])]) == tokens[sid].ids
                        tokens[sid] = Tokens.of(toks)
                    reqs = [setup.request(Role.ROLLOUT, sid, tokens[sid], None) for sid in out.aborted]
                    assert all(r.generated_logprobs == list(tokens[r.seq_id].logprobs) for r in reqs)
                    dev.submit(reqs)
                    aborted_once = bool(out.aborted)
            assert sorted(responses) == list(range(n))
        finally:
            dev.close()
        if aborted_once:
            break
    assert aborted_once, "no sequence was in flight long enough to abort (3 attempts)"

    ids = list(range(n))
    batch = setup.train_batch(ids, {s: float(s % 2) for s in ids}, responses, versions)
    assert batch.old_log_probs is not None
    assert [len(x) for x in batch.old_log_probs] == [len(r) for r in batch.response_ids]
    with Trainer(TrainerSpec(world_size=1, lr=1e-4, logprob_temperature=TEMP, micro_batch_size=64,
                               num_threads=1), str(tiny_assets["policy"])) as tr:
        ref = tr.compute_log_probs(batch)
    for got, want in zip(batch.old_log_probs, ref):
        assert got == pytest.approx(want, abs=2e-4)

    # one sample without log-probs: the whole batch falls back (no mix); a record whose log-probs
    # do not match its tokens cannot be built at all (`Tokens`)
    missing = {**responses, 0: Tokens(responses[0].ids, None)}
    assert setup.train_batch(ids, {s: 0.0 for s in ids}, missing, versions).old_log_probs is None
