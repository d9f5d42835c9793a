"""`python -m pivotrl.report RUN_DIR [RUN_DIR ...] [--out DIR]`.

Prints each run's closing table (several runs: side by side), redraws each run's `timeline.png`
and rewrites its `trace.json` (the Perfetto trace; into its folder, or `--out/<folder>_timeline.png`
and `--out/<folder>_trace.json`), and, when runs have an accuracy per step,
draws `accuracy.png` (per step and per second, paper Fig. 15) into `--out` (default: the only
run's folder, or the current directory for several). Reads only the run folders' files.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from pivotrl.report import TIMELINE_PNG, write_timeline
    from pivotrl.report.accuracy import accuracy_curves, draw_accuracy
    from pivotrl.report.records import MixedRunFolder, RunRecords
    from pivotrl.report.table import closing_rows, format_table
    from pivotrl.report.trace import TRACE_JSON, write_trace

    ap = argparse.ArgumentParser(prog="python -m pivotrl.report", description=__doc__.split("\n\n")[1])
    ap.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    ap.add_argument("--out", type=Path, default=None, help="folder for the pictures (default: see above)")
    ap.add_argument("--no-plots", action="store_true", help="print the table only")
    args = ap.parse_args(argv)
    try:
        runs = [RunRecords.read(d) for d in args.run_dirs]
    except (FileNotFoundError, MixedRunFolder) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table([closing_rows(r) for r in runs]))
    for r in runs:
        for name, (what, unknown) in r.problems.items():
            print(f"note: {r.run_dir / name}: {what}" + ("; the figures read from it are shown as unknown (?)"
                                                          if unknown else ""))
    if args.no_plots:
        return 0
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    for r in runs:
        if r.unknown("timeline.jsonl"):
            print(f"timeline: not drawn for {r.run_dir}: timeline.jsonl {r.problems['timeline.jsonl'][0]}")
            continue
        dest = args.out / f"{r.name}_{TIMELINE_PNG}" if args.out is not None else r.run_dir / TIMELINE_PNG
        print(f"timeline: {write_timeline(r.run_dir, dest)}")
        dest = args.out / f"{r.name}_{TRACE_JSON}" if args.out is not None else r.run_dir / TRACE_JSON
        print(f"trace: {write_trace(r.run_dir, dest)} (open it in ui.perfetto.dev)")
    curves = accuracy_curves(runs)
    if curves:
        out = args.out or (runs[0].run_dir if len(runs) == 1 else Path("."))
        print(f"accuracy: {draw_accuracy(curves, out / 'accuracy.png')}")
    else:
        print("accuracy: none of these runs records an accuracy per step (cluster=sim runs do not)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
