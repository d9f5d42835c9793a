"""Composed Hydra config -> `PivotConfig`, refusing what the dataclasses would not catch.

Owns the one conversion of the project (`to_config`), the test/library `compose`, and the table
of renamed user-facing keys (`RENAMED`, checked on the command line before Hydra composes, so an
old key fails with its new name rather than Hydra's "not in struct").

What it refuses, each with the full config path:
- a key no dataclass declares, also one added with `+` (Hydra lets `+` add keys to typed
  groups, and the conversion would drop them silently);
- a non-finite number anywhere (NaN, inf);
- a value its dataclass's `__post_init__` rejects (`ConfigError`, relative to that dataclass:
  the path of the node is prefixed here).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pivotrl.config.base import ConfigError, finite

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

#: old key -> new key (README "Renamed keys"). A prefix match renames the whole subtree.
RENAMED: dict[str, str] = {
    "cluster.runtime.engine": "engine",
    "cluster.runtime.reward": "reward",
    "cluster.runtime.gps": "cluster.gps",
    "cluster.runtime.bootstrap.data": "data",
    "cluster.runtime.bootstrap": "models.bootstrap",
    "cluster.runtime.lr": "algo.lr",
    "cluster.runtime.micro_batch_size": "algo.micro_batch_size",
    "cluster.runtime.ppo_mini_batches": "algo.ppo_mini_batches",
    "cluster.runtime.ppo_epochs": "algo.ppo_epochs",
    "cluster.runtime.lr_decay_steps": "algo.lr_decay_steps",
    "cluster.runtime.lr_min_ratio": "algo.lr_min_ratio",
    "cluster.runtime.off_policy": "algo.off_policy",
    "cluster.runtime.rollout_temperature": "algo.rollout_temperature",
    "cluster.runtime.max_response_tokens": "data.max_response_length",
    "cluster.runtime.val_size": "data.val_size",
    "cluster.runtime.eval_samples": "data.val_samples",
    "cluster.runtime.cache_dir": "models.bootstrap.cache_dir",
    "cluster.runtime.poll_s": "cluster.poll_s",
    "cluster.runtime.fit_every_s": "cluster.fit_every_s",
    "cluster.runtime.tau_shift_prior_s": "cluster.tau_shift_prior_s",
    "cluster.runtime.max_wall_s": "cluster.max_wall_s",
    "cluster.runtime": "(split: engine, reward, algo, data, cluster.*; see README 'Renamed keys')",
    "models.sim.prompts_per_step": "train.prompts_per_step",
    "models.sim.group_size": "train.group_size",
    "data.num_val": "data.val_size",
    "models.bootstrap.eval_size": "data.val_size",
    "models.bootstrap.data": "data",
    "reward.genrm_parser": "models.genrm.judge.parser",
    "reward.genrm_max_tokens": "models.genrm.judge.max_tokens",
    "reward.genrm_temperature": "models.genrm.judge.temperature",
    "cluster.runtime.reward.genrm_parser": "models.genrm.judge.parser",
    "cluster.runtime.reward.genrm_max_tokens": "models.genrm.judge.max_tokens",
    "cluster.runtime.reward.genrm_temperature": "models.genrm.judge.temperature",
    # one schema per shift strategy (pivotrl/config/planner.py): the strategy is a config group
    "deploy.planner.strategy": "deploy/planner",
    "deploy.planner.rule_up_kv": "deploy.planner.up_kv",
    "deploy.planner.rule_down_kv": "deploy.planner.down_kv",
    # settings the run derives (pivotrl/config/resolve.py builds the trainer's and engines' specs)
    "algo.staleness": "deploy.staleness",
    "algo.seed": "seed",
    "algo.device": "cluster.accelerator",
    "algo.num_threads": "cluster.threads_per_device",
    "algo.world_size": "(derived: the size of the training home set, deploy.allocation.train)",
    "algo.backend": "(derived from cluster.accelerator: gloo on cpu, nccl on cuda)",
    "algo.logprob_temperature": "(derived: algo.rollout_temperature, 1 for greedy)",
    "engine.vllm_tensor_parallel_size": "(derived per replica: models.policy.tp, models.genrm.tp)",
    "engine.vllm_sleep_level": "(derived per role: rollout 2, reward 1)",
    # vLLM's loaders read each rank's shard from views of the GPS file: no staging bucket of ours
    "engine.vllm_weight_bucket_mb": "(removed: vLLM's workers now read each rank's shard straight from the GPS "
                                    "node file, with no bucket to size; see pivotrl/engines/weight_sync.py)",
}


#: group choices that no longer exist -> what to use instead (README "Renamed keys").
REMOVED_CHOICES: dict[str, str] = {
    "cluster=inproc": "local, ray or sim (cluster=inproc, the synchronous loop in one process, was removed: "
                      "cluster=local runs rollout, GenRM and training through the one runtime loop)",
}


def renamed(key: str) -> str | None:
    """The new name of an old key (longest matching prefix), or None if `key` is current."""
    for old in sorted(RENAMED, key=len, reverse=True):
        if key == old or key.startswith(old + "."):
            new = RENAMED[old]
            return new if new.startswith("(") else new + key[len(old):]
    return None


def check_overrides(overrides: list[str]) -> None:
    """Refuse command-line overrides that use a renamed key, naming the new one, and settings of a
    shift strategy other than the chosen one (`check_planner_keys`)."""
    for ov in overrides:
        if "=" not in ov or ov.startswith("hydra"):
            continue
        if ov.lstrip("+~") in REMOVED_CHOICES:
            key, value = ov.lstrip("+~").split("=", 1)
            raise ConfigError(key, REMOVED_CHOICES[ov.lstrip("+~")], value)
        key = ov.split("=", 1)[0].lstrip("+~")
        new = renamed(key)
        if new is not None:
            value = ov.split("=", 1)[1]
            hint = new if new.startswith("(") else f"{new}={value}"
            raise ConfigError(key, f"the new key: {hint} (renamed; see README 'Renamed keys')", value)
    check_planner_keys(overrides)
    check_engine_keys(overrides)


def check_engine_keys(overrides: list[str]) -> None:
    """`engine.<key>` / `engine.<role>.<key>` that no engine setting has: name the full path and
    the settings there are (Hydra alone would suggest adding it with `+`)."""
    from pivotrl.config.engine import ENGINE_ROLES, EngineSettings

    names = sorted(f.name for f in dataclasses.fields(EngineSettings))
    for ov in overrides:
        if "=" not in ov or ov.startswith(("hydra", "~")):
            continue
        key, value = ov.split("=", 1)
        parts = key.lstrip("+").split(".")
        if parts[0] != "engine" or len(parts) < 2:
            continue
        where, rest = ("engine." + parts[1], parts[2:]) if parts[1] in ENGINE_ROLES else ("engine", parts[1:])
        if len(rest) != 1 or rest[0] not in names:
            raise ConfigError(".".join(rest) or "(nothing)", f"a key of {where} ({', '.join(names)}"
                              f"{'' if where != 'engine' else ', or a role: ' + ', '.join(ENGINE_ROLES)})",
                              value, where)


def check_planner_keys(overrides: list[str]) -> None:
    """`deploy.planner.<key>` that the chosen strategy's schema lacks but another's has (e.g.
    `deploy.planner.up_kv` without `deploy/planner=rule`): name the strategies it belongs to.
    Hydra alone would suggest adding it with `+`. The chosen strategy is the `deploy/planner=`
    override, else pivot's default; with another `deploy=` or an `experiment=` overlay (which may
    choose for itself) nothing is assumed and composition reports what it finds."""
    import dataclasses

    from pivotrl.config.planner import PLANNER_SCHEMAS

    pairs = [(ov.split("=", 1)[0].lstrip("+~"), ov.split("=", 1)[1]) for ov in overrides
             if "=" in ov and not ov.startswith("hydra")]
    chosen = dict(pairs).get("deploy/planner")
    if chosen is None:
        if any(k == "experiment" or (k == "deploy" and v != "pivot") for k, v in pairs):
            return
        chosen = "pivot"
    if chosen not in PLANNER_SCHEMAS:
        return  # Hydra names the group's options
    keys = {s: {f.name for f in dataclasses.fields(c)} for s, c in PLANNER_SCHEMAS.items()}
    for key, value in pairs:
        name = key.removeprefix("deploy.planner.")
        if key.startswith("deploy.planner.") and "." not in name and name not in keys[chosen]:
            owners = sorted(s for s, ks in keys.items() if name in ks)
            if owners:
                raise ConfigError(name, f"a key of deploy/planner={chosen} ({', '.join(sorted(keys[chosen]))}); "
                                  f"{name} is a setting of deploy/planner={' | '.join(owners)}: choose that "
                                  "strategy first", value, "deploy.planner")


def _is_dataclass_node(node: Any) -> type | None:
    from omegaconf import OmegaConf

    t = OmegaConf.get_type(node)
    return t if isinstance(t, type) and dataclasses.is_dataclass(t) else None


def _check_value(v: Any, path: str, key: str) -> None:
    """The one non-finite check of the project: every float of the tree, wherever it sits (the
    dataclasses' own range checks use the same `finite`)."""
    if isinstance(v, float) and not finite(v):
        raise ConfigError(key, "a finite number", v, path)


def _walk(node: Any, path: str) -> None:
    """Depth first: unknown keys and non-finite numbers, then each dataclass node's own checks."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    typ = _is_dataclass_node(node)
    if typ is not None:
        names = {f.name for f in dataclasses.fields(typ)}
        for k in node.keys():
            if k not in names:
                raise ConfigError(str(k), f"a key of {typ.__name__} ({', '.join(sorted(names))})",
                                  node[k] if not OmegaConf.is_missing(node, k) else None, path)
    for k in node.keys():
        if OmegaConf.is_missing(node, k):
            continue
        v = node[k]
        sub = f"{path}.{k}" if path else str(k)
        if isinstance(v, DictConfig):
            _walk(v, sub)
        elif isinstance(v, ListConfig):
            for i, x in enumerate(v):
                if isinstance(x, DictConfig):
                    _walk(x, f"{sub}[{i}]")
                elif isinstance(x, ListConfig):
                    for y in x:
                        _check_value(y, path, f"{k}[{i}]")
                else:
                    _check_value(x, path, f"{k}[{i}]")
        else:
            _check_value(v, path, str(k))
    if typ is not None and path:
        try:
            OmegaConf.to_object(node)
        except ConfigError as e:
            raise e.at(path) from None
        except ValueError as e:  # a dataclass not yet on ConfigError: keep its text, add the path
            msg = str(e)
            raise ValueError(msg if msg.startswith(path) else f"{path}: {msg}") from None


def to_config(dcfg: Any) -> Any:
    """The one conversion: checks (module docstring), then `OmegaConf.to_object`."""
    from omegaconf import OmegaConf

    _walk(dcfg, "")
    return OmegaConf.to_object(dcfg)


def compose(overrides: list[str], config_dir: str | None = None) -> Any:
    """Compose `conf/` (or `config_dir`) with `overrides` and convert, as `train.py` does."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from pivotrl.config import register_configs

    check_overrides(overrides)
    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir or CONF_DIR), version_base=None):
        return to_config(hydra_compose("config", overrides=list(overrides)))
