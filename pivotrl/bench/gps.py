"""GPS benchmark: node-local read bandwidth vs memcpy, plan lookup time, memory per replica.

`python -m pivotrl.bench gps [--json PATH] [--layers N] [--repeats R] [--threads T]`

Measures, in one process and one run:
- **read bandwidth** of `store.read` for a Qwen2-shaped bf16 state dict (>= 1 GB by default) under
  TP = 1, 2, 4 (all TP ranks on node 0, single-node store), against a plain `copy_` of the same
  number of bytes between the same source (the store's shared-memory buffer) and destination
  memory. Also `write` (publish a new version from the TP shards; after the first write the
  freed version's buffer is reused, so it is compared with memcpy into touched memory). Two read variants: `out` (reads into preallocated, touched device buffers, as an engine
  reloading its parameters does; compared with memcpy into touched memory) and `alloc` (the read
  allocates fresh tensors; compared with memcpy into a fresh `torch.empty`). Best of `repeats`.
- **plan lookup**: a cache hit for the 1 GB model's TP=4 signature, and a cold plan (empty layout
  cache) for Qwen2.5-72B shapes over 128 devices (16 nodes x 8), replicated and hybrid placements.
- **memory**: bytes the store keeps for one replica / model bytes, and the peak-RSS growth
  (VmHWM, reset through /proc/self/clear_refs) during reads: with `out` it should be ~0 (no hidden
  copies), with `alloc` ~1x model bytes (the destination itself).
Footprint: store (1x) + destination (1x) + one fresh destination or new version (1x): ~3.5 GB.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from pivotrl.bench.common import parser, print_table, write_json
from pivotrl.config.gps import GPSConfig
from pivotrl.gps import Device, Layout, ModelSpec
from pivotrl.gps.layout import device_shards
from pivotrl.gps.store import GlobalParameterStore
from pivotrl.gps.transports import torch_dtype

QWEN72B = dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
               num_attention_heads=64, num_key_value_heads=8, torch_dtype="bfloat16")


def qwen2_shaped(layers: int) -> dict[str, Any]:
    """A Qwen2-architecture config (GQA 16/4, SwiGLU, untied head) of ~1.17 GB in bf16 at 10 layers."""
    return dict(vocab_size=32768, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                num_attention_heads=16, num_key_value_heads=4, torch_dtype="bfloat16")


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return -1


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _nbytes(lt: Any) -> int:
    n = torch_dtype(lt.dtype).itemsize
    for s in lt.shape:
        n *= s
    return n


def _views_into(buf: torch.Tensor, spec: ModelSpec, layout: Layout, devs: list[Device]) -> dict:
    """Destination tensors for every device, carved out of one big touched buffer."""
    out, off = {}, 0
    for r, d in enumerate(devs):
        out[d] = {}
        for lt in device_shards(spec, layout)[r]:
            dt, n = torch_dtype(lt.dtype), _nbytes(lt)
            out[d][lt.name] = buf[off:off + n].view(dt).view(lt.shape)
            off += n
    return out


def bench_bandwidth(layers: int, repeats: int) -> tuple[list[dict], dict[str, Any]]:
    cfg = qwen2_shaped(layers)
    spec = ModelSpec.from_config(cfg)
    nbytes = spec.nbytes
    store = GlobalParameterStore(GPSConfig(node_memory_budget_bytes=4 * nbytes), num_nodes=1)
    # replicated tensors (norms) exist once per TP rank, so destinations are a little larger
    moved = {tp: sum(_nbytes(lt) for sh in device_shards(spec, Layout(tp=tp)) for lt in sh) for tp in (1, 2, 4)}
    dst = torch.empty(max(moved.values()), dtype=torch.uint8)
    # the initial weights are random bytes written straight into the destination buffer, then loaded
    g = torch.Generator().manual_seed(0)
    for i in range(0, nbytes, 1 << 26):
        dst[i:min(i + (1 << 26), nbytes)] = torch.randint(0, 255, (min(1 << 26, nbytes - i),), dtype=torch.uint8, generator=g)
    full = _views_into(dst, spec, Layout(), [Device(0)])[Device(0)]
    for name, t in full.items():  # random bf16 bytes can be NaN patterns; keep them finite
        t.view(torch.int16).bitwise_and_(0x3FFF)
    store.register("policy", cfg, state_dict=full)

    def current_buffer() -> torch.Tensor:
        v, bufs = store.table.acquire("policy")
        store.table.release("policy", v)
        return store.transport.local_view(bufs[0])[:nbytes]

    src = current_buffer()
    memory = {"model_bytes": nbytes, "store_resident_bytes": store.resident_bytes(),
              "replica_cost_ratio": store.resident_bytes() / nbytes}
    rows = []
    for tp in (1, 2, 4):
        lay, devs = Layout(tp=tp), [Device(0, i) for i in range(tp)]
        out = _views_into(dst, spec, lay, devs)
        store.read("policy", devs, lay, out=out)  # plan + warm
        # baseline and read alternate, so both see the same machine load; best of `repeats` each
        t_mem, t_out, t_mfresh, t_alloc, t_write = [], [], [], [], []
        for _ in range(repeats):
            # write publishes a new version into fresh shared memory (then the old one is freed;
            # drop our view of it first, or its mapping would outlive the version)
            src = None
            t_write.append(_best(lambda: store.write("policy", devs, lay, out), 1))
            src = current_buffer()
            t_mem.append(_best(lambda: dst[:nbytes].copy_(src), 1))
            t_out.append(_best(lambda: store.read("policy", devs, lay, out=out), 1))
            # fresh destinations: the read allocates; the memcpy baseline allocates the same bytes
            t_mfresh.append(_best(lambda: torch.empty(nbytes, dtype=torch.uint8).copy_(src), 1))
            t_alloc.append(_best(lambda: store.read("policy", devs, lay).shards, 1))
        plan = store.plan("read", "policy", devs, lay)
        m = moved[tp]
        mem_bw, mfresh_bw = nbytes / min(t_mem), nbytes / min(t_mfresh)
        rows.append({"tp": tp, "transfers": len(plan.transfers), "GB": m / 1e9,
                     "read_out_GBps": m / min(t_out) / 1e9, "memcpy_GBps": mem_bw / 1e9,
                     "ratio_out": m / min(t_out) / mem_bw,
                     "read_alloc_GBps": m / min(t_alloc) / 1e9, "memcpy_fresh_GBps": mfresh_bw / 1e9,
                     "ratio_alloc": m / min(t_alloc) / mfresh_bw,
                     "write_GBps": nbytes / min(t_write) / 1e9, "ratio_write": nbytes / min(t_write) / mem_bw})
    memory["after_writes_resident_bytes"] = store.resident_bytes()
    memory["after_writes_pooled_write_buffer_bytes"] = store.transport.pooled_bytes()
    # peak RSS during reads
    lay, devs = Layout(tp=2), [Device(0, 0), Device(0, 1)]
    out = _views_into(dst, spec, lay, devs)
    can = _reset_peak()
    base = _status("VmRSS")
    store.read("policy", devs, lay, out=out)
    memory["peak_rss_growth_read_out_bytes"] = _status("VmHWM") - base if can else None
    _reset_peak()
    base = _status("VmRSS")
    res = store.read("policy", devs, lay)
    memory["peak_rss_growth_read_alloc_bytes"] = _status("VmHWM") - base if can else None
    memory["read_alloc_result_bytes"] = sum(t.numel() * t.element_size() for s in res.shards.values() for t in s.values())
    del res
    # plan cache hit on this store
    store.read("policy", [Device(0, i) for i in range(4)], Layout(tp=4), out=None).shards.clear()
    key_devs = [Device(0, i) for i in range(4)]
    hits = []
    for _ in range(1000):
        t = time.perf_counter()
        store.plan("read", "policy", key_devs, Layout(tp=4))
        hits.append(time.perf_counter() - t)
    memory["plan_hit_small_ms_median"] = statistics.median(hits) * 1e3
    store.close()
    return rows, memory


def bench_plans() -> list[dict]:
    spec = ModelSpec.from_config(QWEN72B)
    devs = [Device(n, i) for n in range(16) for i in range(8)]
    rows = []
    for placement_name, budget in (("replicated", 2 * 2**40), ("hybrid", int(0.6 * spec.nbytes))):
        store = GlobalParameterStore(GPSConfig(node_memory_budget_bytes=budget, write_headroom_versions=0),
                                     num_nodes=16)
        store.register("qwen72b", spec=spec)  # shapes only: nothing is allocated
        for lay in (Layout(dp=16, tp=8), Layout(dp=4, tp=8, pp=4), Layout(dp=128)):
            spec.forget_shards()
            t = time.perf_counter()
            plan = store.plan("read", "qwen72b", devs, lay)
            cold = time.perf_counter() - t
            hits = []
            for _ in range(1000):
                t = time.perf_counter()
                store.plan("read", "qwen72b", devs, lay)
                hits.append(time.perf_counter() - t)
            hits.sort()
            rows.append({"placement": f"{placement_name} (k={store.placement('qwen72b').k})",
                         "layout": f"dp{lay.dp} tp{lay.tp} pp{lay.pp}", "transfers": len(plan.transfers),
                         "cold_plan_s": cold, "hit_ms_median": hits[500] * 1e3, "hit_ms_p99": hits[990] * 1e3,
                         "est_read_s": plan.est_time})
        store.close()
    return rows


def main(argv: list[str]) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=10, help="layers of the Qwen2-shaped model (10 -> 1.17 GB)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads for reads and memcpy alike")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    bw, memory = bench_bandwidth(args.layers, args.repeats)
    print_table(bw, "node-local read bandwidth vs memcpy (best of %d, %d thread(s))" % (args.repeats, args.threads))
    plans = bench_plans()
    print_table(plans, "\nplan time, Qwen2.5-72B shapes, 128 devices (16 nodes x 8)")
    print_table([{"metric": k, "value": v} for k, v in memory.items()], "\nmemory and small-plan cache hit")
    write_json(args.json, "gps", bw, plans=plans, memory=memory, threads=args.threads, repeats=args.repeats)
    return 0
