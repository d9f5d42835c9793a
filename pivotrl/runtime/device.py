"""One Ray actor per device: it hosts at most one active role (an engine replica or a trainer rank).

Owns: the device process, its thread budget (`torch.set_num_threads`) and core pinning
(`os.sched_setaffinity`, only where the node has a core per device thread: `cluster.cores_for_device`),
the role hosts on this device (one active, the rest dormant with only their preserved context:
`roles.py`), and the driving loop of an active inference engine. The first device of a replica of
several devices starts its engine across the slot's cores and accelerators (`placed`); the other
devices of the slot host a `roles.MemberHost`.

Driving model. The protocol's engines are synchronous (`pivotrl.engines.protocol`). A background
thread steps the active engine while it has work, so decoding never waits for the driver. The
driver talks to the actor between iterations: `abort` / `load_weights` go through the step lock
(they wait for the iteration in progress), `submit` hands requests to the engine without waiting
for it (the CPU engine's intake: the driver's dispatch must not wait out a decode step on every
device it feeds), and `poll(timeout)` blocks until a completion is ready (or the timeout passes)
and returns completions, per-sequence token deltas since the last poll (`progress`) and the
engine's stats with its per-iteration timing samples (the monitor fits the throughput model from
them). The driver keeps every sequence's tokens from these deltas, so if this actor dies the
sequences resume elsewhere from the last tokens it reported (nothing is lost; tokens generated
after the last poll are generated again).

`abort` and a completion can race (a sequence finishes in the iteration right before the abort).
`abort` takes the step lock and also hands back any already-finished completion of the requested
ids, so the driver learns of each sequence exactly once: aborted with tokens, or finished.

The actor is a threaded Ray actor (`max_concurrency`), so a blocking `poll` never holds up `abort`.
Training methods are collective (every home device is called with the same command; `executor.py`
does that). Knows nothing about schedulers, plans or the control plane.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from pivotrl.core.types import Role
from pivotrl.engines.protocol import TokenDeltas
from pivotrl.runtime.roles import (EnginePlacement, InferenceHost, RoleHost, RoleSpec, ShiftTiming, TrainHost,
                                   Weights, make_host)

if TYPE_CHECKING:
    from pivotrl.engines.protocol import Completion, EngineStats, GenerationRequest, InferenceEngine
    from pivotrl.gps.store import GlobalParameterStore
    from pivotrl.runtime.cluster import Cluster
    from pivotrl.trainer.train_batch import TrainBatch
    from pivotrl.trainer.trainer_worker import TrainerWorker

log = logging.getLogger(__name__)

#: Ray threads per device actor: the blocking poll, one control call, and spare for stats/info.
ACTOR_CONCURRENCY = 4


@dataclass
class DevicePoll:
    """What one `poll` returns."""

    device: int
    completions: list[Completion] = field(default_factory=list)
    """`protocol.Completion`s, each reported once."""
    progress: TokenDeltas = field(default_factory=TokenDeltas)
    """New tokens (with their behaviour log-probs) per live sequence since the previous poll, for
    the driver to append to its copy (empty when no engine is active)."""
    stats: EngineStats | None = None
    """`protocol.EngineStats` (samples drained) of the active engine, or None."""
    role: str | None = None
    error: str | None = None
    """The background loop's exception, if the engine failed (the driver treats it as a dead device)."""


@dataclass
class AbortResult:
    """What `abort` returns: stopped sequences with all their tokens, and ones that had finished."""

    aborted: dict[int, list[int]] = field(default_factory=dict)
    """seq_id -> `protocol.TokensSoFar`: every token so far, with its behaviour log-probs."""
    finished: list[Completion] = field(default_factory=list)


