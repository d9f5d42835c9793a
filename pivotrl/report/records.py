"""Reading one run folder: `config.yaml`, `metrics.jsonl`, `timeline.jsonl`, `summary.json`.

Owns the one reader of run folders, `RunRecords`, for every consumer (the report, the replay of a
real run in the simulator, `pivotrl.sim.replay`): only the files, never wandb or the runtimes, so
a folder copied from another machine reads the same.
- `RunRecords.read(run_dir)`: lenient. A run cut short (killed, crashed) may have no summary and a
  last line cut mid-write: the rows before it are kept and the cut line is counted in `skipped`.
  A file that is missing or damaged (a line other than the last not JSON, a summary or config
  that does not parse) is recorded in `problems`, and `unknown(file)` tells the report to show the
  figures read from it as unknown, never as the zeros an empty file would give (issue 22).
  Never lenient about a mixed folder: `metrics.jsonl` steps that repeat or go back (two runs
  wrote into one folder) raise `MixedRunFolder` naming the line.
- `RunRecords.load(run_dir)`: strict, for a finished run: all three record files and a summary.
- Per-step token totals and per-sample lengths (`sample_lengths` timeline records) for the replay.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pivotrl.report.timeline import Timeline, build_timeline


class MixedRunFolder(ValueError):
    """A run folder whose metrics hold more than one run (steps repeat or go back)."""


def check_step_order(path: Path) -> None:
    """`MixedRunFolder` naming the first line of `path` (metrics.jsonl) whose step is not above the
    previous line's."""
    prev: tuple[int, Any] | None = None
    for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            step = json.loads(line).get("step")
        except (json.JSONDecodeError, AttributeError):
            continue
        if not isinstance(step, (int, float)) or isinstance(step, bool):
            continue
        if prev is not None and step <= prev[1]:
            raise MixedRunFolder(
                f"{path} line {no}: step {step} after step {prev[1]} (line {prev[0]}): two runs wrote into this "
                f"folder, so its figures would mix them; report a folder that holds one run")
        prev = (no, step)


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[int], int]:
    """Rows of a jsonl file, the numbers of the lines that are not a JSON object, and the number of
    the last non-empty line."""
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    last = 0
    if not path.exists():
        return rows, bad, last
    for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        last = no
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad.append(no)
    return rows, bad, last


def _jsonl_problem(bad: list[int], last: int) -> tuple[str, bool] | None:
    """What is wrong with a jsonl file, and whether its figures are unknown: only the last line
    bad is a run cut mid-write (the rows before it are whole); any other bad line is damage."""
    if not bad:
        return None
    if bad == [last]:
        return f"line {last} cut mid-write (skipped)", False
    shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    return f"damaged: line(s) {shown} not JSON", True


