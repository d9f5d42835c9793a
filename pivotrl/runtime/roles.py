"""Role contexts on one device: what each role holds, and how it shifts down and up (DESIGN §4.5).

Owns: the four context categories, each role's declaration of what it holds in each, and the two
halves of a shift on one device, each timed:

| role            | temporary                      | parameters        | offloadable                         | preserved                                |
|-----------------|--------------------------------|-------------------|-------------------------------------|------------------------------------------|
| rollout/reward  | KV cache, running sequences,   | weights (policy   | none on the CPU engine (vLLM: its   | the engine object/process, tokenizer,    |
|                 | activations                    | at version v /    | sleep-mode buffers)                 | model config, sampling generator         |
|                 |                                | frozen GenRM)     |                                     |                                          |
| train (rank r)  | activations, gradients         | none: training is | sharded parameters, gradients,      | process group and rank, the worker       |
|                 |                                | the GPS *writer*  | AdamW state                         | object, RNG streams, policy version      |

- `shift_down` discards temporary (running sequences must already have been aborted by the
  executor's scheduler moves, which is how their tokens reach the queue; anything still live is
  aborted here and its tokens are returned, never dropped), discards parameters (engine
  `release_memory`), and offloads the offloadable part to host memory (trainer `offload`, which
  then empties the CUDA allocator's cache so the engine waking next sees the memory free).
- `shift_up` reads parameters at the version the executor names (`weight_sync.GPSWeights`: the
  device reads GPS itself, its own node's copy, so the weights never pass through the driver; a
  plain state dict also works) and reloads what was offloaded. The first shift up of a role on a
  device builds its preserved context (cold start, also timed); a cold engine with weights to load
  never reads its folder's (vLLM `load_format="dummy"`, the CPU engine from config.json), so the
  policy's weights move once, from GPS. The frozen GenRM gets none: its engine loads its folder, a
  host-memory copy of its checkpoint (`ParamSource.keep_frozen`), with its own loader.
- Sleep levels (vLLM's): the policy's rollout engine sleeps at level 2 (weights discarded; the
  next shift up takes the new version from GPS), the frozen GenRM at level 1 (weights kept in host
  memory and put back in place: its shift up reads nothing from GPS, as `needs_parameters()`
  says). A wake or load that fails raises the engine's
  `EngineFailedError` (`pivotrl.engines.errors`) after the host dropped the engine: the device
  holds no serving engine and the next shift up builds a fresh one.

A replica of several devices (`tp` > 1) is hosted by its first device: that device's
`InferenceHost` starts the engine with `tensor_parallel_size=tp` on every device of the slot
(`RoleSpec.placement`), and each other device of the slot holds a `MemberHost`: it belongs to the
replica's role and holds nothing of its own (the engine's other ranks are the engine's processes).

Training's parameters are declared offloadable, not "parameters": its fp32 master weights and
optimizer state are the source of truth that GPS is written *from*, so they go to host memory and
come back bit for bit; reading them back from GPS would lose the optimizer state. Without elastic
training it never moves: its host keeps its home devices and its process group across shifts.
With elastic training its whole state (optimizer moments included) is also in GPS between steps,
and a trainer on other devices is rebuilt from there (`TrainHost`).

Knows nothing about Ray, schedulers or which device it is on (device.py hosts these objects).
"""
from __future__ import annotations

import enum
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional, Union

from pivotrl.core.types import Role

if TYPE_CHECKING:
    from pivotrl.config.engine import EngineSpec
    from pivotrl.config.trainer import TrainerSpec
    from pivotrl.engines.protocol import InferenceEngine
    from pivotrl.engines.weight_sync import GPSWeights
    from pivotrl.trainer.state_store import StateHandle
    from pivotrl.trainer.trainer_worker import TrainerWorker

#: What a shift up loads: a GPS handle (the device reads its node's copy), a state dict, or None
#: (the model folder's own weights; training reads nothing).
Weights = Optional[Union["GPSWeights", Mapping[str, Any]]]

log = logging.getLogger(__name__)


