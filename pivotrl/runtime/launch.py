"""The devices of a real run: the Ray cluster, the device actors (through the executor), the GPS
holding the policy and the frozen GenRM (a Ray store on the cluster's nodes: `params.py`), the
checkpoint a resume starts from, and teardown.

`cluster=local` and `cluster=ray` differ only here, in how the cluster starts (`cluster.py`: a
private Ray instance with virtual devices, or a running cluster's GPUs) and in the accelerator
the role specs name (`cluster.accelerator`, resolved: gloo and CPU engines, or NCCL and vLLM).
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pivotrl.core.types import Role, Slot
from pivotrl.runtime.elastic import TrainerGroups
from pivotrl.runtime.roles import RoleSpec

if TYPE_CHECKING:
    from pivotrl.config import PivotConfig
    from pivotrl.config.resolve import Resolved
    from pivotrl.runtime.cluster import Cluster
    from pivotrl.runtime.executor import Executor
    from pivotrl.runtime.params import ParamSource

log = logging.getLogger(__name__)


class Launch:
    """Cluster, executor and GPS of one real run; `close()` releases all of them."""

    def __init__(self, cfg: PivotConfig, resolved: Resolved, policy_path: Path, genrm_path: Path, run_dir: Path) -> None:
        self.cfg, self.r = cfg, resolved
        self.policy_path, self.genrm_path = Path(policy_path), Path(genrm_path)
        self.run_dir = Path(run_dir)
        self.checkpoint_dir = self.run_dir / "checkpoints"
        tr = int(resolved.allocation.get("train") or 0)
        home = Slot(Role.TRAIN, resolved.num_devices - tr, tr) if resolved.mode == "pivot" and tr else None
        self.groups = TrainerGroups(self.run_dir, home)
        """The trainer's process groups and, with elastic training, its state in GPS (`elastic.py`)."""
        self.cluster: Cluster | None = None
        self.executor: Executor | None = None
        self.params: ParamSource | None = None
        self.resume_path: Path | None = None
        self.resume_version = 0

    def start(self) -> None:
        """The cluster, then GPS on its nodes (a resume restores the policy there), then the
        devices."""
        from pivotrl.runtime.cluster import ClusterSpec, start_cluster
        from pivotrl.runtime.executor import Executor
        from pivotrl.runtime.params import ParamSource

        self.cluster = start_cluster(ClusterSpec.from_config(self.cfg.cluster, self.r.num_devices))
        self.params = ParamSource.create(self.cfg.cluster.gps, self.cluster.ray_node_ids())
        self.params.register_hf("policy", str(self.policy_path), frozen=False)
        self.params.register_hf("genrm", str(self.genrm_path), frozen=True)
        if getattr(self.r.planner, "elastic_training", False) and self.groups.home is not None:
            self.groups.register(self.params, self.policy_path)
        if bool(self.cfg.train.resume):
            self._find_checkpoint()
        cl = self.cfg.cluster
        self.executor = Executor(self.cluster, self.role_spec, self.params, {Role.ROLLOUT: "policy", Role.REWARD: "genrm"},
                                 max_respawns=int(cl.max_respawns), respawn_window_s=float(cl.respawn_window_s),
                                 train_recovery=self.recover_training)
        self.executor.wait_ready()

    def _find_checkpoint(self) -> None:
        """`train.resume=true`: continue from the newest complete checkpoint in the run folder."""
        from pivotrl.engines.hf_model import load_hf_model
        from pivotrl.trainer.trainer_checkpoint import latest_checkpoint

        ck = latest_checkpoint(self.checkpoint_dir)
        if ck is None:
            log.warning("train.resume=true but %s holds no complete checkpoint: starting fresh", self.checkpoint_dir)
            return
        k = int(json.loads((ck / "trainer_state.json").read_text())["version"])
        if k >= self.r.steps:
            raise ValueError(f"train.resume: checkpoint {ck} is at step {k}, train.steps={self.r.steps} leaves "
                             "nothing to run (raise train.steps)")
        self.params.restore("policy", load_hf_model(ck / "hf").state_dict(), k)
        self.resume_path, self.resume_version = ck, k

    def resume_hint(self) -> str:
        """How to continue this run from its newest checkpoint."""
        return (f"resume from its newest checkpoint with the same command plus `train.resume=true "
                f"hydra.run.dir={self.run_dir}`")

    def recover_training(self, version: int) -> None:
        """A trainer rank's state died with its device: the next training shift up rebuilds every
        rank from the checkpoint at `version` (the policy's current one; the start's own state at
        the start version), through a fresh process group. Raises `TrainingStateLost` when no
        checkpoint holds that version (`train.checkpoint_every` skipped it)."""
        from pivotrl.trainer.trainer_checkpoint import checkpoint_dir, latest_checkpoint
        from pivotrl.runtime.outcomes import TrainingStateLost

        if self.groups.holds_version(version):  # elastic training: GPS holds the state at this version
            self.groups.reset()
            log.warning("training state lost: rebuilding the trainer from its state in host memory (version %d)",
                        version)
            return
        self.groups.ready = False  # rebuilt from the checkpoint; the next step writes GPS's state again
        if int(version) != self.resume_version:
            ck = checkpoint_dir(self.checkpoint_dir, int(version))
            if not (ck / "trainer_state.json").is_file():
                newest = latest_checkpoint(self.checkpoint_dir)
                raise TrainingStateLost(
                    f"a device holding the trainer's state (offloaded while lent to another role) died at "
                    f"policy version {version}, and no checkpoint holds that version (newest: {newest or 'none'}; "
                    f"train.checkpoint_every={self.cfg.train.checkpoint_every}): the run stops rather than "
                    f"train on from a wrong version; {self.resume_hint()}")
            self.resume_path = ck
        self.groups.reset()
        log.warning("training state lost: rebuilding the trainer from %s (version %d)",
                    self.resume_path or "the base policy", version)

    def role_spec(self, slot: Slot, index: int) -> RoleSpec:
        """What device `index` of `slot` must become (the executor calls this on shift up)."""
        if slot.role == Role.TRAIN:
            g = self.groups
            # once GPS holds the trainer's state, every new group is built from it (any world size)
            resume = str(self.resume_path) if self.resume_path and not g.ready else None
            return RoleSpec(Role.TRAIN, "policy", str(self.policy_path), trainer=self.r.trainer(self.cfg, slot.tp),
                            rank=index, world_size=slot.tp, init_method=g.url(slot), resume_from=resume,
                            state=g.state if g.ready or resume is None else None, preserve=g.preserve(slot))
        path = self.policy_path if slot.role == Role.ROLLOUT else self.genrm_path
        # a replica of several devices: its first device runs the engine with tensor parallelism
        # across the slot; every other device of the slot is a member holding nothing
        engine = replace(self.cfg.engine, vllm_tensor_parallel_size=slot.tp)
        return RoleSpec(slot.role, "policy" if slot.role == Role.ROLLOUT else "genrm", str(path), engine=engine,
                        leader=slot.first_device if index > 0 else None)

    def close(self) -> None:
        """Devices, then GPS (its actors live in the cluster's Ray), then the cluster."""
        try:
            if self.executor is not None:
                self.executor.close()
        finally:
            try:
                if self.params is not None:
                    self.params.close()
            finally:
                try:
                    if self.cluster is not None:
                        self.cluster.shutdown()
                finally:
                    self.groups.close()
