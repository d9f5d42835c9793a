"""What a real run loads before it starts: the policy and GenRM checkpoints and the data.

Owns the one rule of where models and data come from, shared by every real runtime (`local`,
`ray`, `inproc`):
- both `models.*.hf_path` set: those checkpoints (a local folder, or a Hub id in the local
  Hugging Face cache: `models.resolve.resolve_checkpoint`, which names the path it tried and the
  download command when the weights are missing or partial), and the user's
  `data.train_path`/`val_path` (a real checkpoint needs real data; a missing path is an error);
- both null: the tiny models from the cached SFT bootstrap (`models.bootstrap`), on the synthetic
  task, unless `data.train_path`/`val_path` name the user's parquet, which is then used;
- one set and one null is an error: a user's checkpoint is never silently replaced by a tiny one.

Also the checks at start that the checkpoints can run as configured (`check_fit`,
`check_trainer_fits`), and the memory of one real device (`device_memory_bytes`: the setting
`cluster.device_memory_bytes` or the GPU's own, never the simulator's hardware profile).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivotrl.config.base import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pivotrl.config import PivotConfig
    from pivotrl.gps.layout import ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Assets:
    policy_path: Path
    genrm_path: Path
    train_path: Path
    val_path: Path
    bootstrap_info: dict[str, Any] = field(default_factory=dict)
    """`cached`, `seconds`, the bootstrapped policy's greedy accuracy, the folders served and the
    GenRM's judge quality on the policy's samples; empty for user checkpoints."""

    def tokenizers(self, cfg: PivotConfig) -> tuple[PreTrainedTokenizerBase, PreTrainedTokenizerBase]:
        """(policy, GenRM) tokenizers, each its own model's (`models.<role>.chat`), with a chat template."""
        from pivotrl.rl.chat import load_chat_tokenizer

        return (load_chat_tokenizer(self.policy_path, cfg.models.policy.chat, "models.policy.chat"),
                load_chat_tokenizer(self.genrm_path, cfg.models.genrm.chat, "models.genrm.chat"))


def _existing(path: str | None, key: str, what: str) -> Path:
    if not path:
        raise ConfigError(key, f"the path of {what}", path)
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(key, f"an existing path of {what} (nothing at {p})", path)
    return p


def load_assets(cfg: PivotConfig, progress: bool = False) -> Assets:
    """The checkpoints and data of run `cfg` (rules in the module docstring)."""
    m, d = cfg.models, cfg.data
    user = {"policy": m.policy.hf_path, "genrm": m.genrm.hf_path}
    if any(user.values()):
        for role, path in user.items():
            if not path:
                other = "genrm" if role == "policy" else "policy"
                raise ConfigError("hf_path", f"a checkpoint too: models.{other}.hf_path is set, and a "
                                  "tiny model is never mixed in silently", path, f"models.{role}")
        from pivotrl.models.resolve import resolve_checkpoint  # a folder or the local HF cache, never downloads

        ck = {role: resolve_checkpoint(user[role], f"models.{role}.hf_path",
                                       need_chat_template=getattr(m, role).chat.chat_template is None)
              for role in ("policy", "genrm")}
        check_fit(cfg, ck["policy"].spec, ck["genrm"].spec)
        policy, genrm = ck["policy"].path, ck["genrm"].path
        train = _existing(d.train_path, "data.train_path", "a verl-format train parquet (real checkpoints "
                          "need real data)")
        val = _existing(d.val_path, "data.val_path", "a verl-format validation parquet")
        return Assets(policy, genrm, train, val)
    from pivotrl.models.bootstrap import bootstrap

    t0 = time.perf_counter()
    res = bootstrap(m.bootstrap, d, progress=progress)
    info = {"cached": res.cached, "seconds": time.perf_counter() - t0,
            "policy_val_accuracy_greedy": res.report.get("policy_val_accuracy_greedy"),
            "policy_path": str(res.policy_path), "genrm_path": str(res.genrm_path),
            "genrm_on_policy_samples": res.report.get("genrm_on_policy_samples")}
    train = _existing(d.train_path, "data.train_path", "a train parquet") if d.train_path else res.train_path
    val = _existing(d.val_path, "data.val_path", "a validation parquet") if d.val_path else res.val_path
    return Assets(res.policy_path, res.genrm_path, train, val, info)


