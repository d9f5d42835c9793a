"""The inference-engine protocol shared by rollout (policy) and reward (GenRM) replicas.

Owns: `SamplingParams` (validated), the request/completion/stats types and the `InferenceEngine`
Protocol that every engine (`cpu_engine.CPUEngine`, `vllm_engine.VLLMEngine`) implements. Knows
nothing about any model library: no torch or vLLM import here, so the control plane can type
against it.

Driving model. An engine is a synchronous object. A driver `submit`s requests, then calls `step()`
until `has_unfinished()` is false, collecting the `Completion`s each `step()` returns. A plain
loop does that directly (`generate(requests)` is the convenience); a Ray actor does the same from
its own thread and answers `abort` / `stats` / `snapshot` calls between steps. What one `step()`
means is engine-specific: one batched decode iteration for the CPU engine, "wait up to `timeout`
seconds for the background vLLM loop to make progress" for vLLM.

Abort and resume (DESIGN.md §4.2). `abort(seq_ids)` stops sequences and returns the tokens each
had generated so far; nothing is lost. Submitting a `GenerationRequest` with `generated=` those
tokens resumes it: the engine re-prefills `prompt + generated` (counted in
`Completion.reprefill_tokens` and `EngineStats.reprefill_tokens`) and continues. `max_tokens` is
the budget of the whole response, so a resumed sequence generates at most
`max_tokens - len(generated)` more tokens. Under greedy decoding the resumed continuation equals
an uninterrupted run (tests/engines assert it).

Behaviour log-probs (what PPO's importance ratio needs, DESIGN.md §4.2 staleness). Every
`Completion` carries `logprobs`: for each generated token, its log-probability under the
distribution the engine sampled it from, taken as `log_softmax(logits / T)` at that token, where
`T` is the request's temperature, or 1 for greedy requests (temperature 0: the model's own
distribution, whose argmax was taken). This is the same quantity the trainer recomputes with
`TrainerSpec.logprob_temperature = T` (the runtime sets it to the rollout temperature), so an
on-policy sample has ratio exactly 1 up to float error, and a stale one has the true ratio
pi_current / pi_behaviour. It is taken *before* top-p truncation, like the trainer's: with
`top_p < 1` the CPU engine's value is the full tempered softmax, while vLLM (`processed_logprobs`)
reports the nucleus-renormalised one; the runtime's rollouts use `top_p = 1`, where both agree.
`abort` / `snapshot` return each sequence's tokens as a `TokensSoFar` (a `list[int]`, so callers
that only want tokens are unchanged) whose `.logprobs` holds the matching log-probs; a resume
passes them back as `GenerationRequest.generated_logprobs`, and the completion's list then covers
the whole response. A resume without them (None) yields `Completion.logprobs = None` (unknown).

Weights. `load_weights(state_dict, version)` replaces the weights in place and tags later tokens
with `version`. It does not abort running sequences: their cached keys/values were computed under
the old weights. A caller that needs every token under one version aborts first and resumes after
(that is what the runtime does on a policy update).

Throughput model. `stats()` reports running sequences N, KV tokens K and free KV capacity, and the
per-iteration samples `(N, K, seconds)` from which `tau = A*K + max(B, C*N) + D` is fitted
(DESIGN.md §4.1), plus prefill samples `(L, seconds)` for `P0 + P1*L + P2*L^2`. A sample's seconds
are the wall time the replica spent, not only its model call: an iteration's is the time since the
previous iteration ended while the batch stayed busy, less prefills recorded in between (the CPU
engine: see its module docstring; vLLM: the time between consecutive iteration stats), so a fitted
model predicts what a replica delivers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol, runtime_checkable

FINISH_STOP = "stop"
"""A stop token (or the model's EOS) was sampled; it is the last token of `Completion.token_ids`."""
FINISH_LENGTH = "length"
"""`max_tokens` (or the model's context length) was reached."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one sequence. Validated on construction; errors name the field and range."""

    temperature: float = 1.0
    """Softmax temperature, >= 0. 0 means greedy (argmax), which is deterministic."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]. 1 keeps the whole distribution."""
    max_tokens: int = 256
    """Most tokens in the whole response (including tokens generated before an abort), >= 1."""
    seed: int | None = None
    """Per-sequence sampling seed; None draws from the engine's own generator."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the sequence (kept as its last token). The model's EOS always stops too,
    unless `ignore_eos`."""
    ignore_eos: bool = False
    """Keep generating past EOS / stop tokens until `max_tokens` (fixed-length benchmarks)."""

    def __post_init__(self) -> None:
        t = self.temperature
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        p = self.top_p
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not (0.0 < p <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {p!r}")
        m = self.max_tokens
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an integer >= 1, got {m!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or self.seed < 0):
            raise ValueError(f"SamplingParams.seed must be None or an integer >= 0, got {self.seed!r}")
        stops = tuple(self.stop_token_ids)
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in stops):
            raise ValueError(f"SamplingParams.stop_token_ids must be non-negative integers, got {stops!r}")
        object.__setattr__(self, "stop_token_ids", stops)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class TokensSoFar(list):
    """Tokens a live or aborted sequence has generated (a plain `list[int]` to anyone who only
    wants tokens), with `.logprobs`: their behaviour log-probs (same length), or None when unknown
    (a resume that came without them). A list subclass so `abort()` / `snapshot()` keep their
    `dict[int, list[int]]` contract; it pickles with its `.logprobs` (Ray actors return it)."""

    def __init__(self, tokens: Iterable[int] = (), logprobs: Iterable[float] | None = None) -> None:
        super().__init__(int(t) for t in tokens)
        self.logprobs: list[float] | None = None if logprobs is None else [float(x) for x in logprobs]
        if self.logprobs is not None and len(self.logprobs) != len(self):
            raise ValueError(f"TokensSoFar: {len(self.logprobs)} log-probs for {len(self)} tokens")


def logprobs_of(tokens: list[int]) -> list[float] | None:
    """The `.logprobs` of a `TokensSoFar` (None for a plain list or when unknown)."""
    return getattr(tokens, "logprobs", None)


@dataclass
class GenerationRequest:
    """One sequence to run: a fresh one (`generated` empty) or a resumed one."""

    seq_id: int
    """Caller's id, unique among the engine's live sequences."""
    prompt_ids: list[int]
    """Prompt token ids (non-empty)."""
    params: SamplingParams = field(default_factory=SamplingParams)
    """Sampling parameters; `max_tokens` counts `generated` too."""
    generated: list[int] = field(default_factory=list)
    """Tokens generated before an abort; the engine re-prefills `prompt_ids + generated`."""
    resumed: bool | None = None
    """Whether this is a resume (counts its prefill as re-prefill). None: True iff `generated`."""
    generated_logprobs: list[float] | None = None
    """Behaviour log-probs of `generated` (same length), kept across the abort; None when unknown
    (then the completion's `logprobs` is None). Taken from `generated.logprobs` when `generated`
    is a `TokensSoFar` and this is not given."""

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"GenerationRequest.prompt_ids of seq {self.seq_id} must be non-empty")
        if self.generated_logprobs is None:
            self.generated_logprobs = logprobs_of(self.generated)
        if not self.generated and self.generated_logprobs is None:
            self.generated_logprobs = []  # a fresh sequence: nothing unknown
        self.prompt_ids = [int(t) for t in self.prompt_ids]
        self.generated = [int(t) for t in self.generated]
        if self.generated_logprobs is not None:
            self.generated_logprobs = [float(x) for x in self.generated_logprobs]
            if len(self.generated_logprobs) != len(self.generated):
                raise ValueError(f"GenerationRequest.generated_logprobs of seq {self.seq_id} has "
                                 f"{len(self.generated_logprobs)} entries, generated has {len(self.generated)}")
        if self.resumed is None:
            self.resumed = bool(self.generated)

    @property
    def remaining(self) -> int:
        """Tokens still allowed by `max_tokens`."""
        return max(0, self.params.max_tokens - len(self.generated))


