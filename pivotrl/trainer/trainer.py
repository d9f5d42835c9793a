"""The GRPO trainer's driver: one object that runs an FSDP2 policy update over N ranks.

Owns: the batch contract (`TrainBatch`), joining a process group (`init_process_group`,
`resolve_device`), starting the rank processes (or hosting a single rank in this process), sending
every rank the same command, collecting replies and errors, publishing weights after each step,
and naming checkpoint folders. The rank-local work (model, optimizer, loss, offload, checkpoint I/O) is
`pivotrl.trainer.trainer_worker.TrainerWorker`; a Ray actor per device can host one of those
instead of the processes started here.

Usage::

    from pivotrl.config.trainer import TrainerSpec
    from pivotrl.trainer.trainer import Trainer
    from pivotrl.trainer.train_batch import TrainBatch

    with Trainer(TrainerSpec(world_size=2, lr=1e-4), "/path/to/hf_policy",
                 publish=lambda version, sd: engine.load_weights(sd, version)) as tr:
        m = tr.step(TrainBatch(prompt_ids=..., response_ids=..., versions=[tr.version] * n,
                               rewards=..., group_ids=...))      # -> {"loss": ..., "version": 1, ...}
        tr.save_checkpoint(checkpoint_dir("ckpts", tr.version), extra={"data_cursor": 123})
        tr.offload(); ...; tr.reload()                            # role shift down / up
    # resume:
    tr = Trainer(cfg, "/path/to/hf_policy"); extra = tr.load_checkpoint(latest_checkpoint("ckpts"))

API (every call blocks until all ranks finish it):
    Trainer(cfg, model_path, publish=None, spawn=None)
        cfg.world_size ranks; `spawn=None` spawns processes when world_size > 1 and hosts the
        single rank in this process otherwise (no process start-up, no tensor IPC). A hosted rank
        owns this process's default torch.distributed group until `close()`.
    .version -> int                 policy version of the current weights (0 at start, +1 per step)
    .step(batch) -> dict            one update; metrics include loss, grad_norm, samples_trained,
                                    samples_rejected_stale, version, step_time_s
    .compute_log_probs(batch)       per-response-token log-probs under the current policy
    .state_dict() -> dict           full policy, CPU tensors in cfg.publish_dtype, Hugging Face names
    .save_checkpoint(path, extra) -> Path;  .load_checkpoint(path) -> extra dict
    .offload() / .reload() -> dict  move params, grads and optimizer state to host memory and back
    .device_bytes() -> dict         bytes rank 0 holds in params / grads / optimizer state
    .close()                        stop the ranks (also on `with` exit and garbage collection)

Spawned ranks re-import the caller's `__main__` module (as with multiprocessing's spawn start
method), so a script that builds a multi-rank `Trainer` must do so under `if __name__ == "__main__":`.
They are forked from a fork server that imported the rank's modules (torch, transformers, the
worker) once, when this process first started a rank, and run in the caller's environment as
it is when the `Trainer` starts (`pivotrl.trainer.dist.rank_process`). A hosted
rank (world_size 1) keeps this process's torch thread count, and seeds this process's torch, numpy
and `random` generators with `cfg.seed` when built (and restores them from a checkpoint on load).

`publish(version, state_dict)` is called in this process after every step that changed the
weights, with the full state dict at the new version. It is where the GPS write plugs in.

Processes: spawned ranks rendezvous through a `file://` store in a temporary folder (no port to
race for), each uses `cfg.num_threads` torch threads and, on CUDA, device `cuda:<rank>`. A rank
that raises sends its traceback here and the whole group is stopped, because its peers would be
left waiting in a collective; the `Trainer` then raises `TrainerError` and must be rebuilt.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from pivotrl.config.trainer import TrainerSpec
from pivotrl.trainer.dist import init_process_group, rank_context, rank_process, resolve_device
from pivotrl.trainer.train_batch import TrainBatch
from pivotrl.trainer.trainer_checkpoint import latest_checkpoint

if TYPE_CHECKING:
    from pivotrl.trainer.trainer_worker import TrainerWorker

__all__ = ["Trainer", "TrainerError", "WeightPublisher"]

class TrainerError(RuntimeError):
    """A rank failed (its traceback is in the message) or stopped answering."""


class WeightPublisher(Protocol):
    def __call__(self, version: int, state_dict: dict[str, torch.Tensor]) -> None: ...


def _rank_main(rank: int, cfg: TrainerSpec, model_path: str, init_method: str, backend: str,
               commands: Any, replies: Any) -> None:
    """Entry of a spawned rank: join the group, build the worker, then serve commands until
    'close'. Only rank 0's return values travel back; other ranks send None."""
    try:
        from pivotrl.trainer.trainer_worker import TrainerWorker

        torch.set_num_threads(cfg.num_threads)
        device = None
        if resolve_device(cfg)[0] == "cuda":
            torch.cuda.set_device(rank)
            device = f"cuda:{rank}"
        init_process_group(rank, cfg.world_size, init_method, backend, cfg.timeout_s)
        worker = TrainerWorker(cfg, model_path, device=device)
        replies.put((rank, True, None))
    except BaseException:  # noqa: BLE001 - the driver re-raises it with the rank named
        replies.put((rank, False, traceback.format_exc()))
        return
    try:
        while True:
            name, args, kwargs = commands.get()
            if name == "close":
                break
            try:
                out = getattr(worker, name)(*args, **kwargs)
                replies.put((rank, True, out if rank == 0 else None))
            except BaseException:  # noqa: BLE001
                replies.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class Trainer:
    """FSDP2 GRPO trainer over `cfg.world_size` ranks. See the module docstring for the API."""

    def __init__(self, cfg: TrainerSpec, model_path: str | os.PathLike, *,
                 publish: WeightPublisher | None = None, spawn: bool | None = None):
        cfg.validate()
        self.cfg = cfg
        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").is_file():
            raise ValueError(f"model_path {str(self.model_path)!r} is not a Hugging Face model folder (no config.json)")
        try:
            self._vocab_size = int(json.loads((self.model_path / "config.json").read_text())["vocab_size"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"model_path {str(self.model_path)!r} has an unreadable config.json: {e}") from e
        self.publish = publish
        self._spawn = cfg.world_size > 1 if spawn is None else spawn
        if not self._spawn and cfg.world_size != 1:
            raise ValueError(f"spawn=False hosts a single rank; TrainerSpec.world_size={cfg.world_size} needs spawn")
        self._kind, backend = resolve_device(cfg)
        self._store_dir = tempfile.mkdtemp(prefix="pivotrl-trainer-")
        init_method = f"file://{self._store_dir}/store"
        self._closed = False
        self._broken: str | None = None
        self._version = 0
        self._procs: list[Any] = []
        self._local: "TrainerWorker | None" = None
        self._owns_group = False
        try:
            if self._spawn:
                ctx = rank_context()
                self._commands = [ctx.Queue() for _ in range(cfg.world_size)]
                self._replies = ctx.Queue()
                for r in range(cfg.world_size):
                    p = rank_process(_rank_main, (r, cfg, str(self.model_path), init_method, backend,
                                                  self._commands[r], self._replies),
                                     daemon=True, name=f"pivotrl-trainer-rank{r}")
                    p.start()
                    self._procs.append(p)
                self._collect("start")
            else:
                if dist.is_initialized():
                    raise RuntimeError("this process already has a default process group; a hosted "
                                       "trainer rank needs its own (close the other trainer, or spawn=True)")
                from pivotrl.trainer.trainer_worker import TrainerWorker

                init_process_group(0, 1, init_method, backend, cfg.timeout_s)
                self._owns_group = True
                self._local = TrainerWorker(cfg, self.model_path)
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------------- plumbing
    def _collect(self, name: str) -> Any:
        """Wait for one reply per rank; raise TrainerError (and stop the group) on any failure."""
        replies: dict[int, Any] = {}
        errors: list[str] = []
        waited = 0.0
        while len(replies) + len(errors) < self.cfg.world_size:
            try:
                rank, ok, out = self._replies.get(timeout=1.0)
            except queue.Empty:
                waited += 1.0
                dead = [p.name for p in self._procs if not p.is_alive()]
                if dead and not errors:
                    errors.append(f"rank process(es) {dead} exited during {name}()")
                if errors or waited > self.cfg.timeout_s:
                    break
                continue
            if ok:
                replies[rank] = out
            else:
                errors.append(f"rank {rank} failed in {name}():\n{out}")
                # Its peers may be stuck in a collective; give them a moment to fail too, no more.
                waited = max(waited, self.cfg.timeout_s - 5.0)
        if errors or len(replies) < self.cfg.world_size:
            msg = "\n".join(errors) or f"no reply from all ranks within {self.cfg.timeout_s}s in {name}()"
            self._broken = msg
            self.close()
            raise TrainerError(msg)
        return replies[0]

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise TrainerError(f"trainer is closed{': ' + self._broken if self._broken else ''}")
        if self._local is not None:
            return getattr(self._local, name)(*args, **kwargs)
        for q in self._commands:
            q.put((name, args, kwargs))
        return self._collect(name)

    # ---------------------------------------------------------------------------- API
    @property
    def version(self) -> int:
        """Policy version of the current weights: 0 at start, +1 per update (restored on resume)."""
        return self._version

    @property
    def worker(self) -> "TrainerWorker | None":
        """The hosted rank's `TrainerWorker` (spawn=False), for inspection in tests; None when the
        ranks run in spawned processes."""
        return self._local

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One GRPO update on `batch` (see `TrainBatch`); publishes the new weights if it trained."""
        # Bad batches fail here, before any rank enters a collective it could not leave.
        batch.validate(self._vocab_size)
        if max(batch.versions) > self._version:
            raise ValueError(f"TrainBatch.versions has version {max(batch.versions)} > trainer version {self._version}")
        metrics = self._call("step", batch)
        self._version = int(metrics["version"])
        if metrics.get("trained") and self.publish is not None:
            self.publish(self._version, self.state_dict())
        return metrics

    def compute_log_probs(self, batch: TrainBatch) -> list[list[float]]:
        batch.validate(self._vocab_size)
        return self._call("compute_log_probs", batch)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full unsharded policy weights on CPU in `cfg.publish_dtype`, Hugging Face names, at `self.version`."""
        return self._call("full_state_dict")

    def device_bytes(self) -> dict[str, int]:
        return self._call("device_bytes")

    def offload(self) -> dict[str, float]:
        """Move params, grads and optimizer state of every rank to host memory, freeing the
        device storages. `step` and friends raise until `reload()`."""
        return self._call("offload")

    def reload(self) -> dict[str, float]:
        return self._call("reload")

    def save_checkpoint(self, path: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
        """Write a checkpoint to `path` (use `checkpoint_dir(root, tr.version)` for the usual
        naming). Written into a sibling temp folder and renamed, so `latest_checkpoint` never
        sees a half-written one. `extra` (JSON-serialisable: data cursor, loop state) comes back
        from `load_checkpoint`."""
        path = Path(path)
        if path.exists():
            raise FileExistsError(f"checkpoint folder {str(path)!r} already exists")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            self._call("save_checkpoint", str(tmp), extra)
            os.replace(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return path

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore weights, optimizer, version, counters and RNG from `path` (a checkpoint folder,
        or a root holding `step_*` folders: the latest is taken). Returns the saved `extra`."""
        path = Path(path)
        if not (path / "trainer_state.json").is_file():
            latest = latest_checkpoint(path)
            if latest is None:
                raise ValueError(f"no trainer checkpoint at or under {str(path)!r}")
            path = latest
        if not (path / "dcp" / ".metadata").is_file():
            raise ValueError(f"checkpoint {str(path)!r} has no dcp/.metadata (incomplete or not a trainer checkpoint)")
        extra = self._call("load_checkpoint", str(path))
        self._version = int(self._call("state")["version"])
        return extra

    def close(self) -> None:
        """Stop every rank and release the process group; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._local is not None or self._owns_group:
            self._local = None
            if self._owns_group and dist.is_initialized():
                dist.destroy_process_group()
            self._owns_group = False
        if self._procs:
            for q in self._commands:
                try:
                    q.put(("close", (), {}))
                except Exception:  # noqa: BLE001 - queue may be gone with a dead process
                    pass
            for p in self._procs:
                p.join(timeout=10.0 if self._broken is None else 1.0)
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5.0)
            self._procs = []
        shutil.rmtree(self._store_dir, ignore_errors=True)

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
