"""Real-judge output shapes: each parser on realistic multi-line judgements (reasoning, think blocks,
several candidate scores, malformed ones), ASCII-only digits (issue 12), judge prompts rendered with
the GenRM's own tokenizer and chat template, and the judge config's name checks."""
from __future__ import annotations

import pytest

from pivotrl.config.rl import ChatConfig, JudgeConfig
from pivotrl.rl.genrm import JUDGE_TEMPLATES, ParseStats, judge_conversation, judge_prompt, parse_score, strip_thinking

QWEN3_JUDGE = """<think>
The problem asks for m+n where m/n = 7/28 in lowest terms... 7/28 = 1/4, so m+n = 5.
The candidate writes 1/4 and then m+n = 5. A fully correct solution deserves Score: 10/10, but
let me double check the reduction. 7 and 28 share 7, so 1/4 is right.
</think>

The candidate reduces 7/28 correctly to 1/4 and concludes m + n = 5, which matches my derivation.
The explanation skips the gcd step but is otherwise sound.

**Score: 9/10**"""

GLM_Z1_JUDGE = """<think>
Check each step. Step 2 has an arithmetic slip: 12*13 = 156, not 146.
</think>
The final answer 146 is wrong because of the slip in step 2.
Score: 2/10
"""

# (parser, text, expected score or None for a failure, failure reason substring)
CASES = [
    # score_out_of_10 --------------------------------------------------------------------------
    ("score_out_of_10", QWEN3_JUDGE, 0.9, ""),              # the rubric quote inside <think> is ignored
    ("score_out_of_10", GLM_Z1_JUDGE, 0.2, ""),
    ("score_out_of_10", "Reasoning...\nScore: 3/10\nOn reflection the last step is fine.\nScore: 8 / 10", 0.8, ""),
    ("score_out_of_10", "score = 10/10", 1.0, ""),
    ("score_out_of_10", "Score: 7.5/10", 0.75, ""),
    ("score_out_of_10", "Score: 11/10", None, "out of range"),
    ("score_out_of_10", "Score: 8/100", None, "no 'Score: x/10'"),
    ("score_out_of_10", "I would give it an 8 out of ten.", None, "no 'Score: x/10'"),
    ("score_out_of_10", "Score: ９/10", None, "no 'Score: x/10'"),  # full-width digit
    ("score_out_of_10", "<think>\nScore: 9/10 seems right but let me verify the", None, "think block never closed"),
    # boxed ------------------------------------------------------------------------------------
    ("boxed", "The solution is correct with minor gaps.\n\nFinal score: \\boxed{0.85}", 0.85, ""),
    ("boxed", "<think>maybe \\boxed{1}</think>Actually the sign is wrong. \\boxed{0}", 0.0, ""),
    ("boxed", "Candidate answer \\boxed{\\frac{1}{2}} is restated; my score: \\boxed{1}", 1.0, ""),
    ("boxed", "score \\boxed{0.9", None, "no \\boxed{}"),                   # unbalanced brace
    ("boxed", "\\boxed{9}", None, "out of range"),
    ("boxed", "\\boxed{high}", None, "not a number"),
    ("boxed_10", "Overall \\boxed{7}", 0.7, ""),
    ("boxed_10", "\\boxed{٧}", None, "not a number"),                   # Arabic-Indic digit
    # yes_no -----------------------------------------------------------------------------------
    ("yes_no", "<think>Is 156 right? yes.</think>\nThe computation is wrong in step 3.\nVerdict: No", 0.0, ""),
    ("yes_no", "Step by step the answer holds.\n\n**Final Answer:** Yes", 1.0, ""),
    ("yes_no", "Answer: incorrect", 0.0, ""),
    ("yes_no", "Verdict: No. Wait, I misread the question.\nVerdict: Yes", 1.0, ""),
    ("yes_no", "Everything checks out.\n\\boxed{\\text{yes}}", 1.0, ""),
    ("yes_no", "The reasoning is fine.\nYes.", 1.0, ""),
    ("yes_no", "It is hard to say; perhaps.", None, "no verdict"),
    # tiny score line (unchanged behaviour) and issue 12's digits -----------------------------
    ("score_line", "check: 3+4=7 vs 7\nscore: 1", 1.0, ""),
    ("score_line", "check: 3+4=7 vs 8\nscore: 0", 0.0, ""),
    ("score_line", "score: １", None, "malformed score line"),              # full-width 1
    ("score_line", "score: ٠.٥", None, "malformed score line"),            # Arabic-Indic 0.5
    ("score_line", "score: 0.５", None, "malformed score line"),
    ("last_score_line", "score: 1\nscore: ０", 1.0, ""),                    # the malformed one is skipped
    ("last_score_line", "score: ０", None, "malformed score line"),
]


