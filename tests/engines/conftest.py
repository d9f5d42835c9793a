"""Fixtures for the engine tests: tiny Qwen2 model folders made by `pivotrl.models.tiny`.

head_dim is 32: vLLM's CPU attention rejects head_dim 16 ("Unsupported CPU attention configuration").

The folders use untied input/output embeddings: a random-init model with tied embeddings just
repeats its last input token under greedy decoding (the residual stream is dominated by the
token's own embedding), which would make "outputs equal the reference" tests nearly vacuous.
Untied, greedy outputs vary from token to token and between prompts, so the tests can fail.
"""
from __future__ import annotations

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
