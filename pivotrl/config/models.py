"""Schema of the `models` group: the policy and the GenRM of one model group, and the workload.

Owns the per-model shape and cost constants the simulator derives its time model from, and the
Hugging Face folder the real runtimes load. Every simulator constant in `conf/models/*.yaml` names its
source (`../shared/calibration.md` or a project measurement) in a comment beside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pivotrl.config.base import MISSING, check
from pivotrl.config.rl import BootstrapConfig, ChatConfig, JudgeConfig
from pivotrl.config.sim import ModelArch, PaperAllocation, SimConfig


def _power_of_two(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


@dataclass
class ModelSpec:
    """One model (the policy or the GenRM)."""

    name: str = MISSING
    """Human-readable model name, e.g. `Qwen2.5-7B`."""
    hf_path: str | None = None
    """Hugging Face checkpoint for real runtimes: a local folder or a Hub id found in the local
    Hugging Face cache (`pivotrl.models.resolve.resolve_checkpoint`; never downloaded at run time);
    `null` (tiny only) means 'bootstrap it' (`models.bootstrap`)."""
    chat: ChatConfig = field(default_factory=ChatConfig)
    """This model's own tokenizer and chat template (system prompt, `enable_thinking`)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """GenRM only (ignored for the policy): judge template, score parser, sampling and length limit."""
    params_total: float = MISSING
    """Total parameters (all experts for MoE)."""
    params_active: float = MISSING
    """Parameters touched per token (equals `params_total` for dense models)."""
    layers: int = MISSING
    """Decoder layers."""
    hidden: int = MISSING
    """Hidden size (d_model)."""
    kv_bytes_per_token: float = MISSING
    """KV-cache bytes per token at bf16, all layers (calibration.md §3)."""
    tp: int = 1
    """Devices per inference replica (TP, or TP x EP for MoE). A power of two dividing the node."""
    moe_experts: int = 0
    """Routed experts (0 for dense)."""
    moe_topk: int = 0
    """Experts per token (0 for dense)."""
    moe_expert_fraction: float = 0.0
    """Fraction of weights in routed experts (MoE weight floor, calibration.md §3)."""
    arch: ModelArch = field(default_factory=ModelArch)
    """Shape details the simulated engine's costs need (KV heads, hybrid linear-attention layers)."""
    dtype_bytes: int = 2
    """Bytes per weight (bf16 = 2)."""
    shift_up_base_s: float = 2.0
    """Inference shift up, seconds beyond the weight read (engine wake, graphs): the paper's measured
    shift-up time (Fig. 12/13) minus `weight_bytes/tp/host_to_device_bw`."""
    shift_down_s: float = 1.0
    """Inference shift down, seconds (paper Fig. 12: under 2 s)."""
    train_shift_up_s: float = 3.0
    """Training shift up, seconds (paper Fig. 12: 2-8.5 s by model size). Policy only."""
    train_shift_down_s: float = 2.5
    """Training shift down, seconds (paper Fig. 12: under 6 s). Policy only."""

    def __post_init__(self) -> None:
        check(isinstance(self.tp, int) and _power_of_two(self.tp), "tp", "a power of two (1, 2, 4, 8, ...)", self.tp)

    @property
    def weight_bytes(self) -> float:
        return float(self.params_total) * self.dtype_bytes


@dataclass
class LengthDist:
    """A truncated lognormal length distribution (calibration.md §4)."""

    median: float = MISSING
    """Median length in tokens (at step 0 where the mean grows with the step)."""
    sigma: float = 1.0
    """Lognormal sigma of the whole length."""
    max_len: int = MISSING
    """Truncation cap in tokens."""


@dataclass
class WorkloadConfig:
    """Lengths of prompts, policy responses and GenRM judgements (sim only)."""

    prompt: LengthDist = field(default_factory=lambda: LengthDist(median=150, sigma=0.5, max_len=2048))
    """Prompt lengths."""
    response: LengthDist = field(default_factory=lambda: LengthDist(median=800, sigma=1.0, max_len=15360))
    """Policy response lengths."""
    response_prompt_sigma: float = 0.7
    """Per-prompt component of the response sigma (the rest is per response)."""
    response_growth_per_step: float = 0.0
    """Relative growth of the response median per RL step."""
    genrm: LengthDist = field(default_factory=lambda: LengthDist(median=2000, sigma=0.8, max_len=20480))
    """GenRM judgement lengths."""
    genrm_response_corr: float = 0.3
    """Correlation of GenRM length with the policy response length (log space)."""
    response_mean_curve: list[list[float]] = field(default_factory=list)
    """Piecewise-linear mean response length by RL step, `[[step, mean], ...]` (calibration §4).
    When set it replaces `response.median` and `response_growth_per_step`: the lognormal median at a
    step is `mean / exp(sigma^2 / 2)`."""


@dataclass
class ModelsConfig:
    """The `models` group: one policy/GenRM pair (paper Table 1) or the tiny real pair."""

    name: str = MISSING
    """Group id, e.g. `qwen7b_qwen30b`."""
    policy: ModelSpec = MISSING
    """The policy model (rollout and training)."""
    genrm: ModelSpec = MISSING
    """The generative reward model (frozen)."""
    devices: int = MISSING
    """Devices the paper ran this group on (Table 1); the cluster size unless cluster.num_devices is set."""
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    """Length distributions for the simulator."""
    sim: SimConfig = field(default_factory=SimConfig)
    """Simulator settings: cost models, allocation sweep, paper Table 4 allocations."""
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    """SFT bootstrap of the tiny models; used only when both `hf_path`s are null."""

    def __post_init__(self) -> None:
        check(isinstance(self.devices, int) and self.devices >= 1, "devices", "an int >= 1", self.devices)


__all__ = ["LengthDist", "ModelArch", "ModelSpec", "ModelsConfig", "PaperAllocation", "SimConfig", "WorkloadConfig"]
