"""The driver's truth about every sequence of a real run: tokens and behaviour log-probs, which
device runs it, and what each sample produced (response, version, judge prompt, reward).

Owns `Tokens` (a sequence's generated token ids with their behaviour log-probs as one immutable
record: slicing or copying cannot drop the log-probs, as it could on a list subclass) and
`SequenceLedger`. The engines hand tokens over as `protocol.TokensSoFar` (abort results,
completions) and `protocol.TokenDeltas` (each poll's new tokens); `Tokens.of` converts at the
boundary and `Tokens.for_engine` converts back for a resume request.

Cost (why the ledger appends): every poll of every device brings the new tokens of all its live
sequences. The ledger appends them in place to the sequence's log (`fold`), so a pass over the
polls costs the new tokens, not the tokens so far (a copy of the whole record per poll is
quadratic in the response length: `python -m pivotrl.bench bookkeeping`). The log is private: what
leaves the ledger is a `Tokens` copy (`so_far`), made once per resume.

Rules:
- A sequence's tokens never shrink: an abort result shorter than what the ledger holds is ignored.
- Log-probs are all known or unknown (None), never partial: appending a delta without them makes
  the whole record unknown.
- A completion is accepted only from the device the ledger last placed that sequence on, and a
  poll's new tokens only from the device it runs on.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable

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
        return cls(tuple(map(int, tokens)), None if lp is None else tuple(map(float, lp)))

    def join(self, delta: "Tokens") -> "Tokens":
        """`self + delta`; log-probs known only if both parts' are (empty `self` is known)."""
        a = self.logprobs if self.ids else ()
        lp = None if a is None or delta.logprobs is None else (*a, *delta.logprobs)
        return Tokens((*self.ids, *delta.ids), lp)

    def for_engine(self) -> Any:
        """The engine protocol's `TokensSoFar` (for a resume request)."""
        from pivotrl.engines.protocol import TokensSoFar

        return TokensSoFar(list(self.ids), None if self.logprobs is None else list(self.logprobs))


class _Log:
    """One sequence's tokens as the ledger grows them: appended in place (`Tokens` rules)."""

    __slots__ = ("ids", "logprobs")

    def __init__(self, toks: Tokens = Tokens()) -> None:
        self.ids = array("q", toks.ids)
        self.logprobs: array | None = None if toks.logprobs is None else array("d", toks.logprobs)

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, ids: Iterable[int], logprobs: Iterable[float] | None) -> None:
        if not self.ids:  # an empty record is known: the delta decides
            self.logprobs = array("d")
        self.ids.extend(ids)
        if logprobs is None:
            self.logprobs = None
        elif self.logprobs is not None:
            self.logprobs.extend(logprobs)

    def frozen(self) -> Tokens:
        return Tokens(tuple(self.ids), None if self.logprobs is None else tuple(self.logprobs))


_EMPTY = _Log()


@dataclass
class SequenceLedger:
    """Every live and finished sequence of the run, per role (sample ids are global)."""

    logs: dict[Role, dict[int, _Log]] = field(default_factory=lambda: {r: {} for r in INFERENCE_ROLES})
    """role -> seq id -> its tokens so far (private records: read them through `so_far`/`length`)."""
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

    def so_far(self, role: Role, seq_id: int) -> Tokens:
        """The sequence's tokens so far (a copy: for a resume request)."""
        return self.logs[role].get(seq_id, _EMPTY).frozen()

    def length(self, role: Role, seq_id: int) -> int:
        return len(self.logs[role].get(seq_id, _EMPTY))

    def fold(self, role: Role, device: int, deltas: Any) -> int:
        """Append a poll's `protocol.TokenDeltas` from `device` to the sequences placed there;
        returns the new tokens counted (others' are dropped: a poll that straddled an abort)."""
        placed, logs, unknown = self.placed[role], self.logs[role], deltas.unknown
        ids, lps = deltas.ids, deltas.logprobs
        new = start = 0
        for sid, end in zip(deltas.seq_ids, deltas.ends):
            if placed.get(sid) == device:
                log = logs.get(sid)
                if log is None:
                    log = logs[sid] = _Log()
                log.extend(ids[start:end], None if sid in unknown else lps[start:end])
                new += end - start
            start = end
        return new

    def progress(self, role: Role, seq_id: int, delta: Tokens, device: int) -> int:
        """Fold one sequence's delta from `device`; returns the new tokens counted (0 if the
        sequence is no longer placed there)."""
        if self.placed[role].get(seq_id) != device:
            return 0
        self.logs[role].setdefault(seq_id, _Log()).extend(delta.ids, delta.logprobs)
        return len(delta)

    def aborted(self, role: Role, seq_id: int, toks: Tokens) -> None:
        """An abort returned `toks`: keep the longer of it and what the ledger holds."""
        if len(toks) >= self.length(role, seq_id):
            self.logs[role][seq_id] = _Log(toks)
        self.unplace(role, seq_id)

    def unplace(self, role: Role, seq_id: int) -> None:
        """The sequence no longer runs anywhere (aborted; its tokens stay)."""
        self.placed[role].pop(seq_id, None)

    def place(self, role: Role, seq_id: int, device: int) -> bool:
        """A sequence was submitted to `device`; returns whether it resumes with tokens."""
        self.placed[role][seq_id] = device
        return self.length(role, seq_id) > 0

    def accept(self, role: Role, seq_id: int, device: int, toks: Tokens) -> bool:
        """A completion from `device`: accepted (and the sequence unplaced) only if the ledger
        placed it there."""
        if self.placed[role].get(seq_id) != device:
            return False
        del self.placed[role][seq_id]
        self.logs[role][seq_id] = _Log(toks)
        return True

    def lost(self, role: Role, device: int) -> list[int]:
        """Unplace and return the sequences that ran on `device` (it died): their tokens stay."""
        ids = sorted(sid for sid, d in self.placed[role].items() if d == device)
        for sid in ids:
            del self.placed[role][sid]
        return ids

    def counts(self) -> dict[Role, dict[int, int]]:
        """role -> seq id -> generated tokens, of the running sequences (the controller's progress)."""
        return {r: {sid: self.length(r, sid) for sid in self.placed[r]} for r in INFERENCE_ROLES}

    def running(self) -> bool:
        return any(self.placed[r] for r in INFERENCE_ROLES)
