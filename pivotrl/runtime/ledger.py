"""The driver's truth about every sequence of a real run: tokens and behaviour log-probs, which
device runs it, and what each sample produced (response, version, judge prompt, reward).

Owns `Tokens` (a sequence's generated token ids with their behaviour log-probs as one immutable
record: slicing or copying cannot drop the log-probs, as it could on a list subclass) and
`SequenceLedger`. The engines hand tokens over as `protocol.TokensSoFar` (abort results,
completions) and `protocol.TokenDeltas` (each poll's new tokens); `Tokens.of` converts at the
boundary and `Tokens.for_engine` converts back for a resume request.

Cost (why the ledger is laid out as it is): every poll of every device brings the new tokens of
all its live sequences; at paper scale 24 replicas x 256 sequences. A copy of each sequence's whole
record per poll is quadratic in the response length (0.4-1.4 s per driver pass at 1K-4K tokens),
and even an append per sequence in Python costs about a microsecond each. So an unfinished
sequence's tokens live in one row of a `_TokenRows` table (numpy blocks of rows, as wide as the
role's longest sequence), and `fold` writes a whole poll with a few vectorised operations: the
placement check, the destination of every token, one scatter. A pass over the polls costs the new
tokens, in C (`python -m pivotrl.bench bookkeeping`). What leaves the ledger is a `Tokens` copy
(`so_far`), made once per resume; a finished sequence keeps the `Tokens` of its completion.

Rules:
- A sequence's tokens never shrink: an abort result shorter than what the ledger holds is ignored.
- Log-probs are all known or unknown (None), never partial: a delta without them makes the whole
  record unknown.
- A completion is accepted only from the device the ledger last placed that sequence on, and a
  poll's new tokens only from the device it runs on.
- Sequence ids are non-negative integers (the run's sample ids, dense: they index arrays here).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pivotrl.core.types import INFERENCE_ROLES, Role

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pivotrl.engines.protocol import TokenDeltas


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
        # an engine's lists hold Python ints and floats already: copied as they are (a
        # 20K-token completion in 0.1 ms instead of 1.5 ms); anything else is converted
        ids = tuple(tokens) if isinstance(tokens, list) else tuple(map(int, tokens))
        return cls(ids, None if lp is None else tuple(lp) if isinstance(lp, list) else tuple(map(float, lp)))

    def join(self, delta: "Tokens") -> "Tokens":
        """`self + delta`; log-probs known only if both parts' are (empty `self` is known)."""
        a = self.logprobs if self.ids else ()
        lp = None if a is None or delta.logprobs is None else (*a, *delta.logprobs)
        return Tokens((*self.ids, *delta.ids), lp)

    def for_engine(self) -> Any:
        """The engine protocol's `TokensSoFar` (for a resume request)."""
        from pivotrl.engines.protocol import TokensSoFar

        return TokensSoFar(list(self.ids), None if self.logprobs is None else list(self.logprobs))


def _placed_on(dev: np.ndarray, sids: np.ndarray, device: int) -> np.ndarray:
    """Whether each of `sids` is placed on `device` (`dev`: seq id -> device, -1 beyond its end)."""
    ok = np.zeros(len(sids), dtype=bool)
    inside = sids < len(dev)
    ok[inside] = dev[sids[inside]] == device
    return ok


def grown(a: np.ndarray, size: int, fill: Any) -> np.ndarray:
    """`a` extended with `fill` to at least `size` entries (doubling, so growth is amortised)."""
    if size <= len(a):
        return a
    out = np.full(max(size, 2 * len(a), 64), fill, dtype=a.dtype)
    out[:len(a)] = a
    return out