class Category(str, enum.Enum):
    """The four kinds of role context (DESIGN §4.5)."""

    TEMPORARY = "temporary"
    """Discarded on shift down (KV cache, activations)."""
    PARAMETERS = "parameters"
    """Discarded on shift down; read back from GPS at the current version on shift up."""
    OFFLOADABLE = "offloadable"
    """Moved to host memory on shift down, moved back on shift up."""
    PRESERVED = "preserved"
    """Kept across shifts (processes, communication groups)."""


@dataclass(frozen=True)
class ContextDecl:
    """What one role holds, by category (names are for records and tests)."""

    temporary: tuple[str, ...]
    parameters: tuple[str, ...]
    offloadable: tuple[str, ...]
    preserved: tuple[str, ...]

    def of(self, category: Category) -> tuple[str, ...]:
        return getattr(self, category.value)

    def as_dict(self) -> dict[str, list[str]]:
        return {c.value: list(self.of(c)) for c in Category}


@dataclass
class ShiftTiming:
    """One half of a shift on one device, measured where it ran."""

    role: str
    direction: str
    """`up` or `down`."""
    seconds: float
    cold: bool = False
    """Shift up that had to build the preserved context first (engine/trainer construction)."""
    version: int | None = None
    detail: dict[str, float] = field(default_factory=dict)
    aborted: dict[int, list[int]] = field(default_factory=dict)
    """Sequences still live at shift down, with their tokens (normally empty: the executor aborts
    them through the scheduler first)."""


@dataclass(frozen=True)
class EnginePlacement:
    """Where the engine of a replica of several devices runs: on every device of its slot. The
    executor reads each device actor's cores and accelerator ids (`DeviceWorker.info`); the first
    device's actor starts the engine with these (its tensor-parallel ranks are the engine's own
    processes, which inherit them)."""

    devices: tuple[int, ...]
    cores: tuple[int, ...] | None = None
    """CPU cores of the slot's devices (`cluster=local` pins each device; None: not pinned)."""
    accelerator_ids: tuple[str, ...] = ()
    """GPU ids of the slot's devices as Ray assigned them (`CUDA_VISIBLE_DEVICES`; empty on CPU)."""


@dataclass(frozen=True)
class RoleSpec:
    """Everything a device needs to host a role (picklable: it travels to the device actor)."""

    role: Role
    model_name: str
    """GPS model key (`policy` or `genrm`)."""
    model_path: str
    """Hugging Face folder the role is built from (weights are then replaced by a GPS read)."""
    engine: EngineSpec | None = None
    """For rollout/reward: the replica's engine (`Resolved.engine`)."""
    trainer: TrainerSpec | None = None
    """For training."""
    rank: int = 0
    """Training rank of this device within the home set."""
    world_size: int = 1
    """Training world size (home devices)."""
    init_method: str | None = None
    """Process-group rendezvous URL shared by the training ranks: `tcp://<rank 0's node>:<port>`
    (`launch.Launch.rendezvous`); None for a single rank (a loopback port of its own)."""
    resume_from: str | None = None
    """Training: a trainer checkpoint folder to load when the rank is first built (`train.resume`)."""
    leader: int | None = None
    """Inference, a device of a replica of several devices other than its first: that first
    device, whose actor runs the replica's engine across the slot. This device holds nothing of
    its own (`MemberHost`)."""
    placement: EnginePlacement | None = None
    """Inference, the first device of a replica of several devices: the devices, cores and
    accelerators its engine spans (None: this device alone)."""
    state: StateHandle | None = None
    """Training with elastic training: the trainer's state in GPS (`state_store.StateHandle`). A
    trainer group new to this device is built from it when it holds a version (else from the
    model folder or `resume_from`, and its first state is written there)."""
    preserve: bool = True
    """Training: keep this rank's trainer (offloaded) across shifts; False for a group outside the
    home set, whose ranks drop it on shift down (its state is in GPS)."""

    def __post_init__(self) -> None:
        if self.role in (Role.ROLLOUT, Role.REWARD) and self.engine is None:
            raise ValueError(f"RoleSpec for {self.role.value} needs an EngineSpec (RoleSpec.engine)")
        if self.role == Role.TRAIN:
            if self.trainer is None:
                raise ValueError("RoleSpec for train needs a TrainerSpec (RoleSpec.trainer)")
            if not 0 <= self.rank < self.world_size:
                raise ValueError(f"RoleSpec.rank={self.rank} must be in [0, world_size={self.world_size})")
            if self.world_size > 1 and not self.init_method:
                raise ValueError("RoleSpec.init_method is required when world_size > 1")
        if (self.leader is not None or self.placement is not None) and self.role == Role.TRAIN:
            raise ValueError("RoleSpec.leader and RoleSpec.placement are for inference replicas, not train")
        if self.leader is not None and self.placement is not None:
            raise ValueError("RoleSpec: a member of a replica (leader set) has no engine placement")


