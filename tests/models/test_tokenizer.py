"""The character-level tokenizer: lossless round trip, chat template, HF folder loading, bad folders."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from pivotrl.models.tokenizer import (
    CHARACTERS,
    EOS_TOKEN,
    PAD_TOKEN,
    VOCAB_SIZE,
    build_tokenizer,
    load_tokenizer,
    save_tokenizer,
)


def test_round_trip_is_lossless_one_token_per_char() -> None:
    tok = build_tokenizer()
    text = "Tom has 12 apples.\n  He gives away 3! How many? #### 9 (a,b)=[x];{y}"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert len(tok) == VOCAB_SIZE
    assert all(len(tok.encode(c, add_special_tokens=False)) == 1 for c in CHARACTERS)


def test_unknown_char_maps_to_unk() -> None:
    tok = build_tokenizer()
    # Byte level: a 2-byte UTF-8 character is two unknown bytes.
    assert tok.encode("é", add_special_tokens=False) == [tok.unk_token_id] * 2


def test_model_folder_tokenizer_matches(tmp_path) -> None:
    """transformers 5 loads a qwen2 model folder's tokenizer as `Qwen2Tokenizer` whatever the saved
    class says; its ids must still equal ours (this once dropped every space and newline)."""
    from pivotrl.models.tiny import TinyModelConfig, create_tiny_model

    path = create_tiny_model(tmp_path / "m", TinyModelConfig(hidden_size=32, num_heads=2, num_kv_heads=1))
    loaded, ours = AutoTokenizer.from_pretrained(str(path)), build_tokenizer()
    for text in (CHARACTERS, "Tom has 12 apples.\n  He eats 3!  How many?\n\n#### 9", " lead", "a  b\n\nc"):
        ids = loaded.encode(text, add_special_tokens=False)
        assert ids == ours.encode(text, add_special_tokens=False)
        assert len(ids) == len(text) and loaded.decode(ids) == text
    msgs = [{"role": "user", "content": "Ann had 4 pens. How many?"}]
    assert (loaded.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
            == ours.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False))


def test_special_tokens_and_chat_template() -> None:
    tok = build_tokenizer()
    assert tok.pad_token == PAD_TOKEN and tok.eos_token == EOS_TOKEN
    assert tok.pad_token_id != tok.eos_token_id
    msgs = [{"role": "user", "content": "2+3?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|user|>2+3?<|eos|><|assistant|>"
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert list(ids) == tok.encode(text, add_special_tokens=False)
    assert len(ids) == 1 + 4 + 1 + 1  # role token, 4 chars, eos, assistant token
    full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": "5"}], tokenize=False)
    assert full == "<|user|>2+3?<|eos|><|assistant|>5<|eos|>"
    assert tok.decode(tok.encode(full, add_special_tokens=False), skip_special_tokens=True) == "2+3?5"


def test_saved_folder_loads_with_autotokenizer(tmp_path) -> None:
    save_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    ref = build_tokenizer()
    s = "Ann had 4 pens.\n#### 4"
    assert tok.encode(s, add_special_tokens=False) == ref.encode(s, add_special_tokens=False)
    assert tok.eos_token_id == ref.eos_token_id and tok.pad_token_id == ref.pad_token_id
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                   add_generation_prompt=True) == "<|user|>x<|eos|><|assistant|>"
    # Left padding, so batched generation appends to the end of every row.
    batch = tok(["ab", "abcd"], padding=True)
    assert batch["input_ids"][0][:2] == [tok.pad_token_id] * 2


def test_load_tokenizer_bad_folders(tmp_path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="does not load"):
        load_tokenizer(tmp_path / "empty")


@pytest.mark.parametrize("content,bad", [("Tom has ３ apples.", "'３' (U+FF13)"), ("٣+4=?", "'٣' (U+0663)"),
                                         ("a\tb", "'\\t' (U+0009)"), ("Zoë has 2 cups", "'ë' (U+00EB)")])
def test_data_the_tokenizer_cannot_encode_is_refused_naming_the_row(content: str, bad: str) -> None:
    """Issue 22: the tiny tokenizer silently dropped Unicode characters, digits of the problem
    included; a run now stops at start naming the file, the row and the characters."""
    from pivotrl.models.tokenizer import check_encodable, unknown_characters
    from pivotrl.rl.data import Example

    tok = build_tokenizer()
    rows = [Example([{"role": "user", "content": "1+1?"}], "2"), Example([{"role": "user", "content": content}], "7")]
    assert unknown_characters(tok, rows[0].prompt[0]["content"]) == []
    with pytest.raises(ValueError) as e:
        check_encodable(tok, rows, "train.parquet")
    msg = str(e.value)
    assert msg.startswith("train.parquet: row 1: the policy's tokenizer") and bad in msg and "dropped" in msg


def test_the_bootstrap_data_is_encodable() -> None:
    """The synthetic task the bootstrap trains on (every template, name and item) passes the check
    the runtimes make at start."""
    from pivotrl.models.tokenizer import check_encodable
    from pivotrl.rl.data import Example, generate_rows

    rows = generate_rows(2000, "train", 0, 0, 99)
    check_encodable(build_tokenizer(), [Example(r["prompt"], r["reward_model"]["ground_truth"]) for r in rows], "x")
