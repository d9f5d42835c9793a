"""GPS across Ray nodes: one `NodeStore` actor per node holds that node's buffers in `/dev/shm`.

Owns: `NodeStore` (allocates, frees and serves boxes of its node's buffers, fills a buffer from
the checkpoint folder its node sees, measures its node's memory budget), `RayTransport` (a process
on a buffer's node maps its file directly, zero extra copies; any other process gets the boxes
through Ray object transfer, one call per node for a batch of boxes), `RemoteTable` (the version
table living in one Ray actor, so every process sees the same versions and leases) and
`make_ray_store`, which builds a store whose handle can be shipped to device actors (`store.read`
then runs in the device's own process). The store's per-node budget is what each node's
`NodeStore` measures on its own machine (`placement.budget_bytes` there), never the driver's.
"""
from __future__ import annotations

import os
import uuid
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pivotrl.config.gps import GPSConfig
from pivotrl.gps.placement import budget_bytes
from pivotrl.gps.store import GlobalParameterStore
from pivotrl.gps.transports import BufferRef, SliceItem, Transport, map_file, read_items, write_items
from pivotrl.gps.versions import VersionTable


class NodeStore:
    """Keeps one GPS node's buffers as named `/dev/shm` files (named so that other processes of
    the node can map them); unlinked when freed or when the actor closes."""

    def __init__(self, node: int, shm_dir: str) -> None:
        torch.set_num_threads(1)
        self.node = node
        self.dir = shm_dir
        self.tag = f"pivotrl-gps-n{node}-{uuid.uuid4().hex[:8]}"
        self.bufs: dict[str, torch.Tensor] = {}
        self.copies: set[str] = set()
        self.served = {"read_bytes": 0, "write_bytes": 0, "write_calls": 0, "import_bytes": 0}

    def ray_node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def allocate(self, key: str, nbytes: int) -> str:
        path = os.path.join(self.dir, f"{self.tag}-{key}")
        self.bufs[path] = map_file(path, nbytes)
        return path

    def free(self, path: str) -> None:
        if self.bufs.pop(path, None) is not None and os.path.exists(path):
            os.unlink(path)

    def read(self, path: str, items: list[SliceItem]) -> list[torch.Tensor]:
        # clone: pickling a view would ship its whole underlying buffer
        out = [v.clone() for v in read_items(self.bufs[path], items)]
        self.served["read_bytes"] += sum(t.numel() * t.element_size() for t in out)
        return out

    def write(self, path: str, items: list[SliceItem], tensors: list[torch.Tensor]) -> None:
        write_items(self.bufs[path], items, tensors)
        self.served["write_bytes"] += sum(t.numel() * t.element_size() for t in tensors)
        self.served["write_calls"] += 1

    def fill(self, path: str, entries: list, folder: str) -> int:
        """Fill buffer `path` from `folder` as this node sees it (`node_import.fill_from_folder`)."""
        from pivotrl.gps.node_import import fill_from_folder

        n = fill_from_folder(self.bufs[path], entries, folder)
        self.served["import_bytes"] += n
        return n

    def budget(self, config: GPSConfig) -> int:
        """This node's GPS budget (`placement.budget_bytes`, measured here)."""
        return budget_bytes(config)

    def host_copy(self, folder: str, name: str) -> str:
        """`folder` copied into this node's shared memory as `name` (`node_import.host_copy`);
        its path, the same on every node. Removed when the store closes."""
        from pivotrl.gps.node_import import host_copy

        dst = os.path.join(self.dir, name)
        self.copies.add(dst)
        return str(host_copy(folder, dst))

    def stats(self) -> dict[str, int]:
        return {**self.served, "resident_bytes": sum(b.numel() for b in self.bufs.values())}

    def close(self) -> None:
        import shutil

        for p in list(self.bufs):
            self.free(p)
        for d in self.copies:
            shutil.rmtree(d, ignore_errors=True)
        self.copies.clear()


