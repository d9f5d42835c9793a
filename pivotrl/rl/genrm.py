"""GenRM judging: judge prompt templates, the reference judgement the bootstrap teaches, score parsers.

Owns: how a (prompt, response) pair becomes the GenRM's chat messages (`JUDGE_TEMPLATES`, by name:
`models.genrm.judge.template`), what the tiny GenRM's judgement looks like (`check: <equation>` then
`score: <0..1>`), and turning GenRM output text into a score (`SCORE_PARSERS`, by name:
`models.genrm.judge.parser`). Rendering the messages with the GenRM's own tokenizer and chat
template is `judge_prompt` (through pivotrl/rl/chat.py). The registries themselves are the
config's (`pivotrl.config.rl.JUDGE_TEMPLATES`, `SCORE_PARSERS`: names with lazy targets here), so
the config validates names without importing this module. Knows nothing about engines: callers
generate the judgement text and hand it here.

Before any parser runs, `<think>...</think>` is stripped (everything up to the last `</think>`; a
think block that never closes is a failure: the judge ran out of tokens before its verdict). Only
ASCII digits are numbers (`score: １` is a failure, issue 12). A parse failure is never fatal: it
scores 0, is counted in a `ParseStats` (the module-level `PARSE_STATS` unless the caller passes its
own) and logged at WARNING level; a step whose failure rate is above
`models.genrm.judge.max_parse_failure_rate` warns loudly (`ParseFailureWatch`).

Parsers (all scores end in [0, 1]):
- `score_line` / `last_score_line`: the tiny GenRM's `score: x`, x in [0, 1] (see Decisions);
- `score_out_of_10`: the last `Score: x/10` (x in [0, 10], any case, optional `**` markdown) -> x/10;
- `boxed`: the last `\boxed{x}`, x in [0, 1]; `boxed_10`: the last `\boxed{x}`, x in [0, 10] -> x/10;
- `yes_no`: the final verdict: the last `verdict:`/`final answer:`/`answer:`/`\boxed{}` naming yes or
  no (also correct/incorrect), or a last line that is just yes/no -> 1/0.

Every parser runs in time linear in the text (`python -m pivotrl.bench genrm_parse`, issue 22).

Decisions (the spec is silent):
- `score_line` (default) is strict: exactly one line `score: <number>`; the number must lie in
  [0, 1]. Several score lines are a failure, not "take the last", because a judgement that
  contradicts itself is not a judgement; an out-of-range score is a failure, not clipped, because
  it signals a broken judge rather than a confident one.
- `last_score_line` is lenient: the last line that parses as an in-range score wins.
- A `\boxed{}` of more than 64 characters is no yes/no verdict (a verdict is a word), so no long
  box is copied or rescanned.
- The real-judge parsers take the LAST candidate: reasoning judges quote rubric lines ("a score of
  10/10 means ...") before they conclude. An out-of-range last candidate is a failure, not a reason
  to fall back to an earlier one.
"""
from __future__ import annotations

import logging
import math
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from pivotrl.config.rl import JUDGE_TEMPLATES, SCORE_PARSERS

log = logging.getLogger(__name__)

# Short, because every judge prompt is re-read by a character-level model.
JUDGE_TEMPLATE = "Q: {question}\nA: {response}\nCheck A."

# A score token: an integer or a decimal with digits after the point ("0." is a truncated "0.9").
# [0-9], not \d: \d matches every Unicode digit ("１", "٣"), and float() accepts them too.
_NUMBER = r"[-+]?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_SCORE_LINE = re.compile(rf"^\s*score\s*:\s*(?P<value>{_NUMBER}|nan|inf|-inf)\s*$", re.IGNORECASE)
_SCORE_PREFIX = re.compile(r"^\s*score\s*:", re.IGNORECASE)


def judge_messages(prompt: list[dict[str, str]], response: str, template: str = JUDGE_TEMPLATE) -> list[dict[str, str]]:
    """Chat messages for the GenRM: the last user turn of `prompt` is the question."""
    users = [m["content"] for m in prompt if m.get("role") == "user"]
    if not users:
        raise ValueError("judge_messages: prompt has no message with role 'user'")
    return [{"role": "user", "content": template.format(question=users[-1], response=response.strip())}]


