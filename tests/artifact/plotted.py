"""What an artifact figure shows, read from the `<name>.series.json` that `artifact.common.
save_figure` writes beside every PNG (`plotted_series`): figure tests check the drawn data."""
from __future__ import annotations

import json
import math
from pathlib import Path


def series(png: Path) -> list[dict]:
    """Every axes of the figure: title, labels and its line/bar/scatter series."""
    return json.loads(Path(png).with_suffix(".series.json").read_text())


def values(png: Path) -> list[float]:
    """Every plotted y value, all axes."""
    return [y for ax in series(png) for s in ax["series"] for y in s["y"]]


def shows(png: Path, wanted: list[float], scales: tuple[float, ...] = (1.0, 1e-3)) -> bool:
    """Whether every value of `wanted` is drawn (at one of `scales`: figures often plot K tokens/s)."""
    drawn = values(png)
    assert drawn and all(math.isfinite(y) for y in drawn), "the figure draws no finite data"
    return any(all(any(math.isclose(w * k, y, rel_tol=1e-6, abs_tol=1e-9) for y in drawn) for w in wanted)
               for k in scales)