@dataclass
class Completion:
    """A finished sequence."""

    seq_id: int
    prompt_ids: list[int]
    token_ids: list[int]
    """The whole response, including tokens generated before any abort."""
    finish_reason: str
    """`stop` or `length`."""
    version: int
    """Weights version of the engine when this (last) segment was admitted."""
    reprefill_tokens: int = 0
    """Tokens re-prefilled because this segment was a resume (prompt + earlier tokens)."""
    logprobs: list[float] | None = None
    """Behaviour log-prob of each of `token_ids` (module docstring: `log_softmax(logits / T)`),
    including tokens before any abort; None when a resume came without them."""


@dataclass(frozen=True)
class IterationSample:
    """One decode iteration: `num_seqs` sequences holding `kv_tokens` took `seconds` of the
    replica's wall time (from the end of the previous iteration while busy, prefills excluded:
    see the module docstring's "Throughput model")."""

    num_seqs: int
    kv_tokens: int
    seconds: float


@dataclass(frozen=True)
class PrefillSample:
    """One prefill of `tokens` prompt tokens (summed over the sequences admitted together)."""

    tokens: int
    num_seqs: int
    seconds: float


@dataclass
class EngineStats:
    """A snapshot of an engine's load, and the timing samples gathered since the last `stats()`."""

    running: int
    """N: sequences admitted and decoding."""
    waiting: int
    """Sequences submitted but not yet admitted (no capacity yet)."""
    kv_tokens: int
    """K: tokens held in KV cache by the running sequences."""
    kv_capacity_tokens: int
    """Total KV cache capacity in tokens."""
    version: int
    """Current weights version."""
    memory_released: bool = False
    """True between `release_memory()` and `reacquire_memory()`."""
    generated_tokens: int = 0
    """Tokens generated since the engine started."""
    reprefill_tokens: int = 0
    """Tokens re-prefilled by resumes since the engine started."""
    iterations: list[IterationSample] = field(default_factory=list)
    """Decode iteration samples since the previous `stats(drain=True)`."""
    prefills: list[PrefillSample] = field(default_factory=list)
    """Prefill samples since the previous `stats(drain=True)`."""

    @property
    def free_kv_tokens(self) -> int:
        return max(0, self.kv_capacity_tokens - self.kv_tokens)


