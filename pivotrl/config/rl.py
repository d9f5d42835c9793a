"""Schemas of the `data` and `reward` groups, and of the tiny models and their SFT bootstrap
(`models.bootstrap`).

Owns: `DataConfig`, `RewardConfig`, `ChatConfig` and `JudgeConfig` (each model's chat rendering and
the GenRM's judge settings, fields of `models.<role>` in pivotrl/config/models.py),
`TinyModelConfig`, `BootstrapConfig` (pure dataclasses, a docstring per field, validated in
`__post_init__` without changing any value), and the registries of the judge's names
(`JUDGE_TEMPLATES`, `SCORE_PARSERS`: lazy targets in pivotrl/rl/genrm.py, so no import points
up). Imports no torch, so `pivotrl.models.tiny` and `pivotrl.models.bootstrap` import these, not
the other way round.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivotrl.config.base import check, finite
from pivotrl.registry import Registry

_DTYPES = ("float32", "bfloat16", "float16")

#: Held-out problems the synthetic task generates (a fixed pool; `data.val_size` picks how many of
#: them a run evaluates, so that setting never changes the cached task or the tiny models).
SYNTHETIC_VAL_ROWS = 1000
_EXTRACTORS = ("strict", "flexible")


@dataclass
class DataConfig:
    """The `data` group: RL prompts (synthetic arithmetic word problems, or the user's verl-format
    parquet), held-out evaluation, and the policy's length caps."""

    train_path: str | None = None
    """verl-format train parquet; null: the synthetic task (generated into the bootstrap cache;
    only with the tiny models: a real checkpoint needs real data)."""
    val_path: str | None = None
    """verl-format validation parquet; null: the synthetic task (as `train_path`)."""
    num_train: int = 4000
    """Synthetic train prompts (the synthetic task only)."""
    val_size: int = 200
    """Held-out prompts evaluated (`val_accuracy_before/after`): the first `val_size` rows of
    `val_path`, or of the synthetic task's fixed held-out pool (`SYNTHETIC_VAL_ROWS`). Not part of
    the bootstrap cache key: changing it never rebuilds the tiny models."""
    val_samples: int = 2
    """Sampled responses per held-out prompt: `val_accuracy_*` is their accuracy at the rollout
    temperature (greedy accuracy is reported beside it as `val_accuracy_greedy_*`)."""
    seed: int = 0
    """Seed of the synthetic generator (train and val use separate streams); part of the data's
    identity and of the bootstrap cache key, not the run's sampling seed (top-level `seed`)."""
    min_operand: int = 0
    """Smallest operand of a synthetic problem."""
    max_operand: int = 9
    """Largest operand of a synthetic problem (small keeps the task learnable by a tiny model)."""
    ops: list[str] = field(default_factory=lambda: ["+", "-"])
    """Operators of the synthetic problems: any of '+', '-'."""
    max_prompt_length: int = 128
    """Longest prompt in tokens after the chat template; longer prompts are an error."""
    max_response_length: int = 24
    """Most tokens the policy may generate per response (the one response cap of the run)."""

    def __post_init__(self) -> None:
        for name in ("num_train", "val_size", "val_samples", "max_prompt_length", "max_response_length"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, name, "an int >= 1", v)
        check(0 <= self.min_operand <= self.max_operand, "min_operand", f"0 <= min_operand <= max_operand "
              f"({self.max_operand})", self.min_operand)
        ops = list(self.ops)
        check(bool(ops) and all(o in ("+", "-") for o in ops), "ops", "a non-empty list of '+', '-'", ops)

    def synthetic(self) -> dict:
        """The fields that define the synthetic task (its cache identity)."""
        return {k: getattr(self, k) for k in ("num_train", "seed", "min_operand", "max_operand")} | {
            "ops": list(self.ops), "val_rows": SYNTHETIC_VAL_ROWS}


@dataclass
class RewardConfig:
    """R = verifiable_weight * R_verifiable + genrm_weight * R_genrm. How the GenRM judges (prompt
    template, score parser, sampling, length) is the GenRM's own: `models.genrm.judge`."""

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

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name in ("verifiable_weight", "genrm_weight"):
            check(finite(getattr(self, name)) and getattr(self, name) >= 0, name, "a finite number >= 0",
                  getattr(self, name))
        if self.answer_extraction not in _EXTRACTORS:
            raise ValueError(f"reward.answer_extraction {self.answer_extraction!r} is not one of {list(_EXTRACTORS)}")


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