# Adversarial text of about 20 KB (issue 22: the old scans were quadratic, or worse, on these; a
# judge may write 20,480 tokens). Correctness only: `python -m pivotrl.bench genrm_parse` times
# them up to 1 MB.
N = 20_000
K = N // 8
ADVERSARIAL = [
    ("boxed", "\\boxed{" * K, None, "no \\boxed{}"),                               # every box unclosed
    ("boxed", "\\boxed{0.5}" + "\\boxed{" * K, 0.5, ""),                            # the last closed one
    ("boxed", "\\boxed{" * K + "0.5" + "}" * K, 0.5, ""),                            # nested: the innermost
    ("boxed", "\\boxed{" + "{" * N + "}", None, "no \\boxed{}"),
    ("boxed", "\\boxed{1}" + "}" * N, 1.0, ""),
    ("boxed", "\\boxed{0.5} " * K + "\\boxed{0.25}", 0.25, ""),                     # thousands of matches
    ("boxed", "\\boxed{" + "9" * N + "}", None, "not finite"),                      # a huge number
    ("boxed_10", "\\boxed{" + "9" * 200 + "}", None, "out of range"),
    ("boxed", "\\boxed{0." + "1" * N + "}", 0.1111111111111111, ""),
    ("yes_no", "Verdict: Yes\n" * K + "Verdict: No", 0.0, ""),
    ("yes_no", "Verdict" + " " * N + "maybe", None, "no verdict"),                   # spaces, then no word
    ("yes_no", "Verdict:" + " " * N + "yes", 1.0, ""),
    ("yes_no", "\\boxed{" * K + "yes" + "}" * K, 1.0, ""),
    ("yes_no", "\\boxed{\\text{" * K, None, "no verdict"),
    ("yes_no", "\\boxed{" + " " * N + "yes}", None, "no verdict"),                  # a box of 64+ chars is no verdict
    ("yes_no", "!" * N + "yes!", 1.0, ""),
    ("score_out_of_10", "Score: 7/10\n" * K, 0.7, ""),
    ("score_out_of_10", "Score:" + " " * N + "x", None, "no 'Score: x/10'"),
    ("score_out_of_10", "Score: " + "*" * N, None, "no 'Score: x/10'"),
    ("score_out_of_10", "Score: " + "9" * N + "/10", None, "not finite"),
    ("score_out_of_10", "Score: " + "1" * N, None, "no 'Score: x/10'"),
    ("score_line", "score: 0.5\n" * K, None, "several score lines"),
    ("last_score_line", "score: 0.5\n" * K, 0.5, ""),
    ("score_line", "score: 0." + "1" * N, 0.1111111111111111, ""),
    ("score_line", "score:" + " " * N + "x", None, "malformed score line"),
    ("yes_no", "<think>" + "yes " * K, None, "think block never closed"),
]


@pytest.mark.parametrize("parser,text,want,reason", ADVERSARIAL,
                         ids=[f"{c[0]}-adversarial-{i}" for i, c in enumerate(ADVERSARIAL)])
def test_parsers_on_adversarial_text(parser, text, want, reason):
    test_parsers_on_real_judge_shapes(parser, text, want, reason)


