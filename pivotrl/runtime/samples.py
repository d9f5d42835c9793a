"""Samples of a real run: the prompts as token ids, engine requests, judge prompts, scoring, and
the GRPO batches handed to the trainer.

Owns the mapping of global sample ids (`batch * P * G + prompt * G + index`, `deploy/events.py`)
to training examples (`LocalPrompts`, the controller's `PromptSource`), which responses share a
judgement (`SharedJudgements`), how each role's request is built (sampling settings:
`algo.rollout_temperature` and `data.max_response_length` for the policy, `models.genrm.judge` for
the GenRM), the judge prompt of a finished response (rendered by the GenRM's own tokenizer and chat
template, `models.genrm.chat`), the reward of a judgement, and the train batch of a list of
samples, and how many tokens the judge template adds to a prompt (`judge_template_tokens`,
measured at start with the GenRM's tokenizer). Policy and GenRM are separate models end to end:
each decodes its own tokens. Knows nothing about devices or Ray.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pivotrl.core.types import Role
from pivotrl.runtime.ledger import Tokens

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pivotrl.config import PivotConfig
    from pivotrl.config.rl import ChatConfig, JudgeConfig
    from pivotrl.engines.protocol import GenerationRequest
    from pivotrl.rl.data import Example
    from pivotrl.rl.rewards import RewardBreakdown
    from pivotrl.trainer.train_batch import TrainBatch


def judge_template_tokens(genrm_tok: PreTrainedTokenizerBase, judge: JudgeConfig, chat: ChatConfig) -> int:
    """Tokens a judge prompt adds to its question and response, measured: the GenRM's own
    rendering (`judge_prompt`: its chat template, system prompt and the chosen judge template's
    text) of an empty question and an empty response, in its tokenizer. A judge request is then at
    most question + response + this + `models.genrm.judge.max_tokens` (exact for a tokenizer
    without merges across the fields, the tiny models'; within a few tokens for BPE ones)."""
    from pivotrl.rl.genrm import judge_prompt

    return len(judge_prompt(genrm_tok, [{"role": "user", "content": ""}], "", judge, chat))


@dataclass
class LocalPrompt:
    prompt_id: int
    batch: int
    prompt_len: int
    example: int


class LocalPrompts:
    """`PromptSource` over the training examples: batch `b` takes examples `b*P .. b*P+P-1` (cyclic)."""

    def __init__(self, prompt_ids: list[list[int]], per_batch: int) -> None:
        if not prompt_ids:
            raise ValueError("the training data has no prompts")
        self.ids = prompt_ids
        self.P = per_batch

    def example_of(self, batch: int, prompt_id: int) -> int:
        return (batch * self.P + prompt_id) % len(self.ids)

    def prompts(self, batch: int) -> list[LocalPrompt]:
        out = []
        for p in range(self.P):
            e = self.example_of(batch, p)
            out.append(LocalPrompt(p, batch, len(self.ids[e]), e))
        return out


class SharedJudgements:
    """Which finished responses share a judgement: within a batch, the first response with a given
    judge prompt is judged, and each later one with the same prompt takes its judgement (a greedy
    judge would write the same one again). Off (`on=False`) every response is judged."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self._first: dict[int, dict[tuple[int, ...], int]] = {}  # batch -> judge prompt -> first sample
        self._waiting: dict[int, list[int]] = {}  # judged sample -> samples waiting for its judgement
        self._lead: dict[int, dict[int, int]] = {}  # batch -> sharing sample -> the sample it shares

    def leader(self, batch: int, sid: int, judge_ids: list[int]) -> int:
        """The sample whose judgement `sid` shares (-1: `sid` is judged itself)."""
        if not self.on:
            return -1
        first = self._first.setdefault(batch, {}).setdefault(tuple(judge_ids), sid)
        if first == sid:
            return -1
        self._lead.setdefault(batch, {})[sid] = first
        return first

    def wait(self, lead: int, sid: int) -> None:
        """`sid` takes `lead`'s judgement once it is done (`done`)."""
        self._waiting.setdefault(lead, []).append(sid)

    def done(self, lead: int) -> list[int]:
        """`lead` is judged: the samples that were waiting for its judgement."""
        return self._waiting.pop(lead, [])

    def close(self, batch: int) -> list[list[int]]:
        """Batch `batch` is trained: its judge prompts are no longer matched. Returns its
        `[sample, the sample whose judgement it shared]` pairs (for its records)."""
        self._first.pop(batch, None)
        return [[s, lead] for s, lead in sorted(self._lead.pop(batch, {}).items())]


class Samples:
    """Requests, judge prompts, rewards and train batches of run `cfg` over `train_examples`."""

    def __init__(self, cfg: PivotConfig, tok: PreTrainedTokenizerBase, genrm_tok: PreTrainedTokenizerBase,
                 train_examples: list[Example], prompts_per_step: int, group_size: int, max_response: int) -> None:
        from pivotrl.rl.genrm import ParseFailureWatch
        from pivotrl.rl.rewards import RewardFunction

        self.cfg, self.tok, self.genrm_tok, self.examples = cfg, tok, genrm_tok, train_examples
        self.judge = cfg.models.genrm.judge
        self.P, self.G, self.max_response = prompts_per_step, group_size, max_response
        self.prompt_ids = [self.encode(e.prompt) for e in train_examples]
        self.source = LocalPrompts(self.prompt_ids, self.P)
        self.reward_fn = RewardFunction(cfg.reward, judge=self.judge)
        self.parse_watch = ParseFailureWatch(self.judge, self.reward_fn.stats)
        """The judge's parse-failure rate per step (`rl.genrm.ParseFailureWatch`)."""
        self.shared = SharedJudgements(bool(self.judge.share_identical) and self.judge.temperature == 0)
        """Responses that share a judgement (`models.genrm.judge.share_identical`, a greedy judge)."""
        self.judge_room = judge_template_tokens(genrm_tok, self.judge, cfg.models.genrm.chat)
        """Tokens of the judge template around a question and a response (`judge_template_tokens`)."""
        from pivotrl.config.resolve import resolve

        self.request_seeds = bool(resolve(cfg).engine(cfg, "rollout").settings.request_seeds)
        """Whether each rollout request carries its own seed (`engine.request_seeds`: on on CPU,
        off on GPUs, where vLLM samples seeded requests one by one)."""

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        """The policy's prompt ids (`models.policy.chat`), at most `data.max_prompt_length`."""
        from pivotrl.runtime.evaluation import encode_prompt  # the one prompt encoding of the project

        return encode_prompt(self.tok, messages, self.cfg.data.max_prompt_length, self.cfg.models.policy.chat)

    def batch_of(self, sid: int) -> int:
        return sid // (self.P * self.G)

    def example_of(self, sid: int) -> int:
        b, r = divmod(sid, self.P * self.G)
        return self.source.example_of(b, r // self.G)

    def prompt_len(self, sid: int) -> int:
        return len(self.prompt_ids[self.example_of(sid)])

    def request(self, role: Role, sid: int, generated: Tokens, judge_ids: list[int] | None) -> GenerationRequest:
        """The engine request of sequence `sid` of `role`, resuming from `generated`."""
        from pivotrl.engines.protocol import GenerationRequest, SamplingParams

        done = generated.for_engine()
        if role == Role.ROLLOUT:
            seed = (int(self.cfg.seed) * 1_000_003 + sid) % (2**31) if self.request_seeds else None
            params = SamplingParams(temperature=self.cfg.algo.rollout_temperature, max_tokens=self.max_response,
                                    seed=seed)
            return GenerationRequest(sid, self.prompt_ids[self.example_of(sid)], params, generated=list(done),
                                     generated_logprobs=done.logprobs)
        if judge_ids is None:
            raise RuntimeError(f"reward sequence {sid} dispatched before its response finished")
        j = self.judge
        params = SamplingParams(temperature=j.temperature, top_p=j.top_p, max_tokens=j.max_tokens)
        return GenerationRequest(sid, judge_ids, params, generated=list(done), generated_logprobs=done.logprobs)

    def text(self, ids: tuple[int, ...] | list[int]) -> str:
        """A policy response as text (the policy's tokenizer)."""
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def judge_prompt(self, sid: int, response: Tokens) -> list[int]:
        """The GenRM's prompt for sample `sid`'s response, through the GenRM's own tokenizer."""
        from pivotrl.rl.genrm import judge_prompt

        ex = self.examples[self.example_of(sid)]
        return judge_prompt(self.genrm_tok, ex.prompt, self.text(response.ids), self.judge, self.cfg.models.genrm.chat)

    def score(self, sid: int, response: Tokens, judgement: Tokens) -> RewardBreakdown:
        ex = self.examples[self.example_of(sid)]
        return self.reward_fn(ex.data_source, self.text(response.ids), ex.ground_truth, ex.extra_info,
                              genrm_text=self.genrm_tok.decode(list(judgement.ids), skip_special_tokens=True))

    def train_batch(self, ids: list[int], rewards: dict[int, float], responses: dict[int, Tokens],
                    versions: dict[int, int]) -> TrainBatch:
        """The GRPO batch of samples `ids`. The rollouts' behaviour log-probs become
        `old_log_probs`, so the trainer's importance ratio corrects for staleness; if any sample
        lacks them the batch carries none (the trainer then recomputes them: ratio 1), never a mix."""
        from pivotrl.trainer.train_batch import TrainBatch

        old = None
        if all(responses[s].logprobs is not None for s in ids):
            old = [list(responses[s].logprobs) for s in ids]
        return TrainBatch(prompt_ids=[self.prompt_ids[self.example_of(s)] for s in ids],
                          response_ids=[list(responses[s].ids) for s in ids],
                          versions=[int(versions[s]) for s in ids],
                          rewards=[float(rewards[s]) for s in ids],
                          group_ids=[s // self.G for s in ids], old_log_probs=old)