#: `models.genrm.judge.template` -> the judge prompt (a `JudgeTemplate` of pivotrl/rl/genrm.py,
#: imported on first use: the config knows the names, never the rl layer).
JUDGE_TEMPLATES: Registry[Any] = Registry("models.genrm.judge.template", {
    name: f"pivotrl.rl.genrm:{attr}" for name, attr in (
        ("tiny", "TINY_TEMPLATE"), ("score_out_of_10", "SCORE_OUT_OF_10_TEMPLATE"), ("boxed", "BOXED_TEMPLATE"),
        ("yes_no", "YES_NO_TEMPLATE"))})
#: `models.genrm.judge.parser` -> the score parser (pivotrl/rl/genrm.py, imported on first use;
#: `pivotrl.rl.genrm.register_score_parser` adds more).
SCORE_PARSERS: Registry[Any] = Registry("models.genrm.judge.parser", {
    name: f"pivotrl.rl.genrm:parse_{name}"
    for name in ("score_line", "last_score_line", "score_out_of_10", "boxed", "boxed_10", "yes_no")})


@dataclass
class JudgeConfig:
    """The GenRM's judging: prompt template, score parser, and its sampling and length limits."""

    template: str = "score_out_of_10"
    """Judge prompt template, by name (`JUDGE_TEMPLATES`: tiny | score_out_of_10 | boxed | yes_no)."""
    parser: str = "score_out_of_10"
    """Score parser, by name (`SCORE_PARSERS`); `<think>...</think>` is stripped first."""
    max_tokens: int = 20480
    """Most tokens the GenRM may write per judgement (paper §8.1: GenRM responses up to 20K)."""
    temperature: float = 0.0
    """GenRM sampling temperature (0 = greedy: a judge should be deterministic)."""
    top_p: float = 1.0
    """Nucleus sampling mass of the GenRM (1 = off)."""
    share_identical: bool = True
    """A greedy judge (temperature 0) judges identical judge prompts of one batch once: a response
    that repeats an earlier one of its group shares that one's judgement instead of being decoded
    again (real runtimes; the metrics row counts them, `judgements_shared`). Ignored when
    temperature > 0, where each judgement is its own sample."""
    max_parse_failure_rate: float = 0.5
    """Share of one step's judgements that may fail to parse before the run warns, loudly, naming
    the template and parser (a judge that writes another format, or a policy and judge swapped);
    the rate is in each metrics row, the closing table and summary.json. 1 = never warn."""

    def __post_init__(self) -> None:
        JUDGE_TEMPLATES.check(self.template)
        SCORE_PARSERS.check(self.parser)
        check(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens", "an int >= 1", self.max_tokens)
        check(finite(self.temperature) and self.temperature >= 0, "temperature", "a finite number >= 0",
              self.temperature)
        check(finite(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        check(isinstance(self.share_identical, bool), "share_identical", "true or false", self.share_identical)
        check(finite(self.max_parse_failure_rate) and 0 <= self.max_parse_failure_rate <= 1,
              "max_parse_failure_rate", "in [0, 1]", self.max_parse_failure_rate)


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
    """SFT bootstrap of the tiny policy and GenRM (`models.bootstrap`; used only when
    `models.policy.hf_path` and `models.genrm.hf_path` are null). Every field but `cache_dir`,
    with the synthetic `data` fields, is part of the cache key."""

    policy: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Policy dimensions."""
    genrm: TinyModelConfig = field(default_factory=TinyModelConfig)
    """GenRM dimensions."""
    seed: int = 0
    """Seed of model init, SFT data and batching (the tiny checkpoints' identity, not the run's
    sampling seed)."""
    policy_steps: int = 250
    """SFT optimizer steps for the policy (small on purpose: the policy should be partly right)."""
    policy_label_noise: float = 0.5
    """Fraction of policy SFT answers replaced by a near miss, so sampling is partly right."""
    genrm_steps: int = 600
    """SFT optimizer steps for the GenRM. It computes the arithmetic early and learns the final
    comparison late, at a step that depends on `seed`: at 400 steps (the default until 12-04) seeds
    0-4 judged the policy's samples at AUC 0.91, 0.55, 0.97, 0.70, 0.60; at 600 at 0.99, 0.93,
    0.90, 0.98, 0.88 (BENCHMARKS.md, 'Tiny bootstrap'). A run warns below AUC 0.8. Do not
    cut this to save time without re-measuring over seeds."""
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
    num_threads: int = 1
    """torch threads during bootstrap. 1 by default: on a shared 2-core machine two threads ran
    up to 20x slower per step than one (spin-waiting intra-op threads under contention)."""
    cache_dir: str | None = None
    """Bootstrap cache folder; null = `$PIVOTRL_CACHE` or `~/.cache/pivotrl`."""
    genrm_arch: str = "qwen2"
    """Architecture of the GenRM the run gets: `qwen2` (the dense SFT GenRM) or `qwen3_moe` (a
    Qwen3-MoE upcycled from the cached dense GenRM, `upcycle_to_qwen3_moe`, then SFT-trained
    `moe_steps` more steps). The MoE is a derived cache stage: choosing it never rebuilds the policy
    or the dense GenRM (`pivotrl.models.bootstrap_derived`)."""
    moe_steps: int = 150
    """SFT optimizer steps of the upcycled Qwen3-MoE GenRM (`genrm_arch=qwen3_moe` only). Measured
    at the defaults: AUC 0.98 on the policy's samples after 150 steps (BENCHMARKS.md, issue 14)."""
    moe_num_experts: int = 8
    """Experts per MoE layer of the upcycled GenRM (each a copy of the dense MLP at the start)."""
    moe_experts_per_token: int = 2
    """Experts routed to per token (top-k) in the upcycled GenRM; <= `moe_num_experts`."""
    dtype: str = "float32"
    """dtype the policy and GenRM folders the run gets are saved in: float32 | bfloat16. SFT always
    runs in float32; another dtype is a derived cache stage that casts the cached folders (the
    config.json and safetensors then say bfloat16), so it never retrains anything."""

    def __post_init__(self) -> None:
        check(self.genrm_arch in GENRM_ARCHS, "genrm_arch", " | ".join(GENRM_ARCHS), self.genrm_arch)
        check(self.dtype in ("float32", "bfloat16"), "dtype", "float32 | bfloat16", self.dtype)
        for name in ("moe_steps",):
            check(isinstance(getattr(self, name), int) and getattr(self, name) >= 0, name, "an int >= 0",
                  getattr(self, name))
        check(isinstance(self.moe_num_experts, int) and self.moe_num_experts >= 1, "moe_num_experts",
              "an int >= 1", self.moe_num_experts)
        check(isinstance(self.moe_experts_per_token, int) and 1 <= self.moe_experts_per_token <= self.moe_num_experts,
              "moe_experts_per_token", f"an int in [1, moe_num_experts={self.moe_num_experts}]",
              self.moe_experts_per_token)
        for name in ("policy_steps", "genrm_steps"):
            check(isinstance(getattr(self, name), int) and getattr(self, name) >= 0, name, "an int >= 0",
                  getattr(self, name))
        for name in ("batch_size", "num_threads"):
            check(isinstance(getattr(self, name), int) and getattr(self, name) >= 1, name, "an int >= 1",
                  getattr(self, name))
        for name in ("policy_label_noise", "genrm_wrong_fraction"):
            check(0.0 <= getattr(self, name) <= 1.0, name, "in [0, 1]", getattr(self, name))
        check(finite(self.lr) and self.lr > 0, "lr", "a finite number > 0", self.lr)
        check(self.warmup_steps >= 0, "warmup_steps", ">= 0", self.warmup_steps)

    def key_fields(self) -> dict:
        """The fields of the dense entry's cache key: everything but where the cache is and the
        derived stages' fields (`DERIVED_FIELDS`), so choosing those never rebuilds the dense models."""
        import dataclasses

        d = dataclasses.asdict(self)
        for k in ("cache_dir", *DERIVED_FIELDS):
            d.pop(k)
        return d

    def moe_key_fields(self) -> dict:
        """The fields of the upcycled MoE GenRM's key (with the dense entry's key)."""
        return {k: getattr(self, k) for k in ("moe_steps", "moe_num_experts", "moe_experts_per_token")}


#: GenRM architectures the bootstrap makes (`models.bootstrap.genrm_arch`).
GENRM_ARCHS = ("qwen2", "qwen3_moe")
#: BootstrapConfig fields of the derived cache stages (not in the dense entry's key).
DERIVED_FIELDS = ("genrm_arch", "moe_steps", "moe_num_experts", "moe_experts_per_token", "dtype")