class RoleHost(ABC):
    """One role's context on one device. `active` is True between shift_up and shift_down."""

    CONTEXT: ClassVar[ContextDecl]

    def __init__(self, spec: RoleSpec) -> None:
        self.spec = spec
        self.active = False

    @property
    def role(self) -> Role:
        return self.spec.role

    @abstractmethod
    def shift_up(self, weights: Weights, version: int) -> ShiftTiming:
        """Make the role active; `weights`: what to load (`InferenceHost.shift_up`)."""

    @abstractmethod
    def shift_down(self) -> ShiftTiming: ...

    def close(self, wait: bool = True) -> None:
        """Free everything, preserved context included (device teardown). `wait`: finish the
        role's background work first (a trainer's checkpoint write); False when a peer died."""


def build_engine(spec: RoleSpec, read_weights: bool = True) -> InferenceEngine:
    """Construct the inference engine of `spec` through the engine registry (`engine.name` picks
    it); `read_weights` False: without reading the folder's weights (others are loaded next)."""
    from pivotrl.engines.registry import create_engine

    return create_engine(spec.model_path, spec.engine.settings, tensor_parallel_size=spec.engine.tensor_parallel_size,
                         read_weights=read_weights)


class InferenceHost(RoleHost):
    """A rollout (policy) or reward (GenRM) engine replica."""

    CONTEXT = ContextDecl(
        temporary=("kv_cache", "running_sequences", "activations"),
        parameters=("weights",),
        offloadable=(),
        preserved=("engine", "tokenizer", "model_config", "sampling_generator"),
    )

    def __init__(self, spec: RoleSpec) -> None:
        if spec.role not in (Role.ROLLOUT, Role.REWARD):
            raise ValueError(f"InferenceHost hosts rollout or reward, not {spec.role.value}")
        super().__init__(spec)
        self.engine: InferenceEngine | None = None
        self._weights_kept = False  # released at level 1: the weights come back in place

    @property
    def sleep_level(self) -> int:
        """The engine spec's: 1 for the frozen GenRM (reward), 2 for the policy (rollout), see the
        module docstring."""
        return self.spec.engine.sleep_level

    def needs_parameters(self) -> bool:
        """Whether the next shift up needs a state dict from GPS: not when the engine kept its
        (frozen) weights through a level-1 release."""
        return not (self.engine is not None and self._weights_kept)

    def shift_up(self, weights: Weights, version: int) -> ShiftTiming:
        """`weights`: a `weight_sync.GPSWeights` (read here, from this device's GPS node), a
        state dict, or None (the model folder's own weights)."""
        from pivotrl.engines.errors import EngineFailedError
        from pivotrl.engines.weight_sync import opened

        t0 = time.perf_counter()
        cold = self.engine is None
        detail: dict[str, float] = {}
        try:
            if cold:  # weights to load next: the folder's are never read (a policy takes GPS's)
                self.engine = build_engine(self.spec, read_weights=weights is None)
                detail["read_folder"] = float(weights is None)
                if weights is not None:
                    with opened(weights, version) as (w, v, facts):
                        self.engine.load_weights(w, v)
                    detail.update(_load_detail(facts))
            elif self._weights_kept:  # frozen weights were kept in host memory: nothing to read
                detail = dict(self.engine.reacquire_memory(None) or {})
                detail["weights_kept"] = 1.0
            else:
                with opened(weights, version) as (w, v, facts):
                    detail = dict(self.engine.reacquire_memory(w, v) or {})
                detail.update(_load_detail(facts))
        except EngineFailedError:
            self._drop_engine()  # it shut itself down; the next shift up builds a fresh one
            raise
        self._weights_kept = False
        self.active = True
        st = self.engine.stats(drain=False)  # what the engine itself reports, for the scheduler
        detail.update(kv_capacity_tokens=float(st.kv_capacity_tokens),
                      tensor_parallel_size=float(self.engine.tensor_parallel_size))
        return ShiftTiming(self.role.value, "up", time.perf_counter() - t0, cold=cold,
                           version=int(st.version), detail=detail)

    def shift_down(self) -> ShiftTiming:
        t0 = time.perf_counter()
        aborted: dict[int, list[int]] = {}
        detail: dict[str, float] = {}
        if self.engine is not None and self.active:
            aborted = self.engine.abort(None)  # normally empty; never drop tokens
            t1 = time.perf_counter()
            self.engine.release_memory(level=self.sleep_level)
            self._weights_kept = self.sleep_level == 1
            detail = {"abort_s": t1 - t0, "release_s": time.perf_counter() - t1, "sleep_level": float(self.sleep_level)}
        self.active = False
        return ShiftTiming(self.role.value, "down", time.perf_counter() - t0, aborted=aborted, detail=detail)

    def _drop_engine(self) -> None:
        eng, self.engine = self.engine, None
        self._weights_kept = False
        self.active = False
        if eng is not None:
            try:
                eng.shutdown()
            except Exception:  # noqa: BLE001 - already failed; the error being raised says why
                pass

    def close(self, wait: bool = True) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        self._weights_kept = False
        self.active = False


