"""`runtime/samples.py`: the judge template's tokens are measured with the GenRM's own tokenizer
and chat template, and are exactly what a real judge prompt adds to its question and response."""
from __future__ import annotations

import pytest


def tokens(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("template, system", [("tiny", None), ("score_out_of_10", None), ("tiny", "Be strict. " * 30)])
def test_judge_room_is_what_a_judge_prompt_adds(template, system):
    from pivotrl.config.rl import ChatConfig, JudgeConfig
    from pivotrl.models.tiny import build_tokenizer
    from pivotrl.rl.genrm import JUDGE_TEMPLATES, judge_prompt
    from pivotrl.runtime.samples import judge_template_tokens

    tok = build_tokenizer()  # character-level: token counts add up exactly
    judge = JudgeConfig(template=template, parser=JUDGE_TEMPLATES[template].parser, max_tokens=32)
    chat = ChatConfig(system_prompt=system)
    room = judge_template_tokens(tok, judge, chat)
    for q, r in (("What is 3 + 4?", "3 + 4 = 7 #### 7"), ("Compute 9 - 2.", "#### 7")):
        full = judge_prompt(tok, [{"role": "user", "content": q}], r, judge, chat)
        assert len(full) == tokens(tok, q) + tokens(tok, r) + room
    t = JUDGE_TEMPLATES[template]
    # the template's own text is in it (fields removed), and a system prompt adds its length
    body = t.user.replace("{question}", "").replace("{response}", "")
    assert room >= tokens(tok, body) + (tokens(tok, system) if system else tokens(tok, t.system or ""))