class RayTransport(Transport):
    """Bytes of node `i` live in `actors[i]`; see module docstring."""

    name = "ray"

    def __init__(self, actors: list[Any], node_ids: list[str]) -> None:
        self.actors = actors
        self.node_ids = node_ids
        self._local: int | None | str = "unset"

    @classmethod
    def create(cls, config: GPSConfig, num_nodes: int, ray_node_ids: list[str] | None = None) -> "RayTransport":
        """One NodeStore per GPS node: on the Ray node `ray_node_ids[i]` when given (the runtime
        passes the node of each device group), else on the node carrying
        `config.ray_node_resource` for `i`, else on the `i`-th alive Ray node."""
        if not ray.is_initialized():
            raise RuntimeError("gps.transport='ray' needs ray.init() (or a Ray cluster) first")
        remote_cls = ray.remote(num_cpus=0)(NodeStore)
        actors = []
        if ray_node_ids is not None:
            if len(ray_node_ids) != num_nodes:
                raise ValueError(f"num_nodes={num_nodes} but {len(ray_node_ids)} Ray node ids were given")
            for i, node_id in enumerate(ray_node_ids):
                strat = NodeAffinitySchedulingStrategy(node_id, soft=False)
                actors.append(remote_cls.options(scheduling_strategy=strat).remote(i, config.shm_dir))
        elif config.ray_node_resource:
            for i in range(num_nodes):
                res = {config.ray_node_resource.format(i): 0.001}
                actors.append(remote_cls.options(resources=res).remote(i, config.shm_dir))
        else:
            alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
            if len(alive) < num_nodes:
                raise ValueError(f"num_nodes={num_nodes} but the Ray cluster has {len(alive)} alive nodes")
            for i in range(num_nodes):
                strat = NodeAffinitySchedulingStrategy(alive[i], soft=False)
                actors.append(remote_cls.options(scheduling_strategy=strat).remote(i, config.shm_dir))
        node_ids = ray.get([a.ray_node_id.remote() for a in actors])
        return cls(actors, node_ids)

    def __getstate__(self) -> dict:
        return {"actors": self.actors, "node_ids": self.node_ids}

    def __setstate__(self, s: dict) -> None:
        self.__init__(s["actors"], s["node_ids"])

    @property
    def local_node(self) -> int | None:
        """The GPS node this process runs on (None when it is on none of them)."""
        if self._local == "unset":
            me = ray.get_runtime_context().get_node_id()
            self._local = self.node_ids.index(me) if me in self.node_ids else None
        return self._local  # type: ignore[return-value]

    def allocate(self, node: int, key: str, nbytes: int) -> BufferRef:
        path = ray.get(self.actors[node].allocate.remote(key, nbytes))
        return BufferRef(node, key, nbytes, path)

    def free(self, ref: BufferRef) -> None:
        ray.get(self.actors[ref.node].free.remote(ref.path))

    def local_view(self, ref: BufferRef) -> torch.Tensor | None:
        if ref.node != self.local_node:
            return None
        # several GPS nodes may share one Ray node; the file is then reachable from all of them
        return map_file(ref.path, ref.nbytes)

    def read_remote(self, ref: BufferRef, items: list[SliceItem]) -> list[torch.Tensor]:
        return ray.get(self.actors[ref.node].read.remote(ref.path, items))

    def write_remote(self, ref: BufferRef, items: list[SliceItem], tensors: list[torch.Tensor]) -> None:
        ray.get(self.actors[ref.node].write.remote(ref.path, items, tensors))

    def read_remote_many(self, requests: list[tuple[BufferRef, list[SliceItem]]]) -> list[list[torch.Tensor]]:
        # all holders serve at once: a read's time is its slowest holder's, as the planner assumes
        return ray.get([self.actors[ref.node].read.remote(ref.path, items) for ref, items in requests])

    def write_remote_many(self, requests: list[tuple[BufferRef, list[SliceItem], list[torch.Tensor]]]) -> None:
        ray.get([self.actors[ref.node].write.remote(ref.path, items, ts) for ref, items, ts in requests])

    def fill_many(self, requests: list[tuple[BufferRef, list, str]]) -> None:
        # every node reads the folder its own filesystem shows, all at once
        ray.get([self.actors[ref.node].fill.remote(ref.path, entries, folder) for ref, entries, folder in requests])

    def node_budgets(self, config: GPSConfig) -> list[int]:
        """Each node's GPS budget, measured on that node."""
        return ray.get([a.budget.remote(config) for a in self.actors])

    def host_copy(self, folder: str, name: str) -> str:
        """`folder` copied into every node's shared memory (`NodeStore.host_copy`), all at once;
        the path, which is the same on every node."""
        paths = set(ray.get([a.host_copy.remote(folder, name) for a in self.actors]))
        if len(paths) != 1:
            raise RuntimeError(f"GPS nodes put the host copy of {folder} at different paths: {sorted(paths)}")
        return paths.pop()

    def node_stats(self) -> list[dict[str, int]]:
        return ray.get([a.stats.remote() for a in self.actors])

    def resident_bytes(self) -> int:
        return sum(s["resident_bytes"] for s in self.node_stats())

    def close(self) -> None:
        ray.get([a.close.remote() for a in self.actors])
        for a in self.actors:
            ray.kill(a)


class RemoteTable:
    """Calls a `VersionTable` living in a Ray actor as if it were local (blocking)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def kill(self) -> None:
        ray.kill(self.handle)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self.handle, name)
        return lambda *a, **kw: ray.get(method.remote(*a, **kw))


def make_ray_store(config: GPSConfig, num_nodes: int, ray_node_ids: list[str] | None = None) -> GlobalParameterStore:
    """A store whose metadata lives in one actor and whose bytes live in per-node actors; the
    returned object pickles into device actors, which then read/write from their own process.
    `ray_node_ids`: the Ray node of each GPS node (`RayTransport.create`)."""
    transport = RayTransport.create(config, num_nodes, ray_node_ids)
    budgets = transport.node_budgets(config)  # each node's own memory (module docstring)
    table_actor = ray.remote(num_cpus=0)(VersionTable).remote(
        num_nodes, budgets, config.write_headroom_versions, config.alignment_bytes)
    return GlobalParameterStore(config, num_nodes, transport=transport, table=RemoteTable(table_actor))
