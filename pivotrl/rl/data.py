"""RL prompts: the synthetic arithmetic word problems and the loader for verl-format parquet.

Owns: the seeded problem generator, writing train/validation parquet in verl's row format, and
loading + validating a user's parquet in the same format. Knows nothing about models or rewards
(the reference solution text lives here only because SFT bootstrap needs it).

verl row format (one row per prompt):
    data_source   str                       e.g. "pivotrl/arith"; picks the reward function
    prompt        list[{"role", "content"}]  chat messages (str role, str content)
    ability       str                       e.g. "math" (optional on load)
    reward_model  {"style": "rule", "ground_truth": str}
    extra_info    {"split": str, "index": int, ...}   (optional on load)

Synthetic task: small-number addition/subtraction phrased as short word problems, so a tiny
character-level model can learn it. The reference response is `"{a}{op}{b}={c}\\n#### {c}"`; the
final answer follows `####`, as in verl's GSM8K format (`pivotrl.rl.rewards` extracts it).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

DATA_SOURCE = "pivotrl/arith"

_NAMES = ("Tom", "Ann", "Bob", "Eva", "Sam", "Mia", "Leo", "Zoe", "Max", "Ivy", "Ben", "Amy")
_ITEMS = ("apples", "pens", "coins", "cards", "books", "eggs", "cups", "shells", "stamps", "toys")
_ADD = (
    "{n} has {a} {i}. {n} gets {b} more. How many {i} now?",
    "{n} had {a} {i} and found {b} more. How many {i}?",
    "{n} buys {a} {i}, then {b} more. How many {i} in all?",
)
_SUB = (
    "{n} has {a} {i}. {n} gives away {b}. How many {i} now?",
    "{n} had {a} {i} and lost {b}. How many {i} left?",
    "{n} buys {a} {i}, then eats {b}. How many {i} left?",
)
_OPS = ("+", "-")


@dataclass
class Example:
    """One RL prompt as the loop sees it (a parsed parquet row)."""

    prompt: list[dict[str, str]]
    ground_truth: str
    data_source: str = DATA_SOURCE
    ability: str = "math"
    extra_info: dict[str, Any] = field(default_factory=dict)


def reference_response(a: int, op: str, b: int) -> str:
    """The response the SFT bootstrap teaches: the equation, then the final answer after `####`."""
    c = a + b if op == "+" else a - b
    return f"{a}{op}{b}={c}\n#### {c}"


def make_problem(rng: random.Random, min_operand: int, max_operand: int, ops: tuple[str, ...]) -> dict:
    """One random problem: operands, operator, word text and integer answer."""
    op = rng.choice(ops)
    a = rng.randint(min_operand, max_operand)
    b = rng.randint(min_operand, max_operand)
    if op == "-" and b > a:
        a, b = b, a  # keep answers non-negative: "gives away more than it has" reads as nonsense
    template = rng.choice(_ADD if op == "+" else _SUB)
    text = template.format(n=rng.choice(_NAMES), i=rng.choice(_ITEMS), a=a, b=b)
    answer = a + b if op == "+" else a - b
    return {"a": a, "b": b, "op": op, "text": text, "answer": answer}


def generate_rows(n: int, split: str, seed: int, min_operand: int = 0, max_operand: int = 20,
                  ops: tuple[str, ...] = _OPS) -> list[dict]:
    """`n` verl-format rows, deterministic in (`split`, `seed`): different splits use different
    random streams so train and validation problems are drawn independently."""
    if n < 0:
        raise ValueError(f"number of rows must be >= 0, got {n}")
    if min_operand < 0 or max_operand < min_operand:
        raise ValueError(f"need 0 <= min_operand <= max_operand, got {min_operand}, {max_operand}")
    bad = [o for o in ops if o not in _OPS]
    if bad or not ops:
        raise ValueError(f"ops {list(ops)!r}: each must be one of {list(_OPS)}")
    rng = random.Random(f"{split}:{seed}")
    rows = []
    for index in range(n):
        p = make_problem(rng, min_operand, max_operand, tuple(ops))
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": p["text"]}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(p["answer"])},
            "extra_info": {"split": split, "index": index, "a": p["a"], "b": p["b"], "op": p["op"],
                           "solution": reference_response(p["a"], p["op"], p["b"])},
        })
    return rows


def write_parquet(rows: list[dict], path: str | Path) -> Path:
    """Write rows to parquet atomically (tmp file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


def write_synthetic_dataset(out_dir: str | Path, num_train: int, num_val: int, seed: int,
                            min_operand: int = 0, max_operand: int = 20,
                            ops: tuple[str, ...] = _OPS) -> tuple[Path, Path]:
    """Write `train.parquet` and `val.parquet` under `out_dir`; return both paths."""
    out_dir = Path(out_dir)
    train = write_parquet(generate_rows(num_train, "train", seed, min_operand, max_operand, ops),
                          out_dir / "train.parquet")
    val = write_parquet(generate_rows(num_val, "val", seed, min_operand, max_operand, ops),
                        out_dir / "val.parquet")
    return train, val


def _as_list(value: Any) -> Any:
    # pyarrow returns list columns as numpy arrays; normalise to a Python list.
    return list(value) if hasattr(value, "tolist") and not isinstance(value, (str, dict)) else value


def _check_row(i: int, row: dict, path: str) -> Example:
    where = f"{path}: row {i}"
    prompt = _as_list(row["prompt"])
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(f"{where}: column 'prompt' must be a non-empty list of chat messages "
                         f"{{'role': str, 'content': str}}, got {type(prompt).__name__}")
    msgs = []
    for m in prompt:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: column 'prompt' must hold messages {{'role': str, 'content': str}}, "
                             f"got {m!r}")
        msgs.append({"role": m["role"], "content": m["content"]})
    rm = row["reward_model"]
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        raise ValueError(f"{where}: column 'reward_model' must be a dict with key 'ground_truth', got {rm!r}")
    gt = rm["ground_truth"]
    if isinstance(gt, bool) or not isinstance(gt, (str, int)):
        raise ValueError(f"{where}: column 'reward_model.ground_truth' must be str (or int), "
                         f"got {type(gt).__name__}")
    if not str(gt).strip():
        # a prompt no response can match is never rewarded: it would only dilute the batch
        raise ValueError(f"{where}: column 'reward_model.ground_truth' is empty ({gt!r}): no response can "
                         "match it, so the prompt could never be rewarded; fill it in or drop the row")
    ds = row["data_source"]
    if not isinstance(ds, str):
        raise ValueError(f"{where}: column 'data_source' must be str, got {type(ds).__name__}")
    ability = row.get("ability", "math")
    if not isinstance(ability, str):
        raise ValueError(f"{where}: column 'ability' must be str, got {type(ability).__name__}")
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"{where}: column 'extra_info' must be a dict, got {type(extra).__name__}")
    return Example(prompt=msgs, ground_truth=str(gt), data_source=ds, ability=ability, extra_info=dict(extra))


REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
OPTIONAL_COLUMNS = ("ability", "extra_info")


def load_examples(path: str | Path, limit: int | None = None) -> list[Example]:
    """Load a verl-format parquet file; raise ValueError naming any missing or ill-typed column."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data file {str(path)!r} does not exist")
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - re-raised with the file named
        raise ValueError(f"data file {str(path)!r} is not readable parquet: {e}") from e
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"data file {str(path)!r} is missing column(s) {missing}; verl format needs "
                         f"{list(REQUIRED_COLUMNS)} (optional: {list(OPTIONAL_COLUMNS)}), "
                         f"found {list(df.columns)}")
    if limit is not None:
        df = df.iloc[:limit]
    return [_check_row(i, row, str(path)) for i, row in enumerate(df.to_dict("records"))]
