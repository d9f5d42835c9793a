"""Global Parameter Storage (GPS): every model's current weights in pooled host memory, readable
and writable by any device group under any parallel layout (DESIGN.md §4.4, paper §5.1, App. B).

The API the runtime uses::

    from pivotrl.config.gps import GPSConfig
    from pivotrl.gps import Device, GlobalParameterStore, Layout, import_hf

    store = GlobalParameterStore(GPSConfig(node_memory_budget_bytes=...), num_nodes=2)
    import_hf(store, "policy", "/path/to/hf_dir")                 # version 0
    import_hf(store, "genrm", "/path/to/genrm_dir", frozen=True)  # writes refused

    devs = [Device(node=0, index=0), Device(node=0, index=1)]
    version, shards = store.read("policy", devs, Layout(tp=2))    # shards[dev][name] -> Tensor
    new_version = store.write("policy", devs, Layout(tp=2), shards)  # -> version + 1

- `Device(node, index)`: a device by its node (decides node-local vs remote links) and slot.
- `Layout(dp, tp, pp, ep, fused_qkv, fused_gate_up)`: `len(devices) == dp*tp*pp`, rank order TP
  fastest, then PP, then DP. Device tensors keep HF names (`model.layers.3.self_attn.q_proj.weight`),
  holding the rank's slice; fused layouts use vLLM names (`qkv_proj`, `gate_up_proj`).
- `read(model, devices, layout, version=None, zero_copy=False, out=None) -> ReadResult`: one
  version, never torn; `ReadResult` unpacks as `(version, shards)`. `out` fills given tensors in
  place (e.g. the engine's parameters); `zero_copy` hands out views of node-local GPS memory where
  a device tensor is one whole stored slice (release the result when done with them).
- `write(model, devices, layout, shards) -> version`: validated, then published atomically;
  `write_async(...) -> Future[version]` validates now and copies/publishes on a background thread
  (training overlaps it with its next step; keep `shards` unchanged until the future is done).
- `register(model, config_or_dict, frozen=..., state_dict=...)`, `export_hf`, `current_version`,
  `live_versions`, `plan(...)` (the cached transfer plan, for inspection and overhead estimates).
- Errors (`pivotrl.gps.errors`) name what is wrong and leave the store unchanged.
- Across processes/nodes: `pivotrl.gps.ray_transport.make_ray_store(config, num_nodes)` returns a
  store that pickles into Ray actors; each actor's `read` runs in its own process, mapping its own
  node's shared memory directly and fetching other nodes' bytes through Ray.

Files: families.py (per-architecture tensors and partition rules from config.json), checkpoint.py
(a checkpoint folder's config and tensor index, its spec), state_dict.py (trainer <-> checkpoint
names and the store's dtype), layout.py (shapes, layouts, sharding), placement.py (replicate-first
placement, memory budget),
planner.py (atomic slices and greedy holder choice), versions.py (version table and leases),
store.py (the store: models, plan cache, version lifecycle, leases), execute.py (carrying out a
plan, shard checks), handles.py (read results, row writes, file manifests), transports.py (shm; registry), ray_transport.py, nixl_transport.py,
hf_io.py (HF import/export), errors.py.
"""
from typing import Any

# The pure half (shapes, placement, planning, versions) imports no torch or Ray, so the control
# plane and planner tests can import it; the store and HF I/O load on first use.
from pivotrl.gps.errors import (BudgetError, FrozenModelError, GPSError, ShardMismatchError, UnknownModelError,
                                UnknownVersionError, WriteConflictError)
from pivotrl.gps.layout import Layout, LocalTensor, ModelSpec, TensorSpec, device_shards
from pivotrl.gps.placement import Placement, choose_placement
from pivotrl.gps.planner import Device, LinkProfile, Plan, Transfer, plan_read, plan_write

_LAZY = {"GlobalParameterStore": "store", "ReadResult": "handles", "export_hf": "hf_io", "import_hf": "hf_io"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"pivotrl.gps.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'pivotrl.gps' has no attribute {name!r}")


__all__ = [
    "BudgetError", "Device", "FrozenModelError", "GPSError", "GlobalParameterStore", "Layout", "LinkProfile",
    "LocalTensor", "ModelSpec", "Placement", "Plan", "ReadResult", "ShardMismatchError", "TensorSpec", "Transfer",
    "UnknownModelError", "UnknownVersionError", "WriteConflictError", "choose_placement", "device_shards",
    "export_hf", "import_hf", "plan_read", "plan_write",
]
