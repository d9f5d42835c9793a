"""The policy and the frozen GenRM in GPS, for the real runtimes: `ParamSource`.

The store is a Ray one (`gps.ray_transport.make_ray_store`): its version table lives in an actor
and each node's buffers in that node's `NodeStore`, on the Ray node of that node's devices
(`Cluster.ray_node_ids`). The driver only orchestrates:
- the trainer's ranks write their own shards into it (`DeviceWorker.publish`, no gather);
- every device reads its own node's copy itself (`weights(model)` names what to read: a
  `weight_sync.GPSWeights`, the store's handle plus the versions), never through the driver.
At start the policy's folder becomes GPS version 0 (each node imports it from the folder it sees,
`GlobalParameterStore.import_folder`), and on a resume the checkpoint's policy is written. The
frozen GenRM never enters GPS (`keep_frozen`): every node keeps a host-memory copy of its folder
and its engine loads that with its own loader (vLLM's, or transformers' on the CPU engine), so any
architecture the engine serves is a judge, with no GPS partition rules (Qwen3.5). Policy versions and GPS versions differ after a resume (GPS restarts at 0,
the policy continues from its checkpoint's version): `offset` converts.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from pivotrl.config.gps import GPSConfig
    from pivotrl.engines.weight_sync import GPSWeights
    from pivotrl.gps.store import GlobalParameterStore

#: `cluster.gps.transport` values whose store device actors can read from their own processes.
MULTI_PROCESS_TRANSPORTS = ("ray",)


class ParamSource:
    """Versioned parameters in GPS, shared by the driver and every device actor."""

    def __init__(self, store: GlobalParameterStore) -> None:
        self.store = store
        self.host_copies: dict[str, str] = {}
        """model -> the folder of its host copy (frozen models kept beside GPS, `keep_frozen`)."""
        self._host_copy_bytes: dict[str, int] = {}
        self.offset: dict[str, int] = {}
        """policy version = GPS version + offset (non-zero only after a resume)."""

    @classmethod
    def create(cls, gps_cfg: GPSConfig, ray_node_ids: list[str]) -> ParamSource:
        """A Ray store with one GPS node per entry of `ray_node_ids` (the Ray node of each group of
        devices). Needs Ray started; `cluster.gps.transport` must be a multi-process transport."""
        from pivotrl.gps.ray_transport import make_ray_store

        if gps_cfg.transport not in MULTI_PROCESS_TRANSPORTS:
            raise ValueError(f"cluster.gps.transport={gps_cfg.transport!r}: the devices of cluster=local and "
                             f"cluster=ray read GPS from their own processes, so GPS must be shared across them; "
                             f"allowed: {', '.join(MULTI_PROCESS_TRANSPORTS)}")
        return cls(make_ray_store(gps_cfg, len(ray_node_ids), list(ray_node_ids)))

    def register_hf(self, model: str, path: str, frozen: bool) -> int:
        """Register `model` from a Hugging Face folder as version 0 (GPS's own importer)."""
        from pivotrl.gps.hf_io import import_hf

        return int(import_hf(self.store, model, path, frozen=frozen))

    def keep_frozen(self, model: str, path: str) -> str:
        """Keep frozen `model` beside GPS as a copy of its folder in every node's shared memory
        (`GlobalParameterStore.host_copy`, reserved from the GPS budget); returns the copy's
        folder (the same path on every node), which its engines load from."""
        from pivotrl.gps.node_import import folder_bytes

        self.host_copies[model] = self.store.host_copy(model, str(path))
        self._host_copy_bytes[model] = folder_bytes(path)
        return self.host_copies[model]

    def model_bytes(self, model: str) -> int:
        """Bytes of `model`'s weights: its GPS version's, or its host copy's (a frozen judge)."""
        if model in self._host_copy_bytes:
            return self._host_copy_bytes[model]
        return int(self.store.spec(model).nbytes)

    def restore(self, model: str, state_dict: Mapping[str, Any], version: int) -> None:
        """Publish a checkpoint's weights as policy `version` (resume). The trainer's names and
        dtypes become the store's (`gps.state_dict.to_store`)."""
        from pivotrl.gps.state_dict import to_store

        gps_v = int(self.store.load_state_dict(model, to_store(state_dict, self.store.spec(model))))
        self.offset[model] = int(version) - gps_v

    def policy_version(self, model: str, gps_version: int) -> int:
        """The policy version GPS version `gps_version` of `model` holds."""
        return int(gps_version) + self.offset.get(model, 0)

    def version(self, model: str) -> int:
        """The policy version of `model`'s current GPS version."""
        return self.policy_version(model, int(self.store.current_version(model)))

    def weights(self, model: str) -> tuple[GPSWeights | None, int]:
        """(what a device reads for `model` now, the policy version it holds): a
        `weight_sync.GPSWeights` at GPS's current version, read by the device itself; (None, 0) for
        a model kept as a host copy (the engine's own folder is its weights)."""
        from pivotrl.engines.weight_sync import GPSWeights

        if model in self.host_copies:
            return None, 0
        gv = int(self.store.current_version(model))
        v = self.policy_version(model, gv)
        return GPSWeights(self.store, model, gv, v), v

    def close(self) -> None:
        self.store.close()
