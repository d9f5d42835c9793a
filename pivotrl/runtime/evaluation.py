"""Prompt encoding and held-out accuracy, shared by every real runtime.

Owns `encode_prompt` (the one prompt encoding of the project: chat template, length check),
`sample` (n responses per prompt from an engine) and `evaluate` (held-out accuracy: sampled at the
rollout temperature, `data.val_samples` per prompt, and greedy). Knows nothing about Ray or
device shifting: it takes an inference engine.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING

from pivotrl.engines.protocol import GenerationRequest, InferenceEngine, SamplingParams
from pivotrl.rl.rewards import verifiable_score

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pivotrl.config.rl import ChatConfig
    from pivotrl.rl.data import Example

#: sequence ids of validation requests: far above any run's, so a validation on a device of the
#: cluster (`runtime.validation`) never meets a training sequence there
_ids = itertools.count(1 << 40)


def encode_prompt(tok: PreTrainedTokenizerBase, messages: list[dict], max_len: int, chat: ChatConfig | None = None
                  ) -> list[int]:
    """Token ids of `messages` with the generation prompt through `tok`'s chat template and the
    policy's `chat` settings (`models.policy.chat`: system prompt, `enable_thinking`); an error
    past `max_len`."""
    from pivotrl.rl.chat import render_chat

    ids = render_chat(tok, messages, chat, where="models.policy.chat")
    if len(ids) > max_len:
        raise ValueError(f"prompt of {len(ids)} tokens exceeds data.max_prompt_length={max_len}: "
                         f"{messages[-1]['content'][:80]!r}")
    return ids


def decode(tok: PreTrainedTokenizerBase, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=True)


def sample(engine: InferenceEngine, prompts: list[list[int]], n: int, params: SamplingParams,
           seed: int) -> list[list[list[int]]]:
    """`n` responses (token ids, EOS included when sampled) per prompt, in prompt order."""
    reqs = []
    for i, p in enumerate(prompts):
        for j in range(n):
            sp = dataclasses.replace(params, seed=None if params.greedy else seed + i * n + j)
            reqs.append(GenerationRequest(seq_id=next(_ids), prompt_ids=p, params=sp))
    done = engine.generate(reqs)
    return [[c.token_ids for c in done[i * n:(i + 1) * n]] for i in range(len(prompts))]


def evaluate(engine: InferenceEngine, tok: PreTrainedTokenizerBase, val: list[Example], *, temperature: float,
             samples: int, seed: int, max_prompt_len: int, max_tokens: int, chat: ChatConfig | None = None
             ) -> dict[str, float]:
    """Held-out accuracy: `sampled` (at `temperature`, `samples` per prompt) and `greedy`."""
    prompts = [encode_prompt(tok, e.prompt, max_prompt_len, chat) for e in val]
    sampled = sample(engine, prompts, samples, SamplingParams(temperature=temperature, max_tokens=max_tokens),
                     seed=10_000_000 + seed)
    greedy = sample(engine, prompts, 1, SamplingParams(temperature=0.0, max_tokens=max_tokens), seed=0)
    acc_s = sum(verifiable_score(decode(tok, r), e.ground_truth) for e, rs in zip(val, sampled) for r in rs)
    acc_g = sum(verifiable_score(decode(tok, rs[0]), e.ground_truth) for e, rs in zip(val, greedy))
    return {"sampled": acc_s / (len(val) * samples), "greedy": acc_g / len(val)}
