"""The devices of a real run: the Ray cluster, the check of its nodes (`nodes.py`), the device
actors (through the executor), the GPS holding the policy and the frozen GenRM (a Ray store on the
cluster's nodes: `params.py`), the checkpoint a resume starts from, the trainer's rendezvous, and
teardown.

Nothing assumes a shared filesystem but `train.checkpoint_dir`, and that is checked at start:
before any engine starts, every node writes into it and the driver reads that back, and every node
resolves the model folders it will open (a device then opens its own node's folder). The trainer's
ranks meet over TCP at rank 0's node address and a port free there (`DeviceWorker.rendezvous`),
asked again for every trainer built (a rebuild after a lost rank gets a fresh port).

`cluster=local` and `cluster=ray` differ only here, in how the cluster starts (`cluster.py`: a
private Ray instance with virtual devices, or a running cluster's GPUs) and in the accelerator
the role specs name (`cluster.accelerator`, resolved: gloo and CPU engines, or NCCL and vLLM).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivotrl.core.types import Role, Slot
from pivotrl.runtime.elastic import TrainerGroups
from pivotrl.runtime.roles import RoleSpec

if TYPE_CHECKING:
    from pivotrl.config import PivotConfig
    from pivotrl.runtime.nodes import ModelSource, NodeView
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
        self.checkpoint_dir = cfg.train.checkpoints_in(self.run_dir)
        """The checkpoint folder as the driver sees it (`train.checkpoint_dir`)."""
        raw = cfg.train.checkpoint_dir
        if raw is not None and not raw.startswith(("/", "~", "$")):
            raw = str(Path.cwd() / raw)  # a relative folder is the driver's, not each worker's cwd
        self.rank_checkpoint_dir = raw or str(self.checkpoint_dir.resolve())
        """The same folder as the trainer ranks are told it (each expands `~`, `$VAR` on its node)."""
        self.nodes: NodeView | None = None  # each node's own model folders (the check at start)
        self._ray_nodes: list[str] = []  # the Ray node of each node group (placement group)
        tr = int(resolved.allocation.get("train") or 0)
        home = Slot(Role.TRAIN, resolved.num_devices - tr, tr) if resolved.mode == "pivot" and tr else None
        self.groups = TrainerGroups(home)
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
        from pivotrl.runtime.limits import Limits
        from pivotrl.runtime.nodes import check_nodes
        from pivotrl.runtime.params import ParamSource

        self.cluster = start_cluster(ClusterSpec.from_config(self.cfg.cluster, self.r.num_devices))
        self._ray_nodes = self.cluster.ray_node_ids()
        self.nodes = check_nodes(self._ray_nodes, self.rank_checkpoint_dir, self.model_sources(),
                                 float(self.cfg.cluster.limits.call_s))
        self.params = ParamSource.create(self.cfg.cluster.gps, self._ray_nodes)
        self.params.register_hf("policy", str(self.policy_path), frozen=False)
        # the frozen judge stays out of GPS: a host copy on every node, loaded by its engine's own loader
        self.genrm_path = Path(self.params.keep_frozen("genrm", str(self.genrm_path)))
        if getattr(self.r.planner, "elastic_training", False) and self.groups.home is not None:
            self.groups.register(self.params, self.policy_path)
        if bool(self.cfg.train.resume):
            self._find_checkpoint()
        cl = self.cfg.cluster
        self.executor = Executor(self.cluster, self.role_spec, self.params, {Role.ROLLOUT: "policy", Role.REWARD: "genrm"},
                                 max_respawns=int(cl.max_respawns), respawn_window_s=float(cl.respawn_window_s),
                                 train_recovery=self.recover_training,
                                 limits=Limits.of_params(cl.limits, self.params, {"policy", "genrm"}))
        self.executor.wait_ready()

    def model_sources(self) -> list[ModelSource]:
        """The model folders every node must open (`nodes.check_nodes`): the user's `hf_path`s as
        configured (each node resolves them itself), or the bootstrapped tiny models' folders."""
        from pivotrl.runtime.nodes import ModelSource

        m = self.cfg.models
        if m.policy.hf_path and m.genrm.hf_path:
            return [ModelSource(role, f"models.{role}.hf_path", str(getattr(m, role).hf_path),
                                need_chat_template=getattr(m, role).chat.chat_template is None,
                                frozen=role == "genrm")
                    for role in ("policy", "genrm")]
        return [ModelSource("policy", "models.bootstrap.cache_dir", str(self.policy_path)),
                ModelSource("genrm", "models.bootstrap.cache_dir", str(self.genrm_path), frozen=True)]

    def model_path_on(self, device: int, model: str) -> str:
        """The folder of `model` as `device`'s node resolved it (the driver's when unchecked); a
        frozen model's host copy (the same path on every node) once it has one."""
        if self.params is not None and model in self.params.host_copies:
            return self.params.host_copies[model]
        if self.nodes is None:
            return str(self.policy_path if model == "policy" else self.genrm_path)
        return self.nodes.model_path(self._ray_nodes[self.cluster.node_of(device)], model)

    def for_ranks(self, path: Path) -> str:
        """A path under the driver's checkpoint folder as the trainer ranks are told it."""
        return str(Path(self.rank_checkpoint_dir) / Path(path).relative_to(self.checkpoint_dir))

    def rendezvous(self, rank0: int) -> str:
        """A fresh process-group address for a trainer group: rank 0's node and a port free there,
        asked of device `rank0`'s actor (`TrainerGroups.url` keeps one per training slot)."""
        actor, _ = self.executor.handle(rank0)
        return self.executor.limits.get(actor.rendezvous.remote(), "call", "rendezvous", rank0)

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
        self.groups.reset()  # a fresh process group: rank 0 picks a fresh port
        log.warning("training state lost: rebuilding the trainer from %s (version %d)",
                    self.resume_path or "the base policy", version)

    def role_spec(self, slot: Slot, index: int) -> RoleSpec:
        """What device `index` of `slot` must become (the executor calls this on shift up)."""
        device = slot.devices[index]
        if slot.role == Role.TRAIN:
            g = self.groups
            # once GPS holds the trainer's state, every new group is built from it (any world size)
            resume = self.for_ranks(self.resume_path) if self.resume_path and not g.ready else None
            return RoleSpec(Role.TRAIN, "policy", self.model_path_on(device, "policy"),
                            trainer=self.r.trainer(self.cfg, slot.tp), rank=index, world_size=slot.tp,
                            init_method=g.url(slot, self.rendezvous),  # every slot: a new one is a new group
                            resume_from=resume, state=g.state if g.ready or resume is None else None,
                            preserve=g.preserve(slot))
        model = "policy" if slot.role == Role.ROLLOUT else "genrm"
        # a replica of several devices: its first device runs the engine with tensor parallelism
        # across the slot; every other device of the slot is a member holding nothing
        engine = self.r.engine(self.cfg, slot.role.value)
        if engine.tensor_parallel_size != slot.tp:
            raise ValueError(f"slot {slot.slot_id} spans {slot.tp} device(s), but {slot.role.value} replicas "
                             f"have {engine.tensor_parallel_size}")
        return RoleSpec(slot.role, model, self.model_path_on(device, model), engine=engine,
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
                if self.cluster is not None:
                    self.cluster.shutdown()
