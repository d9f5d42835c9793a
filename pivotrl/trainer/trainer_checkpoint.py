"""Trainer checkpoints: what one `TrainerWorker` writes and reads (collective over its ranks).

A checkpoint folder holds:
- `hf/`: the policy as a Hugging Face folder (float32 weights + the source folder's config and
  tokenizer files), loadable by `AutoModelForCausalLM.from_pretrained`;
- `dcp/`: sharded model + optimizer state (torch.distributed.checkpoint; reshardable, so a run may
  resume on a different world size);
- `rng/rank_<r>.pt`: each rank's torch/numpy/python (and CUDA) RNG states;
- `extra.json`: the caller's state (the data cursor);
- `trainer_state.json`: version and counters, written LAST, by rank 0, once every rank's part is
  on disk: it is what makes a folder a complete checkpoint (`latest_checkpoint` and `load` skip or
  refuse folders without it), so a crash at any point before leaves nothing that looks complete.
  A resume trusts it only once the folder verifies (`verify_checkpoint`: the state parses, every
  shard the DCP metadata names is there and long enough, `hf/` is whole): a folder damaged after
  it was written is skipped, with a warning, for the previous one.

Writes are asynchronous (`Checkpointer`, one per worker). `Checkpointer.start` is the part on the
caller's critical path: it waits for the previous save, writes the small RNG file and stages the
sharded model + optimizer state into fresh host memory (`dcp.async_save`'s synchronous staging,
which copies every tensor, on CPU too), then returns. The training step that follows may change
the parameters freely: the write reads only the staged copies. In the background, DCP writes the
shards (in its own thread) and then this module's finisher thread, on rank 0, builds the `hf/`
folder from the shards just written (read back unsharded with `no_dist`: no gather on the
critical path, and the same snapshot by construction), writes `extra.json`, and, once every rank
reported success, `trainer_state.json`. Background collectives run over a process group of their
own (gloo), so they never interleave with the training step's collectives on the default group.
A blocking save (`start(..., stage=False)`, then `wait`) writes the shards from the live tensors in
the caller instead (no copy) and runs the same finisher: the same files either way.

Memory: while a staged write is in flight, each rank holds a host copy of its model + optimizer
shard (freed when the write ends), and rank 0 the whole float32 model while it writes `hf/`.

Failures are never lost: every rank's finisher exchanges its errors with the others, so all ranks
learn the same outcome, and the next `wait` (also reached through the next `start`) raises
`CheckpointError` naming the folder, on every rank alike.

`Checkpointer` and `load(worker, path)` use the worker's public attributes only.
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

if TYPE_CHECKING:
    from pivotrl.trainer.trainer_worker import TrainerWorker

__all__ = ["CheckpointError", "Checkpointer", "checkpoint_dir", "checkpoint_version", "latest_checkpoint", "load", "verify_checkpoint"]

log = logging.getLogger(__name__)

_CKPT_RE = re.compile(r"^step_(\d+)$")
COMPLETE_MARKER = "trainer_state.json"

# Files of a model folder that are weights; everything else (config, tokenizer, generation config)
# is copied into the Hugging Face part of a checkpoint unchanged.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".safetensors.index.json", ".bin.index.json")


class CheckpointError(RuntimeError):
    """A checkpoint write failed (on some rank); the message names the folder and every rank's error.
    The folder has no `trainer_state.json`, so nothing treats it as a checkpoint."""

    def __init__(self, path: Path, errors: list[str]):
        self.path = path
        self.errors = errors
        super().__init__(f"checkpoint {str(path)!r} was not written: " + "; ".join(errors))


@dataclass
class _InFlight:
    path: Path
    future: Future  # this rank's finisher: None, or raises CheckpointError
    started: float


class Checkpointer:
    """At most one asynchronous checkpoint write of one worker in flight (module docstring).

    `start(w, path, extra)` is collective; `wait`, `pending` and `close` are local, and give every
    rank the same outcome (the finishers agree on it). `timeout_s` bounds every wait."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._group: Any = None  # the background collectives' own gloo group, made on first start
        self._inflight: _InFlight | None = None
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pivotrl-ckpt")

    def pending(self) -> str | None:
        """The folder of the save started and not yet waited for (running or finished), or None."""
        return None if self._inflight is None else str(self._inflight.path)

    def wait(self, timeout_s: float | None = None) -> str | None:
        """Block until the save in flight is complete on every rank; return its folder (None if
        none was in flight). Raises `CheckpointError` if it failed (once: the failure is then
        cleared) and `TimeoutError` naming the folder after `timeout_s` (default: the
        checkpointer's), leaving it in flight."""
        job = self._inflight
        if job is None:
            return None
        limit = self.timeout_s if timeout_s is None else timeout_s
        if not futures_wait([job.future], timeout=limit).done:
            raise TimeoutError(f"checkpoint {str(job.path)!r} is still being written after {limit:.1f}s "
                               f"(started {time.monotonic() - job.started:.1f}s ago; bound: algo.timeout_s)")
        self._inflight = None
        err = job.future.exception()
        if isinstance(err, CheckpointError):
            raise err
        if err is not None:  # the finisher's own collectives failed: still name the checkpoint
            raise CheckpointError(job.path, [f"{type(err).__name__}: {err}"]) from err
        return str(job.path)

    def start(self, w: TrainerWorker, path: Path, extra: dict[str, Any] | None = None, *, stage: bool = True) -> None:
        """Begin writing a checkpoint of worker `w` into the (empty, new or stale) folder `path`.
        Collective. Waits for the previous save first (and raises its failure instead of starting).
        `stage=False` (for a caller that waits at once) writes the shards from the live tensors,
        before returning, instead of copying them to host memory first: no copy, same files."""
        self.wait()
        extra_text = json.dumps(extra or {}, indent=2)  # bad input fails here, before any write
        state_text = json.dumps(w.state(), indent=2)
        if self._group is None:
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout_s))
        if w.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
            # An older checkpoint in the same folder stops being one before anything is overwritten.
            (path / COMPLETE_MARKER).unlink(missing_ok=True)
        dist.barrier()
        model_sd, optim_sd = get_state_dict(w.model, w.optimizer)
        # Written before the shards: DCP's collective finish then implies every rank's RNG is on disk.
        # A failure here is reported like a background one, so this rank still joins the collectives.
        errors: list[str] = []
        try:
            _write_rng(path, w.rank, _rng_state(w.device))
        except Exception as e:  # noqa: BLE001
            errors.append(f"rank {w.rank}: rng/: {type(e).__name__}: {e}")
        state = {"model": model_sd, "optim": optim_sd}
        writer = dcp.FileSystemWriter(str(path / "dcp"), overwrite=True)  # a stale folder is overwritten
        if stage:  # returns once the state is copied to fresh host memory; DCP's thread writes it
            upload = dcp.async_save(state, storage_writer=writer, process_group=self._group)
        else:
            upload = Future()
            try:
                upload.set_result(dcp.save(state, storage_writer=writer, process_group=self._group))
            except Exception as e:  # noqa: BLE001 - reported by the finisher, like a background failure
                upload.set_exception(e)
        del state, model_sd, optim_sd
        job = _Finish(path=path, rank=w.rank, group=self._group, upload=upload, extra_text=extra_text,
                      state_text=state_text, model_path=w.model_path, hf_config=w.hf_config, errors=errors)
        self._inflight = _InFlight(path, self._finisher.submit(job.run), time.monotonic())

    def close(self, wait: bool = True) -> None:
        """Wait for the save in flight (raising its failure), then release the background group.
        `wait=False` (a peer rank died: the write's collectives could only time out) returns at
        once and leaves the group to the caller's `destroy_process_group()`; the abandoned write
        never gets its `trainer_state.json` unless every rank had already finished its part."""
        if not wait:
            self._inflight = None
            self._finisher.shutdown(wait=False)
            return
        try:
            self.wait()
        finally:
            self._finisher.shutdown(wait=False)
            if self._group is not None and dist.is_initialized():
                dist.destroy_process_group(self._group)
            self._group = None