class _TokenRows:
    """The tokens of one role's unfinished sequences, one row each, in blocks of `BLOCK` rows
    (new blocks as rows are needed: nothing is ever copied to grow; a row freed by a completion
    is reused). Rows are `width` tokens wide, widened (copied, doubling) only if a sequence
    outgrows it: the driver passes the role's longest sequence, so a run never widens."""

    BLOCK = 256

    def __init__(self, width: int) -> None:
        self.width = max(1, int(width))
        self.ids: list[np.ndarray] = []
        self.lps: list[np.ndarray] = []
        self.n = np.zeros(0, dtype=np.int64)  # tokens per row
        self.known = np.zeros(0, dtype=bool)  # log-probs known, per row
        self.row = np.full(0, -1, dtype=np.int64)  # seq id -> row (-1: none)
        self.free: list[int] = []

    def row_of(self, sid: int) -> int:
        return int(self.row[sid]) if sid < len(self.row) else -1

    def rows_for(self, sids: np.ndarray) -> np.ndarray:
        """The rows of `sids` (each a sequence with tokens to write), new ones made empty."""
        self.row = grown(self.row, int(sids.max()) + 1, -1)
        rows = self.row[sids]
        for i in np.flatnonzero(rows < 0):  # first tokens of these sequences
            rows[i] = self.row[sids[i]] = self._new_row()
        return rows

    def _new_row(self) -> int:
        if not self.free:
            b = len(self.ids)
            self.ids.append(np.zeros((self.BLOCK, self.width), dtype=np.int64))
            self.lps.append(np.zeros((self.BLOCK, self.width), dtype=np.float64))
            self.n = grown(self.n, (b + 1) * self.BLOCK, 0)
            self.known = grown(self.known, (b + 1) * self.BLOCK, True)
            self.free = list(range((b + 1) * self.BLOCK - 1, b * self.BLOCK - 1, -1))
        r = self.free.pop()
        self.n[r], self.known[r] = 0, True
        return r

    def release(self, sid: int) -> None:
        r = self.row_of(sid)
        if r >= 0:
            self.row[sid] = -1
            self.free.append(r)

    def write(self, rows: np.ndarray, cols: np.ndarray, ids: np.ndarray, lps: np.ndarray) -> None:
        """Token `ids[i]` (log-prob `lps[i]`) at column `cols[i]` of row `rows[i]`."""
        need = int(cols.max()) + 1 if len(cols) else 0
        if need > self.width:
            self._widen(need)
        if not len(rows):
            return
        blocks = rows // self.BLOCK
        local = rows - blocks * self.BLOCK
        lo, hi = int(blocks.min()), int(blocks.max())  # a poll's sequences sit in a block or two
        for b in range(lo, hi + 1):
            at = slice(None) if lo == hi else blocks == b
            self.ids[b][local[at], cols[at]] = ids[at]
            self.lps[b][local[at], cols[at]] = lps[at]

    def _widen(self, need: int) -> None:
        width = max(need, 2 * self.width)
        for blocks in (self.ids, self.lps):
            for i, a in enumerate(blocks):
                wide = np.zeros((self.BLOCK, width), dtype=a.dtype)
                wide[:, :self.width] = a
                blocks[i] = wide
        self.width = width

    def set(self, sid: int, toks: Tokens) -> None:
        """Row of `sid` := `toks` (an abort result)."""
        (r,) = self.rows_for(np.asarray([sid], dtype=np.int64))
        self.n[r] = 0
        self.write(np.full(len(toks), r), np.arange(len(toks)), np.asarray(toks.ids, dtype=np.int64),
                   np.zeros(len(toks)) if toks.logprobs is None else np.asarray(toks.logprobs, dtype=np.float64))
        self.n[r], self.known[r] = len(toks), toks.logprobs is not None

    def tokens(self, sid: int) -> Tokens:
        r = self.row_of(sid)
        if r < 0:
            return Tokens()
        b, i, n = r // self.BLOCK, r % self.BLOCK, int(self.n[r])
        lps = tuple(self.lps[b][i, :n].tolist()) if self.known[r] else None
        return Tokens(tuple(self.ids[b][i, :n].tolist()), lps)


