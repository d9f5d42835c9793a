"""Tensor-parallel weight loads from a GPS node file on CPU: each rank reads only its shard, all
ranks at once, against memcpy.

`python -m pivotrl.bench weight_load [--json PATH] [--hidden 1024] [--layers 8] [--tp 1,2,4]`.

One Qwen2-shaped policy in bf16 (default about 0.4 GB) laid out as a GPS node file in `/dev/shm`
(`placement.ChunkLayout`, the file a `FileManifest` names). For each TP degree, that many rank
processes (each one thread, started and warmed before the clock) load at once, as vLLM's workers
do in `pivot_load_weights_from_gps`: map the file (`weight_sync.iter_manifest_tensors`: views),
narrow each tensor to the rank's part (`gps.layout.device_shards`: vLLM's column/row/vocab
split) and copy that part into the rank's own parameter tensors. Rows, each the median of
`--repeats` loads (wall from the first rank's start to the last rank's end):

- `memcpy`: one process copying the whole file into a reused buffer (the floor of one copy);
- `shard`: the ranks read their own shards (what the workers do now): `MB/rank` = model / TP;
- `whole`: every rank first copies the whole file (what the CUDA path did before: the whole model
  into a pinned bucket per rank), then narrows from that copy.

`GB/s` = bytes the ranks copied in all / wall; `x_memcpy` = wall / memcpy wall of the whole
model (below 1: the ranks together finish a load faster than one memcpy of the model). `cpu_s`
is the ranks' CPU time summed. On a machine with fewer cores than ranks the ranks share cores:
the load's gain there is the bytes each rank no longer moves, not parallel bandwidth.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import statistics
import time
import uuid
from typing import Any

from pivotrl.bench.common import parser, print_table, write_json

_CLOCK = time.CLOCK_MONOTONIC  # one clock for every process of the machine


def _policy_spec(hidden: int, layers: int, vocab: int) -> Any:
    from pivotrl.gps.layout import ModelSpec

    return ModelSpec.from_config(dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=vocab, hidden_size=hidden,
        intermediate_size=int(hidden * 2.75) // 64 * 64, num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=max(4, hidden // 512), tie_word_embeddings=False, torch_dtype="bfloat16"))


def write_node_file(spec: Any, path: str, alignment: int = 64) -> dict[str, Any]:
    """`spec` laid out as one GPS node buffer (a whole copy) at `path`, filled with random bytes;
    the manifest's plain-data form (`FileManifest.to_wire()`)."""
    import torch

    from pivotrl.gps.placement import ChunkLayout, Placement
    from pivotrl.gps.transports import map_file

    layout = ChunkLayout(spec, Placement(1, 1), 0, alignment)
    buf = map_file(path, layout.nbytes)
    g = torch.Generator().manual_seed(0)
    step = 64 << 20
    for a in range(0, layout.nbytes, step):
        n = min(step, layout.nbytes - a)
        buf[a:a + n].copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g))
    entries = [[t.name, layout.entries[t.name].offset, list(t.shape), t.dtype] for t in spec.tensors]
    return {"model": "policy", "version": 0, "path": path, "nbytes": layout.nbytes, "entries": entries}


def load_shard(wire: dict[str, Any], local: tuple, out: dict[str, Any], whole: bool = False) -> int:
    """One rank's load: its parts of the manifest's tensors into `out` (its parameters); bytes
    copied. `whole`: copy the whole file first and narrow from that copy (the old CUDA path)."""
    import torch

    from pivotrl.engines.weight_sync import iter_manifest_tensors
    from pivotrl.gps.transports import box_slices, copy_into

    views = dict(iter_manifest_tensors(wire))
    copied = 0
    if whole:
        staged = torch.empty(int(wire["nbytes"]), dtype=torch.uint8)
        src = torch.from_file(wire["path"], shared=True, size=int(wire["nbytes"]), dtype=torch.uint8)
        staged.copy_(src)
        copied += staged.numel()
        pos = {name: (off, shape, dt) for name, off, shape, dt in wire["entries"]}
        for name, (off, shape, dt) in pos.items():
            t = getattr(torch, dt)
            views[name] = staged[off:off + t.itemsize * math.prod(shape)].view(t).view(tuple(shape))
    for lt in local:
        dst = out[lt.name]
        for p in lt.pieces:
            part = dst[box_slices(p.dst_box)]
            copy_into(part, views[p.src][box_slices(p.src_box)])
            copied += part.numel() * part.element_size()
    return copied


