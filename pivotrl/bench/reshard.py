"""`python -m pivotrl.bench reshard --json PATH`: the trainer's state moved from W ranks to W' ranks,
through host memory (GPS, what elastic training does) and through disk (torch DCP, the checkpoint's
resharding), on CPU (FSDP2 over gloo, spawned ranks).

Per model size and move `W:W'` (`--moves 1:2,2:1`): W ranks build the trainer and take one step (so
AdamW's moments exist), then `--repeats` times write the whole state both ways, timed on rank 0:
`TrainerWorker.save_state` (a GPS row write: every rank its own rows; `trainer/state_store.py`) and
`dcp.save` of the same model + optimizer state dict into a folder (`--dir`, default a temporary one:
on this machine /tmp is whatever disk it is on, say which). Then W' ranks, built without weights,
read it back both ways: `load_state` (each rank copies its rows of the node's mapped GPS buffer) and
`dcp.load` + `set_state_dict` (DCP's own resharding). Columns: seconds (median of the repeats) of
each, and the state's MiB. The GPS is a Ray store on one node (the devices' own GPS in a run).
"""
from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pivotrl.bench.common import parser, print_table, run_ranks, write_json

STATE = "policy.train_state"


def _cfg(world: int) -> Any:
    from pivotrl.config.trainer import TrainerSpec

    return TrainerSpec(world_size=world, micro_batch_size=16, lr=1e-4, num_threads=1, device="cpu", staleness=1000)


def _dcp_state(w: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(w.model, w.optimizer)
    return {"model": model_sd, "optim": optim_sd}


def _rank(rank: int, world: int, phase: str, init: str, address: str, blob: bytes, model: str, folder: str,
          repeats: int, out: str) -> None:
    """One spawned rank: `write` (build, step, write both ways) or `read` (build empty, read both ways)."""
    import ray
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from pivotrl.bench.trainer import random_batch
    from pivotrl.trainer.dist import init_process_group
    from pivotrl.trainer.trainer_worker import TrainerWorker

    torch.set_num_threads(1)
    ray.init(address=address, logging_level="ERROR")
    store = ray.cloudpickle.loads(blob)
    init_process_group(rank, world, init, "gloo", 600.0)
    times: dict[str, list[float]] = {"gps": [], "dcp": []}
    try:
        if phase == "write":
            w = TrainerWorker(_cfg(world), model)
            w.step(random_batch(16, 0, w.version))
        else:
            w = TrainerWorker(_cfg(world), model, load_weights=False)
        for k in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            if phase == "write":
                w.save_state(store, STATE)
            else:
                w.load_state(store, STATE)
            times["gps"].append(time.perf_counter() - t0)
            dist.barrier()
            t0 = time.perf_counter()
            state = _dcp_state(w)
            if phase == "write":
                if rank == 0:
                    shutil.rmtree(folder, ignore_errors=True)
                dist.barrier()
                dcp.save(state, checkpoint_id=folder)
            else:
                dcp.load(state, checkpoint_id=folder)
                set_state_dict(w.model, w.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
            dist.barrier()
            times["dcp"].append(time.perf_counter() - t0)
        if rank == 0:
            Path(out).write_text(json.dumps(times))
    finally:
        dist.destroy_process_group()
        ray.shutdown()


def _spawn(world: int, phase: str, args: tuple, work: Path) -> dict[str, list[float]]:
    out = work / f"{phase}_{world}.json"
    init = f"file://{work}/pg_{phase}_{world}_{time.time_ns()}"
    return run_ranks(_rank, world, lambda r: (r, world, phase, init, *args, str(out)), out,
                     f"the {world}-rank {phase}")


def rows_for(size: str, moves: list[tuple[int, int]], repeats: int, work: Path, folder: Path) -> list[dict[str, Any]]:
    import ray

    from pivotrl.bench.trainer_checkpoint import SIZES
    from pivotrl.config.gps import GPSConfig
    from pivotrl.config.rl import TinyModelConfig
    from pivotrl.gps.ray_transport import make_ray_store
    from pivotrl.models.tiny import create_tiny_model
    from pivotrl.trainer.state_store import register_state

    model = create_tiny_model(work / f"policy_{size}", TinyModelConfig(**SIZES[size]), seed=0)
    ray.init(address="local", num_cpus=2, resources={"gps_node_0": 1}, include_dashboard=False, logging_level="ERROR")
    store = make_ray_store(GPSConfig(transport="ray", ray_node_resource="gps_node_{}"), 1)
    rows = []
    try:
        nbytes = register_state(store, STATE, model)
        args = (ray.get_runtime_context().gcs_address, ray.cloudpickle.dumps(store), str(model), str(folder / size),
                repeats)
        med = statistics.median
        for w, w2 in moves:
            wrote = _spawn(w, "write", args, work)
            read = _spawn(w2, "read", args, work)
            rows.append({"model": size, "move": f"{w}->{w2}", "state_mib": nbytes / 2**20,
                         "gps_write_s": med(wrote["gps"]), "dcp_save_s": med(wrote["dcp"]),
                         "gps_read_s": med(read["gps"]), "dcp_load_s": med(read["dcp"]),
                         "gps_total_s": med(wrote["gps"]) + med(read["gps"]),
                         "dcp_total_s": med(wrote["dcp"]) + med(read["dcp"]), "repeats": repeats})
    finally:
        store.close()
        ray.shutdown()
    return rows


def main(argv: list[str]) -> int:
    from pivotrl.bench.trainer_checkpoint import SIZES

    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", default="tiny,small", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--moves", default="1:2,2:1", help="comma-separated W:W' world-size moves")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="where DCP writes (default: a temporary folder)")
    a = p.parse_args(argv)
    try:
        moves = [tuple(int(x) for x in m.split(":")) for m in a.moves.split(",") if m]
    except ValueError:
        moves = []
    sizes = [s for s in a.sizes.split(",") if s]
    if not moves or any(len(m) != 2 or min(m) < 1 for m in moves) or any(s not in SIZES for s in sizes) \
            or a.repeats < 1:
        p.error(f"--moves must be W:W' pairs of integers >= 1 (got {a.moves!r}), --sizes of {sorted(SIZES)}, "
                f"--repeats >= 1")
    work = Path(tempfile.mkdtemp(prefix="pivotrl-bench-reshard-"))
    folder = a.dir or work / "dcp"
    try:
        rows = [r for s in sizes for r in rows_for(s, moves, a.repeats, work, folder)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, "the trainer's state moved between world sizes: host memory (GPS) vs disk (DCP), "
                      "seconds on rank 0 (median)")
    write_json(a.json, "reshard", rows, dcp_dir=str(folder))
    return 0
