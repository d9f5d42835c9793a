"""Trainer checkpoints on CPU: how long a save holds the training step, blocking vs asynchronous.

`python -m pivotrl.bench trainer_checkpoint [--json PATH] [--repeats 3] [--sizes tiny,small]
[--modes none,blocking,async] [--world-sizes 1,2]`.

FSDP2 over gloo: one rank hosted in this process, or (`--world-sizes 2`) spawned ranks with rank 0's
timings reported; AdamW state present (one warm-up step). Per model size, `--repeats` rounds, each running every mode once (interleaved, so a busy spell on
the shared machine hits all modes) as "save, then the next training step":
- `none`: no save, the step alone, for comparison;
- `blocking`: `save_checkpoint(path)`; the step waits for the whole write (what the runtime did).
- `async`: `save_checkpoint(path, blocking=False)` returns once the state is staged in host memory;
  the next step runs while the write goes on; `wait_checkpoint()` after it ends the round.
Columns: `blocks_step_s`, the seconds the save call held the caller (the critical path);
`step_s`, the training step right after (during the write, for async: on a 2-core machine the
write competes with it for the cores); `wait_after_step_s`, what was left of the write when that
step ended; `complete_by_s`, from the save's start until the checkpoint was known complete (the
call's return for blocking; `wait_checkpoint`'s return after the step for async, so an upper
bound on the write's duration); `checkpoint_mib`, bytes on disk. Medians over the rounds.
"""
from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pivotrl.bench.common import parser, print_table, run_ranks, write_json
from pivotrl.bench.trainer import random_batch

#: model sizes (TinyModelConfig overrides): the tests' tiny policy and a 21M-parameter one
SIZES = {
    "tiny": dict(),
    "small": dict(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=1536,
                  vocab_size=8192, tie_word_embeddings=False),
}


#: "none": the step alone (no save), for comparison
MODES = ("none", "blocking", "async")


def _folder_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def _rounds(w, size: str, repeats: int, work: Path, modes: tuple[str, ...], world_size: int) -> list[dict]:
    """The rounds on worker `w` (every rank runs them; rank 0's timings are the rows)."""
    w.step(random_batch(16, 0, w.version))  # AdamW moments exist from here on
    per: dict[str, dict[str, list[float]]] = {m: {"blocks": [], "steps": [], "waits": [], "totals": []}
                                              for m in modes}
    mib: dict[str, float] = {m: 0.0 for m in modes}
    for k in range(repeats):  # modes interleaved, so a busy spell on the machine hits all of them
        for mode in modes:
            path = work / f"{size}_{mode}_{k}"
            t0 = time.perf_counter()
            if mode != "none":
                w.save_checkpoint(path, {"round": k}, blocking=mode == "blocking")
            t1 = time.perf_counter()
            w.step(random_batch(16, 200 + k, w.version))
            t2 = time.perf_counter()
            w.wait_checkpoint()
            t3 = time.perf_counter()
            got = per[mode]
            got["blocks"].append(t1 - t0)
            got["steps"].append(t2 - t1)
            got["waits"].append(t3 - t2)
            got["totals"].append((t1 - t0) if mode != "async" else (t3 - t0))
            if mode != "none" and w.rank == 0:
                mib[mode] = _folder_mib(path)
                shutil.rmtree(path)
    med = statistics.median
    return [{"model": size, "world_size": world_size, "mode": mode, "blocks_step_s": med(got["blocks"]),
             "step_s": med(got["steps"]), "wait_after_step_s": med(got["waits"]),
             "complete_by_s": med(got["totals"]), "checkpoint_mib": mib[mode], "repeats": repeats}
            for mode, got in per.items()]


def _rank_main(rank: int, world_size: int, init: str, model: str, size: str, repeats: int, work: str,
               modes: tuple[str, ...], out: str) -> None:
    """One spawned rank of a multi-rank run: join the gloo group, build the worker, run the rounds."""
    import json

    import torch
    import torch.distributed as dist

    from pivotrl.trainer.dist import init_process_group
    from pivotrl.trainer.trainer_worker import TrainerWorker

    torch.set_num_threads(1)
    init_process_group(rank, world_size, init, "gloo", 600.0)
    try:
        w = TrainerWorker(_cfg(world_size), model)
        rows = _rounds(w, size, repeats, Path(work), modes, world_size)
        w.close()
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def _cfg(world_size: int):
    from pivotrl.config.trainer import TrainerSpec

    return TrainerSpec(world_size=world_size, micro_batch_size=16, lr=1e-4, num_threads=1, device="cpu",
                         staleness=1000)


def rows_for(size: str, repeats: int, work: Path, modes: tuple[str, ...] = MODES, world_size: int = 1) -> list[dict]:
    """One row per mode for model `size` on `world_size` ranks (1: hosted here; more: spawned)."""
    import torch

    from pivotrl.config.rl import TinyModelConfig
    from pivotrl.trainer.trainer import Trainer
    from pivotrl.models.tiny import create_tiny_model

    torch.set_num_threads(1)
    model = create_tiny_model(work / f"policy_{size}", TinyModelConfig(**SIZES[size]), seed=0)
    if world_size == 1:
        with Trainer(_cfg(1), model) as tr:
            return _rounds(tr.worker, size, repeats, work, modes, 1)
    out = work / f"rows_{size}_{world_size}.json"
    return run_ranks(_rank_main, world_size, lambda r: (r, world_size, f"file://{work}/pg_{size}", str(model), size,
                                                        repeats, str(work), modes, str(out)),
                     out, f"the {world_size}-rank run of {size}")


def main(argv: list[str]) -> int:
    p = parser("trainer checkpoint: blocking vs asynchronous save (CPU, FSDP2 over gloo)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sizes", default="tiny,small", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {list(MODES)}")
    p.add_argument("--world-sizes", default="1", help="comma-separated rank counts (> 1: spawned processes)")
    a = p.parse_args(argv)
    try:
        world_sizes = [int(x) for x in a.world_sizes.split(",") if x]
    except ValueError:
        world_sizes = []
    if not world_sizes or min(world_sizes) < 1:
        p.error(f"--world-sizes must be comma-separated integers >= 1 (got {a.world_sizes!r})")
    sizes = [s for s in a.sizes.split(",") if s]
    modes = tuple(m for m in a.modes.split(",") if m)
    unknown = [s for s in sizes if s not in SIZES] + [m for m in modes if m not in MODES]
    if unknown or not modes or a.repeats < 1:
        p.error(f"--sizes must be of {sorted(SIZES)}, --modes of {list(MODES)} (unknown: {unknown}) "
                f"and --repeats >= 1 (got {a.repeats})")
    work = Path(tempfile.mkdtemp(prefix="pivotrl-bench-ckpt-"))
    try:
        rows = [r for ws in world_sizes for s in sizes for r in rows_for(s, a.repeats, work, modes, ws)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, "trainer checkpoint: seconds a save holds the training step (median of repeats)")
    write_json(a.json, "trainer_checkpoint", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
