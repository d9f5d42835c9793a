"""Weight sync on CPU: trainer -> GPS publish and GPS -> engine load, old path vs new, against memcpy.

`python -m pivotrl.bench weight_sync [--json PATH] [--hidden 512] [--layers 8] [--vocab 32000]`.

One Qwen2 policy (float32; default about 0.3 GB), a hosted trainer rank (world size 1), a GPS
on the Ray transport (one NodeStore, its buffers `/dev/shm` files that this process and the
engine map) and the CPU engine. Rows, each the median of `--repeats` runs:

- `memcpy`: one `copy_` of the model's bytes into a reused buffer (the floor), and into a fresh
  `/dev/shm` mapping (what a GPS write into a new version's buffer pays for page faults);
- `publish old`: `full_state_dict()` (gather to rank 0 and a clone), then `load_state_dict` into
  GPS: what the local runtime's `_train` does before Ray moves the dict (which adds its own
  serialisation copy, not counted here);
- `publish new`: `publish_shards`: each rank's rows straight into the GPS buffer, cast in the copy;
- `load old`: a GPS read into fresh tensors, the clone `ParamSource.read` makes, and the engine's
  `load_weights` (the Ray object copy between driver and device is again not counted);
- `load new`: `load_from_gps`: the engine maps its node's GPS file and copies into its weights;
- `runtime publish` / `runtime load`: the same two as the real runtimes run them, through device
  actors of a local cluster (`DeviceWorker.publish` on a trainer rank's actor, `load_weights` of
  a `GPSWeights` on a rollout actor: each reads its node's GPS file itself); seconds as the driver
  waits for them (Ray calls included), and the actor's own seconds in `in_actor_s`.
The old rows are the path the runtime took before (the driver gathered, read and shipped).

`copies` is the structural count of host copies of the model's bytes on that path (by reading
the code, stated per row); `x_memcpy` = seconds / memcpy seconds, the measured copy-equivalents
(the target: a publish makes <= 2 host copies; a load runs at >= 0.5x memcpy, i.e. x_memcpy <= 2).
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from pivotrl.bench.common import parser, print_table, write_json


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    p = parser("weight sync: publish and load vs memcpy (CPU)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    import torch

    from pivotrl.config.engine import EngineConfig
    from pivotrl.config.gps import GPSConfig
    from pivotrl.config.rl import TinyModelConfig
    from pivotrl.config.trainer import TrainerSpec
    from pivotrl.engines.cpu_engine import CPUEngine
    from pivotrl.trainer.trainer import Trainer
    from pivotrl.engines.weight_sync import load_from_gps, publish_shards
    from pivotrl.gps.layout import Layout, ModelSpec
    from pivotrl.gps.planner import Device
    from pivotrl.gps.ray_transport import make_ray_store
    from pivotrl.gps.transports import map_file
    from pivotrl.models.tiny import create_tiny_model

    from pivotrl.runtime.cluster import ClusterSpec, start_cluster
    from pivotrl.runtime.device import spawn_device

    torch.set_num_threads(1)
    spec = TinyModelConfig(hidden_size=a.hidden, num_layers=a.layers, num_heads=8, num_kv_heads=2,
                           intermediate_size=4 * a.hidden, vocab_size=a.vocab, max_position_embeddings=256,
                           tie_word_embeddings=False)
    folder = create_tiny_model(Path(tempfile.mkdtemp()) / "policy", spec, seed=0)
    cluster = start_cluster(ClusterSpec(kind="local", num_devices=2, node_size=2))
    store = make_ray_store(GPSConfig(transport="ray"), 1, cluster.ray_node_ids())
    rows = []
    try:
        mspec = ModelSpec.from_config(json.loads((folder / "config.json").read_text()))
        nbytes = mspec.nbytes
        store.register("policy", spec=mspec)
        src = torch.empty(nbytes, dtype=torch.uint8).random_()
        dst = torch.empty(nbytes, dtype=torch.uint8)
        dst.copy_(src)
        memcpy = _median_s(lambda: dst.copy_(src), a.repeats)

        def fresh_shm() -> None:
            buf = map_file(tempfile.mktemp(dir="/dev/shm", prefix="pivotrl-bench-"), nbytes)
            buf.copy_(src)

        memcpy_fresh = _median_s(fresh_shm, a.repeats)
        gb = nbytes / 1e9
        rows.append({"path": "memcpy (reused buffer)", "copies": 1, "seconds": memcpy, "s_per_gb": memcpy / gb,
                     "x_memcpy": 1.0})
        rows.append({"path": "memcpy (fresh /dev/shm)", "copies": 1, "seconds": memcpy_fresh,
                     "s_per_gb": memcpy_fresh / gb, "x_memcpy": memcpy_fresh / memcpy})
        with Trainer(TrainerSpec(device="cpu", lr=1e-4), folder) as tr:
            w = tr.worker

            def publish_old() -> None:
                full = w.full_state_dict()
                store.load_state_dict("policy", {k: v for k, v in full.items() if k in mspec})

            old = _median_s(publish_old, a.repeats)
            new = _median_s(lambda: publish_shards(w, store, "policy"), a.repeats)
        rows.append({"path": "publish old (gather+clone, GPS write)", "copies": 3, "seconds": old,
                     "s_per_gb": old / gb, "x_memcpy": old / memcpy})
        rows.append({"path": "publish new (publish_shards)", "copies": 1, "seconds": new, "s_per_gb": new / gb,
                     "x_memcpy": new / memcpy})
        eng = CPUEngine(folder, EngineConfig(name="cpu", num_threads=1))
        dev = Device(0, 0)

        def load_old() -> None:
            with store.read("policy", [dev], Layout()) as res:
                sd = {k: t.clone() for k, t in res.shards[dev].items()}
            eng.load_weights(sd, 1)

        lo = _median_s(load_old, a.repeats)
        events = []
        ln = _median_s(lambda: events.append(load_from_gps(eng, store, "policy", node=0)), a.repeats)
        assert all(e["path"] == "file" for e in events), events
        rows.append({"path": "load old (GPS read, clone, load_weights)", "copies": 3, "seconds": lo,
                     "s_per_gb": lo / gb, "x_memcpy": lo / memcpy})
        rows.append({"path": "load new (load_from_gps: mapped file)", "copies": 1, "seconds": ln,
                     "s_per_gb": ln / gb, "x_memcpy": ln / memcpy})
        rows += _runtime_rows(store, folder, spawn_device(cluster, 0), spawn_device(cluster, 1), a.repeats, memcpy, gb)
    finally:
        store.close()
        cluster.shutdown()
    for r in rows:
        r["model_gb"] = gb
    print_table(rows, f"weight sync, {gb:.3f} GB float32 model")
    write_json(a.json, "weight_sync", rows)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))


def _runtime_rows(store, folder, trainer_actor, rollout_actor, repeats: int, memcpy: float, gb: float) -> list[dict]:
    """Publish and load as the runtime runs them, through two device actors (module docstring)."""
    import ray

    from pivotrl.config.engine import EngineConfig, EngineSpec
    from pivotrl.config.trainer import TrainerSpec
    from pivotrl.core.types import Role
    from pivotrl.engines.weight_sync import GPSWeights
    from pivotrl.runtime.roles import RoleSpec

    ray.get(trainer_actor.shift_up.remote(RoleSpec(Role.TRAIN, "policy", str(folder),
                                                   trainer=TrainerSpec(device="cpu", lr=1e-4))))
    ray.get(rollout_actor.shift_up.remote(RoleSpec(Role.ROLLOUT, "policy", str(folder),
                                                   engine=EngineSpec.for_role(EngineConfig(name="cpu", num_threads=1),
                                                                              "rollout"))))
    pubs, loads = [], []

    def publish() -> None:
        pubs.append(ray.get(trainer_actor.publish.remote(store, "policy")))

    def load() -> None:
        gv = int(store.current_version("policy"))
        loads.append(ray.get(rollout_actor.load_weights.remote(GPSWeights(store, "policy", gv, gv), gv)))

    pub_s = _median_s(publish, repeats)
    load_s = _median_s(load, repeats)
    assert all(e["path"] == "file" for e in loads), loads
    rows = []
    for path, secs, evs in (("runtime publish (trainer actor: DeviceWorker.publish)", pub_s, pubs),
                            ("runtime load (rollout actor: load_weights of GPSWeights)", load_s, loads)):
        rows.append({"path": path, "copies": 1, "seconds": secs, "s_per_gb": secs / gb, "x_memcpy": secs / memcpy,
                     "in_actor_s": statistics.median(e["seconds"] for e in evs)})
    for actor in (trainer_actor, rollout_actor):
        ray.get(actor.close.remote())
        ray.kill(actor)
    return rows