@dataclass
class RunRecords:
    """The records of one run folder (see the module docstring)."""

    run_dir: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    timeline: list[dict[str, Any]]
    summary: dict[str, Any] | None
    skipped: int = 0
    problems: dict[str, tuple[str, bool]] = field(default_factory=dict)
    """File name -> (what is wrong, whether the figures read from it are unknown): a missing or
    damaged file. A run's missing summary is a partial run (`status`), not a problem."""
    _built: Timeline | None = field(default=None, repr=False)

    @classmethod
    def read(cls, run_dir: Path | str) -> "RunRecords":
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise FileNotFoundError(f"{run_dir} is not a run folder (no such directory)")
        if not (run_dir / "timeline.jsonl").exists() and not (run_dir / "metrics.jsonl").exists():
            raise FileNotFoundError(f"{run_dir} is not a run folder: it has no timeline.jsonl or metrics.jsonl")
        problems: dict[str, tuple[str, bool]] = {}
        config: dict[str, Any] = {}
        if (run_dir / "config.yaml").exists():
            import yaml

            try:
                got = yaml.safe_load((run_dir / "config.yaml").read_text(errors="replace"))
            except yaml.YAMLError:
                got = None
            if isinstance(got, dict):
                config = got
            else:
                problems["config.yaml"] = ("damaged: not a YAML mapping", True)
        else:
            problems["config.yaml"] = ("missing", True)
        if (run_dir / "metrics.jsonl").exists():
            check_step_order(run_dir / "metrics.jsonl")
        files: dict[str, list[dict[str, Any]]] = {}
        skipped = 0
        for name in ("metrics.jsonl", "timeline.jsonl"):
            files[name], bad, last = read_jsonl(run_dir / name)
            skipped += len(bad)
            problem = _jsonl_problem(bad, last) if (run_dir / name).exists() else ("missing", True)
            if problem is not None:
                problems[name] = problem
        summary = None
        if (run_dir / "summary.json").exists():
            try:
                summary = json.loads((run_dir / "summary.json").read_text(errors="replace"))
            except json.JSONDecodeError:
                summary = None
            if not isinstance(summary, dict):
                summary = None
                skipped += 1
                problems["summary.json"] = ("damaged: not a JSON object", True)
        return cls(run_dir, config, files["metrics.jsonl"], files["timeline.jsonl"], summary, skipped, problems)

    def unknown(self, *names: str) -> str | None:
        """`? (<file> <what>)` when a figure read from any of `names` cannot be trusted (its file is
        missing or damaged), else None."""
        for name in names:
            what, unknown = self.problems.get(name, ("", False))
            if unknown:
                return f"? ({name} {what.split(':')[0]})"
        return None

    @classmethod
    def load(cls, run_dir: Path | str) -> "RunRecords":
        """`read` for a finished run: all three record files and a summary."""
        run_dir = Path(run_dir)
        for name in ("summary.json", "metrics.jsonl", "timeline.jsonl"):
            if not (run_dir / name).exists():
                raise FileNotFoundError(f"{run_dir} has no {name}: not a finished run folder")
        rec = cls.read(run_dir)
        if rec.summary is None:
            raise ValueError(f"{run_dir}/summary.json is not JSON: not a finished run folder")
        return rec

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The metrics rows ordered by step."""
        return sorted(self.metrics, key=lambda r: r["step"])

    @property
    def P(self) -> int:
        """Prompts per step (from the summary)."""
        return int((self.summary or {})["prompts_per_step"])

    @property
    def G(self) -> int:
        """Samples per prompt (from the summary)."""
        return int((self.summary or {})["group_size"])

    def step_totals(self) -> list[dict[str, float]]:
        """Per-batch token totals, ordered by batch: prompt, response and GenRM-output tokens."""
        out = []
        for r in sorted(self.metrics, key=lambda r: r["batch"]):
            n = r["samples"]
            resp = r["response_tokens_mean"] * n
            gen = r["genrm_tokens_mean"] * n
            out.append({"prompt_tokens": r["policy_tokens"] - resp, "response_tokens": resp, "genrm_tokens": gen})
        return out

    def sample_lengths(self) -> dict[int, dict[int, tuple[int, int, int]]]:
        """Per-sample `(prompt, response, genrm_output)` tokens from `sample_lengths` timeline
        records, batch -> sample id -> lengths.

        The record this reads (one per batch, written when the batch is trained by
        `pivotrl.runtime.stats.RealStats.step_fields`): `{"kind": "sample_lengths",
        "batch": b, "samples": [[sample_id, prompt_tokens, response_tokens, genrm_output_tokens],
        ...]}` over the batch's P*G trained samples."""
        out: dict[int, dict[int, tuple[int, int, int]]] = {}
        for x in self.timeline:
            if x.get("kind") == "sample_lengths":
                out[int(x["batch"])] = {int(sid): (int(p), int(r), int(g)) for sid, p, r, g in x["samples"]}
        return out

    def shared_judgements(self) -> dict[int, int]:
        """Sample id -> the sample whose judgement it shared (its judge prompt repeated that one's:
        `shared` of the `sample_lengths` records; none in runs before it was recorded)."""
        return {int(sid): int(lead) for x in self.timeline if x.get("kind") == "sample_lengths"
                for sid, lead in x.get("shared", [])}

    @property
    def per_sample(self) -> bool:
        """True if every batch has its per-sample lengths recorded (runs since the local runtime
        writes `sample_lengths`; older folders have per-step totals only)."""
        per = self.sample_lengths()
        return bool(per) and all(len(per.get(int(r["batch"]), {})) == self.P * self.G for r in self.metrics)

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def num_devices(self) -> int:
        if self.summary and isinstance(self.summary.get("devices"), int):
            return int(self.summary["devices"])
        n = (self.config.get("cluster") or {}).get("num_devices") or (self.config.get("models") or {}).get("devices")
        if isinstance(n, int) and n > 0:
            return n
        # neither: count the devices the slot ids name
        from pivotrl.report.timeline import slot_devices

        top = -1
        for r in self.timeline:
            for s in (r.get("up") or []) + (r.get("down") or []) if r.get("kind") == "shift" else []:
                top = max(top, max(slot_devices(s)[1]))
        return top + 1

    def label(self) -> str:
        """`deploy/models/cluster` of the run (from the summary, else the config)."""
        s = self.summary or {}
        c = self.config
        mode = s.get("deploy") or (c.get("deploy") or {}).get("mode", "?")
        models = s.get("models") or (c.get("models") or {}).get("name", "?")
        cluster = s.get("cluster") or (c.get("cluster") or {}).get("kind", "?")
        return f"{mode}/{models}/{cluster}"

    def timeline_view(self) -> Timeline:
        if self._built is None:
            self._built = build_timeline(self.timeline, self.metrics, self.num_devices)
        return self._built
