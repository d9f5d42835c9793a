"""Behaviour log-probs through the local runtime: a device's poll deltas and abort results carry
them, the driver's token bookkeeping (`join_tokens`) and resume requests keep them, and the train
batch (`LocalSetup.train_batch`) turns them into `TrainBatch.old_log_probs` that equal the
trainer's own log-probs of the same on-policy samples. Real CPU engine, real device worker (its
body, without Ray), real trainer; tiny random models."""
from __future__ import annotations

import time

import pytest
import torch

from pivotrl.core.types import Role
from pivotrl.engines.protocol import TokensSoFar, logprobs_of
from pivotrl.runtime.local import join_tokens

from tests.e2e.conftest import make_local_cfg

torch.set_num_threads(1)

TEMP = 0.8


@pytest.fixture
def setup(tiny_assets, tmp_path):
    """A `LocalSetup` with its prompts encoded (what `start()` does before Ray is needed)."""
    from pivotrl.rl.data import load_examples
    from pivotrl.runtime.local_setup import LocalPrompts, LocalSetup

    cfg = make_local_cfg(tiny_assets, "pivot", [f"algo.rollout_temperature={TEMP}", "data.max_response_length=160"])
    s = LocalSetup(cfg, tmp_path)
    from pivotrl.models.tokenizer import load_tokenizer

    s.tok = load_tokenizer(tiny_assets["policy"])
    s.max_response = 160  # long enough that sequences are still in flight at the first polls
    s.train_examples = load_examples(tiny_assets["train"])
    s.prompt_ids = [s._encode(e.prompt) for e in s.train_examples]
    s.source = LocalPrompts(s.prompt_ids, s.P)
    return s


def test_join_tokens_keeps_logprobs_only_when_all_known():
    a = join_tokens(None, TokensSoFar([1, 2], [-0.1, -0.2]))
    b = join_tokens(a, TokensSoFar([3], [-0.3]))
    assert b == [1, 2, 3] and b.logprobs == [-0.1, -0.2, -0.3]
    assert join_tokens(b, [4]).logprobs is None  # a delta without log-probs: unknown, never partial
    assert join_tokens([5], TokensSoFar([6], [-1.0])).logprobs is None
    assert join_tokens([], TokensSoFar([6], [-1.0])).logprobs == [-1.0]


def test_device_poll_and_abort_carry_logprobs_into_train_batch(setup, tiny_assets):
    """Drive a real device worker the way `local.py` does: submit, poll deltas, abort, resume on
    the same device, complete; the assembled batch's old_log_probs equal the trainer's."""
    from pivotrl.config.engine import EngineConfig
    from pivotrl.config.trainer import TrainerConfig
    from pivotrl.engines.trainer import Trainer
    from pivotrl.runtime.device import DeviceWorker
    from pivotrl.runtime.roles import RoleSpec

    # The device steps on its own thread: on an overloaded machine every sequence can finish before
    # the first poll shows one in flight. Retry on a fresh device rather than flake.
    for _attempt in range(3):
        dev = DeviceWorker(0, threads=1)
        try:
            dev.shift_up(RoleSpec(Role.ROLLOUT, "policy", str(tiny_assets["policy"]),
                                  engine=EngineConfig(name="cpu", num_threads=1)))
            n = setup.P * setup.G
            tokens: dict[int, list[int]] = {}
            responses, logprobs, versions = {}, {}, {}
            dev.submit([setup.request(Role.ROLLOUT, sid, [], None) for sid in range(n)])
            deadline = time.monotonic() + 60
            aborted_once = False
            while len(responses) < n and time.monotonic() < deadline:
                res = dev.poll(0.002)  # short: on a quiet machine a whole batch can finish within a 50 ms poll
                for sid, delta in res.progress.items():
                    assert isinstance(delta, TokensSoFar) and len(delta.logprobs) == len(delta)
                    tokens[sid] = join_tokens(tokens.get(sid), delta)
                for c in res.completions:
                    responses[c.seq_id], logprobs[c.seq_id], versions[c.seq_id] = c.token_ids, c.logprobs, c.version
                live = [sid for sid in tokens if sid not in responses and len(tokens[sid]) >= 1]
                if not aborted_once and live:
                    out = dev.abort(live)
                    for c in out.finished:
                        responses[c.seq_id], logprobs[c.seq_id], versions[c.seq_id] = c.token_ids, c.logprobs, c.version
                    for sid, toks in out.aborted.items():
                        assert toks.logprobs is not None and len(toks.logprobs) == len(toks)
                        assert toks[:len(tokens[sid])] == tokens[sid]
                        tokens[sid] = TokensSoFar(toks, logprobs_of(toks))
                    reqs = [setup.request(Role.ROLLOUT, sid, tokens[sid], None) for sid in out.aborted]
                    assert all(r.generated_logprobs == tokens[r.seq_id].logprobs for r in reqs)
                    dev.submit(reqs)
                    aborted_once = bool(out.aborted)
            assert sorted(responses) == list(range(n))
        finally:
            dev.close()
        if aborted_once:
            break
    assert aborted_once, "no sequence was in flight long enough to abort (3 attempts)"

    ids = list(range(n))
    batch = setup.train_batch(ids, {s: float(s % 2) for s in ids}, responses, versions, logprobs)
    assert batch.old_log_probs is not None
    assert [len(x) for x in batch.old_log_probs] == [len(r) for r in batch.response_ids]
    with Trainer(TrainerConfig(world_size=1, lr=1e-4, logprob_temperature=TEMP, micro_batch_size=64,
                               num_threads=1), str(tiny_assets["policy"])) as tr:
        ref = tr.compute_log_probs(batch)
    for got, want in zip(batch.old_log_probs, ref):
        assert got == pytest.approx(want, abs=2e-4)

    # one sample without log-probs: the whole batch falls back (no mix), and a wrong length is an error
    missing = {**logprobs, 0: None}
    assert setup.train_batch(ids, {s: 0.0 for s in ids}, responses, versions, missing).old_log_probs is None
    bad = {**logprobs, 1: logprobs[1] + [-1.0]}
    with pytest.raises(ValueError, match="sample 1"):
        setup.train_batch(ids, {s: 0.0 for s in ids}, responses, versions, bad)
