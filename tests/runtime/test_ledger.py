"""The ledger appends each poll's new tokens (`SequenceLedger.fold`) and keeps its invariants through
any interleaving of steps, polls (on time and delivered late), aborts, resumes, completions and
device deaths: every sequence's tokens are at all times an exact prefix of what its engines
generated (nothing duplicated or skipped), they never shrink, log-probs stay aligned, and a
completion or delta counts only from the device the sequence runs on."""
from __future__ import annotations

from hypothesis import example, given, settings, strategies as st

from pivotrl.core.types import Role
from pivotrl.engines.protocol import TokenDeltas, TokensSoFar
from pivotrl.runtime.ledger import SequenceLedger, Tokens

R = Role.ROLLOUT
SEQS, DEVICES = 4, 2


def tok(sid: int, i: int) -> int:
    """The i-th token of sequence `sid` (an engine's stream, the same on any device: greedy)."""
    return sid * 1000 + i


def lp(sid: int, i: int) -> float:
    return -(sid + i) / 64


class Device:
    """A device's engine as the ledger sees it: live sequences' tokens and what it reported."""

    def __init__(self) -> None:
        self.live: dict[int, list[int]] = {}  # sid -> [generated, reported]

    def submit(self, sid: int, done: int) -> None:
        self.live[sid] = [done, done]

    def step(self, n: int) -> None:
        for s in self.live.values():
            s[0] += n

    def new_tokens(self) -> TokenDeltas:
        d = TokenDeltas()
        for sid, s in self.live.items():
            if s[0] > s[1]:
                d.add(sid, [tok(sid, i) for i in range(s[1], s[0])], [lp(sid, i) for i in range(s[1], s[0])], s[1])
                s[1] = s[0]
        return d

    def full(self, sid: int) -> Tokens:
        n = self.live.pop(sid)[0]
        return Tokens.of(TokensSoFar([tok(sid, i) for i in range(n)], [lp(sid, i) for i in range(n)]))


OPS = st.lists(st.tuples(st.sampled_from(["step", "poll", "late", "abort", "resume", "bounce", "finish", "die"]),
                         st.integers(0, DEVICES - 1), st.integers(0, SEQS - 1), st.integers(1, 3)),
               max_size=80)


@settings(max_examples=300, deadline=None)
@given(OPS)
@example([("step", 0, 0, 2), ("late", 0, 0, 1), ("bounce", 0, 0, 1), ("poll", 0, 0, 1)])  # a report outlives its abort
@example([("step", 0, 0, 1), ("late", 0, 0, 2), ("step", 0, 0, 1), ("poll", 0, 0, 1)])  # a later report overtakes it
def test_ledger_invariants_under_any_interleaving(ops):
    led, devs = SequenceLedger(), [Device() for _ in range(DEVICES)]
    finished: dict[int, Tokens] = {}
    for sid in range(SEQS):
        led.place(R, sid, sid % DEVICES)
        devs[sid % DEVICES].submit(sid, 0)
    late: list[tuple[int, int, TokenDeltas]] = []  # (ops left before delivery, device, report)
    longest = {sid: 0 for sid in range(SEQS)}
    for op, d, sid, n in ops:
        dev = devs[d]
        if op == "step":
            dev.step(n)
        elif op == "poll":
            deltas = dev.new_tokens()
            before = {s: led.length(R, s) for s in range(SEQS)}
            counted = led.fold(R, d, deltas)
            assert counted == sum(led.length(R, s) - before[s] for s in range(SEQS))
            if not any(sd == d for _, sd, _ in late):  # no earlier report of this device still on its way
                assert counted == deltas.tokens, "every delta of a device's own sequences counts"
            # else a delta past the gap that report leaves is dropped, never misplaced: the
            # sequence's completion or abort brings all its tokens (the prefix checks below)
        elif op == "late":  # a poll taken now, delivered after the next n ops (aborts, resumes...)
            late.append((n, d, dev.new_tokens()))
            continue
        elif op in ("abort", "bounce") and sid in dev.live:
            led.aborted(R, sid, dev.full(sid))
            if op == "bounce":  # resumed at once on the same device (a report of it may still be on its way)
                assert led.place(R, sid, d) == (led.length(R, sid) > 0)
                dev.submit(sid, led.length(R, sid))
        elif op == "resume" and sid not in finished and sid not in led.placed[R] and sid not in dev.live:
            if led.place(R, sid, d):
                assert led.length(R, sid) > 0
            dev.submit(sid, led.length(R, sid))
        elif op == "finish" and sid in dev.live:
            toks = dev.full(sid)
            assert led.accept(R, sid, d, toks)
            finished[sid] = toks
        elif op == "die":
            for s in led.lost(R, d):
                assert s not in finished and s not in led.placed[R]
            devs[d] = Device()  # its unreported tokens are gone
        due = [x for x in late if x[0] <= 1]
        late = [(k - 1, sd, x) for k, sd, x in late if k > 1]
        for _, sd, deltas in due:  # delivered late: counted only where still placed, and never twice
            before = {s: led.length(R, s) for s in range(SEQS)}
            counted = led.fold(R, sd, deltas)
            assert counted == sum(led.length(R, s) - before[s] for s in range(SEQS))
        for s in range(SEQS):
            have = led.so_far(R, s)
            assert have.ids == tuple(tok(s, i) for i in range(len(have))), "an exact prefix, once each"
            assert have.logprobs == tuple(lp(s, i) for i in range(len(have)))
            assert len(have) >= longest[s], "tokens never shrink"
            longest[s] = len(have)
            where = led.placed[R].get(s)
            if where is not None:
                assert s in devs[where].live and devs[where].live[s][1] <= devs[where].live[s][0]
    for s, toks in finished.items():
        assert led.so_far(R, s) == toks