@dataclass(frozen=True)
class JudgeTemplate:
    """A judge prompt: an optional system message and a user message with `{question}` and
    `{response}` fields; `parser` names the parser whose format the prompt asks for."""

    user: str
    parser: str
    system: str | None = None


_RUBRIC = ("You are a strict grader of math solutions. Read the problem and the candidate solution, check "
           "the reasoning and the final answer step by step, then give your verdict.")
# The judge prompt templates; `pivotrl.config.rl.JUDGE_TEMPLATES` names them (`models.genrm.judge.template`).
TINY_TEMPLATE = JudgeTemplate(JUDGE_TEMPLATE, parser="score_line")
SCORE_OUT_OF_10_TEMPLATE = JudgeTemplate(
    "Problem:\n{question}\n\nCandidate solution:\n{response}\n\nEvaluate the solution's correctness. "
    "End with one line of the form 'Score: X/10', where X is an integer from 0 (wrong) to 10 (fully correct).",
    parser="score_out_of_10", system=_RUBRIC)
BOXED_TEMPLATE = JudgeTemplate(
    "Problem:\n{question}\n\nCandidate solution:\n{response}\n\nHow likely is the solution correct? "
    "Put a number between 0 and 1 in \\boxed{{}} at the end, e.g. \\boxed{{0.8}}.",
    parser="boxed", system=_RUBRIC)
YES_NO_TEMPLATE = JudgeTemplate(
    "Problem:\n{question}\n\nCandidate solution:\n{response}\n\nIs the final answer correct? "
    "Finish with 'Verdict: Yes' or 'Verdict: No'.",
    parser="yes_no", system=_RUBRIC)


def get_judge_template(name: str) -> JudgeTemplate:
    """The template registered as `name`; a `ConfigError` lists the registered names otherwise."""
    return JUDGE_TEMPLATES[name]


def judge_conversation(prompt: list[dict[str, str]], response: str, template: str,
                       system_prompt: str | None = None) -> list[dict[str, str]]:
    """Chat messages for the judge template named `template`: a system message (`system_prompt`,
    else the template's own, else none) and the user turn with the last user turn of `prompt` as the
    question and `response` (its own `<think>` block removed: the judge grades the answer, not the
    policy's scratchpad) as the candidate."""
    t = get_judge_template(template)
    if t.user == JUDGE_TEMPLATE:
        msgs = judge_messages(prompt, response, t.user)
    else:
        msgs = judge_messages(prompt, strip_thinking(response)[0], t.user)
    system = system_prompt if system_prompt is not None else t.system
    return ([{"role": "system", "content": system}] if system else []) + msgs


def judge_prompt(tokenizer: Any, prompt: list[dict[str, str]], response: str, judge: Any, chat: Any) -> list[int]:
    """Token ids of the GenRM's judge prompt, rendered with the GenRM's own tokenizer and chat
    template: `judge` is a JudgeConfig (template name), `chat` the GenRM's ChatConfig (system prompt,
    `enable_thinking`, template override)."""
    from pivotrl.rl.chat import render_chat

    msgs = judge_conversation(prompt, response, judge.template, getattr(chat, "system_prompt", None))
    return render_chat(tokenizer, msgs, chat, where="models.genrm.chat", add_system=False)


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