def preflight(cfg: PivotConfig) -> None:
    """Before a real run writes anything: the user's checkpoints exist, are complete, have chat
    templates, split under their `tp`, and fit GPS memory (no-op for the bootstrapped tiny models,
    which `load_assets` builds)."""
    m = cfg.models
    if m.policy.hf_path and m.genrm.hf_path:
        from pivotrl.models.resolve import resolve_checkpoint

        ck = {role: resolve_checkpoint(getattr(m, role).hf_path, f"models.{role}.hf_path",
                                       need_chat_template=getattr(m, role).chat.chat_template is None)
              for role in ("policy", "genrm")}
        check_fit(cfg, ck["policy"].spec, ck["genrm"].spec)
        check_trainer_fits(cfg, ck["policy"].config, m.policy.name)


def device_memory_bytes(cfg: PivotConfig) -> int | None:
    """Memory of one real device, bytes (the one definition, `cluster.device_memory_bytes`): the
    setting, else the GPU this process sees (device 0), else None (no GPU here: a Ray driver on a
    CPU head). Never the simulator's `cluster.hardware.hbm_bytes`."""
    if cfg.cluster.device_memory_bytes is not None:
        return int(cfg.cluster.device_memory_bytes)
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return None


def check_trainer_fits(cfg: PivotConfig, hf_config: dict, name: str) -> None:
    """On GPUs: one training rank of the policy on its home set must fit a device's memory
    (`device_memory_bytes`) with the engines asleep (`engines.memory.check_fits`, issue 10's
    arithmetic), else stop at start naming the model, the devices and the memory. CPU devices
    share host memory: not checked; nor is a GPU run whose driver sees no GPU and has no
    `cluster.device_memory_bytes` (a warning says so)."""
    from pivotrl.config.resolve import resolve
    from pivotrl.trainer.memory import ModelShape, check_fits

    r = resolve(cfg)
    if r.accelerator != "cuda":
        return
    memory = device_memory_bytes(cfg)
    if memory is None:
        log.warning("cluster.device_memory_bytes is null and this process sees no GPU: the check that a "
                    "training rank of %s fits its home devices is skipped (set cluster.device_memory_bytes "
                    "to run it at start)", name)
        return
    a, d = cfg.algo, cfg.data
    home = r.allocation.get("train") or r.num_devices
    tokens = a.micro_batch_tokens or a.micro_batch_size * (d.max_prompt_length + d.max_response_length)
    check_fits(ModelShape.from_hf_config(hf_config, name), devices=list(range(r.num_devices - home, r.num_devices)),
               device_memory_bytes=memory, micro_batch_tokens=int(tokens),
               response_tokens=int(d.max_response_length), param_dtype=a.param_dtype,
               gradient_checkpointing=a.gradient_checkpointing, logprob_chunk_tokens=a.logprob_chunk_tokens)


def check_fit(cfg: PivotConfig, policy_spec: ModelSpec, genrm_spec: ModelSpec) -> None:
    """Stop at start when a checkpoint cannot run as configured: a `tp` that does not split its
    tensors (names the field and the degrees that work), or GPS memory too small for both models
    (names both numbers)."""
    from pivotrl.config.resolve import resolve
    from pivotrl.gps.layout import check_tp
    from pivotrl.gps.placement import budget_bytes, check_budget

    r, gps = resolve(cfg), cfg.cluster.gps
    check_tp(policy_spec, r.tp["rollout"], "models.policy.tp")
    check_tp(genrm_spec, r.tp["reward"], "models.genrm.tp")
    nodes = max(1, -(-r.num_devices // r.node_size))
    check_budget(budget_bytes(gps), [("policy", policy_spec, False), ("genrm", genrm_spec, True)], nodes,
                 gps.write_headroom_versions, gps.alignment_bytes, where="cluster.gps.node_memory_budget_bytes")


def load_val_examples(path: Path, limit: int) -> list:
    """The first `limit` held-out examples (`data.val_size`); an empty or unreadable set is an
    error naming it, and so is a set with fewer rows than asked for."""
    from pivotrl.rl.data import load_examples

    try:
        val = load_examples(path, limit=limit)
    except Exception as e:
        raise ConfigError("val_path", f"a readable verl-format parquet ({type(e).__name__}: {e})", str(path),
                          "data") from None
    if not val:
        raise ConfigError("val_path", "a parquet with at least one row (held-out accuracy needs prompts)",
                          str(path), "data")
    if len(val) < limit:
        raise ConfigError("val_size", f"at most the {len(val)} held-out rows of {path}", limit, "data")
    return val