class DeviceWorker:
    """The body of a device actor (`DeviceActor` is this class under `ray.remote`)."""

    def __init__(self, device: int, threads: int = 1, cores: list[int] | None = None) -> None:
        import torch

        self.device = int(device)
        self.threads = int(threads)
        try:  # per-shift weight loads would otherwise print a progress bar per device to the driver
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:
            pass
        torch.set_num_threads(self.threads)
        os.environ["OMP_NUM_THREADS"] = str(self.threads)
        self.cores: list[int] | None = None
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, set(cores))
            self.cores = sorted(os.sched_getaffinity(0))
        self.hosts: dict[Role, RoleHost] = {}
        self.active: RoleHost | None = None
        self._cv = threading.Condition()  # guards outbox, active, error
        self._step_lock = threading.Lock()  # held by one engine step, an abort, or a shift
        self._outbox: list[Completion] = []
        self._error: str | None = None
        self._stop = False
        self._loop = threading.Thread(target=self._run, name=f"device{device}-loop", daemon=True)
        self._loop.start()

    # ------------------------------------------------------------------ identity
    def info(self) -> dict[str, Any]:
        import ray
        import torch

        ctx = ray.get_runtime_context()
        live = 0
        if isinstance(self.active, InferenceHost) and self.active.active:
            st = self.active.engine.stats(drain=False)
            live = st.running + st.waiting
        return {"device": self.device, "live_sequences": live, "pid": os.getpid(), "host": socket.gethostname(),
                "node_id": ctx.get_node_id(), "threads": torch.get_num_threads(), "cores": self.cores,
                "accelerators": [str(g) for g in ray.get_gpu_ids()],
                "role": None if self.active is None else self.active.role.value,
                "dormant": sorted(r.value for r, h in self.hosts.items() if not h.active)}

    def ping(self) -> int:
        return self.device

    def stall(self, seconds: float) -> bool:
        """Hold the step lock for `seconds` on a thread of its own, as an engine call stuck inside
        this device would (a hung RPC or collective): every call that needs the lock waits behind
        it. Back once the lock is held. For the fault tests of the time limits (`faults.stall_at`)."""
        held = threading.Event()

        def body() -> None:
            with self._step_lock:
                held.set()
                time.sleep(seconds)

        threading.Thread(target=body, name=f"device{self.device}-stall", daemon=True).start()
        return held.wait(timeout=60)

    def rendezvous(self) -> str:
        """`tcp://ip:port` on this device's node, the port free now: the process-group address of
        a trainer whose rank 0 is this device (`nodes.tcp_rendezvous`)."""
        from pivotrl.runtime.nodes import tcp_rendezvous

        return tcp_rendezvous()

    # ------------------------------------------------------------------ role shifts
    def shift_up(self, spec: RoleSpec, weights: Weights = None, version: int = 0) -> ShiftTiming:
        """Make `spec.role` the active role (reusing its preserved context if this device held
        it); `weights`: a `weight_sync.GPSWeights` this actor reads from GPS itself, a state dict,
        or None."""
        with self._step_lock:
            if self.active is not None:
                raise RuntimeError(f"device {self.device}: shift_up({spec.role.value}) while "
                                   f"{self.active.role.value} is active; shift it down first")
            if spec.leader is not None:  # a member holds nothing: no context to keep for later
                host = make_host(spec)
            else:
                host = self.hosts.get(spec.role)
                if host is None or host.spec.model_path != spec.model_path:
                    if host is not None:
                        host.close()
                    host = self.hosts[spec.role] = make_host(spec)
                elif isinstance(host, TrainHost):
                    host.retarget(spec)  # its group may have changed (elastic training)
            with placed(spec.placement):
                timing = host.shift_up(weights, version)
            with self._cv:
                self.active = host
                self._cv.notify_all()
            return timing

    def shift_down(self) -> ShiftTiming:
        """Discard/offload the active role's context; keep its preserved part for a later shift up."""
        with self._step_lock:
            if self.active is None:
                return ShiftTiming("none", "down", 0.0)
            host = self.active
            timing = host.shift_down()
            with self._cv:
                self.active = None
                self._cv.notify_all()
            return timing

    def drop_role(self, role: str) -> bool:
        """Free `role`'s context on this device, preserved part included (shift it down first if
        active); a later shift up builds it anew. Used when a training rank elsewhere died: the
        survivors' process group is gone, so the trainer is rebuilt from a checkpoint."""
        r = Role(role)
        with self._step_lock:
            host = self.hosts.pop(r, None)
            if host is None:
                return False
            if host is self.active:
                if not isinstance(host, TrainHost):  # a trainer is discarded, not offloaded
                    host.shift_down()
                with self._cv:
                    self.active = None
                    self._cv.notify_all()
            host.close(wait=False)  # its peers are gone: an unfinished checkpoint write is abandoned
            return True

    # ------------------------------------------------------------------ inference
    def _engine(self) -> InferenceEngine:
        if not isinstance(self.active, InferenceHost):
            held = None if self.active is None else self.active.role.value
            raise RuntimeError(f"device {self.device} has no active inference role (active: {held})")
        return self.active.engine

    def submit(self, requests: list[GenerationRequest]) -> int:
        """Queue `GenerationRequest`s (fresh or resumed) on the active engine; returns how many."""
        eng = self._engine()
        for r in requests:
            eng.submit(r)
        with self._cv:
            self._cv.notify_all()
        return len(requests)

    def abort(self, seq_ids: list[int] | None = None) -> AbortResult:
        """Stop `seq_ids` (all when None) and return their tokens; finished ones come back as such."""
        with self._step_lock:
            if not isinstance(self.active, InferenceHost):
                return AbortResult()
            aborted = self.active.engine.abort(seq_ids)
            with self._cv:
                want = None if seq_ids is None else set(seq_ids)
                done = [c for c in self._outbox if want is None or c.seq_id in want]
                self._outbox = [c for c in self._outbox if not (want is None or c.seq_id in want)]
            return AbortResult(aborted=aborted, finished=done)

    def load_weights(self, weights: Weights, version: int, role: Role = Role.ROLLOUT) -> dict[str, Any] | None:
        """Replace the active engine's weights in place with `weights` (a `weight_sync.GPSWeights`
        this actor reads from its own GPS node, or a state dict), tagged `version`, if that engine
        serves `role`. Returns the load as a measured event, `{"seconds", "version", "bytes",
        "path", "gps_version"}` (`version`: the one loaded, newer than asked if GPS moved on
        meanwhile; seconds timed inside the step lock: the time decoding stood still for it,
        without the wait for the iteration in progress), or None when no engine of `role` is
        active: a publish that raced a shift (down, or down and up to the other role: the judge's
        engine must never take the policy's weights; the next shift up reads GPS anyway). A failed load raises the engine's
        `EngineFailedError` with the engine shut down: the executor then replaces this actor, so
        no half-loaded engine serves."""
        from pivotrl.engines.weight_sync import opened

        with self._step_lock:
            host = self.active
            if not isinstance(host, InferenceHost) or not host.active or host.role != Role(role):
                return None
            t0 = time.perf_counter()
            with opened(weights, version) as (w, v, facts):
                host.engine.load_weights(w, v)
            return {"seconds": time.perf_counter() - t0, "version": v, **facts}

    def poll(self, timeout: float = 0.5) -> DevicePoll:
        """Wait up to `timeout` s for a completion; return completions, token deltas and stats.
        The deltas are the engine's own (`new_tokens`): the cost is the new tokens', not the
        live sequences' lengths."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self._outbox and self._error is None and time.monotonic() < deadline:
                self._cv.wait(max(0.0, deadline - time.monotonic()))
            out, self._outbox = self._outbox, []
            host = self.active
            error = self._error
        res = DevicePoll(device=self.device, completions=out, error=error,
                         role=None if host is None else host.role.value)
        if isinstance(host, InferenceHost) and host.engine is not None and host.active:
            res.progress = host.engine.new_tokens()
            res.stats = host.engine.stats(drain=True)
        return res

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._has_work():
                    self._cv.wait(0.05)
                if self._stop:
                    return
            try:
                with self._step_lock:
                    host = self.active
                    if not isinstance(host, InferenceHost) or not host.active:
                        continue
                    done = host.engine.step()
            except Exception as e:  # surfaced through poll: the driver retires this device
                log.exception("device %d: engine step failed", self.device)
                with self._cv:
                    self._error = f"{type(e).__name__}: {e}"
                    self._cv.notify_all()
                return
            if done:
                with self._cv:
                    self._outbox.extend(done)
                    self._cv.notify_all()

    def _has_work(self) -> bool:
        host = self.active
        return isinstance(host, InferenceHost) and host.active and host.engine.has_unfinished() \
            and self._error is None

    # ------------------------------------------------------------------ training (collective)
    def _trainer(self) -> TrainerWorker:
        host = self.hosts.get(Role.TRAIN)
        if not isinstance(host, TrainHost) or host.worker is None:
            raise RuntimeError(f"device {self.device} holds no trainer rank (shift training up first)")
        return host.worker

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        return self._trainer().step(batch)

    def publish(self, store: GlobalParameterStore, model: str) -> dict[str, float]:
        """Write this rank's shard of the policy into GPS `model` of `store` (collective over the
        ranks: `weight_sync.publish_shards`, no gather); `{"gps_version", "seconds"}`."""
        from pivotrl.engines.weight_sync import publish_shards

        t0 = time.perf_counter()
        v = publish_shards(self._trainer(), store, model)
        return {"gps_version": float(v), "seconds": time.perf_counter() - t0}

    def trainer_state(self) -> dict[str, Any]:
        return self._trainer().state()

    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None, blocking: bool = True) -> str | None:
        """Collective. `blocking=False`: back once the state is staged in host memory, the write
        goes on in the background (`wait_checkpoint`). `path` as configured: `~` and `$VAR`
        are this node's (`train.checkpoint_dir`)."""
        from pivotrl.config.run import expand_path

        return self._trainer().save_checkpoint(expand_path(path), extra, blocking=blocking)

    def wait_checkpoint(self, timeout_s: float | None = None) -> str | None:
        """The checkpoint write in flight, finished (its folder), or None if none was (or this
        device's trainer rank was dropped since: it waited for its write first)."""
        host = self.hosts.get(Role.TRAIN)
        if not isinstance(host, TrainHost) or host.worker is None:
            return None
        return host.worker.wait_checkpoint(timeout_s)

    def save_state(self, store: GlobalParameterStore, name: str) -> dict[str, float]:
        """Collective: this rank's part of the trainer's state into GPS (elastic training)."""
        return self._trainer().save_state(store, name)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        from pivotrl.config.run import expand_path

        return self._trainer().load_checkpoint(expand_path(path))

    # ------------------------------------------------------------------ teardown
    def reset(self) -> bool:
        """Close every role (after the step in progress) and forget the run, for a kept cluster's
        next run (`cluster.keep_devices`). Whether the actor is now as spawned: False when its
        engine loop ended on an error (the executor then stops it)."""
        with self._step_lock:
            for host in self.hosts.values():
                host.close()
            with self._cv:
                self.hosts.clear()
                self.active = None
                self._outbox = []
                return self._loop.is_alive() and self._error is None

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._loop.join(timeout=5)
        with self._step_lock:
            for host in self.hosts.values():
                host.close()
            self.hosts.clear()
            self.active = None


