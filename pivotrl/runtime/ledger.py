"""The driver's truth about every sequence of a real run: tokens and behaviour log-probs, which
device runs it, and what each sample produced (response, version, judge prompt, reward).

Owns `Tokens` (a sequence's generated token ids with their behaviour log-probs as one immutable
record: slicing or copying cannot drop the log-probs, as it could on a list subclass) and
`SequenceLedger`. The engines still hand tokens over as `protocol.TokensSoFar`; `Tokens.of`
converts at the boundary and `Tokens.for_engine` converts back for a resume request.

Rules:
- A sequence's tokens never shrink: an abort result shorter than what the ledger holds is ignored.
- Log-probs are all known or unknown (None), never partial: joining a delta without them makes the
  whole record unknown.
- A completion is accepted only from the device the ledger last placed that sequence on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pivotrl.core.types import INFERENCE_ROLES, Role


@dataclass(frozen=True)
class Tokens:
    """Generated token ids and their behaviour log-probs (None: unknown)."""

    ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] | None = ()

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.ids):
            raise ValueError(f"Tokens: {len(self.logprobs)} log-probs for {len(self.ids)} tokens")

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def of(cls, tokens: Any, logprobs: Any = "from-tokens") -> "Tokens":
        """From an engine's token list (a `TokensSoFar` carries its log-probs; a plain list has
        none) or explicit `logprobs`."""
        from pivotrl.engines.protocol import logprobs_of

        lp = logprobs_of(tokens) if isinstance(logprobs, str) else logprobs
        return cls(tuple(int(t) for t in tokens), None if lp is None else tuple(float(x) for x in lp))

    def join(self, delta: "Tokens") -> "Tokens":
        """`self + delta`; log-probs known only if both parts' are (empty `self` is known)."""
        a = self.logprobs if self.ids else ()
        lp = None if a is None or delta.logprobs is None else (*a, *delta.logprobs)
        return Tokens((*self.ids, *delta.ids), lp)

    def for_engine(self) -> Any:
        """The engine protocol's `TokensSoFar` (for a resume request)."""
        from pivotrl.engines.protocol import TokensSoFar

        return TokensSoFar(list(self.ids), None if self.logprobs is None else list(self.logprobs))


@dataclass
class SequenceLedger:
    """Every live and finished sequence of the run, per role (sample ids are global)."""

    tokens: dict[Role, dict[int, Tokens]] = field(default_factory=lambda: {r: {} for r in INFERENCE_ROLES})
    placed: dict[Role, dict[int, int]] = field(default_factory=lambda: {r: {} for r in INFERENCE_ROLES})
    """role -> seq id -> the device its engine runs on (only while running)."""
    responses: dict[int, Tokens] = field(default_factory=dict)
    """sample id -> the finished rollout (its log-probs become `TrainBatch.old_log_probs`)."""
    versions: dict[int, int] = field(default_factory=dict)
    """sample id -> the policy version that generated it."""
    judge_ids: dict[int, list[int]] = field(default_factory=dict)
    """sample id -> the GenRM prompt built from its response."""
    rewards: dict[int, Any] = field(default_factory=dict)
    """sample id -> its `RewardBreakdown`."""

    def progress(self, role: Role, seq_id: int, delta: Tokens, device: int) -> int:
        """Fold a poll's delta of a sequence running on `device`; returns the new tokens counted
        (0 if the sequence is no longer placed there)."""
        if self.placed[role].get(seq_id) != device:
            return 0
        self.tokens[role][seq_id] = self.tokens[role].get(seq_id, Tokens()).join(delta)
        return len(delta)

    def aborted(self, role: Role, seq_id: int, toks: Tokens) -> None:
        """An abort returned `toks`: keep the longer of it and what the ledger holds."""
        if len(toks) >= len(self.tokens[role].get(seq_id, ())):
            self.tokens[role][seq_id] = toks
        self.unplace(role, seq_id)

    def unplace(self, role: Role, seq_id: int) -> None:
        """The sequence no longer runs anywhere (aborted; its tokens stay)."""
        self.placed[role].pop(seq_id, None)

    def place(self, role: Role, seq_id: int, device: int) -> bool:
        """A sequence was submitted to `device`; returns whether it resumes with tokens."""
        self.placed[role][seq_id] = device
        return bool(self.tokens[role].get(seq_id))

    def accept(self, role: Role, seq_id: int, device: int, toks: Tokens) -> bool:
        """A completion from `device`: accepted (and the sequence unplaced) only if the ledger
        placed it there."""
        if self.placed[role].get(seq_id) != device:
            return False
        del self.placed[role][seq_id]
        self.tokens[role][seq_id] = toks
        return True

    def lost(self, role: Role, device: int) -> list[int]:
        """Unplace and return the sequences that ran on `device` (it died): their tokens stay."""
        ids = sorted(sid for sid, d in self.placed[role].items() if d == device)
        for sid in ids:
            del self.placed[role][sid]
        return ids

    def counts(self) -> dict[Role, dict[int, int]]:
        """role -> seq id -> generated tokens, of the running sequences (the controller's progress)."""
        return {r: {sid: len(self.tokens[r].get(sid, ())) for sid in self.placed[r]} for r in INFERENCE_ROLES}

    def running(self) -> bool:
        return any(self.placed[r] for r in INFERENCE_ROLES)
