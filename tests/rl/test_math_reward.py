"""Verifiable math reward for real data: verl-style extraction first (after the last "Answer:" for
math_dapo, the last \\boxed{} for math), then math-verify; near-misses score 0; the synthetic task's
`####` rule is unchanged; the verl hook keeps its signature."""
from __future__ import annotations

import threading

import pytest

from pivotrl.config.rl import JudgeConfig, RewardConfig
from pivotrl.rl.rewards import (RewardFunction, compute_score, extract_after_answer, extract_last_boxed, grader_of,
                                load_reward_function)

DAPO_RIGHT = """Let the fraction be m/n. Reducing 14/42 gives 1/3, so m = 1 and n = 3.
Wait, the problem asks for m + n with the other fraction: 17/18 gives m + n = 35.
Answer: 35"""

CASES = [
    # (data_source, response, ground truth, expected)
    ("math_dapo", DAPO_RIGHT, "35", 1.0),
    ("math_dapo", "Answer: 34", "34", 1.0),                             # issue 14: was scored wrong
    ("math_dapo", "so the value is 1/2.\nAnswer: \\frac{1}{2}", "0.5", 1.0),
    ("math_dapo", "Answer: 0.5", "\\frac{1}{2}", 1.0),
    ("math_dapo", "Answer: $\\dfrac{3}{4}$.", "3/4", 1.0),
    ("math_dapo", "Answer: x = 3", "3", 1.0),
    ("math_dapo", "First try. Answer: 12\nThat was wrong; recompute.\nAnswer: 13", "13", 1.0),  # the LAST one
    ("math_dapo", "First try. Answer: 13\nThat was wrong; recompute.\nAnswer: 12", "13", 0.0),
    ("math_dapo", "m+n = 35, not 34", "34", 0.0),                       # no Answer: line -> wrong
    ("math_dapo", "Answer: 35, not 34", "34", 0.0),                     # one expression, not "last number"
    ("math_dapo", "Answer: 340", "34", 0.0),
    ("math_dapo", "Answer: -34", "34", 0.0),
    ("math_dapo", "Answer: 3.4", "34", 0.0),
    ("math_dapo", "The answer is \\boxed{34}", "34", 0.0),               # DAPO's format is "Answer:"
    ("math_dapo", "Answer: ３４", "34", 0.0),                             # full-width digits are not 34
    ("math_dapo", "Answer:", "34", 0.0),
    ("aime24", "Answer: 204", "204", 1.0),
    ("math", "Thus the area is $\\boxed{\\frac{1}{2}}$.", "0.5", 1.0),
    ("math", "\\boxed{34}", "34", 1.0),                                  # issue 14: was scored wrong
    ("math", "We get \\boxed{\\sqrt{2}/2} after rationalising.", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("math", "first \\boxed{3} then corrected: \\boxed{4}", "4", 1.0),
    ("math", "first \\boxed{4} then corrected: \\boxed{3}", "4", 0.0),
    ("math", "m+n = 35, not 34", "34", 0.0),                            # no box -> wrong
    ("math", "\\boxed{\\frac{1}{3}}", "0.33", 0.0),
    ("math", "\\boxed{x^2+1", "x^2+1", 0.0),                             # unbalanced
    ("math", "The answer is \\fbox{7}", "7", 1.0),
    ("HuggingFaceH4/MATH-500", "\\boxed{(1, 2)}", "(1,2)", 1.0),
    ("lighteval/MATH", "\\boxed{\\{1,2\\}}", "\\{2,1\\}", 1.0),
    # the synthetic task keeps GSM8K's rule
    ("pivotrl/arith", "3+4=7\n#### 7", "7", 1.0),
    ("pivotrl/arith", "3+4=7\nAnswer: 7", "7", 0.0),
    ("openai/gsm8k", "#### 1,234", "1234", 1.0),
    ("pivotrl/arith", "#### ７", "7", 0.0),                              # full-width digit: not 7
]


@pytest.mark.parametrize("ds,resp,gt,want", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_math_reward_table(ds, resp, gt, want):
    assert compute_score(ds, resp, gt, {}) == want


def test_extractors():
    assert extract_after_answer("a\nAnswer: 5.\nb") == "5"
    assert extract_after_answer("answer : $12$") == "12"
    assert extract_after_answer("no marker") is None
    assert extract_last_boxed("\\boxed{\\frac{a}{b}} and \\boxed{c{d}e}") == "c{d}e"
    assert extract_last_boxed("none") is None
    assert grader_of("math_dapo") == "dapo" and grader_of("AIME2025") == "dapo"
    assert grader_of("math") == "boxed" and grader_of("pivotrl/arith") == "default"


def test_works_off_the_main_thread():
    """Reward workers run in threads; math-verify's SIGALRM timeout would raise there."""
    out = []
    t = threading.Thread(target=lambda: out.append(compute_score("math", "\\boxed{0.5}", "\\frac12", {})))
    t.start()
    t.join()
    assert out == [1.0]


def test_reward_function_routes_math_and_uses_the_judge_parser():
    rf = RewardFunction(RewardConfig(genrm_weight=1.0), judge=JudgeConfig(parser="score_out_of_10"))
    r = rf("math_dapo", "Answer: 34", "34", {}, genrm_text="<think>ok</think>Score: 8/10")
    assert (r.verifiable, r.genrm, r.genrm_ok) == (1.0, pytest.approx(0.8), True) and r.total == pytest.approx(1.8)
    bad = rf("math_dapo", "Answer: 33", "34", {}, genrm_text="Score: ８/10")
    assert (bad.verifiable, bad.genrm, bad.genrm_ok) == (0.0, 0.0, False) and rf.stats.failures == 1
    tiny = RewardFunction(RewardConfig())  # no judge config: the tiny task's score line, as before
    assert tiny("pivotrl/arith", "#### 7", "7", {}, genrm_text="check: 3+4=7 vs 7\nscore: 1").total == 2.0


def test_verl_hook_signature_kept():
    fn = load_reward_function("pivotrl.rl.rewards:compute_score")
    assert fn("math_dapo", "Answer: 2", "2", {"split": "train"}) == 1.0
