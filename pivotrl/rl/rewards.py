"""Rewards: verifiable answer checking, custom reward functions by import path, and R = w_v*R_v + w_g*R_g.

Owns: extracting the final answer from a response, the default verl-signature `compute_score`,
resolving a user's `compute_score(data_source, solution_str, ground_truth, extra_info)` from an
import path, and combining the verifiable score with a GenRM score. Knows nothing about engines:
the GenRM text comes in already generated (see `pivotrl.rl.genrm` for the judge prompt/parsers).

Math data sources (verl's `data_source` names), graded as verl's graders extract, then compared by
`math-verify` (so `\\frac{1}{2}` equals 0.5 and `x = 3` equals 3):
- `math_dapo` (DAPO-Math-17k) and `aime*`: the rest of the line after the LAST "Answer:" (verl's
  `math_dapo.py`); no "Answer:" -> wrong;
- `math`, `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval`, `HuggingFaceH4/MATH-500`: the
  LAST `\\boxed{...}` (balanced braces; `\\fbox{}` too); none -> wrong.
Extraction comes first because math-verify alone takes the last number anywhere ("m+n = 35, not 34"
would count for 34). The extracted answer is parsed as one LaTeX expression (`$answer$`), so an
answer line that says "35, not 34" is the set {35, not 34}, not 34. Scores are 1.0 / 0.0 (verl's
DAPO grader gives -1 for wrong: scale with `reward.verifiable_weight` and a custom function if you
want that). math-verify's own timeouts use SIGALRM, which only works in a main thread; elsewhere
they are off and the answer length is capped (`MAX_ANSWER_CHARS`) instead.

Other data sources (the synthetic task, GSM8K), by `reward.answer_extraction`:
- `strict` (default): the integer after the last `####` (verl's GSM8K convention); none -> wrong.
- `flexible`: the last integer anywhere in the response.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pivotrl.config.rl import JudgeConfig, RewardConfig
from pivotrl.rl.genrm import ParseStats, get_score_parser, parse_score

_STRICT = re.compile(r"####\s*([-+]?[0-9,]*[0-9])")
_INTEGER = re.compile(r"[-+]?[0-9][0-9,]*")
_ANSWER_LINE = re.compile(r"Answer\s*:\s*(?P<ans>[^\n]*)", re.IGNORECASE)
_BOXED_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER_TOKEN = re.compile(r"[-+]?[0-9]+(?:\.[0-9]+)?")

#: Longest extracted answer handed to math-verify (verl's DAPO grader looks at the last 300 chars).
MAX_ANSWER_CHARS = 300
DAPO_SOURCES = ("math_dapo",)
DAPO_PREFIXES = ("aime",)
BOXED_SOURCES = ("math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")

EXTRACTORS = ("strict", "flexible")

ComputeScore = Callable[..., Any]


def extract_answer(text: str, method: str = "strict") -> str | None:
    """The final answer in `text` as a normalised integer string, or None if there is none."""
    if method == "strict":
        found = _STRICT.findall(text)
    elif method == "flexible":
        found = _INTEGER.findall(text)
    else:
        raise ValueError(f"reward.answer_extraction {method!r} is not one of {list(EXTRACTORS)}")
    if not found:
        return None
    return _normalise(found[-1])


def _normalise(s: str) -> str | None:
    s = s.strip().replace(",", "")
    try:
        return str(int(s))
    except ValueError:
        return s or None


def verifiable_score(solution_str: str, ground_truth: str | int, method: str = "strict") -> float:
    """1.0 if the extracted final answer equals the ground truth, else 0.0."""
    answer = extract_answer(solution_str, method)
    return 1.0 if answer is not None and answer == _normalise(str(ground_truth)) else 0.0


def extract_after_answer(text: str) -> str | None:
    """The rest of the line after the last "Answer:" (verl's math_dapo), or None."""
    found = _ANSWER_LINE.findall(text)
    if not found:
        return None
    ans = found[-1].strip().rstrip(".").strip()
    return ans.strip("$").strip() or None


def extract_last_boxed(text: str) -> str | None:
    """The contents of the last `\\boxed{...}` / `\\fbox{...}` (balanced braces), or None."""
    starts = list(_BOXED_START.finditer(text))
    for m in reversed(starts):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[m.end():i - 1].strip() or None
    return None


def _mv_parse(s: str, timeout: int | None) -> list:
    from math_verify import parse

    got = parse(f"${s}$", parsing_timeout=timeout)
    if not got and len(_NUMBER_TOKEN.findall(s)) == 1:  # e.g. "5 dollars": one number, safe to take
        got = parse(s, parsing_timeout=timeout)
    return got


def math_equal(answer: str, ground_truth: str) -> bool:
    """Whether an extracted answer equals the ground truth by math-verify (module docstring)."""
    from math_verify import verify

    if len(answer) > MAX_ANSWER_CHARS:
        return False
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call without a timeout
    gold, pred = _mv_parse(str(ground_truth).strip(), timeout), _mv_parse(answer, timeout)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def grader_of(data_source: str) -> str:
    """`dapo`, `boxed` or `default` (the `reward.answer_extraction` rule) for a verl data source."""
    ds = str(data_source)
    if ds in DAPO_SOURCES or ds.lower().startswith(DAPO_PREFIXES):
        return "dapo"
    if ds in BOXED_SOURCES:
        return "boxed"
    return "default"


def math_score(data_source: str, solution_str: str, ground_truth: str) -> float | None:
    """1.0/0.0 for a math data source (module docstring); None for other sources."""
    kind = grader_of(data_source)
    if kind == "default":
        return None
    answer = extract_after_answer(solution_str) if kind == "dapo" else extract_last_boxed(solution_str)
    return 1.0 if answer is not None and math_equal(answer, ground_truth) else 0.0


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  answer_extraction: str = "strict") -> float:
    """Default verifiable reward with verl's `compute_score` signature: the math graders for math
    data sources, else the `####` (strict) or last-integer (flexible) rule."""
    got = math_score(data_source, solution_str, ground_truth)
    return got if got is not None else verifiable_score(solution_str, ground_truth, answer_extraction)


