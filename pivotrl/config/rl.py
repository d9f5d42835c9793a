"""Schemas of the tiny real task: data, rewards, tiny model dimensions and their SFT bootstrap.

Owns: `DataConfig`, `RewardConfig`, `ChatConfig` and `JudgeConfig` (each model's chat rendering and
the GenRM's judge settings, fields of `models.<role>` in pivotrl/config/models.py),
`TinyModelConfig`, `BootstrapConfig` and `SyncLoopConfig` (pure dataclasses, a docstring per field,
validated in `__post_init__`). Imports no torch, so
`pivotrl.models.tiny` and `pivotrl.models.bootstrap` import these, not the other way round.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

_DTYPES = ("float32", "bfloat16", "float16")
_EXTRACTORS = ("strict", "flexible")


@dataclass
class DataConfig:
    """RL prompts: synthetic arithmetic word problems, or the user's verl-format parquet."""

    train_path: str | None = None
    """verl-format train parquet; null: generate the synthetic task into the cache."""
    val_path: str | None = None
    """verl-format validation parquet; null: generate the synthetic task into the cache."""
    num_train: int = 4000
    """Synthetic train prompts (ignored when `train_path` is set)."""
    num_val: int = 200
    """Synthetic validation prompts (ignored when `val_path` is set)."""
    seed: int = 0
    """Seed of the synthetic generator (train and val use separate streams)."""
    min_operand: int = 0
    """Smallest operand of a synthetic problem."""
    max_operand: int = 9
    """Largest operand of a synthetic problem (small keeps the task learnable by a tiny model)."""
    ops: tuple[str, ...] = ("+", "-")
    """Operators of the synthetic problems: any of '+', '-'."""
    max_prompt_length: int = 128
    """Longest prompt in tokens (characters) after the chat template; longer prompts are an error."""
    max_response_length: int = 24
    """Most tokens the policy may generate per response."""

    def __post_init__(self) -> None:
        for name in ("num_train", "num_val", "max_prompt_length", "max_response_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.min_operand <= self.max_operand:
            raise ValueError(f"data.min_operand/max_operand need 0 <= min <= max, got "
                             f"{self.min_operand}, {self.max_operand}")
        self.ops = tuple(self.ops)
        bad = [o for o in self.ops if o not in ("+", "-")]
        if bad or not self.ops:
            raise ValueError(f"data.ops {list(self.ops)!r}: each must be one of ['+', '-']")


@dataclass
class RewardConfig:
    """R = verifiable_weight * R_verifiable + genrm_weight * R_genrm."""

    verifiable_weight: float = 1.0
    """Weight of the verifiable reward (final answer == ground truth)."""
    genrm_weight: float = 1.0
    """Weight of the GenRM's parsed score; 0 disables the GenRM."""
    answer_extraction: str = "strict"
    """How the final answer is found for data sources without their own grader (`math_dapo` and
    `math` always use theirs, see pivotrl/rl/rewards.py): strict (the integer after the last '####') |
    flexible (the last integer)."""
    custom_reward_function: str | None = None
    """Import path 'module:function' (or 'module.function', 'file.py:function') of a verl-style
    compute_score(data_source, solution_str, ground_truth, extra_info); replaces the verifiable reward."""
    genrm_parser: str = "score_line"
    """Registered GenRM score parser (pivotrl.rl.genrm.SCORE_PARSERS)."""
    genrm_max_tokens: int = 32
    """Most tokens the GenRM may write per judgement."""
    genrm_temperature: float = 0.0
    """GenRM sampling temperature (0 = greedy: a judge should be deterministic)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.verifiable_weight < 0 or self.genrm_weight < 0:
            raise ValueError(f"reward.verifiable_weight/genrm_weight must be >= 0, got "
                             f"{self.verifiable_weight}, {self.genrm_weight}")
        if self.answer_extraction not in _EXTRACTORS:
            raise ValueError(f"reward.answer_extraction {self.answer_extraction!r} is not one of {list(_EXTRACTORS)}")
        if self.genrm_max_tokens < 1:
            raise ValueError(f"reward.genrm_max_tokens must be >= 1, got {self.genrm_max_tokens}")
        if self.genrm_temperature < 0:
            raise ValueError(f"reward.genrm_temperature must be >= 0, got {self.genrm_temperature}")


@dataclass
class ChatConfig:
    """How one model's prompts are rendered: its own tokenizer and chat template."""

    tokenizer_path: str | None = None
    """Tokenizer folder; null: the model checkpoint's own."""
    chat_template: str | None = None
    """Jinja chat template replacing the tokenizer's (a template string, or a path to a `.jinja`
    file); null: the tokenizer's own. A tokenizer without one is an error at start."""
    system_prompt: str | None = None
    """System message put first in every conversation; null: none (a judge template may bring its own)."""
    enable_thinking: bool | None = None
    """Passed to the chat template as `enable_thinking` (Qwen3-style templates: false pre-fills an
    empty think block); null: the template's default."""


@dataclass
class JudgeConfig:
    """The GenRM's judging: prompt template, score parser, and its sampling and length limits."""

    template: str = "score_out_of_10"
    """Judge prompt template, by name (pivotrl.rl.genrm.JUDGE_TEMPLATES)."""
    parser: str = "score_out_of_10"
    """Score parser, by name (pivotrl.rl.genrm.SCORE_PARSERS); `<think>...</think>` is stripped first."""
    max_tokens: int = 20480
    """Most tokens the GenRM may write per judgement (paper §8.1: GenRM responses up to 20K)."""
    temperature: float = 0.0
    """GenRM sampling temperature (0 = greedy: a judge should be deterministic)."""
    top_p: float = 1.0
    """Nucleus sampling mass of the GenRM (1 = off)."""

    def __post_init__(self) -> None:
        from pivotrl.rl.genrm import JUDGE_TEMPLATES, SCORE_PARSERS  # stdlib-only module

        if self.template not in JUDGE_TEMPLATES:
            raise ValueError(f"models.genrm.judge.template {self.template!r} is unknown; registered: "
                             f"{sorted(JUDGE_TEMPLATES)}")
        if self.parser not in SCORE_PARSERS:
            raise ValueError(f"models.genrm.judge.parser {self.parser!r} is unknown; registered: {sorted(SCORE_PARSERS)}")
        if self.max_tokens < 1:
            raise ValueError(f"models.genrm.judge.max_tokens must be >= 1, got {self.max_tokens}")
        if not self.temperature >= 0:
            raise ValueError(f"models.genrm.judge.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"models.genrm.judge.top_p must be in (0, 1], got {self.top_p}")


@dataclass
class TinyModelConfig:
    """Dimensions of one tiny Qwen2 model (sizes vLLM's CPU build accepts)."""

    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of decoder layers."""
    num_heads: int = 4
    """Attention (query) heads; hidden_size / num_heads is the head dim (multiple of 16)."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide num_heads."""
    intermediate_size: int = 512
    """Width of the MLP."""
    max_position_embeddings: int = 512
    """Longest sequence (prompt + response) the model is configured for."""
    dtype: str = "float32"
    """Weight dtype on disk: float32 | bfloat16 | float16."""
    vocab_size: int = 128
    """Embedding rows; >= the tokenizer's vocabulary, padded to a round number."""
    tie_word_embeddings: bool = True
    """Share input embedding and LM head (halves the parameters of a tiny model)."""
    rope_theta: float = 10000.0
    """RoPE base."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def validate(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_position_embeddings", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TinyModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"TinyModelConfig.hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_heads ({self.num_heads})")
        if self.head_dim % 16:
            raise ValueError(f"TinyModelConfig head_dim = hidden_size/num_heads = {self.head_dim} must be "
                             "a multiple of 16 (vLLM's CPU attention kernels)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"TinyModelConfig.num_kv_heads ({self.num_kv_heads}) must divide num_heads "
                             f"({self.num_heads})")
        if self.dtype not in _DTYPES:
            raise ValueError(f"TinyModelConfig.dtype {self.dtype!r} is not one of {list(_DTYPES)}")


def default_cache_dir() -> Path:
    """`$PIVOTRL_CACHE`, else `~/.cache/pivotrl`."""
    env = os.environ.get("PIVOTRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pivotrl"


@dataclass
class BootstrapConfig:
    """SFT bootstrap of the tiny policy and GenRM. Every field is part of the cache key."""

    data: DataConfig = field(default_factory=DataConfig)
    """The task both models are trained on (its synthetic generator settings)."""
    policy: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Policy dimensions."""
    genrm: TinyModelConfig = field(default_factory=TinyModelConfig)
    """GenRM dimensions."""
    seed: int = 0
    """Seed of model init, SFT data and batching."""
    policy_steps: int = 250
    """SFT optimizer steps for the policy (small on purpose: the policy should be partly right)."""
    policy_label_noise: float = 0.5
    """Fraction of policy SFT answers replaced by a near miss, so sampling is partly right."""
    genrm_steps: int = 400
    """SFT optimizer steps for the GenRM. Measured at the defaults: the GenRM computes the arithmetic
    early but learns the final comparison late (AUC on the policy's samples 0.59 at 300 steps, 0.91
    at 400), so do not cut this to save time without re-measuring."""
    genrm_init_from_policy: bool = True
    """Start the GenRM from the SFT policy's weights (it already reads the problems and knows some
    arithmetic), as reward models are usually initialised from the SFT model. Needs `genrm` and
    `policy` to have the same dimensions; otherwise the GenRM starts from random weights."""
    genrm_score_weight: float = 2.0
    """Loss weight of the GenRM's score token(s) relative to its check text."""
    genrm_wrong_fraction: float = 0.5
    """Fraction of GenRM SFT examples whose response is wrong (teaches 'score: 0')."""
    batch_size: int = 64
    """Sequences per SFT step."""
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warm-up, cosine decay)."""
    warmup_steps: int = 20
    """Linear warm-up steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    eval_size: int = 200
    """Held-out prompts for the reported accuracy and GenRM agreement."""
    num_threads: int = 1
    """torch threads during bootstrap. 1 by default: on a shared 2-core machine two threads ran
    up to 20x slower per step than one (spin-waiting intra-op threads under contention)."""

    def __post_init__(self) -> None:
        for name in ("policy_steps", "genrm_steps", "batch_size", "eval_size", "num_threads"):
            if getattr(self, name) < 0 or (name != "policy_steps" and name != "genrm_steps" and getattr(self, name) < 1):
                raise ValueError(f"bootstrap.{name} must be >= 1 (steps >= 0), got {getattr(self, name)}")
        for name in ("policy_label_noise", "genrm_wrong_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"bootstrap.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"bootstrap.lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"bootstrap.warmup_steps must be >= 0, got {self.warmup_steps}")


@dataclass
class SyncLoopConfig:
    """The synchronous proof loop: rollout -> GenRM reward -> GRPO step, on the tiny models."""

    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    """Which bootstrapped policy/GenRM (and synthetic data) to start from (built if not cached)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward weights, answer extraction and GenRM parsing."""
    policy_path: str | None = None
    """Policy model folder to start from; null: the bootstrapped policy."""
    genrm_path: str | None = None
    """GenRM model folder; null: the bootstrapped GenRM."""
    engine: str = "cpu"
    """Inference engine for both roles: cpu | vllm | auto (registry key of pivotrl.engines)."""
    steps: int = 200
    """Most GRPO steps (the `max_minutes` budget usually ends the run first)."""
    max_minutes: float = 10.0
    """Stop after the step that crosses this wall-clock budget (bootstrap excluded)."""
    prompts_per_step: int = 32
    """Prompts per step; each gets `group_size` responses."""
    group_size: int = 8
    """G: responses per prompt (GRPO group)."""
    temperature: float = 1.0
    """Rollout sampling temperature (also the temperature of the reported sampled accuracy)."""
    lr: float = 3e-4
    """Trainer learning rate (AdamW)."""
    world_size: int = 1
    """Trainer FSDP2 ranks (1 hosts the trainer in this process)."""
    micro_batch_size: int = 64
    """Trainer micro-batch (sequences per forward/backward)."""
    kl_coef: float = 0.0
    """KL-to-reference weight (0: no reference model)."""
    eval_size: int = 200
    """Validation prompts for the accuracy before/after."""
    eval_samples: int = 2
    """Sampled responses per validation prompt (the sampled accuracy averages over them)."""
    eval_every: int = 5
    """Evaluate every this many steps (and always at the start and end)."""
    seed: int = 0
    """Seed of prompt order and sampling."""
    num_threads: int = 1
    """torch threads in this process (engines and a hosted trainer share them)."""

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "group_size", "eval_size", "eval_samples",
                     "eval_every", "world_size", "micro_batch_size", "num_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"sync_loop.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"sync_loop.group_size must be >= 2 (GRPO compares samples of a prompt), "
                             f"got {self.group_size}")
        if self.temperature <= 0:
            raise ValueError(f"sync_loop.temperature must be > 0 (GRPO needs diverse samples), got {self.temperature}")
        if self.lr <= 0 or self.max_minutes <= 0 or self.kl_coef < 0:
            raise ValueError(f"sync_loop.lr and max_minutes must be > 0 and kl_coef >= 0, got "
                             f"{self.lr}, {self.max_minutes}, {self.kl_coef}")
        if self.engine not in ("cpu", "vllm", "auto"):
            raise ValueError(f"sync_loop.engine {self.engine!r} is not one of ['auto', 'cpu', 'vllm']")