def _rank(wire: dict, local: tuple, whole: bool, repeats: int, barrier: Any, out_q: Any) -> None:
    import torch

    torch.set_num_threads(1)
    params = {lt.name: torch.empty(lt.shape, dtype=getattr(torch, lt.dtype)) for lt in local}
    load_shard(wire, local, params, whole)  # warm: page tables, allocator, imports
    for _ in range(repeats):
        barrier.wait()
        c0, t0 = time.process_time(), time.clock_gettime(_CLOCK)
        n = load_shard(wire, local, params, whole)
        out_q.put((t0, time.clock_gettime(_CLOCK), time.process_time() - c0, n))


def _run_ranks(wire: dict, spec: Any, tp: int, whole: bool, repeats: int) -> dict[str, float]:
    from pivotrl.gps.layout import Layout, device_shards

    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(tp), ctx.Queue()
    shards = device_shards(spec, Layout(tp=tp))
    procs = [ctx.Process(target=_rank, args=(wire, shards[r], whole, repeats, barrier, q)) for r in range(tp)]
    for p in procs:
        p.start()
    got = [q.get(timeout=600) for _ in range(tp * repeats)]
    for p in procs:
        p.join(timeout=60)
    walls, cpus, nbytes = [], [], 0
    for i in range(repeats):  # the queue holds each repeat's tp results in turn (barrier-separated)
        part = sorted(got, key=lambda x: x[0])[i * tp:(i + 1) * tp]
        walls.append(max(e for _, e, _, _ in part) - min(s for s, _, _, _ in part))
        cpus.append(sum(c for _, _, c, _ in part))
        nbytes = sum(n for *_, n in part)
    return {"seconds": statistics.median(walls), "cpu_s": statistics.median(cpus), "bytes": nbytes}


def _memcpy(wire: dict, repeats: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(1)
    src = torch.from_file(wire["path"], shared=True, size=int(wire["nbytes"]), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    walls, cpus = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        dst.copy_(src)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return {"seconds": statistics.median(walls), "cpu_s": statistics.median(cpus), "bytes": src.numel()}


def main(argv: list[str]) -> int:
    p = parser("TP weight loads from a GPS node file: shard reads vs whole-model copies vs memcpy (CPU)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=64000)
    p.add_argument("--tp", default="1,2,4", help="comma-separated TP degrees")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    spec = _policy_spec(a.hidden, a.layers, a.vocab)
    path = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp", f"pivotrl-bench-load-{uuid.uuid4().hex[:8]}")
    rows: list[dict[str, Any]] = []
    try:
        wire = write_node_file(spec, path)
        mb = wire["nbytes"] / 2**20
        base = _memcpy(wire, a.repeats)
        rows.append({"tp": 1, "path": "memcpy", "MB/rank": round(mb, 1), "seconds": base["seconds"],
                     "GB/s": base["bytes"] / 1e9 / base["seconds"], "x_memcpy": 1.0, "cpu_s": base["cpu_s"]})
        for tp in (int(x) for x in a.tp.split(",")):
            for whole in (False, True):
                if whole and tp == 1:
                    continue  # one rank: the whole model is its shard
                r = _run_ranks(wire, spec, tp, whole, a.repeats)
                rows.append({"tp": tp, "path": "whole" if whole else "shard", "MB/rank": round(r["bytes"] / tp / 2**20, 1),
                             "seconds": r["seconds"], "GB/s": r["bytes"] / 1e9 / r["seconds"],
                             "x_memcpy": r["seconds"] / base["seconds"], "cpu_s": r["cpu_s"]})
    finally:
        if os.path.exists(path):
            os.unlink(path)
    load = os.getloadavg()
    print_table(rows, title=f"weight load from a GPS node file ({mb:.0f} MB bf16 Qwen2-shaped policy; "
                            f"{os.cpu_count()} cores, load {load[0]:.1f})")
    write_json(a.json, "weight_load", rows, model_mb=mb, loadavg=list(load),
               args={k: v for k, v in vars(a).items() if k != "json"})
    return 0