@dataclass
class _Finish:
    """The background tail of one rank's save (module docstring), run on the finisher thread."""

    path: Path
    rank: int
    group: Any
    upload: Future
    extra_text: str
    state_text: str
    model_path: Path
    hf_config: Any
    errors: list[str]  # this rank's errors so far (the RNG file)

    def run(self) -> None:
        errors = list(self.errors)
        try:
            self.upload.result()
        except BaseException as e:  # noqa: BLE001 - reported to every rank below
            errors.append(f"rank {self.rank}: sharded state (dcp/): {type(e).__name__}: {e}")
        if self.rank == 0 and not errors:
            try:
                _save_hf_from_dcp(self.model_path, self.hf_config, self.path / "dcp", self.path / "hf")
                (self.path / "extra.json").write_text(self.extra_text)
            except BaseException as e:  # noqa: BLE001
                errors.append(f"rank 0: hf/ or extra.json: {type(e).__name__}: {e}")
        errors = self._agree(errors)
        if not errors and self.rank == 0:
            try:
                tmp = self.path / f".{COMPLETE_MARKER}.tmp"
                with open(tmp, "w") as f:  # DCP fsyncs the shards; the marker is made as durable
                    f.write(self.state_text)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path / COMPLETE_MARKER)  # atomic: the marker is whole or absent
            except BaseException as e:  # noqa: BLE001
                errors.append(f"rank 0: {COMPLETE_MARKER}: {type(e).__name__}: {e}")
        errors = self._agree(errors)
        if errors:
            raise CheckpointError(self.path, errors)

    def _agree(self, errors: list[str]) -> list[str]:
        """Every rank's errors, on every rank (a collective over the checkpoint group)."""
        out: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(out, errors, group=self.group)
        return [e for part in out for e in part]


