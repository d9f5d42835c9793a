"""Where shifted-up replicas read parameters from: `ParamSource`, backed by the GPS
(`pivotrl.gps.GlobalParameterStore`: the policy at its current version, the GenRM frozen). The
driver reads a full-replica layout and ships it to the device through Ray's object store (one
`put` per version, shared by every device that reads it); the trainer publishes into it.
"""
from __future__ import annotations

import threading
from typing import Any, Mapping


class ParamSource:
    """Versioned parameters for shift up, backed by the GPS (one driver-side store)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        # policy version = GPS version + offset (non-zero only after a resume, where GPS restarts
        # at 0 but the policy continues from its checkpoint's version)
        self.offset: dict[str, int] = {}
        self._refs: dict[tuple[str, int], Any] = {}
        self._lock = threading.Lock()

    @classmethod
    def create(cls, gps_cfg: Any = None, num_nodes: int = 1) -> "ParamSource":
        from pivotrl.config.gps import GPSConfig
        from pivotrl.gps.store import GlobalParameterStore

        return cls(GlobalParameterStore(gps_cfg or GPSConfig(), num_nodes=num_nodes))

    def register_hf(self, model: str, path: str, frozen: bool) -> int:
        """Register `model` from a Hugging Face folder as version 0 (GPS's own importer)."""
        from pivotrl.gps.hf_io import import_hf

        return int(import_hf(self.store, model, path, frozen=frozen))

    def publish(self, model: str, state_dict: Mapping[str, Any]) -> int:
        """Write a new version of `model` (atomic for readers); returns it. The trainer's names and
        dtypes become the store's (`gps.state_dict.to_store`: fused MoE experts split, a tied
        `lm_head` dropped, each tensor cast to the checkpoint's dtype: an fp32 trainer publishes
        into a bf16 store)."""
        from pivotrl.gps.state_dict import to_store

        v = int(self.store.load_state_dict(model, to_store(state_dict, self.store.spec(model))))
        return v + self.offset.get(model, 0)

    def restore(self, model: str, state_dict: Mapping[str, Any], version: int) -> None:
        """Publish a checkpoint's weights as policy `version` (resume)."""
        from pivotrl.gps.state_dict import to_store

        gps_v = int(self.store.load_state_dict(model, to_store(state_dict, self.store.spec(model))))
        self.offset[model] = int(version) - gps_v

    def _gps_version(self, model: str) -> int:
        return int(self.store.current_version(model))

    def version(self, model: str) -> int:
        return self._gps_version(model) + self.offset.get(model, 0)

    def read(self, model: str) -> tuple[Any, int]:
        """(Ray object ref of the full state dict, version): one consistent GPS version."""
        import ray

        from pivotrl.gps.layout import Layout
        from pivotrl.gps.planner import Device

        with self._lock:
            gv = self._gps_version(model)
            v = gv + self.offset.get(model, 0)
            ref = self._refs.get((model, v))
            if ref is None:
                dev = Device(0, 0)
                res = self.store.read(model, [dev], Layout(), version=gv)
                ref = ray.put({k: t.clone() for k, t in res.shards[dev].items()})
                res.release()
                # keep only the newest version of each model pinned in the object store
                self._refs = {k: r for k, r in self._refs.items() if k[0] != model}
                self._refs[(model, v)] = ref
            return ref, v

    def close(self) -> None:
        self._refs.clear()
        self.store.close()