@contextlib.contextmanager
def placed(placement: EnginePlacement | None) -> Iterator[None]:
    """Within: this process runs on every core and sees every accelerator of `placement`, so an
    engine started here spawns its tensor-parallel ranks across the replica's devices (they keep
    what they inherited); the actor's own pinning and visibility come back after."""
    if placement is None:
        yield
        return
    cores = os.sched_getaffinity(0) if placement.cores and hasattr(os, "sched_setaffinity") else None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        if cores is not None:
            os.sched_setaffinity(0, set(placement.cores))
        if placement.accelerator_ids:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(placement.accelerator_ids)
        yield
    finally:
        if cores is not None:
            os.sched_setaffinity(0, cores)
        if placement.accelerator_ids:
            if visible is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = visible


def device_actor_class() -> Any:
    """`DeviceWorker` as a threaded Ray actor class (built lazily so importing this needs no Ray)."""
    import ray

    return ray.remote(max_concurrency=ACTOR_CONCURRENCY, max_restarts=0)(DeviceWorker)


def actor_name(device: int, generation: int) -> str:
    """Ray name of the `generation`-th actor of `device` (0 at start, +1 per respawn after a death),
    so tools and fault tests can find a device's actor with `ray.get_actor`."""
    return f"pivotrl-device{device}-gen{generation}"


def spawn_device(cluster: Cluster, device: int, generation: int = 0) -> Any:
    """Start the actor of `device` on its bundle, with its thread budget and (if possible) cores."""
    from pivotrl.runtime.cluster import cores_for_device

    threads = cluster.spec.threads_per_device
    # Virtual devices of every virtual node share this machine, so cores go by global index.
    cores = cores_for_device(device, threads) if cluster.spec.kind == "local" else None
    cls = device_actor_class()
    return cls.options(name=actor_name(device, generation), **cluster.actor_options(device)).remote(
        device, threads, cores)
