"""The sample pipeline: release gated by staleness, each sample through each stage once."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from pivotrl.core.types import Role
from pivotrl.deploy.pipeline import SamplePipeline


@dataclass(frozen=True)
class P:
    prompt_id: int
    batch: int
    prompt_len: int


def prompts(b, n=2):
    return [P(i, b, 10 + i) for i in range(n)]


def finish_batch(pipe, b, now=1.0):
    base = b * pipe.samples_per_batch
    done = False
    for sid in range(base, base + pipe.samples_per_batch):
        rseq = pipe.response_done(sid, 5, now)
        assert rseq.role == Role.REWARD and rseq.prompt_len == pipe.batches[b].prompt_len[sid] + 5
        done = pipe.reward_done(sid, 7, now)
    return done


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_release_is_bounded_by_staleness(staleness):
    pipe = SamplePipeline(2, 3, steps=10, staleness=staleness)
    released = 0
    while pipe.can_release():
        pipe.release(prompts(pipe.next_release), 0.0)
        released += 1
    assert released == staleness + 1
    assert finish_batch(pipe, 0)
    b, ids, tokens = pipe.start_training(2.0)
    assert b == 0 and ids == list(range(6)) and tokens == sum(10 + i + 5 for i in (0, 0, 0, 1, 1, 1))
    pipe.training_done(0, 3.0)
    assert pipe.version == 1 and pipe.can_release()


def test_staleness_violation_raises():
    pipe = SamplePipeline(1, 1, steps=5, staleness=1)
    pipe.release(prompts(0, 1), 0.0)
    pipe.release(prompts(1, 1), 0.0)
    finish_batch(pipe, 0)
    finish_batch(pipe, 1)
    pipe.start_training(0.0)
    pipe.training_done(0, 1.0)
    pipe.batches[1].version = -1  # pretend batch 1 was generated two versions back
    with pytest.raises(RuntimeError, match="staleness violated"):
        pipe.start_training(2.0)


def test_duplicates_and_out_of_order_are_refused():
    pipe = SamplePipeline(1, 2, steps=3, staleness=0)
    pipe.release(prompts(0, 1), 0.0)
    with pytest.raises(RuntimeError):
        pipe.release(prompts(1, 1), 0.0)          # staleness 0: next batch waits for training
    pipe.response_done(0, 3, 0.0)
    with pytest.raises(RuntimeError, match="twice"):
        pipe.response_done(0, 3, 0.0)
    with pytest.raises(RuntimeError, match="before its response"):
        pipe.reward_done(1, 3, 0.0)
    with pytest.raises(RuntimeError, match="not ready"):
        pipe.start_training(0.0)


def test_bad_input():
    with pytest.raises(ValueError, match="staleness"):
        SamplePipeline(1, 1, 1, -1)
    pipe = SamplePipeline(2, 1, 1, 0)
    with pytest.raises(ValueError, match="expected 2"):
        pipe.release(prompts(0, 1), 0.0)


def test_shared_judgements_are_recorded_with_their_leader():
    """A response whose judge prompt repeats an earlier one of its batch gets no GenRM sequence and
    takes that one's judgement: waiting when it finishes first, at once when the judgement is done
    (then it may be what completes the batch)."""
    pipe = SamplePipeline(1, 4, steps=2, staleness=0)
    pipe.release(prompts(0, 1), 0.0)
    assert pipe.response_done(0, 5, 0.0).seq_id == 0
    assert pipe.response_done(1, 5, 0.0, shares_judgement_of=0) is None      # waits for 0's judgement
    assert pipe.response_done(2, 6, 0.0).seq_id == 2
    assert pipe.reward_done(0, 7, 1.0) is False                               # records 0 and 1
    assert pipe.batches[0].genrm_len == {0: 7, 1: 7}
    assert pipe.reward_done(2, 9, 2.0) is False
    assert not pipe.batch_ready(0)
    assert pipe.response_done(3, 6, 3.0, shares_judgement_of=2) is None      # 2 is judged: taken now
    assert pipe.batch_ready(0) and pipe.batches[0].reward_done_at == 3.0
    pipe.start_training(3.0)
    fig = pipe.training_done(0, 4.0)
    assert fig["judgements_shared"] == 2
    assert fig["genrm_tokens"] == (10 + 5 + 7) + (10 + 6 + 9)                 # what the GenRM ran
    assert fig["genrm_tokens_mean"] == (7 + 7 + 9 + 9) / 4                   # what each sample has
    assert pipe.finished_lengths("genrm") == [7, 9]


def test_a_shared_judgement_must_name_a_judged_sample_of_the_batch():
    pipe = SamplePipeline(1, 3, steps=2, staleness=1)
    pipe.release(prompts(0, 1), 0.0)
    pipe.release(prompts(1, 1), 0.0)
    pipe.response_done(0, 5, 0.0)
    pipe.response_done(1, 5, 0.0, shares_judgement_of=0)
    for sid, lead in ((2, 2), (2, 5), (2, 1), (3, 0)):   # itself, unfinished, a sharer, another batch
        with pytest.raises(RuntimeError, match="cannot share"):
            pipe.response_done(sid, 5, 0.0, shares_judgement_of=lead)
    with pytest.raises(RuntimeError, match="shares a judgement"):
        pipe.reward_done(1, 7, 0.0)
