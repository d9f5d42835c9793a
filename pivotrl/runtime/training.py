"""One training step of a real run, on the devices the controller gave the trainer (a driver
thread runs it).

Owns `TrainingSteps`: the batch built from the ledger (trained ids checked for repeats,
`TrainedOnce`), the collective step, the publish into GPS (each rank writes its own shard,
`DeviceWorker.publish`; the version GPS then holds must be the trainer's), the checkpoint every
`train.checkpoint_every` versions, and the error a dead training rank stops the run with (what was
lost, how to resume).

Elastic training (`deploy.planner.elastic_training`, DESIGN §4.6): after every step the ranks
write the trainer's whole state into host memory (`state_store`, a GPS model: `Launch.groups`),
which is what a trainer of another world size is built from (`roles.TrainHost`; the rebuild's
seconds are the step's `reshard_s`). A rank that dies mid-step (a borrowed device, or any) no longer
ends the run when that state is at the step's version: the trainer is rebuilt on the longest run of
the step's devices still alive and the step runs again on the same batch (nothing of the failed
attempt was published or written), so no sample is lost or trained twice.

Checkpoints are off the critical path: the ranks stage their state in host memory and write it in
the background (`save_checkpoint(..., blocking=False)`), while the run goes on (the publish, the
weight refresh, the next batch's rollout). The next step starts only once that write is complete
(normally long finished by then), as does a shift lending the trainer's devices to another role
(`roles.TrainHost.shift_down`), so a rank that dies in a step, or a lent device that dies, always
leaves the last checkpoint whole. The end of the run (`finish`) waits for the last one. A failed
write surfaces at that wait, naming its folder. A checkpoint counts (for a resume, or for
rebuilding a lost trainer) only once complete: `trainer_state.json` is written last.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from pivotrl.core.types import Role
from pivotrl.runtime.faults import point
from pivotrl.runtime.ledger import grown
from pivotrl.runtime.outcomes import ShiftResult, TrainingRankDied, TrainingResult

if TYPE_CHECKING:
    import ray

    from pivotrl.config import PivotConfig
    from pivotrl.deploy.events import StartTraining
    from pivotrl.runtime.executor import Executor
    from pivotrl.runtime.launch import Launch
    from pivotrl.runtime.ledger import SequenceLedger
    from pivotrl.runtime.samples import Samples
    from pivotrl.runtime.stats import RealStats

log = logging.getLogger(__name__)


class TrainedOnce:
    """The sample ids a run has trained, one byte per id: ids are dense from 0 (batch `b`'s are
    `b * samples_per_batch + i`). A run of 1,000 steps of 8,192 samples holds 10 MB here, where the
    list and the set of its ids this replaced held 571 MB (tracemalloc), and the summary built a
    second set. `add` refuses a sample trained before, or twice in one batch."""

    def __init__(self) -> None:
        self._marked = np.zeros(0, dtype=bool)
        self.count = 0
        """Samples trained (the summary's `samples_trained`)."""

    def add(self, sample_ids: Sequence[int]) -> None:
        ids = np.asarray(sample_ids, dtype=np.int64)
        if not len(ids):
            return
        if ids.min() < 0:
            raise ValueError(f"sample ids are >= 0, got {int(ids.min())}")
        self._marked = grown(self._marked, int(ids.max()) + 1, False)
        ids_once, n = np.unique(ids, return_counts=True)
        dup = np.union1d(ids_once[n > 1], ids_once[self._marked[ids_once]])
        if len(dup):
            raise RuntimeError(f"samples {dup[:8].tolist()} would be trained twice")
        self._marked[ids] = True
        self.count += len(ids)

    @property
    def unique(self) -> int:
        """Distinct samples trained, counted from the marks (the summary's
        `samples_trained_unique`: equal to `count` unless `add` let a repeat through)."""
        return int(self._marked.sum())


class TrainingSteps:
    """The training side of a `DeviceDriver` (module docstring): counts into `stats`, timeline
    records through `record_event(kind, **fields)`."""

    def __init__(self, cfg: PivotConfig, executor: Executor, samples: Samples, ledger: SequenceLedger, launch: Launch,
                 stats: RealStats, record_event: Callable[..., None]) -> None:
        self.cfg, self.ex, self.s, self.ledger, self.launch = cfg, executor, samples, ledger, launch
        self.stats, self.record_event = stats, record_event
        self.trained = TrainedOnce()  # every sample trained: the repeat check and the summary's counts
        self._batches: dict[int, tuple[list[int], dict[str, float]]] = {}  # until `take(batch)`
        self.home: tuple[int, ...] = ()  # the devices of the last step (the checkpoint in flight is theirs)
        self.reshard_s: float | None = None  # the last training shift up's rebuild from host memory

    def died(self, devices: list[int], why: str) -> str:
        """The error of a training rank's death: what was lost, and how to resume."""
        return (f"device(s) {devices} (training rank) died ({why}); the trainer's process group is lost, so "
                f"the run stops; {self.launch.resume_hint()}")

    def run(self, act: StartTraining) -> TrainingResult:
        """Train batch `act.batch` on `act.devices`, publish, checkpoint."""
        import ray

        self.trained.add(act.sample_ids)
        led = self.ledger
        batch = self.s.train_batch(act.sample_ids, {sid: led.rewards[sid].total for sid in act.sample_ids},
                                   led.responses, led.versions)
        if batch.old_log_probs is None:
            self.stats.counts["logprobs_missing"] += 1
            log.warning("batch %d: some samples have no behaviour log-probs; training them as on-policy", act.batch)
        t0 = time.perf_counter()
        ref = ray.put(batch)
        devices = tuple(act.devices)
        self.home = devices
        reshard, self.reshard_s = self.reshard_s, None
        try:
            self._wait_checkpoint(devices, "before_step")
            try:
                metrics = self._step(devices, ref)
            except TrainingRankDied as e:
                devices = self._restart(act, devices, e)
                t0, reshard = time.perf_counter(), self.reshard_s
                metrics = self._step(devices, ref)
            secs = time.perf_counter() - t0
            version = int(metrics["version"])
            self._save_state(devices, version)
            self._publish(devices, act.batch, version)
            if version % self.cfg.train.checkpoint_every == 0:
                self._checkpoint(devices, act.batch, version)
        except TrainingRankDied as e:
            raise RuntimeError(self.died(e.devices, f"during {e.method} of batch {act.batch}")) from None
        self.home = devices
        self._batches[act.batch] = (list(act.sample_ids), metrics)
        world = len(devices) if devices != tuple(act.devices) else 0
        return TrainingResult(act, metrics, secs, world=world, reshard_s=reshard)

    def take(self, batch: int) -> tuple[list[int], dict[str, float]]:
        """The sample ids and the step metrics of trained `batch`, handed over once (its step's
        row is being written); empty for a batch not trained here."""
        return self._batches.pop(batch, ([], {}))

    def _step(self, devices: tuple[int, ...], ref: ray.ObjectRef) -> dict[str, float]:
        for d in devices:
            point("train", d, self.ex.handle(d)[0])
        return self.ex.train_call(devices, "train_step", ref)[0]

    # ------------------------------------------------------------------ elastic training
    def shifted(self, res: ShiftResult) -> None:
        """A shift finished: a trainer rebuilt from host memory on another layout (elastic
        training) is what the next step reports as its `reshard_s` (the slowest rank's)."""
        ups = [t.get("reshard_s") for t in res.timings if t["role"] == Role.TRAIN.value and t["direction"] == "up"]
        ups = [x for x in ups if x is not None]
        if ups:
            self.reshard_s = max(ups)

    def _save_state(self, devices: tuple[int, ...], version: int) -> None:
        """Elastic training: the trainer's state into host memory (GPS) after every step, so a
        trainer of any world size can be built from it, and a step that loses a rank restarts."""
        g = self.launch.groups
        if g.state is None:
            return
        out = self.ex.train_call(devices, "save_state", g.state.store, g.state.name)
        g.ready = True
        self.record_event("state_write", version=version, seconds=max(o["seconds"] for o in out),
                          bytes=sum(o["bytes"] for o in out), world=len(devices))

    def _restart(self, act: StartTraining, devices: tuple[int, ...], e: TrainingRankDied) -> tuple[int, ...]:
        """A rank died in the step: with the trainer's state in host memory at this step's start
        (elastic training), rebuild the trainer on the longest run of the step's devices still
        alive and run the step again, on the same batch (nothing was trained: the version did not
        move, nothing was published); else the run stops (`died`)."""
        from pivotrl.core.types import ShiftPlan, Slot
        from pivotrl.runtime.elastic import restart_slot

        g = self.launch.groups
        slot = restart_slot(devices, e.devices)
        if slot is None or not g.holds_version(act.version):
            raise RuntimeError(self.died(e.devices, f"during {e.method} of batch {act.batch}")) from None
        for d in e.devices:
            self.ex.respawn(d, f"{e.method}: training rank died")
        log.warning("batch %d: training rank(s) on %s died; the step restarts on devices %s from the state in "
                    "host memory (version %d)", act.batch, e.devices, list(slot.devices), act.version)
        res = self.ex.run_shift(ShiftPlan(Role.TRAIN, up=[slot], down=[Slot(Role.TRAIN, devices[0], len(devices))]))
        if res.error is not None:
            raise res.error
        self.shifted(res)
        self.record_event("training_restarted", batch=act.batch, version=act.version, dead=list(e.devices),
                          devices=list(slot.devices), reshard_s=self.reshard_s)
        return slot.devices

    def _publish(self, devices: tuple[int, ...], batch: int, version: int) -> None:
        params = self.ex.params
        pub = self.ex.train_call(devices, "publish", params.store, "policy")[0]
        published = params.policy_version("policy", int(pub["gps_version"]))
        if published != version:
            raise RuntimeError(f"batch {batch}: the trainer is at policy version {version} but its "
                               f"publish made GPS hold version {published}")
        self.record_event("weight_publish", version=version, seconds=float(pub["seconds"]))

    def _checkpoint(self, devices: tuple[int, ...], batch: int, version: int) -> None:
        from pivotrl.trainer.trainer_checkpoint import checkpoint_dir

        path = self.launch.for_ranks(checkpoint_dir(self.launch.checkpoint_dir, version))
        t0 = time.perf_counter()
        blocking = not bool(self.cfg.train.checkpoint_async)
        self.ex.train_call(devices, "save_checkpoint", path, {"step": version, "batch": batch}, blocking)
        for d in devices:  # the write goes on in the background (a kill here: the chaos soak)
            point("checkpoint", d, self.ex.handle(d)[0])
        self.record_event("checkpoint", version=version, path=path, background=not blocking,
                                 step_blocked_s=time.perf_counter() - t0)

    def _wait_checkpoint(self, devices: tuple[int, ...], when: str) -> None:
        """Wait for the checkpoint write in flight on `devices` (a failed one raises, naming its
        folder); record how long it held things up."""
        t0 = time.perf_counter()
        done = [p for p in self.ex.train_call(devices, "wait_checkpoint") if p]
        if done:
            self.record_event("checkpoint_finished", path=done[0], when=when, wait_s=time.perf_counter() - t0)

    def finish(self) -> None:
        """The end of the run: wait for the checkpoint in flight."""
        if self.home:
            self._wait_checkpoint(self.home, "end")