def _load_detail(facts: Mapping[str, Any]) -> dict[str, float]:
    """A GPS load's facts as shift-timing detail (numbers only): bytes read and whether the
    engine mapped the node's file (1) or took a GPS read (0)."""
    if not facts:
        return {}
    return {"gps_bytes": float(facts["bytes"]), "gps_file": float(facts["path"] == "file")}


class TrainHost(RoleHost):
    """One FSDP2 rank of the trainer. Its process group is created on the first shift up and kept
    while the trainer keeps its devices (`RoleSpec.init_method` names the group).

    Elastic training (DESIGN §4.6): a shift up naming another group (the trainer grown onto more
    devices, or back on its home set) tears this rank's trainer and process group down, joins the
    new group and builds the trainer there from its state in host memory (`RoleSpec.state`,
    `TrainerWorker(load_weights=False)` + `load_state`: the resharding W -> W'); that shift up is
    timed as `reshard_s` and counted cold (it rebuilds the preserved context, so it is no sample of
    `tau_shift`). A rank of a group outside the home set (`RoleSpec.preserve` false) drops its
    trainer on shift down instead of offloading it."""

    CONTEXT = ContextDecl(
        temporary=("activations", "gradients"),
        parameters=(),
        offloadable=("sharded_parameters", "gradients", "optimizer_state"),
        preserved=("process_group", "rank", "trainer_worker", "rng_streams", "policy_version"),
    )

    def __init__(self, spec: RoleSpec) -> None:
        if spec.role != Role.TRAIN:
            raise ValueError(f"TrainHost hosts train, not {spec.role.value}")
        super().__init__(spec)
        self.worker: TrainerWorker | None = None
        self.group: str | None = None
        """The rendezvous of the process group this rank's trainer belongs to."""

    def retarget(self, spec: RoleSpec) -> None:
        """The spec of the next shift up (its group, rank and world size may differ)."""
        if spec.role != Role.TRAIN:
            raise ValueError(f"TrainHost hosts train, not {spec.role.value}")
        self.spec = spec

    def _from_state(self) -> bool:
        st = self.spec.state
        return st is not None and int(st.store.current_version(st.name)) >= 0

    def _build(self) -> dict[str, float]:
        import torch.distributed as dist

        from pivotrl.trainer.trainer_worker import TrainerWorker
        from pivotrl.trainer.dist import init_process_group, resolve_device

        from pivotrl.config.run import expand_path
        from pivotrl.runtime.nodes import free_port

        cfg = self.spec.trainer
        if self.worker is not None or dist.is_initialized():  # another group's trainer: leave it
            self._drop()
        _, backend = resolve_device(cfg)
        # one rank without an address: a private loopback port (never a shared file)
        init = self.spec.init_method or f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
        init_process_group(self.spec.rank, self.spec.world_size, init, backend, cfg.timeout_s)
        self.group = self.spec.init_method
        st = self.spec.state
        if self._from_state():
            self.worker = TrainerWorker(cfg, self.spec.model_path, load_weights=False)
            read = self.worker.load_state(st.store, st.name)
            return {"state_read_s": read["seconds"], "state_read_bytes": read["bytes"]}
        self.worker = TrainerWorker(cfg, self.spec.model_path)
        if self.spec.resume_from:  # as configured: `~` and `$VAR` are this node's
            self.worker.load_checkpoint(expand_path(self.spec.resume_from))  # collective: every rank at once
        if st is not None:  # the first state in host memory, for the groups that come next
            wrote = self.worker.save_state(st.store, st.name)
            return {"state_write_s": wrote["seconds"]}
        return {}

    def shift_up(self, weights: Weights, version: int) -> ShiftTiming:
        del weights  # training is the GPS writer: it reloads its own state, reads nothing
        t0 = time.perf_counter()
        cold = self.worker is None or self.group != self.spec.init_method
        resharded = cold and self._from_state()
        if cold:
            detail = self._build()
            if resharded:
                detail["reshard_s"] = time.perf_counter() - t0
        else:
            detail = dict(self.worker.reload())
        self.active = True
        return ShiftTiming(self.role.value, "up", time.perf_counter() - t0, cold=cold,
                           version=int(self.worker.version), detail=detail)

    def shift_down(self) -> ShiftTiming:
        """Offload to host memory (a group outside the home set drops its trainer instead). A
        checkpoint write in flight is waited for first: the devices go on to another role, and
        one that dies there must leave a complete checkpoint of the state it held
        (`train.checkpoint_async`)."""
        t0 = time.perf_counter()
        detail: dict[str, float] = {}
        version = None if self.worker is None else int(self.worker.version)
        if self.worker is not None and self.active:
            waited = self.worker.wait_checkpoint() is not None
            t1 = time.perf_counter()
            if self.spec.preserve:
                detail = dict(self.worker.offload())
            else:
                self._drop()
                detail = {"dropped": 1.0}
            if waited:
                detail["checkpoint_wait_s"] = t1 - t0
        self.active = False
        return ShiftTiming(self.role.value, "down", time.perf_counter() - t0, detail=detail, version=version)

    def _drop(self, wait: bool = True) -> None:
        """Tear down this rank's trainer and process group (its state is elsewhere, or lost)."""
        worker, self.worker, self.group = self.worker, None, None
        self.active = False
        if worker is not None:
            try:
                worker.close(wait)  # the checkpoint write in flight, and its process group
            except Exception as e:  # noqa: BLE001 - teardown goes on; the failure is said
                log.error("trainer rank %d: the checkpoint in flight failed at close: %s", self.spec.rank, e)
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # teardown must not mask the run's own error
            pass

    def close(self, wait: bool = True) -> None:
        self._drop(wait)


class MemberHost(RoleHost):
    """A device lent to a replica of several devices whose engine runs in the first device's actor
    (`RoleSpec.leader`): the engine's other tensor-parallel ranks run on this device's accelerator
    (or cores), so the device belongs to the replica's role while its own actor holds nothing."""

    CONTEXT = ContextDecl(temporary=(), parameters=(), offloadable=(), preserved=())

    def shift_up(self, weights: Weights, version: int) -> ShiftTiming:
        self.active = True
        return ShiftTiming(self.role.value, "up", 0.0, version=version, detail={"member_of": float(self.spec.leader)})

    def shift_down(self) -> ShiftTiming:
        self.active = False
        return ShiftTiming(self.role.value, "down", 0.0, detail={"member_of": float(self.spec.leader)})


HOSTS: dict[Role, type[RoleHost]] = {Role.ROLLOUT: InferenceHost, Role.REWARD: InferenceHost, Role.TRAIN: TrainHost}


def make_host(spec: RoleSpec) -> RoleHost:
    """The host of `spec`: a member of another device's replica, or the role's own host."""
    return MemberHost(spec) if spec.leader is not None else HOSTS[spec.role](spec)