@runtime_checkable
class InferenceEngine(Protocol):
    """What the runtime needs from one inference replica (rollout or reward)."""

    name: str
    tensor_parallel_size: int
    """Devices this engine runs across (its tensor-parallel ranks), as the engine itself reports it."""

    def submit(self, request: GenerationRequest) -> None:
        """Queue a sequence (fresh or resumed). Raises ValueError for a duplicate live seq_id or a
        prompt longer than the model's context."""
        ...

    def step(self, timeout: float | None = None) -> list[Completion]:
        """Make progress and return the sequences that finished since the last call."""
        ...

    def has_unfinished(self) -> bool:
        """Whether any submitted sequence has not yet been returned by `step()`."""
        ...

    def snapshot(self, seq_ids: Iterable[int] | None = None) -> dict[int, list[int]]:
        """Tokens generated so far by live sequences (streaming view; does not stop them), each a
        `TokensSoFar` carrying its log-probs."""
        ...

    def abort(self, seq_ids: Iterable[int] | None = None) -> dict[int, list[int]]:
        """Stop the given live sequences (all when None); return their tokens so far (each a
        `TokensSoFar` carrying its log-probs, for the resume). Sequences that
        already finished (completion not yet collected) are not aborted and stay collectable."""
        ...

    def generate(self, requests: Iterable[GenerationRequest]) -> list[Completion]:
        """Submit `requests`, run to completion, return their completions in request order."""
        ...

    def load_weights(self, state_dict: Mapping[str, object], version: int) -> None:
        """Replace the weights in place (full or partial state dict, HF parameter names)."""
        ...

    def stats(self, drain: bool = True) -> EngineStats:
        """Load and timing samples; `drain` clears the samples so each is reported once."""
        ...

    def release_memory(self, level: int = 2) -> None:
        """Free device memory for a role shift. Raises if sequences are live (abort first).
        `level` as vLLM's sleep: 1 keeps the weights in host memory (a frozen model: they come
        back in place), 2 discards them (the policy: the next version comes from GPS)."""
        ...

    def reacquire_memory(self, state_dict: Mapping[str, object] | None = None,
                         version: int | None = None) -> dict[str, float]:
        """Undo `release_memory`; returns the seconds of each phase. Weights come from
        `state_dict` (a GPS read, tagged `version`), else after a level-1 release the kept
        weights (version unchanged), else the engine's model folder (version back to the
        initial one). A failure raises `pivotrl.engines.errors.EngineWakeError` and leaves the
        engine unusable, never serving half-loaded weights."""
        ...

    def shutdown(self) -> None:
        """Stop background work and free everything. Idempotent."""
        ...


def run_to_completion(engine: InferenceEngine, requests: Iterable[GenerationRequest],
                      timeout: float | None = None) -> list[Completion]:
    """Shared `generate()` body: submit, step until these requests finish, return in order.

    Completions of other sequences that finish meanwhile are dropped by this helper, so callers
    mixing `generate` with their own `submit`/`step` should not do that."""
    reqs = list(requests)
    ids = [r.seq_id for r in reqs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"generate(): duplicate seq_id in requests: {ids}")
    for r in reqs:
        engine.submit(r)
    done: dict[int, Completion] = {}
    while len(done) < len(reqs):
        for c in engine.step(timeout):
            done[c.seq_id] = c
        if len(done) < len(reqs) and not engine.has_unfinished():
            missing = sorted(set(ids) - set(done))
            raise RuntimeError(f"generate(): engine {engine.name} has no work left but seqs {missing} "
                               "never finished (aborted from another thread?)")
    return [done[i] for i in ids]
