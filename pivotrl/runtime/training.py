"""One training step of a real run, on the trainer's home devices (a driver thread runs it).

Owns `TrainingSteps`: the batch built from the ledger (trained ids checked for repeats), the
collective step, the publish into GPS (each rank writes its own shard, `DeviceWorker.publish`;
the version GPS then holds must be the trainer's), the checkpoint every `train.checkpoint_every`
versions, and the error a dead training rank stops the run with (what was lost, how to resume).

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
from typing import TYPE_CHECKING, Callable

from pivotrl.runtime.faults import point
from pivotrl.runtime.outcomes import TrainingRankDied, TrainingResult

if TYPE_CHECKING:
    from pivotrl.config import PivotConfig
    from pivotrl.deploy.events import StartTraining
    from pivotrl.runtime.executor import Executor
    from pivotrl.runtime.launch import Launch
    from pivotrl.runtime.ledger import SequenceLedger
    from pivotrl.runtime.samples import Samples
    from pivotrl.runtime.stats import RealStats

log = logging.getLogger(__name__)


class TrainingSteps:
    """The training side of a `DeviceDriver` (module docstring): counts into `stats`, timeline
    records through `record_event(kind, **fields)`."""

    def __init__(self, cfg: PivotConfig, executor: Executor, samples: Samples, ledger: SequenceLedger, launch: Launch,
                 stats: RealStats, record_event: Callable[..., None]) -> None:
        self.cfg, self.ex, self.s, self.ledger, self.launch = cfg, executor, samples, ledger, launch
        self.stats, self.record_event = stats, record_event
        self.trained_ids: list[int] = []
        self.metrics: dict[int, dict[str, float]] = {}
        self.home: tuple[int, ...] = ()  # the devices of the last step (the checkpoint in flight is theirs)

    def died(self, devices: list[int], why: str) -> str:
        """The error of a training rank's death: what was lost, and how to resume."""
        return (f"device(s) {devices} (training rank) died ({why}); the trainer's process group is lost, so "
                f"the run stops; {self.launch.resume_hint()}")

    def run(self, act: StartTraining) -> TrainingResult:
        """Train batch `act.batch` on `act.devices`, publish, checkpoint."""
        import ray

        dup = set(act.sample_ids) & set(self.trained_ids)
        if dup:
            raise RuntimeError(f"samples {sorted(dup)[:8]} would be trained twice")
        self.trained_ids.extend(act.sample_ids)
        led = self.ledger
        batch = self.s.train_batch(act.sample_ids, {sid: led.rewards[sid].total for sid in act.sample_ids},
                                   led.responses, led.versions)
        if batch.old_log_probs is None:
            self.stats.counts["logprobs_missing"] += 1
            log.warning("batch %d: some samples have no behaviour log-probs; training them as on-policy", act.batch)
        t0 = time.perf_counter()
        ref = ray.put(batch)
        self.home = tuple(act.devices)
        try:
            self._wait_checkpoint(act.devices, "before_step")
            for d in act.devices:
                point("train", d, self.ex.handle(d)[0])
            metrics = self.ex.train_call(act.devices, "train_step", ref)[0]
            secs = time.perf_counter() - t0
            version = int(metrics["version"])
            self._publish(act, version)
            if version % self.cfg.train.checkpoint_every == 0:
                self._checkpoint(act, version)
        except TrainingRankDied as e:
            raise RuntimeError(self.died(e.devices, f"during {e.method} of batch {act.batch}")) from None
        self.metrics[act.batch] = metrics
        return TrainingResult(act, metrics, secs)

    def _publish(self, act: StartTraining, version: int) -> None:
        params = self.ex.params
        pub = self.ex.train_call(act.devices, "publish", params.store, "policy")[0]
        published = params.policy_version("policy", int(pub["gps_version"]))
        if published != version:
            raise RuntimeError(f"batch {act.batch}: the trainer is at policy version {version} but its "
                               f"publish made GPS hold version {published}")
        self.record_event("weight_publish", version=version, seconds=float(pub["seconds"]))

    def _checkpoint(self, act: StartTraining, version: int) -> None:
        from pivotrl.trainer.trainer_checkpoint import checkpoint_dir

        path = str(checkpoint_dir(self.launch.checkpoint_dir, version))
        t0 = time.perf_counter()
        blocking = not bool(self.cfg.train.checkpoint_async)
        self.ex.train_call(act.devices, "save_checkpoint", path, {"step": version, "batch": act.batch}, blocking)
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