class ParseFailureWatch:
    """A run's GenRM parse failures step by step, against `judge.max_parse_failure_rate`.

    `step(step, failures, judged)` returns the step's failure rate (None when nothing was judged)
    and, above the threshold, logs a WARNING that names the judge's keys (issue 22: a policy and
    judge swapped ran to the end with every judgement unparsed and 5 console lines). `summary()`
    is what `summary.json` reports as `genrm_parse`, the closing table's row."""

    def __init__(self, judge: Any, stats: ParseStats | None = None) -> None:
        self.judge, self.stats = judge, stats
        self.threshold = float(judge.max_parse_failure_rate)
        self.judged = self.failures = 0
        self.steps_over: list[int] = []

    def step(self, step: int, failures: int, judged: int) -> float | None:
        if judged <= 0:
            return None
        self.judged += judged
        self.failures += failures
        rate = failures / judged
        if rate > self.threshold:
            self.steps_over.append(int(step))
            top = self.stats.reasons.most_common(2) if self.stats is not None else []
            log.warning(
                "GenRM JUDGE OUTPUT NOT PARSED: %d of %d judgements of step %d (%.0f%%) did not parse, above "
                "models.genrm.judge.max_parse_failure_rate=%g%s; those samples get no GenRM reward. Check that "
                "the judge (models.genrm.hf_path) writes what models.genrm.judge.template=%r asks for and "
                "models.genrm.judge.parser=%r reads (a policy and judge swapped? a judge cut short by "
                "models.genrm.judge.max_tokens?)", failures, judged, step, 100 * rate, self.threshold,
                f" (so far: {', '.join(f'{r} x{n}' for r, n in top)})" if top else "", self.judge.template,
                self.judge.parser)
        return rate

    def summary(self) -> dict[str, Any]:
        return {"total": self.judged, "failures": self.failures,
                "failure_rate": self.failures / self.judged if self.judged else None,
                "max_parse_failure_rate": self.threshold, "steps_over": list(self.steps_over),
                "template": self.judge.template, "parser": self.judge.parser}


PARSE_STATS = ParseStats()
"""Process-wide counter used when a caller passes no `stats`."""

ScoreParser = Callable[[str], ParsedScore]


def register_score_parser(name: str) -> Callable[[ScoreParser], ScoreParser]:
    """Decorator: register a parser under `name` (the value of `models.genrm.judge.parser`)."""
    return SCORE_PARSERS.register(name)


def get_score_parser(name: str) -> ScoreParser:
    """The parser registered as `name`; a `ConfigError` lists the registered names otherwise."""
    return SCORE_PARSERS[name]


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


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def strip_thinking(text: str) -> tuple[str, bool]:
    """(text after the last `</think>`, ok). With no think tags the text is unchanged; an opened
    `<think>` that never closes gives ("", False): the verdict was never written."""
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        return text[close + len(_THINK_CLOSE):], True
    if _THINK_OPEN in text:
        return "", False
    return text, True


