"""Character-level tokenizer for the tiny models, saved in Hugging Face format.

Owns: the vocabulary (special tokens, then one token per printable character), the chat template,
and saving/loading the tokenizer folder. Knows nothing about models or training.

Why character level: the project has no pretrained tokenizer (no internet), and arithmetic word
problems need only printable ASCII. One token per character also makes digits their own tokens,
which is what lets a tiny model learn arithmetic at all.

The tokenizer is a `transformers.PreTrainedTokenizerFast` backed by a `tokenizers` byte-level
BPE model with no merges (one token per character; see `build_tokenizer` for why), so `AutoTokenizer.from_pretrained(folder)` loads it, and so does vLLM (which uses
`AutoTokenizer`). The chat template renders verl-style `prompt` messages as

    <|user|>{content}<|eos|><|assistant|>{response}<|eos|>

so a generation stops at `<|eos|>` (the model's `eos_token_id`).

A character outside the vocabulary is dropped (the tokenizer loaded from a model folder encodes it
to nothing; the one built here, to `<|unk|>`), so the model never sees it (issue 22: `３` and `٣`
were dropped, digits of the problem included). A run therefore refuses data with such a character
at start, naming the row (`check_encodable`, for any tokenizer; a byte-level one encodes
everything and refuses nothing).

Public API:
    build_tokenizer() -> PreTrainedTokenizerFast
    save_tokenizer(path) -> Path
    load_tokenizer(path) -> PreTrainedTokenizerFast     (clear error if the folder does not load)
    check_encodable(tok, examples, path)                (ValueError naming the row and characters)
    PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, ROLE_TOKENS, CHAT_TEMPLATE, VOCAB_SIZE
"""
from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|eos|>"
UNK_TOKEN = "<|unk|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, *ROLE_TOKENS)

# Printable ASCII without the rare whitespace kinds (tab, CR, vertical tab, form feed).
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"

VOCAB_SIZE = len(SPECIAL_TOKENS) + len(CHARACTERS)

# Jinja template used by `apply_chat_template`. Every turn ends with EOS so the assistant learns to
# stop; `add_generation_prompt` opens an assistant turn for the model to complete.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|eos|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable-unicode table (the one ByteLevel uses).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_TO_UNICODE = _bytes_to_unicode()


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer (same vocabulary and ids every call).

    Why byte-level BPE with no merges rather than a plain WordLevel model: `AutoTokenizer` in
    transformers 5 ignores the saved tokenizer class for a folder whose config says
    `model_type: qwen2` and builds a `Qwen2Tokenizer` (byte-level BPE pipeline) from
    tokenizer.json's vocabulary. Storing each character under its byte-level name and using that
    same pipeline makes the tokenizer we build here and the one transformers/vLLM load from a model
    folder produce identical ids (tests/models/test_tokenizer.py asserts it)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab[_BYTE_TO_UNICODE[ord(ch)]] = len(vocab)
    # No merges: every character stays its own token.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS),
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
        padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tokenizer(path: str | Path) -> Path:
    """Write the tokenizer files (tokenizer.json, tokenizer_config.json, chat template) to `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save_pretrained(str(path))
    return path


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer folder with `AutoTokenizer`; raise ValueError naming the folder if it fails."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"tokenizer folder {str(path)!r} does not exist or is not a directory")
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - re-raised with the folder named
        raise ValueError(f"tokenizer folder {str(path)!r} does not load: {type(e).__name__}: {e}") from e
    if tok.eos_token_id is None or tok.pad_token_id is None:
        raise ValueError(f"tokenizer folder {str(path)!r} has no eos or pad token")
    return tok


def unknown_characters(tok: PreTrainedTokenizerBase, text: str) -> list[str]:
    """The characters of `text` that `tok` cannot encode, in order of appearance: each encodes to
    nothing (the folder-loaded tiny tokenizer drops it) or to the unknown token. Text that round
    trips is taken whole; only text that does not is looked at character by character (so a
    tokenizer that normalizes, without dropping, refuses nothing)."""
    ids = tok.encode(text, add_special_tokens=False)
    unk = tok.unk_token_id
    if (unk is None or unk not in ids) and tok.decode(ids) == text:
        return []
    out = []
    for c in dict.fromkeys(text):
        got = tok.encode(c, add_special_tokens=False)
        if not got or (unk is not None and unk in got):
            out.append(c)
    return out


def check_encodable(tok: PreTrainedTokenizerBase, examples: list, path: str | Path) -> None:
    """Every prompt message of `examples` (rows of `path`, in order) encodes without the unknown
    token; else ValueError naming the file, the row, the message and the characters."""
    for i, ex in enumerate(examples):
        for m in ex.prompt:
            bad = unknown_characters(tok, m["content"])
            if bad:
                raise ValueError(
                    f"{path}: row {i}: the policy's tokenizer ({tok.name_or_path}) cannot encode "
                    f"{', '.join(f'{c!r} (U+{ord(c):04X})' for c in bad)} in the {m['role']} message "
                    f"{m['content'][:80]!r}: they would be dropped from the prompt (or become "
                    f"{tok.unk_token}); write them with the characters it has, or drop the row")
