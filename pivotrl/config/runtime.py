"""`RuntimeConfig`: settings of the real runtimes (`cluster=local`, `cluster=ray`) beyond the groups.

Owns only the dataclass and its checks. The engine, trainer, reward and bootstrap settings are the
other engineers' dataclasses, nested here with defaults that suit the tiny task on a CPU machine.
It lives at `cluster.runtime` (so `conf/cluster/ray.yaml` can set GPU defaults: vLLM, bf16).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pivotrl.config.engine import EngineConfig
from pivotrl.config.gps import GPSConfig
from pivotrl.config.rl import BootstrapConfig, RewardConfig


def _engine() -> EngineConfig:
    return EngineConfig(name="cpu", num_threads=1, max_num_seqs=64, kv_capacity_tokens=16384)


@dataclass
class RuntimeConfig:
    """Real-runtime settings (local/ray)."""

    engine: EngineConfig = field(default_factory=_engine)
    """Every inference replica's engine (rollout and reward); `name=cpu` on `local`."""
    lr: float = 5e-4
    """Policy learning rate of the GRPO trainer (AdamW peak; decays per `lr_decay_steps`).
    Measured on the tiny task (`python train.py`, 30 steps of 64 prompts x 8, pivot, staleness 2;
    held-out sampled accuracy before -> after): with decoupled PPO and the decay, 0.325 -> 0.63;
    without the decay 0.325 -> 0.3675 (peaks near 0.53 mid-run, then wobbles); clipping against
    the behaviour policy instead (`off_policy=behaviour`) 0.325 -> 0.41..0.47, while the on-policy
    colocated mode reached 0.63 at the same settings. 1e-3 loses accuracy within 10 steps; 4
    mini-batches or 2 epochs at 5e-4 collapse the policy onto its current answers."""
    micro_batch_size: int = 64
    """Trainer micro-batch (sequences per forward/backward on one rank)."""
    ppo_mini_batches: int = 2
    """Optimizer steps per RL step (the batch is shuffled and cut into this many mini-batches).
    Training is the tiny run's bottleneck; two mini-batches give two updates for the same
    forward/backward work (see `lr` for what was measured)."""
    ppo_epochs: int = 1
    """Passes over the mini-batches per RL step."""
    lr_decay_steps: int | None = None
    """Linear learning-rate decay to `lr * lr_min_ratio` over this many versions (`TrainerConfig`);
    None: over the run's `train.steps`; 0: constant."""
    lr_min_ratio: float = 0.1
    """Floor of the decay as a fraction of `lr`."""
    off_policy: str = "decoupled"
    """Correction of stale samples (`TrainerConfig.off_policy`): decoupled | behaviour."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """R = w_v * R_verifiable + w_g * R_genrm and the GenRM output parser."""
    gps: GPSConfig = field(default_factory=GPSConfig)
    """Global Parameter Storage: memory budget, links, transport."""
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    """SFT bootstrap of the tiny models (cached; `models=tiny` with `hf_path: null`)."""
    rollout_temperature: float = 1.0
    """Sampling temperature of policy rollouts (GRPO needs diverse groups)."""
    max_response_tokens: int | None = None
    """Policy response cap; None = `bootstrap.data.max_response_length`."""
    val_size: int = 200
    """Held-out prompts for `val_accuracy_before/after`."""
    eval_samples: int = 2
    """Sampled responses per held-out prompt: `val_accuracy_*` is their accuracy at the rollout
    temperature (greedy accuracy is reported beside it as `val_accuracy_greedy_*`)."""
    poll_s: float = 0.05
    """Longest a device poll waits for a completion before returning its progress."""
    fit_every_s: float = 5.0
    """Refit each role's throughput model from engine samples this often (seconds)."""
    tau_shift_prior_s: float = 1.0
    """`tau_shift` before any shift was measured (seconds, up + down)."""
    max_wall_s: float = 3600.0
    """Abort the run with an error if it takes longer than this (a stalled run must not hang)."""
    cache_dir: str | None = None
    """Bootstrap cache folder; None = `$PIVOTRL_CACHE` or `~/.cache/pivotrl`."""

    def __post_init__(self) -> None:
        for name in ("lr", "poll_s", "fit_every_s", "max_wall_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"runtime.{name} must be > 0, got {getattr(self, name)}")
        if self.tau_shift_prior_s < 0:
            raise ValueError(f"runtime.tau_shift_prior_s must be >= 0, got {self.tau_shift_prior_s}")
        from pivotrl.config.trainer import OFF_POLICY

        if self.lr_decay_steps is not None and not (isinstance(self.lr_decay_steps, int) and self.lr_decay_steps >= 0):
            raise ValueError(f"runtime.lr_decay_steps must be null or an int >= 0, got {self.lr_decay_steps!r}")
        if not 0.0 <= self.lr_min_ratio <= 1.0:
            raise ValueError(f"runtime.lr_min_ratio must be in [0, 1], got {self.lr_min_ratio}")
        if self.off_policy not in OFF_POLICY:
            raise ValueError(f"runtime.off_policy must be one of {list(OFF_POLICY)}, got {self.off_policy!r}")
        for name in ("ppo_mini_batches", "ppo_epochs"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"runtime.{name} must be an int >= 1, got {getattr(self, name)!r}")
        if self.val_size < 1 or self.micro_batch_size < 1 or self.eval_samples < 1:
            raise ValueError(f"runtime.val_size, micro_batch_size and eval_samples must be >= 1, got "
                             f"{self.val_size}, {self.micro_batch_size}, {self.eval_samples}")
        if self.rollout_temperature < 0:
            raise ValueError(f"runtime.rollout_temperature must be >= 0, got {self.rollout_temperature}")
