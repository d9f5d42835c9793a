"""Resolve a model's `hf_path` to a complete local checkpoint folder, or stop saying how to get one.

Owns: turning `models.policy.hf_path` / `models.genrm.hf_path` into a folder (a local path, or a Hub
id found in the local Hugging Face cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`~/.cache/huggingface/hub`, read as `models--{org}--{name}/snapshots/{refs/main}`), and checking it is
complete and usable before anything starts: config.json, an architecture GPS has rules for, every
weight file and tensor its config implies (headers only, nothing is loaded), and a tokenizer with a
chat template when one is needed. A frozen judge (`gps_rules=False`) never goes through GPS: its
engine loads its folder with its own loader (from a host-memory copy, `gps.node_import.host_copy`),
so any architecture the installed transformers knows is accepted; its weight files must still be
all there, and their size is what the copy will take. Nothing is ever downloaded, and nothing falls back to the tiny
models: every failure is a `CheckpointError` naming the config key, the paths tried and the
`hf download` command.

Public API:
    resolve_checkpoint(hf_path, where, need_chat_template=True, cache_dir=None) -> ResolvedCheckpoint
    hf_cache_dir() -> Path
    download_command(repo_id) -> str
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivotrl.gps.checkpoint import checkpoint_spec, read_config, safetensors_header, weight_files
from pivotrl.gps.families import CheckpointMismatchError, UnsupportedArchitectureError
from pivotrl.gps.layout import ModelSpec


class CheckpointError(ValueError):
    """A model's hf_path cannot be used: missing, partial, unsupported, or without a chat template."""


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """A complete local checkpoint: where it is, its config.json, and its GPS spec (dtypes as
    stored; None for a judge that GPS never holds)."""

    path: Path
    config: dict[str, Any]
    spec: ModelSpec | None
    weight_bytes: int = 0
    """Bytes of its weight files."""

    @property
    def nbytes(self) -> int:
        """Bytes of the weights as stored (what GPS, or a judge's host copy, holds of one version)."""
        return self.spec.nbytes if self.spec is not None else self.weight_bytes


def hf_cache_dir() -> Path:
    """The local Hugging Face hub cache (the environment variables huggingface_hub reads)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def download_command(repo_id: str) -> str:
    return f"hf download {repo_id}   (older huggingface_hub: huggingface-cli download {repo_id})"


def _looks_like_repo_id(s: str) -> bool:
    parts = s.split("/")
    return len(parts) == 2 and all(parts) and not s.startswith((".", "~")) and " " not in s


def _cached_snapshot(repo_id: str, cache: Path) -> tuple[Path | None, Path]:
    """(snapshot folder or None, the repo folder looked in)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    snaps = repo / "snapshots"
    if ref.is_file() and (snaps / ref.read_text().strip()).is_dir():
        return snaps / ref.read_text().strip(), repo
    if snaps.is_dir():  # no refs/main (e.g. fetched by revision): the newest snapshot
        found = sorted((p for p in snaps.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1], repo
    return None, repo


def _has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    tc = path / "tokenizer_config.json"
    return tc.is_file() and bool(json.loads(tc.read_text()).get("chat_template"))


def _judge_config(path: Path, cfg: dict[str, Any]) -> None:
    """A judge's architecture must be one the installed transformers knows (its engine builds it)."""
    from transformers import CONFIG_MAPPING

    mtype = cfg.get("model_type")
    if mtype not in CONFIG_MAPPING:
        raise UnsupportedArchitectureError(f"{path}: model_type {mtype!r} (architectures {cfg.get('architectures')}) "
                                           "is unknown to the installed transformers")


def resolve_checkpoint(hf_path: str, where: str = "models.policy.hf_path", *, need_chat_template: bool = True,
                       cache_dir: str | Path | None = None, gps_rules: bool = True) -> ResolvedCheckpoint:
    """The complete local checkpoint `hf_path` names (module docstring); CheckpointError otherwise.
    `gps_rules`: the model goes through GPS (the policy), so its architecture needs GPS partition
    rules; False for a frozen judge (module docstring)."""
    if not isinstance(hf_path, str) or not hf_path.strip():
        raise CheckpointError(f"{where} must name a checkpoint folder or Hugging Face Hub id, got {hf_path!r}")
    local = Path(hf_path).expanduser()
    repo_id = hf_path if _looks_like_repo_id(hf_path) and not local.exists() else None
    fix = (f"download it with: {download_command(repo_id)}" if repo_id
           else f"point {where} at a complete Hugging Face model folder")
    if repo_id is None:
        if not local.is_dir():
            raise CheckpointError(f"{where}={hf_path!r}: no such folder ({local.resolve()}); {fix}")
        path = local
    else:
        cache = Path(cache_dir) if cache_dir is not None else hf_cache_dir()
        snap, looked = _cached_snapshot(repo_id, cache)
        if snap is None:
            raise CheckpointError(f"{where}={hf_path!r}: not a local folder, and not in the Hugging Face cache "
                                  f"(looked in {looked}); {fix}. Nothing is downloaded at run time.")
        path = snap
    try:
        cfg = read_config(path)
        files = weight_files(path)
        for f in files:
            safetensors_header(f)  # whole headers: a truncated download fails here, not in an engine
        if gps_rules:
            spec = checkpoint_spec(path, cfg)
        else:
            spec = None
            _judge_config(path, cfg)
    except UnsupportedArchitectureError as e:
        raise CheckpointError(f"{where}={hf_path!r}: {e}") from None
    except (FileNotFoundError, CheckpointMismatchError) as e:
        raise CheckpointError(f"{where}={hf_path!r}: checkpoint at {path} is missing or partial: {e}; {fix}") from None
    if need_chat_template and not _has_chat_template(path):
        raise CheckpointError(f"{where}={hf_path!r}: the tokenizer at {path} has no chat template (neither "
                              "chat_template.jinja nor tokenizer_config.json 'chat_template'); set the model's "
                              "chat_template field or use an instruct/chat checkpoint")
    return ResolvedCheckpoint(path=path, config=cfg, spec=spec, weight_bytes=sum(f.stat().st_size for f in files))
