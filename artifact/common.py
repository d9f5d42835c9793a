"""Shared helpers for the artifact: compose a config, run it in-process, collect results.

Each artifact item (`artifact/<item>/run.py`) builds a list of override lists, runs each through
`pivotrl.run.run` (the same path as `python train.py`), reads the run folders' files, and writes a
CSV and a PNG under `artifact/results/<item>/`. Plots read the files, never wandb.
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "artifact" / "results"
MODEL_GROUPS = ["qwen1.5b_glm9b", "qwen7b_qwen30b", "qwen32b_qwen30b", "qwen72b_qwen122b"]
MODES = ["colocated", "disaggregated", "rr_colocated", "pivot"]


def run_one(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """Run one config into `run_dir` (reusing a finished run there) and return its summary."""
    from pivotrl.config import compose_config
    from pivotrl.run import run

    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        return json.loads(summary_path.read_text())
    cfg = compose_config(overrides + ["logging.wandb_mode=disabled", "logging.progress=false"])
    run(cfg, run_dir)
    return json.loads(summary_path.read_text())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_csv(rows: Iterable[dict[str, Any]], path: Path) -> Path:
    rows = list(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def item_parser(item: str, doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--quick", action="store_true", help="kick-the-tires variant: small and fast")
    p.add_argument("--out", type=Path, default=RESULTS / item, help="results folder")
    p.add_argument("--plot-only", action="store_true", help="re-plot from an existing CSV")
    return p


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def plotted_series(fig) -> list[dict]:
    """What `fig` shows, as data: per axes its title and labels, and every line (x, y), bar group
    (x, heights) and scatter (x, y) with its label. Tests compare these with the CSV the figure
    was drawn from (a figure test checks what is drawn, not the PNG's bytes)."""
    out = []
    for ax in fig.axes:
        series = []
        for ln in ax.get_lines():
            series.append({"kind": "line", "label": str(ln.get_label()),
                           "x": [float(v) for v in ln.get_xdata()], "y": [float(v) for v in ln.get_ydata()]})
        for bars in ax.containers:
            rects = [r for r in bars if hasattr(r, "get_height")]
            series.append({"kind": "bar", "label": str(bars.get_label()),
                           "x": [float(r.get_x() + r.get_width() / 2) for r in rects],
                           "y": [float(r.get_height()) for r in rects]})
        for col in ax.collections:
            offs = col.get_offsets()
            if len(offs):
                series.append({"kind": "scatter", "label": str(col.get_label()),
                               "x": [float(p[0]) for p in offs], "y": [float(p[1]) for p in offs]})
        out.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                    "series": series})
    return out


def save_figure(fig, png_path: Path, dpi: int = 120) -> Path:
    """Lay out, write and close `fig` (items draw several figures in one process); beside the PNG,
    `<name>.series.json` holds what it shows (`plotted_series`)."""
    fig.tight_layout()
    fig.savefig(png_path, dpi=dpi)
    Path(png_path).with_suffix(".series.json").write_text(json.dumps(plotted_series(fig), indent=1))
    plt().close(fig)
    print(f"wrote {png_path}")
    return png_path


def item_main(item: str, doc: str, collect, plot, argv=None) -> int:
    """The usual item entry: `collect(out, quick) -> rows` into `<item>.csv` (unless
    --plot-only), then `plot(csv, png)`."""
    args = item_parser(item, doc).parse_args(argv)
    csv_path = args.out / f"{item}.csv"
    if not args.plot_only:
        write_csv(collect(args.out, args.quick), csv_path)
    plot(csv_path, args.out / f"{item}.png")
    return 0