@dataclass
class SequenceLedger:
    """Every live and finished sequence of the run, per role (sample ids are global).
    `widths`: per role, the longest a sequence can get (the row width of its token table)."""

    widths: dict[Role, int] = field(default_factory=dict)
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

    def __post_init__(self) -> None:
        self._rows = {r: _TokenRows(self.widths.get(r, 256)) for r in INFERENCE_ROLES}
        self._done: dict[Role, dict[int, Tokens]] = {r: {} for r in INFERENCE_ROLES}  # accepted completions
        self._dev = {r: np.full(0, -1, dtype=np.int64) for r in INFERENCE_ROLES}  # `placed` as an array

    # ------------------------------------------------------------------ reading
    def so_far(self, role: Role, seq_id: int) -> Tokens:
        """The sequence's tokens so far (a copy: for a resume request)."""
        done = self._done[role].get(seq_id)
        return done if done is not None else self._rows[role].tokens(seq_id)

    def length(self, role: Role, seq_id: int) -> int:
        done = self._done[role].get(seq_id)
        if done is not None:
            return len(done)
        r = self._rows[role].row_of(seq_id)
        return int(self._rows[role].n[r]) if r >= 0 else 0

    def counts(self) -> dict[Role, dict[int, int]]:
        """role -> seq id -> generated tokens, of the running sequences (the controller's progress)."""
        return {r: {sid: self.length(r, sid) for sid in self.placed[r]} for r in INFERENCE_ROLES}

    def running(self) -> bool:
        return any(self.placed[r] for r in INFERENCE_ROLES)

    # ------------------------------------------------------------------ polls
    def fold(self, role: Role, device: int, deltas: TokenDeltas) -> int:
        """Append a poll's `protocol.TokenDeltas` from `device` to the sequences placed there;
        returns the new tokens counted. Each delta says where it starts: what the ledger holds
        already (an abort's result came first) is skipped, a delta past a gap is dropped (the
        sequence's completion or abort brings all its tokens), and sequences placed elsewhere
        are not this poll's. Vectorised over the whole poll (module docstring)."""
        sids = np.frombuffer(deltas.seq_ids, dtype=np.int64)
        if not len(sids):
            return 0
        ends = np.frombuffer(deltas.ends, dtype=np.int64)
        counts = ends.copy()
        counts[1:] -= ends[:-1]
        dev = self._dev[role]
        ok = dev[sids] == device if int(sids.max()) < len(dev) else _placed_on(dev, sids, device)
        every = bool(ok.all())
        if not every and not ok.any():
            return 0
        st = self._rows[role]
        sids_ok = sids if every else sids[ok]
        rows = st.rows_for(sids_ok)
        cnt = counts if every else counts[ok]
        off = np.frombuffer(deltas.starts, dtype=np.int64)
        off, n = (off if every else off[ok]), st.n[rows]
        held = n - off  # tokens of each delta the ledger holds already (< 0: a gap before it)
        ids, lps = np.frombuffer(deltas.ids, dtype=np.int64), np.frombuffer(deltas.logprobs, dtype=np.float64)
        seg = np.cumsum(cnt) - cnt  # where each delta starts among the kept deltas' tokens
        if every and not held.any():  # the usual poll: every delta continues its sequence
            take = cnt
            st.known[rows[n == 0]] = True  # an empty record is known: the delta decides
            st.write(np.repeat(rows, cnt), np.repeat(n - seg, cnt) + np.arange(len(ids)), ids, lps)
        else:
            take = np.where(held >= 0, np.maximum(cnt - held, 0), 0)
            if not take.any():
                return 0
            j = np.arange(int(cnt.sum())) - np.repeat(seg, cnt)  # index within its delta
            keep = (j >= np.repeat(held, cnt)) & np.repeat(take > 0, cnt)
            if not every:
                tok = np.repeat(ok, counts)
                ids, lps = ids[tok], lps[tok]
            st.known[rows[(n == 0) & (take > 0)]] = True
            st.write(np.repeat(rows, cnt)[keep], (np.repeat(off, cnt) + j)[keep], ids[keep], lps[keep])
        st.n[rows] += take
        total = int(take.sum())
        if deltas.unknown:  # rare: a resume that came without log-probs
            for sid, r, t in zip(sids_ok.tolist(), rows.tolist(), take.tolist()):
                if t and sid in deltas.unknown:
                    st.known[r] = False
        return total

    # ------------------------------------------------------------------ placement
    def _place_as(self, role: Role, seq_id: int, device: int) -> None:
        if seq_id < 0:
            raise ValueError(f"SequenceLedger: sequence ids are non-negative (sample ids), got {seq_id}")
        self._dev[role] = grown(self._dev[role], seq_id + 1, -1)
        self._dev[role][seq_id] = device

    def place(self, role: Role, seq_id: int, device: int) -> bool:
        """A sequence was submitted to `device`; returns whether it resumes with tokens."""
        self._place_as(role, seq_id, device)
        self.placed[role][seq_id] = device
        return self.length(role, seq_id) > 0

    def unplace(self, role: Role, seq_id: int) -> None:
        """The sequence no longer runs anywhere (aborted; its tokens stay)."""
        if self.placed[role].pop(seq_id, None) is not None:
            self._dev[role][seq_id] = -1

    def aborted(self, role: Role, seq_id: int, toks: Tokens) -> None:
        """An abort returned `toks`: keep the longer of it and what the ledger holds."""
        if len(toks) >= self.length(role, seq_id):
            self._done[role].pop(seq_id, None)
            self._rows[role].set(seq_id, toks)
        self.unplace(role, seq_id)

    def accept(self, role: Role, seq_id: int, device: int, toks: Tokens) -> bool:
        """A completion from `device`: accepted (and the sequence unplaced) only if the ledger
        placed it there."""
        if self.placed[role].get(seq_id) != device:
            return False
        self.unplace(role, seq_id)
        self._done[role][seq_id] = toks
        self._rows[role].release(seq_id)
        return True

    def share(self, role: Role, seq_id: int, toks: Tokens) -> None:
        """`seq_id` takes another sequence's completion `toks` without running (a sample whose judge
        prompt repeats an earlier one's, `SequenceFinished.shares_judgement_of`)."""
        if seq_id in self.placed[role] or seq_id in self._done[role]:
            raise RuntimeError(f"{role.value} seq {seq_id} shares a completion but has run or finished itself")
        self._done[role][seq_id] = toks

    def forget(self, sample_ids: Iterable[int]) -> None:
        """Drop every record of samples `sample_ids` (their batch is trained and written): tokens,
        responses, versions, judge prompts and rewards, so a long run's driver memory stays flat (by
        arithmetic, a paper-scale step holds ~0.6 GB of them). A late report or completion of one counts nothing."""
        ids = list(sample_ids)
        running = [sid for sid in ids for r in INFERENCE_ROLES if sid in self.placed[r]]
        if running:
            raise RuntimeError(f"SequenceLedger.forget: samples {running[:5]} still run")
        for sid in ids:
            for kept in (self.responses, self.versions, self.judge_ids, self.rewards):
                kept.pop(sid, None)
            for r in INFERENCE_ROLES:
                self._done[r].pop(sid, None)
                self._rows[r].release(sid)

    def lost(self, role: Role, device: int) -> list[int]:
        """Unplace and return the sequences that ran on `device` (it died): their tokens stay."""
        ids = sorted(sid for sid, d in self.placed[role].items() if d == device)
        for sid in ids:
            self.unplace(role, sid)
        return ids
