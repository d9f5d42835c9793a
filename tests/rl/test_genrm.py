"""Table tests of the GenRM score parsers (malformed, truncated, adversarial) and the judge prompt."""
from __future__ import annotations

import pytest

from pivotrl.rl.genrm import (
    JUDGE_TEMPLATE,
    PARSE_STATS,
    SCORE_PARSERS,
    ParseStats,
    get_score_parser,
    judge_messages,
    parse_score,
    reference_judgement,
)

# (text, strict score_line result, lenient last_score_line result); None = parse failure
CASES = [
    ("check: 3+4=7\nscore: 1", 1.0, 1.0),
    ("check: 3+4=7\nscore: 0", 0.0, 0.0),
    ("check: 3+4=7\nscore: 0.9", 0.9, 0.9),
    ("score: .25", 0.25, 0.25),
    ("  SCORE :  0.5  ", 0.5, 0.5),
    ("check: 3+4=7\nscore: 1\n", 1.0, 1.0),
    # none
    ("", None, None),
    ("check: 3+4=7", None, None),
    ("the answer looks right, 1", None, None),
    # truncated mid-line
    ("check: 3+4=7\nscore:", None, None),
    ("check: 3+4=7\nscore: 0.", None, None),
    ("check: 3+4=7\nsco", None, None),
    # out of range / not finite
    ("score: 1.5", None, None),
    ("score: -0.2", None, None),
    ("score: 90", None, None),
    ("score: nan", None, None),
    ("score: inf", None, None),
    ("score: 1e3", None, None),
    # malformed values
    ("score: high", None, None),
    ("score: 90%", None, None),
    ("score: 1 (very sure)", None, None),
    ("score: 0.5 0.7", None, None),
    # several score lines: strict refuses, lenient takes the last valid one
    ("score: 0\nscore: 1", None, 1.0),
    ("score: 1\nscore: 7", None, 1.0),
    ("score: 0.2\ncheck again\nscore: 0.3", None, 0.3),
    # adversarial: the score must be on its own line, not embedded in text
    ("I would give score: 1 to this", None, None),
    ("check: score: 1", None, None),
]


@pytest.mark.parametrize("text,strict,lenient", CASES)
def test_parser_table(text: str, strict: float | None, lenient: float | None) -> None:
    for name, want in (("score_line", strict), ("last_score_line", lenient)):
        stats = ParseStats()
        got = parse_score(text, name, stats)
        assert stats.total == 1
        if want is None:
            assert not got.ok and got.score == 0.0 and got.reason, (name, text, got)
            assert stats.failures == 1
        else:
            assert got.ok and got.score == pytest.approx(want), (name, text, got)
            assert stats.failures == 0


def test_failures_are_counted_and_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    stats = ParseStats()
    with caplog.at_level("WARNING"):
        for text in ("score: 2", "nothing", "score: 1", None):
            parse_score(text, stats=stats)  # type: ignore[arg-type]
    assert stats.total == 4 and stats.failures == 3
    assert stats.failure_rate == pytest.approx(0.75)
    assert stats.reasons["out of range"] == 1 and stats.reasons["no score line"] == 1
    assert "parse failure" in caplog.text
    d = stats.as_dict()
    assert d["failures"] == 3
    stats.reset()
    assert stats.total == 0 and not stats.reasons


def test_module_counter_used_by_default() -> None:
    before = PARSE_STATS.failures
    parse_score("garbage")
    assert PARSE_STATS.failures == before + 1


def test_registry_contract_and_unknown_name() -> None:
    assert {"score_line", "last_score_line", "score_out_of_10", "boxed", "boxed_10", "yes_no"} <= set(SCORE_PARSERS)
    for name in ("score_line", "last_score_line"):
        fn = SCORE_PARSERS[name]
        assert fn("score: 1").ok and fn("score: 1").score == 1.0, name
        assert not fn("score: 3").ok, name
    for name, fn in SCORE_PARSERS.items():
        assert not fn("").ok, name
    with pytest.raises(ValueError, match=r"models.genrm.judge.parser='nope' is invalid; allowed: .*score_line"):
        get_score_parser("nope")


def test_reference_judgement_round_trips_through_parser() -> None:
    for s in (0.0, 1.0, 0.9):
        assert parse_score(reference_judgement("3+4=7", s), stats=ParseStats()).score == pytest.approx(s)


def test_judge_messages_uses_last_user_turn() -> None:
    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Q1"},
              {"role": "assistant", "content": "x"}, {"role": "user", "content": "Tom has 3 pens."}]
    msgs = judge_messages(prompt, " 3+1=4\n#### 4 ")
    assert msgs == [{"role": "user", "content": JUDGE_TEMPLATE.format(question="Tom has 3 pens.",
                                                                      response="3+1=4\n#### 4")}]
    with pytest.raises(ValueError, match="role 'user'"):
        judge_messages([{"role": "system", "content": "s"}], "r")
