"""Rewards: verifiable answer checking, custom reward functions by import path, and R = w_v*R_v + w_g*R_g.

Owns: extracting the final answer from a response, the default verl-signature `compute_score`,
resolving a user's `compute_score(data_source, solution_str, ground_truth, extra_info)` from an
import path, and combining the verifiable score with a GenRM score. Knows nothing about engines:
the GenRM text comes in already generated (see `pivotrl.rl.genrm` for the judge prompt/parsers).

Answer extraction (`reward.answer_extraction`):
- `strict` (default): the integer after the last `####` (verl's GSM8K convention); none -> wrong.
- `flexible`: the last integer anywhere in the response.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pivotrl.config.rl import RewardConfig
from pivotrl.rl.genrm import ParseStats, get_score_parser, parse_score

_STRICT = re.compile(r"####\s*([-+]?[\d,]*\d)")
_INTEGER = re.compile(r"[-+]?\d[\d,]*")

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


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """Default verifiable reward with verl's `compute_score` signature (strict extraction)."""
    return verifiable_score(solution_str, ground_truth, "strict")


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
    """R = verifiable_weight * R_verifiable + genrm_weight * R_genrm, per `RewardConfig`."""

    def __init__(self, cfg: RewardConfig, stats: ParseStats | None = None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.stats = stats if stats is not None else ParseStats()
        self._custom = (load_reward_function(cfg.custom_reward_function)
                        if cfg.custom_reward_function is not None else None)
        get_score_parser(cfg.genrm_parser)  # fail at start, not at the first judgement

    @property
    def uses_genrm(self) -> bool:
        return self.cfg.genrm_weight != 0.0

    def verifiable(self, data_source: str, solution_str: str, ground_truth: str,
                   extra_info: dict | None = None) -> float:
        if self._custom is not None:
            return _as_float(self._custom(data_source, solution_str, ground_truth, extra_info or {}),
                             f"custom reward function {self.cfg.custom_reward_function!r}")
        return verifiable_score(solution_str, ground_truth, self.cfg.answer_extraction)

    def __call__(self, data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict | None = None, genrm_text: str | None = None) -> RewardBreakdown:
        rv = self.verifiable(data_source, solution_str, ground_truth, extra_info)
        rg, ok = 0.0, True
        if self.uses_genrm:
            if genrm_text is None:
                raise ValueError("reward.genrm_weight != 0 but no GenRM output was given for the sample")
            parsed = parse_score(genrm_text, self.cfg.genrm_parser, self.stats)
            rg, ok = parsed.score, parsed.ok
        total = self.cfg.verifiable_weight * rv + self.cfg.genrm_weight * rg
        return RewardBreakdown(total=total, verifiable=rv, genrm=rg, genrm_ok=ok)