def _rng_state(device: torch.device) -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def _write_rng(path: Path, rank: int, rng: dict[str, Any]) -> None:
    (path / "rng").mkdir(exist_ok=True)
    torch.save(rng, path / "rng" / f"rank_{rank}.pt")


def _save_hf_from_dcp(model_path: Path, hf_config: Any, dcp_dir: Path, out: Path) -> None:
    """The `hf/` folder from the model shards in `dcp_dir`, read back whole in this process."""
    meta = dcp.FileSystemReader(str(dcp_dir)).read_metadata()
    full = {key[len("model."):]: torch.empty(m.size, dtype=m.properties.dtype)
            for key, m in meta.state_dict_metadata.items()
            if key.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load({"model": full}, checkpoint_id=str(dcp_dir), no_dist=True)
    _save_hf(model_path, hf_config, out, {k: v.to(torch.float32) for k, v in full.items()})


def _save_hf(model_path: Path, hf_config: Any, out: Path, full: dict[str, torch.Tensor]) -> None:
    from transformers import AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    for f in model_path.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, out / f.name)
    # A meta-device skeleton takes the tensors by assignment: no second random init, and
    # save_pretrained handles tied weights and large-file sharding the HF way.
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    skeleton.load_state_dict(full, assign=True, strict=True)
    skeleton.tie_weights()
    skeleton.save_pretrained(str(out), safe_serialization=True)


def load(w: TrainerWorker, path: Path) -> dict[str, Any]:
    """Restore model, optimizer, version, counters and RNG from `path`; return its extra state.
    RNG is restored only when the checkpoint was written by the same world size (per-rank
    streams do not map onto a different rank count). The KL reference is not in checkpoints:
    it is always the initial policy at `model_path`, so resume with the same `model_path`."""
    if not (path / COMPLETE_MARKER).is_file():
        raise ValueError(f"checkpoint {str(path)!r} has no {COMPLETE_MARKER} (not a trainer checkpoint, "
                         "or its write did not finish)")
    model_sd, optim_sd = get_state_dict(w.model, w.optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    set_state_dict(w.model, w.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    w.optimizer.zero_grad(set_to_none=True)
    meta = json.loads((path / COMPLETE_MARKER).read_text())
    w.version = int(meta["version"])
    w.counters = {k: int(v) for k, v in meta["counters"].items()}
    rng_file = path / "rng" / f"rank_{w.rank}.pt"
    if int(meta["world_size"]) == w.world_size and rng_file.is_file():
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if rng.get("cuda") is not None and w.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], w.device)
    dist.barrier()
    return json.loads((path / "extra.json").read_text()) if (path / "extra.json").is_file() else {}