def test_a_report_delivered_after_an_abort_and_a_resume_on_the_same_device_counts_once():
    led, dev = SequenceLedger(), Device()
    led.place(R, 0, 1)
    dev.submit(0, 0)
    dev.step(3)
    report = dev.new_tokens()  # taken before the abort, delivered after the resume
    led.aborted(R, 0, dev.full(0))
    assert led.place(R, 0, 1)
    dev.submit(0, led.length(R, 0))
    assert led.fold(R, 1, report) == 0 and led.length(R, 0) == 3
    dev.step(2)
    assert led.fold(R, 1, dev.new_tokens()) == 2
    assert led.so_far(R, 0).ids == tuple(tok(0, i) for i in range(5))


def test_fold_counts_only_the_device_a_sequence_runs_on_and_keeps_unknown_logprobs():
    led = SequenceLedger()
    led.place(R, 1, device=0)
    led.place(R, 2, device=0)
    led.place(R, 3, device=1)
    d = TokenDeltas()
    d.add(1, [10, 11], [-0.1, -0.2])
    d.add(2, [20], None)
    d.add(3, [30], [-0.3])  # runs on device 1: not this poll's
    d.add(9, [90], [-0.9])  # runs nowhere (never placed)
    assert led.fold(R, 0, d) == 3
    assert led.so_far(R, 1) == Tokens((10, 11), (-0.1, -0.2))
    assert led.so_far(R, 2) == Tokens((20,), None) and led.length(R, 3) == 0
    again = TokenDeltas()
    again.add(2, [21], [-0.5], start=1)  # known now, but the record stays unknown: never partial
    assert led.fold(R, 0, again) == 1
    assert led.so_far(R, 2) == Tokens((20, 21), None)
    assert led.counts()[R] == {1: 2, 2: 2, 3: 0}


def test_forget_drops_every_record_of_trained_samples_and_refuses_running_ones():
    """A trained batch's samples leave the ledger (a long run's driver memory stays flat); a late
    report or completion of one of them counts nothing; a sample still running is refused."""
    import pytest

    led, dev = SequenceLedger(), Device()
    for sid in (0, 1):
        led.place(R, sid, 0)
        dev.submit(sid, 0)
    dev.step(2)
    late = dev.new_tokens()
    assert led.accept(R, 0, 0, dev.full(0))
    led.responses[0], led.versions[0], led.judge_ids[0], led.rewards[0] = led.so_far(R, 0), 3, [1, 2], 0.5
    led.share(Role.REWARD, 0, Tokens((7,), (-0.1,)))
    with pytest.raises(RuntimeError, match=r"samples \[1\] still run"):
        led.forget([0, 1])
    led.forget([0])
    assert (led.responses, led.versions, led.judge_ids, led.rewards) == ({}, {}, {}, {})
    assert led.length(R, 0) == 0 and led.length(Role.REWARD, 0) == 0
    assert led.fold(R, 0, late) == 2  # sample 1's two tokens; sample 0's are not placed anywhere
    assert not led.accept(R, 0, 0, Tokens((1, 2), None))
