"""The RL sample pipeline shared by every deployment mode, and its staleness bound.

Owns: batches of prompts -> G rollout sequences per prompt -> one GenRM sequence per finished
response (none for a response whose judge prompt repeats an earlier one of its batch: it shares
that one's judgement) -> rewarded samples -> a full training batch; policy versions; the staleness
rule. Knows nothing about devices, replicas or time (the controllers do), and nothing about how
long anything is before an event says so.

Staleness. Training step `t` consumes batch `t` and turns policy version `t` into `t+1`. Every
rollout sequence is stamped with the policy version current when its batch is released, and
versions only grow, so releasing batch `b` only while `b - version <= staleness` guarantees that a
sample generated under version `v` is trained at step `t = b` with `t - v <= staleness`.
`train()` re-checks the bound on every sample and raises if it were ever broken.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from pivotrl.core.types import Role, Sequence

#: Finished sequences whose lengths are kept per kind (response, judgement): what a sequence in
#: flight is expected to reach is estimated from them (elastic training's backlog).
LENGTH_SAMPLE = 4096


class PromptLike(Protocol):
    prompt_id: int
    batch: int
    prompt_len: int


class PromptSource(Protocol):
    """What a data loader gives the controller: the prompts (token counts) of a batch."""

    def prompts(self, batch: int) -> list[PromptLike]: ...


@dataclass
class BatchState:
    batch: int
    version: int
    released_at: float
    prompt_len: dict[int, int] = field(default_factory=dict)     # sample -> prompt tokens
    response_len: dict[int, int] = field(default_factory=dict)   # sample -> response tokens
    genrm_len: dict[int, int] = field(default_factory=dict)      # sample -> judgement tokens
    shared: dict[int, int] = field(default_factory=dict)         # sample -> the sample whose judgement it shares
    waiting: dict[int, list[int]] = field(default_factory=dict)  # judged sample -> samples waiting to share it
    rollout_done_at: float | None = None
    reward_done_at: float | None = None
    train_start: float | None = None
    train_end: float | None = None
    trained: bool = False


class SamplePipeline:
    """Batches, samples and versions of one run."""

    def __init__(self, prompts_per_step: int, group_size: int, steps: int, staleness: int) -> None:
        if staleness < 0:
            raise ValueError(f"deploy.staleness must be >= 0, got {staleness}")
        self.P, self.G, self.steps, self.staleness = prompts_per_step, group_size, steps, staleness
        self.version = 0
        self.next_release = 0
        self.batches: dict[int, BatchState] = {}
        self.trained_samples = 0
        self.trained_tokens = 0
        """Policy + GenRM tokens of the trained batches (the run's processed tokens so far)."""
        # the last finished sequences' lengths, for what a sequence in flight is expected to reach
        self._done: dict[str, deque[int]] = {"response": deque(maxlen=LENGTH_SAMPLE),
                                             "genrm": deque(maxlen=LENGTH_SAMPLE)}

    def resume(self, version: int) -> None:
        """Start at policy `version`, as a fresh pipeline would be after `version` trained steps:
        batches before it count as trained and the next release is batch `version`."""
        if self.batches or self.version:
            raise RuntimeError("resume() is only for a pipeline that has not started")
        if not 0 <= version < self.steps:
            raise ValueError(f"resume version {version} outside [0, train.steps={self.steps})")
        self.version = self.next_release = int(version)

    @property
    def samples_per_batch(self) -> int:
        return self.P * self.G

    def batch_of(self, sample_id: int) -> int:
        return sample_id // self.samples_per_batch

    # -- release ---------------------------------------------------------------------------
    def can_release(self) -> bool:
        b = self.next_release
        return b < self.steps and b - self.version <= self.staleness

    def release(self, prompts: list[PromptLike], now: float) -> list[Sequence]:
        """Rollout sequences of the next batch, stamped with the current policy version."""
        b = self.next_release
        if not self.can_release():
            raise RuntimeError(f"batch {b} may not be released at version {self.version} "
                               f"(staleness {self.staleness}, steps {self.steps})")
        if len(prompts) != self.P:
            raise ValueError(f"prompt source gave {len(prompts)} prompts for batch {b}, expected {self.P}")
        st = BatchState(b, self.version, now)
        seqs = []
        for p in prompts:
            for i in range(self.G):
                sid = b * self.samples_per_batch + p.prompt_id * self.G + i
                st.prompt_len[sid] = int(p.prompt_len)
                seqs.append(Sequence(seq_id=sid, role=Role.ROLLOUT, prompt_len=int(p.prompt_len),
                                     sample_id=sid, version=self.version, step=b))
        self.batches[b] = st
        self.next_release += 1
        return seqs

    # -- progress --------------------------------------------------------------------------
    def response_done(self, sample_id: int, generated: int, now: float, shares_judgement_of: int = -1
                      ) -> Sequence | None:
        """Record a finished response; returns its GenRM sequence (input = prompt + response), or
        None when it shares the judgement of `shares_judgement_of`, an earlier finished sample of
        its batch (`SequenceFinished.shares_judgement_of`): its judgement is recorded when that
        one's is, or now if that one's is done (then `batch_ready` may have just become true)."""
        st = self.batches[self.batch_of(sample_id)]
        if sample_id in st.response_len:
            raise RuntimeError(f"sample {sample_id}: response finished twice")
        lead = int(shares_judgement_of)
        if lead >= 0 and (lead == sample_id or self.batch_of(lead) != st.batch or lead not in st.response_len
                          or lead in st.shared):
            raise RuntimeError(f"sample {sample_id} cannot share the judgement of sample {lead}: it must be "
                               f"another finished sample of batch {st.batch} that is judged on its own")
        st.response_len[sample_id] = int(generated)
        self._done["response"].append(int(generated))
        if len(st.response_len) == self.samples_per_batch:
            st.rollout_done_at = now
        if lead >= 0:
            st.shared[sample_id] = lead
            if lead in st.genrm_len:
                self._judged(st, sample_id, st.genrm_len[lead], now)
            else:
                st.waiting.setdefault(lead, []).append(sample_id)
            return None
        return Sequence(seq_id=sample_id, role=Role.REWARD, prompt_len=st.prompt_len[sample_id] + int(generated),
                        sample_id=sample_id, version=st.version, step=st.batch)

    def rollouts_complete(self, batch: int) -> bool:
        st = self.batches.get(batch)
        return st is not None and len(st.response_len) == self.samples_per_batch

    def reward_done(self, sample_id: int, generated: int, now: float) -> bool:
        """Record a finished judgement, and the samples that share it; True when it completes its batch."""
        st = self.batches[self.batch_of(sample_id)]
        if sample_id in st.genrm_len:
            raise RuntimeError(f"sample {sample_id}: reward finished twice")
        if sample_id not in st.response_len or sample_id in st.shared:
            raise RuntimeError(f"sample {sample_id}: rewarded before its response finished, or it shares a judgement")
        self._done["genrm"].append(int(generated))
        for s in [sample_id, *st.waiting.pop(sample_id, [])]:
            self._judged(st, s, generated, now)
        return len(st.genrm_len) == self.samples_per_batch

    def _judged(self, st: BatchState, sample_id: int, generated: int, now: float) -> None:
        st.genrm_len[sample_id] = int(generated)
        if len(st.genrm_len) == self.samples_per_batch:
            st.reward_done_at = now

    def batch_ready(self, batch: int) -> bool:
        st = self.batches.get(batch)
        return st is not None and len(st.genrm_len) == self.samples_per_batch

    # -- training --------------------------------------------------------------------------
    @property
    def next_train_batch(self) -> int:
        """Training step `t` consumes batch `t`; the next one is the current version."""
        return self.version

    def train_ready(self) -> bool:
        b = self.next_train_batch
        return b < self.steps and self.batch_ready(b) and not self.batches[b].trained \
            and self.batches[b].train_start is None

    def finished_lengths(self, kind: str) -> list[int]:
        """Generated tokens of the last `LENGTH_SAMPLE` finished `response`s or `genrm` judgements."""
        return list(self._done[kind])

    def ready_tokens(self) -> int:
        """Policy tokens (prompt + response) of the batch ready for training (0: none ready)."""
        if not self.train_ready():
            return 0
        st = self.batches[self.next_train_batch]
        return sum(st.prompt_len[s] + st.response_len[s] for s in st.genrm_len)

    def start_training(self, now: float) -> tuple[int, list[int], int]:
        """(batch, sample ids, policy tokens) of the next step; enforces the staleness bound."""
        b = self.next_train_batch
        if not self.train_ready():
            raise RuntimeError(f"batch {b} is not ready for training")
        st = self.batches[b]
        if b - st.version > self.staleness:
            raise RuntimeError(f"staleness violated: batch {b} generated under version {st.version}, "
                               f"bound {self.staleness}")
        st.train_start = now
        ids = sorted(st.genrm_len)
        tokens = sum(st.prompt_len[s] + st.response_len[s] for s in ids)
        return b, ids, tokens

    def training_done(self, batch: int, now: float) -> dict[str, float]:
        """Advance the version; returns the step's figures for metrics.jsonl."""
        st = self.batches[batch]
        if batch != self.version or st.trained:
            raise RuntimeError(f"training of batch {batch} done out of order (version {self.version})")
        st.trained, st.train_end = True, now
        self.version += 1
        self.trained_samples += len(st.genrm_len)
        ids = st.genrm_len
        policy_tokens = sum(st.prompt_len[s] + st.response_len[s] for s in ids)
        # the GenRM's work: judgements shared by identical judge prompts ran once
        genrm_tokens = sum(st.prompt_len[s] + st.response_len[s] + st.genrm_len[s] for s in ids if s not in st.shared)
        self.trained_tokens += policy_tokens + genrm_tokens
        fig = {
            "batch": batch, "generated_under_version": st.version, "samples": len(ids),
            "policy_tokens": policy_tokens, "genrm_tokens": genrm_tokens,
            "tokens": policy_tokens + genrm_tokens,
            "response_tokens_mean": sum(st.response_len[s] for s in ids) / max(len(ids), 1),
            "genrm_tokens_mean": sum(st.genrm_len[s] for s in ids) / max(len(ids), 1),
            "judgements_shared": len(st.shared),
            "released_at": st.released_at, "rollout_done_at": st.rollout_done_at,
            "reward_done_at": st.reward_done_at, "train_start": st.train_start, "train_end": now,
        }
        # memory stays flat on long runs: figures are out, drop the per-sample maps
        st.prompt_len, st.response_len, st.genrm_len, st.shared, st.waiting = {}, {}, {}, {}, {}
        return fig

    @property
    def finished(self) -> bool:
        return self.version >= self.steps
