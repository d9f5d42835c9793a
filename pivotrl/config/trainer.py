"""The GRPO trainer's settings: `AlgoConfig`, what a user sets (the `algo` group), and
`TrainerSpec`, what one trainer (`pivotrl.trainer.trainer`) receives: the user's settings plus the
ones the run derives (world size, staleness, seed, devices, threads, log-prob temperature, the
resolved decay), built by `pivotrl.config.resolve` and never set by a user.

Owns: field names, defaults, per-field docs and the checks that reject bad values with an error
naming the field, and the registries of the names `algo.advantage_estimator` and `algo.loss` may
take (lazy targets in pivotrl/rl/advantages.py and pivotrl/rl/losses.py: the config knows the
names and imports no layer above it, so validating a config never imports numpy or torch).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from pivotrl.config.base import ConfigError
from pivotrl.registry import Registry

#: `algo.advantage_estimator` -> the estimator (imported on first use; `register_advantage` adds more).
ADVANTAGE_ESTIMATORS: Registry = Registry("algo.advantage_estimator", {
    "grpo": "pivotrl.rl.advantages:grpo_advantages",
    "rloo": "pivotrl.rl.advantages:rloo_advantages",
})
#: `algo.loss` -> the policy loss (imported on first use; `register_policy_loss` adds more).
POLICY_LOSSES: Registry = Registry("algo.loss", {"ppo_clip": "pivotrl.rl.losses:ppo_clip_loss"})
#: `algo.loss_agg_mode` and `algo.kl_estimator` values (pivotrl/rl/losses.py implements them).
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k2", "k3")

BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
PARAM_DTYPES = ("float32", "bfloat16")
OFF_POLICY = ("behaviour", "decoupled")


@dataclass
class AlgoConfig:
    """The GRPO trainer's settings a user chooses (`algo.*`); the derived ones are `TrainerSpec`'s."""

    # --- optimiser -----------------------------------------------------------------------------
    lr: float = 1e-5
    """AdamW peak learning rate."""
    lr_decay_steps: int | None = 0
    """0: constant `lr`. null: over the run's `train.steps` (resolved by `pivotrl.config.resolve`
    into the `TrainerSpec`; a trainer never sees null). Otherwise the rate falls linearly from `lr` at version 0 to
    `lr * lr_min_ratio` at this many versions, and stays there (the policy a run ends with is then
    not one noisy full-size step away from where it was)."""
    lr_min_ratio: float = 0.1
    """Floor of the linear decay, as a fraction of `lr`. In [0, 1]."""
    lr_warmup_steps: int = 0
    """Linear warm-up over the first this many versions: version v trains at
    `(v + 1) / lr_warmup_steps` of the decayed rate (AdamW's first steps move every weight by about
    the rate, whatever the gradient's size). 0: none. An int >= 0."""
    adam_beta1: float = 0.9
    """AdamW beta1, in [0, 1)."""
    adam_beta2: float = 0.999
    """AdamW beta2, in [0, 1)."""
    adam_eps: float = 1e-8
    """AdamW epsilon, > 0."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay, >= 0."""
    grad_clip: float = 1.0
    """Clip the global gradient L2 norm to this value; 0 disables clipping (the norm is still
    reported)."""

    # --- batch shape ---------------------------------------------------------------------------
    micro_batch_size: int = 16
    """Sequences per forward/backward on one rank. Gradients accumulate over micro-batches, so it
    trades memory for speed and never changes the result (up to float rounding)."""

    micro_batch_tokens: int = 0
    """Dynamic batch size: 0 cuts micro-batches by `micro_batch_size` sequences; > 0 packs each
    rank's samples (sorted by length) into micro-batches of at most this many *padded* tokens
    (sequences x longest; one longer sequence gets a micro-batch alone) and ignores
    `micro_batch_size` (verl's `ppo_max_token_len_per_gpu`). Bounds activation memory by tokens,
    which is what it scales with. >= 0."""

    ppo_mini_batches: int = 1
    """Optimizer steps per batch: the fresh samples are shuffled and cut into this many
    mini-batches, one AdamW step each (verl's ppo_mini_batch_size, as a count). The policy version
    still moves by one per batch. With more than one, the ratio's denominator is the behaviour
    policy's log-probs (the batch's `old_log_probs`, else recomputed before the first step)."""
    ppo_epochs: int = 1
    """Passes over the mini-batches per batch (PPO epochs). >= 1."""

    # --- objective -----------------------------------------------------------------------------
    advantage_estimator: str = "grpo"
    """Registry key in `pivotrl.rl.advantages` used when a batch carries rewards, not advantages."""
    norm_adv_by_std: bool = True
    """Divide group-centred rewards by the group std (GRPO). False gives Dr. GRPO / plain RLOO."""
    adv_eps: float = 1e-6
    """Added to the group std before dividing, > 0."""
    loss: str = "ppo_clip"
    """Registry key in `POLICY_LOSSES` (pivotrl/rl/losses.py)."""
    loss_agg_mode: str = "token-mean"
    """How token losses become one scalar: token-mean (over all valid tokens of the whole batch,
    across micro-batches and ranks), seq-mean-token-mean or seq-mean-token-sum."""
    clip_ratio_low: float = 0.2
    """PPO clip range below 1: ratios under 1 - clip_ratio_low are clipped. In (0, 1)."""
    clip_ratio_high: float = 0.2
    """PPO clip range above 1 (DAPO's clip-higher uses 0.28). > 0."""
    kl_coef: float = 0.0
    """Weight of KL(pi || pi_ref) in the loss; 0 disables it and no reference model is kept."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3 (see `pivotrl.rl.losses.kl_penalty`)."""
    rollout_temperature: float = 1.0
    """Sampling temperature of the policy's rollouts (GRPO needs diverse groups); the trainer's
    log-probs are taken at the same temperature (`TrainerSpec.logprob_temperature`: 1 for greedy)."""

    off_policy: str = "behaviour"
    """How samples from an older policy are corrected (they carry the behaviour policy's
    `old_log_probs`): `behaviour` clips the ratio pi/pi_behaviour (plain PPO; a stale sample's
    decisive tokens are often clipped away); `decoupled` clips against the policy at the start of
    the step (proximal, recomputed: one extra forward) and weights each token by the truncated
    importance ratio pi_prox/pi_behaviour (decoupled PPO, as in AReaL). Same update when fresh."""
    behaviour_is_cap: float = 2.0
    """Truncation of the decoupled importance weight pi_prox/pi_behaviour. > 0."""

    # --- memory and precision ------------------------------------------------------------------
    param_dtype: str = "float32"
    """Dtype of parameters in forward/backward (FSDP2 mixed precision); master weights, gradient
    reduction and optimizer state stay float32. bfloat16 is meant for GPUs."""
    init_on_meta: bool = True
    """Build the model skeleton on the meta device, shard it, and let rank 0 alone read the
    safetensors files and broadcast them into every rank's shards (no rank ever holds the whole
    model on its device). False: every rank loads the whole float32 model, then shards it (the
    original path; needs no safetensors)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of storing them (Hugging
    Face `gradient_checkpointing_enable`, non-reentrant): activation memory per layer falls to its
    input hidden state, for about one extra forward of compute. Turn it on for real models."""
    logprob_chunk_tokens: int = 1024
    """Log-probs and entropy are computed over the vocabulary this many response tokens at a time
    (`pivotrl.trainer.logprobs`), each chunk recomputed in backward, so no `[B, L, V]` float32
    logits exist. 0: the original full-logits path (kept for comparison). >= 0."""
    publish_dtype: str = "float32"
    """Dtype of the weights `full_state_dict` and the publish callback hand out: set it to the
    GPS store's dtype (a bfloat16 store rejects float32 tensors). float32 or bfloat16."""
    timeout_s: float = 600.0
    """How long the driver waits for a worker reply before it declares the group dead. > 0."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise `ValueError` naming the first bad field and its allowed values."""
        def bad(name: str, allowed: str) -> None:
            raise ConfigError(name, allowed, getattr(self, name))

        if not self.lr > 0:
            bad("lr", "> 0")
        if not (self.lr_decay_steps is None or (isinstance(self.lr_decay_steps, int) and self.lr_decay_steps >= 0)):
            bad("lr_decay_steps", "null (over train.steps) or an int >= 0 (0: constant)")
        if not 0.0 <= self.lr_min_ratio <= 1.0:
            bad("lr_min_ratio", "[0, 1]")
        if not (isinstance(self.lr_warmup_steps, int) and self.lr_warmup_steps >= 0):
            bad("lr_warmup_steps", "an int >= 0 (0: no warm-up)")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                bad(name, "[0, 1)")
        if not self.adam_eps > 0:
            bad("adam_eps", "> 0")
        if not self.weight_decay >= 0:
            bad("weight_decay", ">= 0")
        if not self.grad_clip >= 0:
            bad("grad_clip", ">= 0 (0 disables)")
        if not (isinstance(self.micro_batch_size, int) and self.micro_batch_size >= 1):
            bad("micro_batch_size", "an int >= 1")
        for name in ("micro_batch_tokens", "logprob_chunk_tokens"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 0):
                bad(name, "an int >= 0 (0: off)")
        if self.publish_dtype not in PARAM_DTYPES:
            bad("publish_dtype", str(list(PARAM_DTYPES)))
        if self.off_policy not in OFF_POLICY:
            bad("off_policy", str(list(OFF_POLICY)))
        if not self.behaviour_is_cap > 0:
            bad("behaviour_is_cap", "> 0")
        for name in ("ppo_mini_batches", "ppo_epochs"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                bad(name, "an int >= 1")
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            bad("advantage_estimator", str(sorted(ADVANTAGE_ESTIMATORS)))
        if not self.adv_eps > 0:
            bad("adv_eps", "> 0")
        if self.loss not in POLICY_LOSSES:
            bad("loss", str(sorted(POLICY_LOSSES)))
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            bad("loss_agg_mode", str(list(LOSS_AGG_MODES)))
        if not 0.0 < self.clip_ratio_low < 1.0:
            bad("clip_ratio_low", "(0, 1)")
        if not self.clip_ratio_high > 0:
            bad("clip_ratio_high", "> 0")
        if not self.kl_coef >= 0:
            bad("kl_coef", ">= 0")
        if self.kl_estimator not in KL_ESTIMATORS:
            bad("kl_estimator", str(list(KL_ESTIMATORS)))
        if not self.rollout_temperature >= 0:
            bad("rollout_temperature", ">= 0")
        if self.param_dtype not in PARAM_DTYPES:
            bad("param_dtype", str(list(PARAM_DTYPES)))
        if not self.timeout_s > 0:
            bad("timeout_s", "> 0")

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class TrainerSpec(AlgoConfig):
    """One GRPO trainer (one policy, `world_size` FSDP2 ranks) as it runs: the user's `algo`
    settings plus the derived ones below. A run builds it in `Resolved.trainer` only; library use
    (tests, benchmarks) may construct one directly."""

    # --- asynchrony ----------------------------------------------------------------------------
    staleness: int = 2
    """A sample generated under policy version v is trained at step t only if t - v <= staleness;
    staler samples are rejected and counted. 0 means strictly on-policy. >= 0. From `deploy.staleness`."""

    # --- processes and devices -----------------------------------------------------------------
    world_size: int = 1
    """Number of FSDP2 ranks (worker processes). >= 1. The training home set's size."""
    backend: str = "auto"
    """Collective backend: auto (nccl on CUDA, gloo on CPU), gloo or nccl. From `cluster.accelerator`."""
    device: str = "auto"
    """Training device kind: auto (cuda when available), cpu or cuda. From `cluster.accelerator`."""
    num_threads: int = 1
    """torch intra-op threads of each spawned rank process (CPU runs share few cores). A rank
    hosted in the caller's process, or built by a Ray actor, keeps that process's setting. >= 1.
    From `cluster.threads_per_device`."""
    seed: int = 0
    """Seeds torch/numpy/random in every rank (rank added), so runs repeat. From `seed`."""
    logprob_temperature: float = 1.0
    """Logits are divided by this before log-softmax, so recomputed log-probs describe the
    distribution the samples were drawn from: `algo.rollout_temperature`, or 1 for greedy. > 0."""

    def validate(self) -> None:
        """`AlgoConfig.validate`, the derived fields, and a resolved `lr_decay_steps`."""
        super().validate()

        def bad(name: str, allowed: str) -> None:
            raise ConfigError(name, allowed, getattr(self, name))

        if self.lr_decay_steps is None:
            bad("lr_decay_steps", "an int >= 0 (a trainer's decay is resolved: null means over train.steps in the "
                "config only)")
        if not self.logprob_temperature > 0:
            bad("logprob_temperature", "> 0")
        if not (isinstance(self.staleness, int) and self.staleness >= 0):
            bad("staleness", "an int >= 0")
        if not (isinstance(self.world_size, int) and self.world_size >= 1):
            bad("world_size", "an int >= 1")
        if self.backend not in BACKENDS:
            bad("backend", str(list(BACKENDS)))
        if self.device not in DEVICES:
            bad("device", str(list(DEVICES)))
        if self.device == "cpu" and self.backend == "nccl":
            bad("backend", "gloo or auto when device='cpu' (NCCL needs CUDA)")
        if not (isinstance(self.num_threads, int) and self.num_threads >= 1):
            bad("num_threads", "an int >= 1")

    @classmethod
    def of(cls, algo: AlgoConfig, **derived: object) -> TrainerSpec:
        """`algo`'s settings with the derived fields `derived` (`Resolved.trainer`; a resolved
        `lr_decay_steps` replaces the user's)."""
        return cls(**{**{f.name: getattr(algo, f.name) for f in fields(AlgoConfig)}, **derived})
