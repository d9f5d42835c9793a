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


def test_rollout_requests_carry_seeds_on_cpu_only_unless_asked():
    """`engine.request_seeds` null: a per-request seed on CPU (reproducible runs), none on GPUs
    (vLLM samples seeded requests one by one); a user's true keeps them on GPUs too."""
    from pivotrl.config import compose_config
    from pivotrl.core.types import Role
    from pivotrl.models.tiny import build_tokenizer
    from pivotrl.rl.data import Example
    from pivotrl.runtime.ledger import Tokens
    from pivotrl.runtime.samples import Samples

    tok = build_tokenizer()
    ex = [Example(prompt=[{"role": "user", "content": "1+1"}], data_source="x", ground_truth="2", extra_info={})]
    seeds = {}
    for name, ov in (("cpu", []), ("cuda", ["cluster.accelerator=cuda"]),
                     ("cuda+seeds", ["cluster.accelerator=cuda", "engine.rollout.request_seeds=true"])):
        cfg = compose_config(["cluster=local", *ov])
        s = Samples(cfg, tok, tok, ex, 1, 2, 8)
        seeds[name] = [s.request(Role.ROLLOUT, sid, Tokens(), None).params.seed for sid in (0, 1)]
    assert all(isinstance(x, int) for x in seeds["cpu"]) and seeds["cpu"][0] != seeds["cpu"][1]
    assert seeds["cuda"] == [None, None] and seeds["cuda+seeds"] == seeds["cpu"]
