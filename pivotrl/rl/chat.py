"""Render a conversation with one model's own tokenizer and chat template (policy or GenRM).

Owns `render_chat` and `load_chat_tokenizer`: a `ChatConfig` (pivotrl/config/rl.py) says which
tokenizer, which template (the tokenizer's own or an override), which system prompt and whether to
pass `enable_thinking`; the result is the prompt's token ids, ending with the generation prompt.
Knows nothing about engines or judging (pivotrl/rl/genrm.py builds the judge's messages).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pivotrl.config.rl import ChatConfig


class ChatTemplateError(ValueError):
    """A tokenizer has no chat template where one is needed (names the config field)."""


def _template_text(override: str) -> str:
    p = Path(override).expanduser()
    if override.endswith(".jinja") or (len(override) < 4096 and "{" not in override and p.is_file()):
        if not p.is_file():
            raise ChatTemplateError(f"chat template file {override!r} does not exist")
        return p.read_text()
    return override


def load_chat_tokenizer(model_path: str | Path, chat: ChatConfig | None = None, where: str = "models.policy.chat") -> Any:
    """The tokenizer `chat.tokenizer_path` (else `model_path`) names, with `chat.chat_template`
    installed when set. Raises ChatTemplateError naming `where` when it ends up without a template."""
    from transformers import AutoTokenizer

    path = getattr(chat, "tokenizer_path", None) or model_path
    tok = AutoTokenizer.from_pretrained(str(path))
    override = getattr(chat, "chat_template", None)
    if override:
        tok.chat_template = _template_text(override)
    if not getattr(tok, "chat_template", None):
        raise ChatTemplateError(f"{where}: the tokenizer at {path} has no chat template; set "
                                f"{where}.chat_template (a Jinja string or a .jinja file)")
    return tok


def render_chat(tokenizer: Any, messages: list[dict[str, str]], chat: ChatConfig | None = None, where: str = "models.policy.chat",
                add_system: bool = True) -> list[int]:
    """Token ids of `messages` with the generation prompt, through `tokenizer`'s chat template.
    `chat.system_prompt` goes first when `add_system` and the messages have no system turn;
    `chat.enable_thinking` is passed to the template when not None."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(f"{where}: the tokenizer has no chat template; set {where}.chat_template")
    system = getattr(chat, "system_prompt", None)
    if add_system and system and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": system}, *messages]
    kwargs: dict[str, Any] = {}
    thinking = getattr(chat, "enable_thinking", None)
    if thinking is not None:
        kwargs["enable_thinking"] = bool(thinking)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    return list(tokenizer.encode(text, add_special_tokens=False))
