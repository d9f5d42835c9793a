"""The tiny bootstrap as it ships with the package, and the command that rebuilds it.

Owns `pivotrl/models/bootstrap_shipped/`: the default dense cache entry (`bootstrap.cache_key` of
the default `models.bootstrap` and `data`: the SFT policy and GenRM, the synthetic train/val
parquet files, the build's `report.json`) with the derived stages the project's own runs and tests
use (`SHIPPED_STAGES`: the Qwen3-MoE GenRM in bf16 beside the bf16 policy, which `cluster=ray` on
CPU runs), laid out exactly as in the user cache (`<key>/`, `<key>/<stage>-<stage key>/`). A cache
entry that is missing and has a shipped twin is copied from here instead of trained
(`sft.cached_entry(..., seed=twin(...))`), so a fresh machine runs `python train.py` without minutes
of SFT. Anything else (another recipe, seed or size) is built as before.

Why ship it: the default bootstrap is ~5.5 minutes of single-threaded SFT on a quiet 2-core
machine (more on a busy one), more than the RL run it prepares; the shipped folders are ~12 MB. The
recipe is seeded, so a rebuild with the same code on the same kind of host reproduces them
(`tests/models/test_shipped.py`: the rebuilt entry's report lands in the shipped one's band; a
recipe change that moves the default key without a re-ship fails the fast test).

Rebuild (after changing the bootstrap recipe or its defaults):
    python -m pivotrl.models.bootstrap --ship
which builds every shipped stage into a fresh temporary cache (`bootstrap.ship`: never copied from
here) and replaces this folder with the result (`write_shipped`).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

#: The shipped entries, mirroring `<cache>/bootstrap/`.
SHIPPED = Path(__file__).resolve().with_name("bootstrap_shipped")

#: `models.bootstrap` fields of the derived stages shipped beside the default dense entry (each a
#: `BootstrapConfig` override). The fp32 MoE stage they are cast from is not shipped (13 MB): a
#: stage that only feeds a shipped one is skipped (`bootstrap_derived.derive`).
SHIPPED_STAGES: tuple[dict, ...] = ({"genrm_arch": "qwen3_moe", "dtype": "bfloat16"},)


def twin(entry: Path, cache_root: Path) -> Path | None:
    """The shipped folder of cache entry `entry` (a folder under `cache_root/bootstrap/`), or None."""
    try:
        rel = Path(entry).relative_to(Path(cache_root) / "bootstrap")
    except ValueError:
        return None
    path = SHIPPED / rel
    return path if (path / "report.json").is_file() else None


def write_shipped(entry: Path, stages: list[Path], out: Path = SHIPPED) -> None:
    """Make `out` hold exactly the dense cache entry `entry` (its own files and folders) and the
    stage folders `stages` inside it, as the cache lays them out; replaced atomically enough for a
    developer's tree (staged beside it, then renamed)."""
    staged = Path(tempfile.mkdtemp(prefix=".ship-", dir=out.parent))
    try:
        root = staged / entry.name
        root.mkdir()
        for item in entry.iterdir():  # the dense entry's own files, without its stage folders or locks
            if item.name.startswith("."):
                continue
            if item.is_file():
                shutil.copy2(item, root / item.name)
            elif not (item / "report.json").exists():
                shutil.copytree(item, root / item.name)
        for stage in stages:
            shutil.copytree(stage, root / stage.name)
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
