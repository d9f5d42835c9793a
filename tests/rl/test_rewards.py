"""Verifiable reward, custom reward functions by import path, and the weighted sum with the GenRM."""
from __future__ import annotations

import pytest

from pivotrl.config.rl import RewardConfig
from pivotrl.rl.genrm import ParseStats
from pivotrl.rl.rewards import RewardFunction, compute_score, extract_answer, load_reward_function

EXTRACT = [
    ("3+4=7\n#### 7", "strict", "7"),
    ("#### 1,234", "strict", "1234"),
    ("#### -5", "strict", "-5"),
    ("####12", "strict", "12"),
    ("#### 3\n#### 8", "strict", "8"),
    ("3+4=7", "strict", None),
    ("####", "strict", None),
    ("", "strict", None),
    ("3+4=7", "flexible", "7"),
    ("a 3 b 12 c", "flexible", "12"),
    ("no digits", "flexible", None),
    ("#### 007", "strict", "7"),
]


@pytest.mark.parametrize("text,method,want", EXTRACT)
def test_extract_answer_table(text: str, method: str, want: str | None) -> None:
    assert extract_answer(text, method) == want


def test_extract_unknown_method() -> None:
    with pytest.raises(ValueError, match="answer_extraction 'fuzzy'.*strict"):
        extract_answer("1", "fuzzy")


@pytest.mark.parametrize("solution,truth,want", [
    ("5+3=8\n#### 8", "8", 1.0),
    ("5+3=8\n#### 8", 8, 1.0),
    ("5+3=9\n#### 9", "8", 0.0),
    ("5+3=8", "8", 0.0),  # strict: no final answer line is wrong even if the equation is right
    ("#### 8 #### 9", "8", 0.0),
])
def test_compute_score_verl_signature(solution: str, truth: str, want: float) -> None:
    assert compute_score("pivotrl/arith", solution, truth, {}) == want


def test_weighted_sum_with_genrm() -> None:
    stats = ParseStats()
    rf = RewardFunction(RewardConfig(verifiable_weight=1.0, genrm_weight=0.5), stats)
    r = rf("ds", "#### 8", "8", {}, genrm_text="check: 5+3=8\nscore: 0.8")
    assert (r.total, r.verifiable, r.genrm, r.genrm_ok) == (pytest.approx(1.4), 1.0, 0.8, True)
    # A GenRM parse failure scores 0 and is counted, never raised.
    r = rf("ds", "#### 9", "8", {}, genrm_text="score: 5")
    assert (r.total, r.genrm_ok) == (0.0, False)
    assert stats.failures == 1
    with pytest.raises(ValueError, match="no GenRM output"):
        rf("ds", "#### 8", "8", {})


def test_genrm_weight_zero_needs_no_genrm() -> None:
    r = RewardFunction(RewardConfig(genrm_weight=0.0))("ds", "#### 8", "8")
    assert r.total == 1.0 and r.genrm == 0.0


@pytest.fixture
def custom_module(tmp_path, monkeypatch):
    (tmp_path / "my_reward_mod.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': 0.25 if ground_truth in solution_str else -1.0}\n"
        "def bad_signature(x):\n    return 1\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("spec", ["my_reward_mod:compute_score", "my_reward_mod.compute_score"])
def test_custom_reward_by_import_path(custom_module, spec: str) -> None:
    fn = load_reward_function(spec)
    assert fn("ds", "xx 8", "8", {}) == {"score": 0.25}
    rf = RewardFunction(RewardConfig(custom_reward_function=spec, genrm_weight=0.0))
    assert rf("ds", "xx 8", "8").total == 0.25
    assert rf("ds", "xx", "8").total == -1.0


def test_custom_reward_by_file_path(custom_module) -> None:
    fn = load_reward_function(f"{custom_module / 'my_reward_mod.py'}:compute_score")
    assert fn("ds", "8", "8", {}) == {"score": 0.25}


@pytest.mark.parametrize("spec,match", [
    ("no_such_module_xyz:compute_score", "cannot import 'no_such_module_xyz'"),
    ("my_reward_mod:missing", "has no attribute 'missing'"),
    ("my_reward_mod:NOT_CALLABLE", "not callable"),
    ("my_reward_mod:bad_signature", "must accept"),
    ("compute_score", "expected 'module:function'"),
    ("/nope/file.py:compute_score", "cannot import"),
    ("", "must be 'module:function'"),
])
def test_custom_reward_bad_paths(custom_module, spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_reward_function(spec)
    with pytest.raises(ValueError, match="custom_reward_function"):
        RewardFunction(RewardConfig(custom_reward_function=spec))


@pytest.mark.parametrize("kwargs,match", [
    ({"verifiable_weight": -1.0}, "verifiable_weight"),
    ({"answer_extraction": "fuzzy"}, "answer_extraction 'fuzzy'"),
    ({"genrm_weight": float("nan")}, "genrm_weight"),
])
def test_reward_config_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RewardConfig(**kwargs)


def test_unknown_parser_name_is_clear() -> None:
    from pivotrl.config.rl import JudgeConfig

    with pytest.raises(ValueError, match="models.genrm.judge.parser='nope' is invalid"):
        JudgeConfig(parser="nope")