def load_reward_function(path: str) -> ComputeScore:
    """Resolve `module:function`, `module.function` or `file.py:function` to a callable with verl's
    `compute_score(data_source, solution_str, ground_truth, extra_info)` signature.

    Raises ValueError naming the path and what went wrong (module not found, no such attribute,
    not callable, wrong signature)."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"reward.custom_reward_function must be 'module:function', got {path!r}")
    if ":" in path:
        mod_name, _, attr = path.rpartition(":")
    else:
        mod_name, _, attr = path.rpartition(".")
    if not mod_name or not attr:
        raise ValueError(f"reward.custom_reward_function {path!r}: expected 'module:function' or "
                         "'module.function' or 'path/to/file.py:function'")
    try:
        if mod_name.endswith(".py"):
            file = Path(mod_name)
            if not file.is_file():
                raise FileNotFoundError(f"no file {mod_name!r}")
            spec = importlib.util.spec_from_file_location(f"pivotrl_custom_reward_{file.stem}", file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any import failure is a config error naming the path
        raise ValueError(f"reward.custom_reward_function {path!r}: cannot import {mod_name!r}: "
                         f"{type(e).__name__}: {e}") from e
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"reward.custom_reward_function {path!r}: module {mod_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ValueError(f"reward.custom_reward_function {path!r}: {attr!r} is not callable")
    try:
        inspect.signature(fn).bind("ds", "sol", "gt", {})
    except TypeError as e:
        raise ValueError(f"reward.custom_reward_function {path!r}: must accept (data_source, solution_str, "
                         f"ground_truth, extra_info): {e}") from None
    except ValueError:
        pass  # builtins without a signature: trust the caller
    return fn


def _as_float(result: Any, where: str) -> float:
    # verl allows a dict with "score" as well as a bare number.
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"{where} returned a dict without key 'score': {result!r}")
        result = result["score"]
    if isinstance(result, bool):
        return float(result)
    if not isinstance(result, (int, float)):
        raise ValueError(f"{where} returned {type(result).__name__}, expected a number or {{'score': number}}")
    return float(result)


@dataclass
class RewardBreakdown:
    """One sample's reward and its parts (`genrm_ok` is False on a GenRM parse failure)."""

    total: float
    verifiable: float
    genrm: float
    genrm_ok: bool = True


class RewardFunction:
    """R = verifiable_weight * R_verifiable + genrm_weight * R_genrm, per `RewardConfig`. The GenRM
    parser is `judge.parser` (`models.genrm.judge`); without a JudgeConfig, the tiny task's
    `score_line` (library use and tests)."""

    def __init__(self, cfg: RewardConfig, stats: ParseStats | None = None, judge: JudgeConfig | None = None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.stats = stats if stats is not None else ParseStats()
        self._custom = (load_reward_function(cfg.custom_reward_function)
                        if cfg.custom_reward_function is not None else None)
        self.parser = judge.parser if judge is not None else "score_line"
        get_score_parser(self.parser)  # fail at start, not at the first judgement

    @property
    def uses_genrm(self) -> bool:
        return self.cfg.genrm_weight != 0.0

    def verifiable(self, data_source: str, solution_str: str, ground_truth: str,
                   extra_info: dict | None = None) -> float:
        if self._custom is not None:
            return _as_float(self._custom(data_source, solution_str, ground_truth, extra_info or {}),
                             f"custom reward function {self.cfg.custom_reward_function!r}")
        return compute_score(data_source, solution_str, ground_truth, extra_info, self.cfg.answer_extraction)

    def __call__(self, data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict | None = None, genrm_text: str | None = None) -> RewardBreakdown:
        rv = self.verifiable(data_source, solution_str, ground_truth, extra_info)
        rg, ok = 0.0, True
        if self.uses_genrm:
            if genrm_text is None:
                raise ValueError("reward.genrm_weight != 0 but no GenRM output was given for the sample")
            parsed = parse_score(genrm_text, self.parser, self.stats)
            rg, ok = parsed.score, parsed.ok
        total = self.cfg.verifiable_weight * rv + self.cfg.genrm_weight * rg
        return RewardBreakdown(total=total, verifiable=rv, genrm=rg, genrm_ok=ok)
