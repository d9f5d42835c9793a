"""Synthetic verl-format data: determinism, row format, parquet round trip, and loader errors."""
from __future__ import annotations

import pandas as pd
import pytest

from pivotrl.config.rl import DataConfig
from pivotrl.rl.data import DATA_SOURCE, generate_rows, load_examples, write_parquet, write_synthetic_dataset
from pivotrl.rl.rewards import compute_score


def test_rows_are_verl_format_and_solutions_are_right() -> None:
    rows = generate_rows(50, "train", seed=3, max_operand=9)
    for i, r in enumerate(rows):
        assert set(r) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert r["data_source"] == DATA_SOURCE and r["ability"] == "math"
        assert r["prompt"][0]["role"] == "user" and isinstance(r["prompt"][0]["content"], str)
        assert r["reward_model"]["style"] == "rule"
        gt = r["reward_model"]["ground_truth"]
        assert isinstance(gt, str) and int(gt) >= 0
        x = r["extra_info"]
        assert x["split"] == "train" and x["index"] == i
        assert 0 <= x["a"] <= 9 and 0 <= x["b"] <= 9
        assert int(gt) == (x["a"] + x["b"] if x["op"] == "+" else x["a"] - x["b"])
        assert str(x["a"]) in r["prompt"][0]["content"] and str(x["b"]) in r["prompt"][0]["content"]
        assert compute_score(r["data_source"], x["solution"], gt, x) == 1.0


def test_seeded_and_splits_differ() -> None:
    assert generate_rows(20, "train", 1) == generate_rows(20, "train", 1)
    assert generate_rows(20, "train", 1) != generate_rows(20, "train", 2)
    assert generate_rows(20, "train", 1) != generate_rows(20, "val", 1)


def test_ops_restrict_problems() -> None:
    assert {r["extra_info"]["op"] for r in generate_rows(40, "train", 0, ops=("-",))} == {"-"}
    with pytest.raises(ValueError, match=r"ops \['\*'\]"):
        generate_rows(1, "train", 0, ops=("*",))
    with pytest.raises(ValueError, match="min_operand"):
        generate_rows(1, "train", 0, min_operand=5, max_operand=2)


def test_parquet_round_trip(tmp_path) -> None:
    train, val = write_synthetic_dataset(tmp_path, 30, 10, seed=0)
    ex = load_examples(train)
    rows = generate_rows(30, "train", 0)
    assert len(ex) == 30 and len(load_examples(val)) == 10
    assert ex[4].prompt == rows[4]["prompt"]
    assert ex[4].ground_truth == rows[4]["reward_model"]["ground_truth"]
    assert ex[4].extra_info["index"] == 4
    assert len(load_examples(train, limit=7)) == 7
    assert not list(tmp_path.glob(".*tmp"))  # atomic writes leave no tmp files


def _write(tmp_path, rows: list[dict]):
    p = tmp_path / "user.parquet"
    pd.DataFrame(rows).to_parquet(p, index=False)
    return p


def _good_row() -> dict:
    return {"data_source": "user/math", "prompt": [{"role": "user", "content": "1+1?"}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": "2"},
            "extra_info": {"split": "train", "index": 0}}


def test_user_parquet_minimal_columns(tmp_path) -> None:
    row = _good_row()
    del row["ability"], row["extra_info"]
    ex = load_examples(_write(tmp_path, [row]))
    assert ex[0].ground_truth == "2" and ex[0].data_source == "user/math" and ex[0].extra_info == {}


@pytest.mark.parametrize("drop", ["data_source", "prompt", "reward_model"])
def test_missing_column_is_named(tmp_path, drop: str) -> None:
    row = _good_row()
    del row[drop]
    with pytest.raises(ValueError, match=f"missing column.*'{drop}'"):
        load_examples(_write(tmp_path, [row]))


@pytest.mark.parametrize("column,value,match", [
    ("prompt", "just a string", "column 'prompt'"),
    ("prompt", [{"role": "user"}], "column 'prompt'"),
    ("reward_model", {"style": "rule"}, "column 'reward_model'"),
    ("reward_model", {"ground_truth": 2.5}, r"reward_model.ground_truth' must be str"),
    ("data_source", 7, "column 'data_source' must be str"),
    ("ability", 3, "column 'ability' must be str"),
])
def test_ill_typed_column_is_named(tmp_path, column: str, value, match: str) -> None:
    row = _good_row()
    row[column] = value
    with pytest.raises(ValueError, match=match):
        load_examples(_write(tmp_path, [row]))


def test_missing_or_unreadable_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_examples(tmp_path / "nope.parquet")
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(ValueError, match="not readable parquet"):
        load_examples(bad)


@pytest.mark.parametrize("kwargs,match", [
    ({"num_train": 0}, "^num_train="),
    ({"min_operand": 3, "max_operand": 1}, "^min_operand="),
    ({"ops": ("/",)}, "^ops="),
])
def test_data_config_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):  # relative to DataConfig; the loader adds `data.`
        DataConfig(**kwargs)


@pytest.mark.parametrize("gt", ["", "   ", "\n"])
def test_an_empty_ground_truth_is_refused_naming_the_row(tmp_path, gt: str) -> None:
    """Issue 22: an empty ground truth was accepted; that prompt could never be rewarded."""
    bad = _good_row()
    bad["reward_model"] = {"style": "rule", "ground_truth": gt}
    p = _write(tmp_path, [_good_row(), _good_row(), bad])
    with pytest.raises(ValueError, match=rf"{p}: row 2: column 'reward_model.ground_truth' is empty .*never be rewarded"):
        load_examples(p)
