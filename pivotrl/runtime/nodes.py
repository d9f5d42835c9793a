"""What every node of a real run must see, checked at start; and the trainer's rendezvous address.

Owns:
- `check_nodes(ray_node_ids, checkpoint_dir, models, timeout_s)`: one probe task on every Ray node
  that holds devices (pinned there by node affinity, claiming no resources), before any engine
  starts. Each probe (a) writes a file into `train.checkpoint_dir` as its node sees it (`~` and
  `$VAR` expanded with that node's environment, as the trainer ranks there will), and the driver
  then reads every file back: the trainer ranks write checkpoints on their own nodes, and the
  driver reads them back for a resume or to rebuild a lost trainer, so that folder must be one
  storage every node and the driver share; (b) resolves every model folder the node will open,
  the way it will open it (a Hub id in that node's own Hugging Face cache, a folder path with that
  node's `~`): it must exist with its config.json, its weights' safetensors headers and tensors
  (`models.resolve.resolve_checkpoint`). A failure is a `NodeCheckError` that names the node
  (host, IP, Ray node id), the path and the config key; a node that does not answer within the
  limit (`cluster.limits.call_s`) is one too. The check returns each node's own folder of each
  model (`NodeView.model_path`): a device opens the folder resolved on its node.
- `tcp_rendezvous()`: `tcp://<this node's IP>:<a port free on it now>`, asked of the device that
  will be training rank 0 (`DeviceWorker.rendezvous`), as verl and torchtitan do: no file in a
  shared folder, and a rebuilt trainer asks again, so it gets a fresh port.

Knows nothing about roles or the control plane.
"""
from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Name prefix of the files the check writes into the checkpoint folder (removed afterwards).
PROBE_PREFIX = ".pivotrl-node-check-"


class NodeCheckError(RuntimeError):
    """A node cannot write or share the checkpoint folder, or cannot open a model folder."""


@dataclass(frozen=True)
class ModelSource:
    """One model folder every node will open."""

    name: str
    """GPS model key (`policy`, `genrm`)."""
    key: str
    """The config key that names it (`models.policy.hf_path`, `models.bootstrap.cache_dir`)."""
    path: str
    """The folder or Hub id, as configured (each node resolves it itself)."""
    need_chat_template: bool = False
    frozen: bool = False
    """A frozen model (the judge) is loaded by its engine's own loader: no GPS partition rules needed."""


@dataclass
class NodeView:
    """What the check found: each node's own folder of each model."""

    paths: dict[str, dict[str, str]] = field(default_factory=dict)
    """Ray node id -> model name -> that node's folder."""
    nodes: dict[str, str] = field(default_factory=dict)
    """Ray node id -> how errors name it (`host (ip, node id)`)."""

    def model_path(self, ray_node_id: str, model: str) -> str:
        return self.paths[ray_node_id][model]


def node_label(host: str, ip: str, node_id: str) -> str:
    return f"{host} ({ip}, Ray node {node_id[:12]})"


def free_port(host: str = "") -> int:
    """A TCP port nothing listens on now on this machine (the OS picks it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tcp_rendezvous() -> str:
    """`tcp://ip:port` of this node for a process group whose rank 0 runs here (module docstring)."""
    import ray

    ip = ray.util.get_node_ip_address()
    host = f"[{ip}]" if ":" in ip else ip
    return f"tcp://{host}:{free_port()}"


def expand(path: str) -> str:
    """`~` and `$VAR` expanded with this process's environment (one definition: the config's)."""
    from pivotrl.config.run import expand_path

    return expand_path(path)


def probe_node(checkpoint_dir: str, models: list[ModelSource], token: str) -> dict[str, Any]:
    """The probe that runs on one node (module docstring): never raises, reports what failed."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    out: dict[str, Any] = {"node_id": node_id, "host": socket.gethostname(), "ip": ray.util.get_node_ip_address(),
                           "checkpoint_dir": expand(checkpoint_dir), "models": {}, "errors": []}
    probe = Path(out["checkpoint_dir"]) / f"{PROBE_PREFIX}{token}-{node_id[:16]}"
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        with open(probe, "w") as f:
            f.write(node_id)
            f.flush()
            os.fsync(f.fileno())
        out["probe"] = str(probe)
    except OSError as e:
        out["errors"].append(("train.checkpoint_dir", checkpoint_dir,
                              f"cannot write there (as this node sees it: {out['checkpoint_dir']}): "
                              f"{type(e).__name__}: {e}"))
    from pivotrl.models.resolve import resolve_checkpoint

    for m in models:
        try:
            ck = resolve_checkpoint(m.path, m.key, need_chat_template=m.need_chat_template, gps_rules=not m.frozen)
            out["models"][m.name] = str(ck.path)
        except Exception as e:  # noqa: BLE001 - reported, with the node, by the driver
            out["errors"].append((m.key, m.path, f"{type(e).__name__}: {e}"))
    return out


def remove_probe(path: str) -> None:
    """Remove one node's probe file (on that node: the driver may not see it)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _on_node(fn: Any, node_id: str) -> Any:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(num_cpus=0, max_retries=0)(fn).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))


def check_nodes(ray_node_ids: list[str], checkpoint_dir: str, models: list[ModelSource],
                timeout_s: float) -> NodeView:
    """Probe every node of `ray_node_ids` (duplicates once), read back what each wrote; raise
    `NodeCheckError` naming the node, the path and the key of every failure (module docstring)."""
    import ray

    token = secrets.token_hex(6)
    nodes = list(dict.fromkeys(ray_node_ids))
    refs = {n: _on_node(probe_node, n).remote(checkpoint_dir, models, token) for n in nodes}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    problems: list[str] = []
    view = NodeView()
    results: dict[str, dict[str, Any]] = {}
    for n, ref in refs.items():
        if ref not in ready:
            ray.cancel(ref, force=True)
            problems.append(f"Ray node {n[:12]} did not answer the node check within cluster.limits.call_s="
                            f"{timeout_s:g}s (is it alive and reachable from the head?)")
            continue
        try:
            results[n] = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - the node died or its worker could not start
            problems.append(f"Ray node {n[:12]}: the node check failed there ({type(e).__name__}: {e})")
    mine = Path(expand(checkpoint_dir))
    for n, res in results.items():
        label = node_label(res["host"], res["ip"], n)
        view.nodes[n] = label
        view.paths[n] = dict(res["models"])
        for key, value, why in res["errors"]:
            problems.append(f"node {label}: {key}={value!r}: {why}")
        if "probe" in res:
            seen = mine / Path(res["probe"]).name
            try:
                ok = seen.read_text() == n
            except OSError:
                ok = False
            if not ok:
                problems.append(
                    f"node {label} wrote {res['probe']} into train.checkpoint_dir={checkpoint_dir!r} (there: "
                    f"{res['checkpoint_dir']}), but the driver does not read it back at {seen}: the trainer ranks "
                    f"write checkpoints on their own nodes and the driver reads them back (resume, rebuilding "
                    f"a lost trainer), so train.checkpoint_dir must be storage every node and the driver share "
                    f"(a network filesystem mounted on each)")
    leftovers = [(n, r["probe"]) for n, r in results.items() if "probe" in r]
    if leftovers:  # each node removes its own (the driver may not see it)
        ray.wait([_on_node(remove_probe, n).remote(p) for n, p in leftovers], num_returns=len(leftovers),
                 timeout=timeout_s)
    if problems:
        raise NodeCheckError("the check of the cluster's nodes at start failed, before any engine started:\n  - "
                             + "\n  - ".join(problems))
    return view
