"""Schemas of the RL loop (`train`: steps, batch, resume; every runtime) and of run outputs
(`logging`)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pivotrl.config.base import check


@dataclass
class TrainConfig:
    """The RL loop, common to every runtime."""

    steps: int = 30
    """RL steps (policy versions) to run, warm-up included. 30 is the embedded default run's length
    (`python train.py`: about 4 min on a 2-core machine with the bootstrap cached); the paper
    experiments set their own (`conf/experiment/*`)."""
    warmup_steps: int = 1
    """Leading steps excluded from throughput (DESIGN §4.6)."""
    prompts_per_step: int = 64
    """Prompts per training batch (every runtime; the paper model groups select `train=paper`)."""
    group_size: int = 8
    """G: responses per prompt (GRPO group); >= 2, since GRPO compares the samples of a prompt."""
    resume: bool = False
    """Continue from the last checkpoint in the run folder (`hydra.run.dir=<that run's folder>`). A
    folder without a complete checkpoint is an error at start, unless `allow_fresh_start`."""
    allow_fresh_start: bool = False
    """With `resume`: start over when the run folder holds no checkpoint, instead of stopping."""
    checkpoint_every: int = 1
    """Checkpoint every this many steps (real runtimes)."""
    checkpoint_dir: str | None = None
    """Real runtimes: where every trainer rank writes its checkpoints and the driver reads them back
    (a resume, rebuilding a lost trainer); null = the run folder's `checkpoints/`. On a cluster of
    several nodes it must be storage that every node and the driver see (a network filesystem
    mounted on each): the check at start writes a file there from every node and reads it back on
    the driver, and stops naming the node when it cannot (`runtime/nodes.py`). `~` and `$VAR` are
    expanded by each process that uses the path, with its own node's environment."""
    checkpoint_async: bool = True
    """Real runtimes: write checkpoints in the background (the step waits only while the ranks
    copy their state to host memory; `runtime.training`). The next step, and a shift that lends
    the trainer's devices to another role, wait for the write first, so a device that dies always
    leaves the last checkpoint whole. false: the step waits for the whole write."""

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "checkpoint_every"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, name, "an int >= 1", v)
        check(isinstance(self.group_size, int) and self.group_size >= 2, "group_size",
              "an int >= 2 (GRPO's advantage compares the samples of one prompt; 1 learns nothing)",
              self.group_size)
        check(self.checkpoint_dir is None or (isinstance(self.checkpoint_dir, str) and self.checkpoint_dir.strip() != ""),
              "checkpoint_dir", "null (the run folder's checkpoints/) or a folder path", self.checkpoint_dir)
        check(isinstance(self.warmup_steps, int) and 0 <= self.warmup_steps < max(self.steps, 1),
              "warmup_steps", f"in [0, train.steps={self.steps})", self.warmup_steps)

    def checkpoints_in(self, run_dir: Path | str) -> Path:
        """The checkpoint folder as this process sees it: `checkpoint_dir` with `~` and `$VAR`
        expanded here, or `run_dir/checkpoints`."""
        if self.checkpoint_dir is None:
            return Path(run_dir) / "checkpoints"
        return Path(expand_path(self.checkpoint_dir))


def expand_path(path: str) -> str:
    """`~` and `$VAR` of `path` expanded with this process's environment (on a cluster: each
    node's own, `TrainConfig.checkpoint_dir`)."""
    return os.path.expandvars(os.path.expanduser(path))


@dataclass
class LoggingConfig:
    """Where a run's records go besides its run folder."""

    wandb_mode: str = "auto"
    """wandb mode: auto (online if logged in, else offline) | online | offline | disabled."""
    wandb_project: str = "pivotrl"
    """wandb project name."""
    progress: bool = True
    """Show progress bars on long work, the step lines and the closing table."""
    verbose: bool = False
    """Show on the console what a run normally keeps off it (`pivotrl/logging/console.py`): Ray's
    worker output (and its "[repeated Nx across cluster]" lines) and driver notices, the
    project's INFO lines (always in the run folder's train.log), transformers' logger warnings."""

    def __post_init__(self) -> None:
        allowed = ("auto", "online", "offline", "disabled")
        check(self.wandb_mode in allowed, "wandb_mode", " | ".join(allowed), self.wandb_mode)