# Every parser runs in time linear in the text (issue 22: a judge may write 20,480 tokens, and an
# unbalanced `\boxed{` made the old scan quadratic). So: no pattern has two `\s*` that can share one
# run of spaces (each optional token carries its own trailing `\s*`), and braces are matched once,
# in one pass (`_boxes`). `python -m pivotrl.bench genrm_parse` measures them on adversarial
# text up to 1 MB.
_OUT_OF_10 = re.compile(rf"score\s*(?:[:=]\s*)?(?:\*+\s*)?(?P<value>{_NUMBER})\s*(?:\*+\s*)?/\s*10(?![0-9])",
                        re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\s*\{")


@dataclass(frozen=True)
class _Box:
    """One closed `\\boxed{...}`: where `\\boxed` starts and where its contents start and end."""

    at: int
    start: int
    end: int


def _boxes(text: str) -> list[_Box]:
    """Every closed `\\boxed{...}` (balanced braces), in the order the boxes open, found in one
    pass: a stack of open braces, each `}` closing the newest one. A box that never closes is not
    one."""
    opens = {m.end() - 1: m for m in _BOXED.finditer(text)}  # the box's `{` -> its `\\boxed{` match
    if not opens:
        return []
    found: dict[int, _Box] = {}
    stack: list[int] = []
    for m in re.finditer(r"[{}]", text):
        i = m.start()
        if text[i] == "{":
            stack.append(i)
        elif stack:
            j = stack.pop()
            if j in opens:
                found[j] = _Box(opens[j].start(), opens[j].end(), i)
    return [found[j] for j in sorted(found)]


def _ranged(raw: str, scale: float) -> ParsedScore:
    """A number in [0, scale] scaled to [0, 1]; ASCII digits only."""
    if not re.fullmatch(_NUMBER, raw.strip()):
        return ParsedScore(0.0, False, "not a number")
    v = float(raw)
    if math.isnan(v) or math.isinf(v):
        return ParsedScore(0.0, False, "not finite")
    if not 0.0 <= v <= scale:
        return ParsedScore(0.0, False, "out of range")
    return ParsedScore(v / scale, True)


def parse_score_out_of_10(text: str) -> ParsedScore:
    """The last `Score: x/10`, x in [0, 10], scaled to [0, 1]."""
    found = _OUT_OF_10.findall(text)
    if not found:
        return ParsedScore(0.0, False, "no 'Score: x/10'")
    return _ranged(found[-1], 10.0)


def parse_boxed(text: str) -> ParsedScore:
    """The last `\\boxed{x}`, x in [0, 1]."""
    boxes = _boxes(text)
    return _ranged(text[boxes[-1].start:boxes[-1].end], 1.0) if boxes else ParsedScore(0.0, False, "no \\boxed{}")


def parse_boxed_10(text: str) -> ParsedScore:
    """The last `\\boxed{x}`, x in [0, 10], scaled to [0, 1]."""
    boxes = _boxes(text)
    return _ranged(text[boxes[-1].start:boxes[-1].end], 10.0) if boxes else ParsedScore(0.0, False, "no \\boxed{}")


_VERDICT_WORDS = {"yes": 1.0, "no": 0.0, "correct": 1.0, "incorrect": 0.0, "true": 1.0, "false": 0.0}
_VERDICT = re.compile(r"(?:verdict|final answer|answer|judgement|judgment)\s*(?:is\s*)?(?:[:=]\s*)?(?:\*+\s*)?"
                      r"(?P<word>yes|no|correct|incorrect|true|false)\b", re.IGNORECASE)
_BARE = re.compile(r"^\W*(?P<word>yes|no|correct|incorrect)\W*$", re.IGNORECASE)
# A boxed verdict is a word, perhaps in `\text{}`: a longer box is no verdict, and is not copied.
_BOXED_VERDICT_MAX = 64


def parse_yes_no(text: str) -> ParsedScore:
    """The final verdict (module docstring): 1 for yes/correct, 0 for no/incorrect."""
    cands: list[tuple[int, str]] = [(m.start(), m.group("word")) for m in _VERDICT.finditer(text)]
    for box in _boxes(text):
        if box.end - box.start > _BOXED_VERDICT_MAX:
            continue
        word = re.sub(r"\\text\{(.*)\}", r"\1", text[box.start:box.end]).strip().lower()
        if word in _VERDICT_WORDS:
            cands.append((box.at, word))
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if lines and _BARE.match(lines[-1]):
        cands.append((len(text), _BARE.match(lines[-1]).group("word")))
    if not cands:
        return ParsedScore(0.0, False, "no verdict")
    return ParsedScore(_VERDICT_WORDS[max(cands)[1].lower()], True)


def parse_score(text: str, parser: str = "score_line", stats: ParseStats | None = None) -> ParsedScore:
    """Parse GenRM output with the named parser, after stripping `<think>...</think>`; count it and
    log a failure; never raise on bad text."""
    if not isinstance(text, str):
        parsed = ParsedScore(0.0, False, f"not text ({type(text).__name__})")
    else:
        body, ok = strip_thinking(text)
        parsed = get_score_parser(parser)(body) if ok else ParsedScore(0.0, False, "think block never closed")
    (stats if stats is not None else PARSE_STATS).record(parsed)
    if not parsed.ok:
        # The first few failures at WARNING, then every 100th, so a broken judge is visible without
        # flooding the log with one line per sample.
        n = (stats if stats is not None else PARSE_STATS).failures
        log.log(logging.WARNING if n <= 5 or n % 100 == 0 else logging.DEBUG,
                "GenRM score parse failure #%d (%s, parser=%s): %r", n, parsed.reason, parser,
                text[-200:] if isinstance(text, str) else text)
    return parsed
