"""GenRM judging: the judge prompt, the reference judgement the bootstrap teaches, and score parsers.

Owns: how a (prompt, response) pair becomes the GenRM's chat messages, what a well-formed
judgement looks like (`check: <equation>` then `score: <0..1>`), and turning GenRM output text into
a score. Knows nothing about engines: callers generate the judgement text and hand it here.

Parsers are registered by name (`SCORE_PARSERS`; the config string `reward.genrm_parser` picks
one). A parse failure is never fatal: it scores 0, is counted in a `ParseStats` (the module-level
`PARSE_STATS` unless the caller passes its own) and logged at WARNING level.

Decisions (the spec is silent):
- `score_line` (default) is strict: exactly one line `score: <number>`; the number must lie in
  [0, 1]. Several score lines are a failure, not "take the last", because a judgement that
  contradicts itself is not a judgement; an out-of-range score is a failure, not clipped, because
  it signals a broken judge rather than a confident one.
- `last_score_line` is lenient: the last line that parses as an in-range score wins.
"""
from __future__ import annotations

import logging
import math
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)

# Short, because every judge prompt is re-read by a character-level model.
JUDGE_TEMPLATE = "Q: {question}\nA: {response}\nCheck A."

# A score token: an integer or a decimal with digits after the point ("0." is a truncated "0.9").
_NUMBER = r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
_SCORE_LINE = re.compile(rf"^\s*score\s*:\s*(?P<value>{_NUMBER}|nan|inf|-inf)\s*$", re.IGNORECASE)
_SCORE_PREFIX = re.compile(r"^\s*score\s*:", re.IGNORECASE)


def judge_messages(prompt: list[dict[str, str]], response: str, template: str = JUDGE_TEMPLATE) -> list[dict[str, str]]:
    """Chat messages for the GenRM: the last user turn of `prompt` is the question."""
    users = [m["content"] for m in prompt if m.get("role") == "user"]
    if not users:
        raise ValueError("judge_messages: prompt has no message with role 'user'")
    return [{"role": "user", "content": template.format(question=users[-1], response=response.strip())}]


def reference_judgement(equation: str, score: float, response_answer: str | None = None) -> str:
    """What the bootstrap teaches the GenRM to write: its own check of the arithmetic, the answer it
    read from the response ("none" if there is none), then the score. Writing both numbers side by
    side turns "is the response right" into a comparison of two adjacent numbers, which a tiny model
    learns far faster than comparing across the prompt."""
    got = response_answer if response_answer is not None else "none"
    return f"check: {equation} vs {got}\nscore: {score:g}"


@dataclass
class ParsedScore:
    """A parser's verdict. `score` is 0 when `ok` is False; `reason` says why it failed."""

    score: float
    ok: bool
    reason: str = ""


@dataclass
class ParseStats:
    """Counts of parsed judgements and failures by reason (thread-safe)."""

    total: int = 0
    failures: int = 0
    reasons: Counter = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, parsed: ParsedScore) -> None:
        with self._lock:
            self.total += 1
            if not parsed.ok:
                self.failures += 1
                self.reasons[parsed.reason] += 1

    @property
    def failure_rate(self) -> float:
        return self.failures / self.total if self.total else 0.0

    def reset(self) -> None:
        with self._lock:
            self.total, self.failures = 0, 0
            self.reasons.clear()

    def as_dict(self) -> dict:
        return {"total": self.total, "failures": self.failures, "failure_rate": self.failure_rate,
                "reasons": dict(self.reasons)}


PARSE_STATS = ParseStats()
"""Process-wide counter used when a caller passes no `stats`."""

ScoreParser = Callable[[str], ParsedScore]
SCORE_PARSERS: dict[str, ScoreParser] = {}


def register_score_parser(name: str) -> Callable[[ScoreParser], ScoreParser]:
    """Decorator: register a parser under `name` (the value of `reward.genrm_parser`)."""
    def deco(fn: ScoreParser) -> ScoreParser:
        if name in SCORE_PARSERS:
            raise ValueError(f"score parser {name!r} is already registered")
        SCORE_PARSERS[name] = fn
        return fn
    return deco


def get_score_parser(name: str) -> ScoreParser:
    try:
        return SCORE_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown GenRM score parser {name!r}; registered: {sorted(SCORE_PARSERS)}") from None


def _value(raw: str) -> ParsedScore:
    try:
        v = float(raw)
    except ValueError:
        return ParsedScore(0.0, False, "not a number")
    if math.isnan(v) or math.isinf(v):
        return ParsedScore(0.0, False, "not finite")
    if not 0.0 <= v <= 1.0:
        return ParsedScore(0.0, False, "out of range")
    return ParsedScore(v, True)


def _score_lines(text: str) -> tuple[list[str], int]:
    """Values on well-formed score lines, and how many lines start with `score:` at all."""
    values, prefixed = [], 0
    for line in text.splitlines():
        if _SCORE_PREFIX.match(line):
            prefixed += 1
            m = _SCORE_LINE.match(line)
            if m:
                values.append(m.group("value"))
    return values, prefixed


@register_score_parser("score_line")
def parse_score_line(text: str) -> ParsedScore:
    """Strict: exactly one `score: x` line with x in [0, 1]."""
    values, prefixed = _score_lines(text)
    if prefixed == 0:
        return ParsedScore(0.0, False, "no score line")
    if prefixed > 1:
        return ParsedScore(0.0, False, "several score lines")
    if not values:
        return ParsedScore(0.0, False, "malformed score line")
    return _value(values[0])


@register_score_parser("last_score_line")
def parse_last_score_line(text: str) -> ParsedScore:
    """Lenient: the last score line whose value is a number in [0, 1]."""
    values, prefixed = _score_lines(text)
    if prefixed == 0:
        return ParsedScore(0.0, False, "no score line")
    last_failure = ParsedScore(0.0, False, "malformed score line")
    for raw in reversed(values):
        parsed = _value(raw)
        if parsed.ok:
            return parsed
        last_failure = parsed
    return last_failure


def parse_score(text: str, parser: str = "score_line", stats: ParseStats | None = None) -> ParsedScore:
    """Parse GenRM output with the named parser; count it and log a failure; never raise on bad text."""
    if not isinstance(text, str):
        parsed = ParsedScore(0.0, False, f"not text ({type(text).__name__})")
    else:
        parsed = get_score_parser(parser)(text)
    (stats if stats is not None else PARSE_STATS).record(parsed)
    if not parsed.ok:
        # The first few failures at WARNING, then every 100th, so a broken judge is visible without
        # flooding the log with one line per sample.
        n = (stats if stats is not None else PARSE_STATS).failures
        log.log(logging.WARNING if n <= 5 or n % 100 == 0 else logging.DEBUG,
                "GenRM score parse failure #%d (%s, parser=%s): %r", n, parsed.reason, parser,
                text[-200:] if isinstance(text, str) else text)
    return parsed
