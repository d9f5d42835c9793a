"""Fixtures for the engine tests: tiny Qwen2 model folders made by `pivotrl.models.tiny`.

head_dim is 32: vLLM's CPU attention rejects head_dim 16 ("Unsupported CPU attention configuration").

The folders use untied input/output embeddings: a random-init model with tied embeddings just
repeats its last input token under greedy decoding (the residual stream is dominated by the
token's own embedding), which would make "outputs equal the reference" tests nearly vacuous.
Untied, greedy outputs vary from token to token and between prompts, so the tests can fail.
"""
from __future__ import annotations

import time

import pytest
import torch

from pivotrl.models.tiny import TinyModelConfig, create_tiny_model

torch.set_num_threads(1)

TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                       max_position_embeddings=160, tie_word_embeddings=False)

PROMPT_TEXTS = [
    "Tom has 3 apples and buys 5 more. How many apples?",
    "7+8=",
    "a",
    "What is 12 times 4?",
    "Sara had 40 coins, lost 13. Coins left?",
    "hello there",
]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny policy folder (seed 1)."""
    return create_tiny_model(tmp_path_factory.mktemp("engines") / "policy", TINY, seed=1)


@pytest.fixture(scope="session")
def tiny_dir_b(tmp_path_factory):
    """A second tiny model with the same shapes and different weights (seed 2)."""
    return create_tiny_model(tmp_path_factory.mktemp("engines") / "policy_b", TINY, seed=2)


@pytest.fixture(scope="session")
def prompts(tiny_dir):
    from pivotrl.models.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_dir)
    return [tok.encode(t) for t in PROMPT_TEXTS]


def hf_greedy(model_dir, prompt_ids: list[int], max_new_tokens: int, state_dict=None) -> list[int]:
    """Greedy continuation by `transformers` `generate` (the reference), one prompt, no padding."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    if state_dict is not None:
        model.load_state_dict(state_dict)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


def check_new_tokens(engine, prompts: list[list[int]], base: int, step_timeout: float | None) -> None:
    """The `new_tokens` contract, on any engine: drive fresh sequences and two resumed ones (one
    with log-probs, one without), polling `new_tokens` between steps, aborting one sequence
    mid-way and resuming it. Each sequence's reported deltas, in order, continue exactly where the
    previous report (or the tokens it was submitted with) ended: joined to those and to what its
    abort or completion adds, they equal its final tokens and log-probs, with nothing repeated
    or skipped; a sequence resumed without log-probs reports them unknown."""
    from pivotrl.engines.protocol import GenerationRequest, SamplingParams, TokenDeltas

    sp = SamplingParams(temperature=1.0, max_tokens=20, seed=3, ignore_eos=True)
    reqs = [GenerationRequest(base + i, p, sp) for i, p in enumerate(prompts)]
    given = {base + 90: ([7, 8], [-0.5, -0.25]), base + 91: ([7, 8, 9], None)}
    for sid, (toks, lps) in given.items():
        reqs.append(GenerationRequest(sid, prompts[0], sp, generated=toks, generated_logprobs=lps))
    # per sequence: tokens known so far (as a driver's ledger holds them) and their log-probs
    ids = {r.seq_id: list(r.generated) for r in reqs}
    lps = {r.seq_id: None if r.generated_logprobs is None else list(r.generated_logprobs) for r in reqs}
    for r in reqs:
        engine.submit(r)
    done, aborted, reports = {}, None, 0
    deadline = time.monotonic() + 120
    while len(done) < len(reqs) and time.monotonic() < deadline:
        for c in engine.step(step_timeout):
            done[c.seq_id] = c
        d = engine.new_tokens()
        assert isinstance(d, TokenDeltas) and d.tokens == sum(len(t) for _, t in d.items())
        for sid, t in d.items():
            assert sid not in done, "a finished sequence reported new tokens after its completion"
            reports += 1
            ids[sid] += list(t)
            lps[sid] = None if lps[sid] is None or t.logprobs is None else lps[sid] + t.logprobs
            assert (t.logprobs is None) == (sid == base + 91)
        live = [s for s in ids if s not in done and len(ids[s]) >= 2 and s not in given]
        if aborted is None and live:
            aborted = live[0]
            out = engine.abort([aborted])
            if aborted in out:  # else it finished meanwhile: its completion comes from step()
                toks = out[aborted]
                assert list(toks[:len(ids[aborted])]) == ids[aborted], "the abort repeats what was reported"
                assert toks.logprobs[:len(lps[aborted])] == pytest.approx(lps[aborted])
                ids[aborted], lps[aborted] = list(toks), list(toks.logprobs)
                engine.submit(GenerationRequest(aborted, prompts[aborted - base], sp, generated=toks))
    assert len(done) == len(reqs), f"only {len(done)}/{len(reqs)} finished"
    assert aborted is not None and reports > len(reqs), "too few reports to test anything"
    for sid, c in done.items():
        assert c.token_ids[:len(ids[sid])] == ids[sid], f"seq {sid}: reported tokens are not its prefix"
        if lps[sid] is None:
            assert c.logprobs is None
        else:
            assert c.logprobs[:len(lps[sid])] == pytest.approx(lps[sid], abs=1e-6)
    assert engine.new_tokens().tokens == 0, "nothing live, nothing new"