def checkpoint_dir(root: str | os.PathLike, version: int) -> Path:
    """The conventional folder of the checkpoint at `version` under `root`: `root/step_00000042`."""
    return Path(root) / f"step_{version:08d}"


def checkpoint_version(path: str | os.PathLike) -> int:
    """The policy version a checkpoint folder holds (its `trainer_state.json`)."""
    return int(json.loads((Path(path) / COMPLETE_MARKER).read_text())["version"])


def verify_checkpoint(path: str | os.PathLike) -> str | None:
    """Why the checkpoint folder `path` cannot be resumed from, or None when it verifies: its
    `trainer_state.json` parses and names a version; `dcp/.metadata` reads, and every shard file it
    names is present and holds the bytes it indexes; `hf/` (what the driver publishes as the
    policy) has its config and weight files, each as long as its header says; `extra.json`, when
    present, parses. Reads metadata and file sizes only, no tensors."""
    from pivotrl.gps.checkpoint import weight_files, safetensors_header
    from pivotrl.gps.families import CheckpointMismatchError

    path = Path(path)
    try:
        state = json.loads((path / COMPLETE_MARKER).read_text())
        int(state["version"])
    except FileNotFoundError:
        return f"no {COMPLETE_MARKER} (its write did not finish)"
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as e:
        return f"{COMPLETE_MARKER} is damaged ({type(e).__name__}: {e})"
    dcp_dir = path / "dcp"
    if not (dcp_dir / ".metadata").is_file():
        return "no dcp/.metadata (the sharded model and optimizer state is missing)"
    try:
        meta = dcp.FileSystemReader(str(dcp_dir)).read_metadata()
    except Exception as e:  # noqa: BLE001 - any unreadable metadata makes the folder unusable
        return f"dcp/.metadata does not read ({type(e).__name__}: {e})"
    need: dict[str, int] = {}
    for info in (meta.storage_data or {}).values():
        rel = str(info.relative_path)
        need[rel] = max(need.get(rel, 0), int(info.offset) + int(info.length))
    for rel, size in sorted(need.items()):
        f = dcp_dir / rel
        if not f.is_file():
            return f"shard dcp/{rel} is missing"
        if f.stat().st_size < size:
            return f"shard dcp/{rel} is cut short ({f.stat().st_size} of {size} bytes)"
    try:
        if not (path / "hf" / "config.json").is_file():
            return "no hf/config.json (the policy's Hugging Face folder is missing)"
        for f in weight_files(path / "hf"):
            safetensors_header(f)
    except (FileNotFoundError, CheckpointMismatchError) as e:
        return f"hf/ is incomplete ({e})"
    if (path / "extra.json").is_file():
        try:
            json.loads((path / "extra.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return f"extra.json is damaged ({type(e).__name__}: {e})"
    return None


#: (folder, reason) of skipped checkpoints already logged: a resume looks twice (the run's check at
#: start, then the launch), and says it once
_SKIPS_LOGGED: set[tuple[str, str]] = set()


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest checkpoint under `root` that verifies (`verify_checkpoint`), or None if there is
    none. A folder without `trainer_state.json` (a save that crashed or failed, or is still running)
    is passed over silently, as it never counted; a folder that claims completeness but does not
    verify (a damaged state file, a missing or cut shard) is passed over with a warning naming it
    and why, and the previous checkpoint is taken (issue 22)."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = sorted(((int(m.group(1)), p) for p in root.iterdir()
                    if (m := _CKPT_RE.match(p.name)) and (p / COMPLETE_MARKER).is_file()), reverse=True)
    for i, (_, p) in enumerate(found):
        why = verify_checkpoint(p)
        if why is None:
            return p
        if (str(p), why) not in _SKIPS_LOGGED:
            _SKIPS_LOGGED.add((str(p), why))
            nxt = next((q for _, q in found[i + 1:]), None)
            log.warning("checkpoint %s is skipped: %s; %s", p, why,
                        f"trying the previous one, {nxt.name}" if nxt is not None else "no earlier checkpoint")
    return None