@pytest.mark.parametrize("parser,text,want,reason", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_parsers_on_real_judge_shapes(parser, text, want, reason):
    stats = ParseStats()
    got = parse_score(text, parser, stats)
    assert stats.total == 1
    if want is None:
        assert not got.ok and got.score == 0.0 and reason in got.reason and stats.failures == 1
    else:
        assert got.ok and got.score == pytest.approx(want) and stats.failures == 0


def test_malformed_outputs_are_counted_never_fatal():
    stats = ParseStats()
    outs = [QWEN3_JUDGE, "", "<think>no end", None, 42, "Score: nan/10", GLM_Z1_JUDGE]
    scores = [parse_score(o, "score_out_of_10", stats).score for o in outs]
    assert scores == [0.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2]
    assert stats.total == 7 and stats.failures == 5
    assert stats.reasons["think block never closed"] == 1 and stats.reasons["not text (NoneType)"] == 1


def test_strip_thinking():
    assert strip_thinking("<think>a</think>b<think>c</think> d") == (" d", True)
    assert strip_thinking("plain") == ("plain", True)
    assert strip_thinking("pre-filled think</think>answer") == ("answer", True)  # template opened <think>
    assert strip_thinking("<think>unfinished") == ("", False)


def test_judge_prompt_uses_the_genrm_tokenizer_and_chat_options():
    from pivotrl.models.tiny_families import family_tokenizer

    tok = family_tokenizer()
    prompt = [{"role": "user", "content": "What is 2+3?"}]
    response = "<think>2+3 is 5</think>The answer is 5.\nAnswer: 5"
    judge = JudgeConfig(template="score_out_of_10", parser="score_out_of_10")
    ids = judge_prompt(tok, prompt, response, judge, ChatConfig(enable_thinking=False))
    text = tok.decode(ids)
    assert text.startswith("<|system|>You are a strict grader")  # the template's own system prompt
    assert "What is 2+3?" in text and "Answer: 5" in text and "2+3 is 5" not in text  # policy's think removed
    assert text.endswith("<|assistant|><think>\n\n</think>\n\n")  # enable_thinking=False pre-fills it
    ids2 = judge_prompt(tok, prompt, response, judge, ChatConfig(system_prompt="Be brief.", enable_thinking=True))
    text2 = tok.decode(ids2)
    assert text2.startswith("<|system|>Be brief.<|eos|>") and text2.endswith("<|assistant|>")
    tiny = judge_conversation(prompt, " 2+3=5\n#### 5", "tiny")
    assert tiny == [{"role": "user", "content": "Q: What is 2+3?\nA: 2+3=5\n#### 5\nCheck A."}]


def test_judge_prompt_without_chat_template_names_the_field():
    from pivotrl.models.tokenizer import build_tokenizer
    from pivotrl.rl.chat import ChatTemplateError

    tok = build_tokenizer()
    tok.chat_template = None
    with pytest.raises(ChatTemplateError, match="models.genrm.chat: the tokenizer has no chat template"):
        judge_prompt(tok, [{"role": "user", "content": "q"}], "r", JudgeConfig(), ChatConfig())


def test_every_template_asks_for_its_parser():
    assert {"tiny", "score_out_of_10", "boxed", "yes_no"} <= set(JUDGE_TEMPLATES)
    for name, t in JUDGE_TEMPLATES.items():
        JudgeConfig(template=name, parser=t.parser)  # registered names pass


@pytest.mark.parametrize("kw,match", [
    ({"template": "nope"}, r"^models\.genrm\.judge\.template='nope' is invalid; allowed: boxed \| "),
    ({"parser": "nope"}, r"^models\.genrm\.judge\.parser='nope' is invalid; allowed: boxed \| "),
    ({"max_tokens": 0}, r"^max_tokens=0 is invalid; allowed: an int >= 1"),
    ({"temperature": float("nan")}, r"^temperature=nan is invalid; allowed: a finite number >= 0"),
    ({"top_p": 0}, r"^top_p=0 is invalid; allowed: in \(0, 1\]"),
    ({"max_parse_failure_rate": 1.5}, r"^max_parse_failure_rate=1.5 is invalid; allowed: in \[0, 1\]"),
])
def test_judge_config_refuses_bad_values(kw, match):
    from pivotrl.config.base import ConfigError

    with pytest.raises(ConfigError, match=match):
        JudgeConfig(**kw)


@pytest.mark.parametrize("override,message", [
    ("models.genrm.judge.parser=nope", "models.genrm.judge.parser='nope' is invalid; allowed: boxed | boxed_10 | "
     "last_score_line | score_line | score_out_of_10 | yes_no"),
    ("models.genrm.judge.max_tokens=0", "models.genrm.judge.max_tokens=0 is invalid; allowed: an int >= 1"),
    ("models.genrm.judge.top_p=1.5", "models.genrm.judge.top_p=1.5 is invalid; allowed: in (0, 1]"),
])
def test_judge_errors_name_the_full_path_once(override, message):
    from pivotrl.config import compose_config
    from pivotrl.config.base import ConfigError

    with pytest.raises(ConfigError) as ei:
        compose_config([override])
    assert str(ei.value) == message


def test_the_config_names_the_judge_without_importing_it():
    """`pivotrl.config` holds the judge's names with lazy targets here; validating a config imports
    no rl module (checked in a fresh interpreter), and every name reaches this module's object."""
    import subprocess
    import sys

    import pivotrl.rl.genrm as genrm
    from pivotrl.config.rl import SCORE_PARSERS

    code = ("import sys; from pivotrl.config import compose_config; compose_config(['cluster=sim']); "
            "print(sorted(m for m in sys.modules if m.startswith('pivotrl.rl') or m in ('torch', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert genrm.JUDGE_TEMPLATES["boxed"] is genrm.BOXED_TEMPLATE and SCORE_PARSERS is genrm.SCORE_PARSERS
    assert SCORE_PARSERS["yes_no"] is genrm.parse_yes_no


def test_default_judge_fits_a_reasoning_judge():
    assert JudgeConfig().max_tokens >= 20000  # paper §8.1: GenRM responses up to 20K tokens


def test_load_chat_tokenizer_override_and_missing(tmp_path):
    from pivotrl.models.tiny_families import make_tiny_checkpoint
    from pivotrl.rl.chat import ChatTemplateError, load_chat_tokenizer, render_chat

    path = make_tiny_checkpoint("qwen3", tmp_path / "q", dtype="bfloat16")
    tok = load_chat_tokenizer(path, ChatConfig(), "models.genrm.chat")
    assert tok.decode(render_chat(tok, [{"role": "user", "content": "hi"}], ChatConfig(enable_thinking=False))) \
        == "<|user|>hi<|eos|><|assistant|><think>\n\n</think>\n\n"
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    tok2 = load_chat_tokenizer(path, ChatConfig(chat_template=str(jinja), system_prompt="S"), "models.genrm.chat")
    assert tok2.decode(render_chat(tok2, [{"role": "user", "content": "hi"}], ChatConfig(system_prompt="S"))) == "[S][hi]"
    with pytest.raises(ChatTemplateError, match="chat template file .*missing.jinja.* does not exist"):
        load_chat_tokenizer(path, ChatConfig(chat_template=str(tmp_path / "missing.jinja")))


def test_a_step_whose_judgements_mostly_fail_to_parse_warns_loudly_naming_the_judge(caplog):
    """Issue 22: a policy and judge swapped ran to the end with every judgement unparsed and no
    failure rate anywhere; each step over `max_parse_failure_rate` now warns, naming the keys."""
    import logging

    from pivotrl.rl.genrm import ParseFailureWatch

    stats = ParseStats()
    for text in ("junk", "more junk", "Score: 7/10"):
        parse_score(text, "score_out_of_10", stats)
    watch = ParseFailureWatch(JudgeConfig(), stats)
    with caplog.at_level(logging.WARNING, logger="pivotrl.rl.genrm"):
        caplog.clear()
        assert watch.step(1, 4, 8) == 0.5 and not caplog.records, "at the threshold: no warning"
        assert watch.step(2, 0, 0) is None and not caplog.records, "nothing judged: no rate"
        assert watch.step(3, 7, 8) == 0.875
    (rec,) = caplog.records
    msg = rec.getMessage()
    assert rec.levelno == logging.WARNING and "GenRM JUDGE OUTPUT NOT PARSED: 7 of 8 judgements of step 3 (88%)" in msg
    assert "models.genrm.judge.max_parse_failure_rate=0.5" in msg and "no 'Score: x/10' x2" in msg
    assert "models.genrm.judge.template='score_out_of_10'" in msg and "models.genrm.judge.parser='score_out_of_10'" in msg
    assert watch.summary() == {"total": 16, "failures": 11, "failure_rate": 11 / 16, "max_parse_failure_rate": 0.5,
                               "steps_over": [3], "template": "score_out_of_10", "parser": "score_out_of_10"}
    assert ParseFailureWatch(JudgeConfig(max_parse_failure_rate=1.0)).step(1, 8, 8) == 1.0
