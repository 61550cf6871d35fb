"""Every accepted prompt form (text, texts, token ids, chat messages) → checked token id lists.

Shared by the OpenAI routes and k-CBS, so no route module imports another."""

from __future__ import annotations

from typing import Any

from cascade.api.errors import APIError
from cascade.api.input_bounds import check_fits
from cascade.api.input_bounds import tokenize as tokenize_text
from cascade.api.openai_protocol import ChatMessage
from cascade.api.sampling import check_token_ids
from cascade.engine.manager import EngineManager


def _prompt_ids(ids: list[int], vocab_size: int) -> list[int]:
    if not ids:
        raise APIError(400, "prompt must not be empty", param="prompt")
    check_token_ids(ids, vocab_size, "prompt", "prompt token ids")
    return ids


async def _text_ids(engines: EngineManager, text: str, max_len: int) -> list[int]:
    check_fits(len(text), max_len, engines.tokenizer, "prompt")
    return _prompt_ids(await tokenize_text(engines.tokenizer, text), len(engines.tokenizer))


async def completion_prompts(engines: EngineManager, value: str | list[Any], max_len: int,
                             max_prompts: int) -> list[list[int]]:
    """Every accepted prompt form (text, texts, ids, lists of ids) as token id lists; text that cannot
    fit in ``max_len`` tokens is refused before it is tokenised."""
    vocab = len(engines.tokenizer)
    if isinstance(value, str):
        return [await _text_ids(engines, value, max_len)]
    if not value:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if all(isinstance(v, int) for v in value):
        return [_prompt_ids(list(value), vocab)]
    if len(value) > max_prompts:
        raise APIError(400, f"at most {max_prompts} prompts per request (max_prompts)", param="prompt")
    out = []
    for item in value:
        out.append(await _text_ids(engines, item, max_len) if isinstance(item, str)
                   else _prompt_ids(list(item), vocab))
    return out


def _template_messages(tokenizer: Any, chat: list[ChatMessage]) -> list[dict[str, str]]:
    """Messages for the chat template; a ``name`` goes to the template when the template reads
    names, and is refused otherwise (dropping it would silently change the conversation)."""
    reads_names = "name" in str(getattr(tokenizer, "chat_template", None) or "")
    messages = []
    for i, message in enumerate(chat):
        if (media := message.media()) is not None:
            raise APIError(400, f"{media} content parts are not supported: this model reads text only",
                           param=f"messages.{i}.content", code="unsupported_content")
        rendered = {"role": message.role, "content": message.text()}
        if message.name is not None:
            if not reads_names:
                raise APIError(400, "message names are not supported: this model's chat template does not use "
                                    "them", param=f"messages.{i}.name", code="unsupported_parameter")
            rendered["name"] = message.name
        messages.append(rendered)
    return messages


async def chat_prompt_from_messages(engines: EngineManager, chat: list[ChatMessage], max_len: int) -> list[int]:
    """Render messages with the model's chat template, then tokenise (refused first when the
    messages alone cannot fit in ``max_len`` tokens)."""
    messages = _template_messages(engines.tokenizer, chat)
    check_fits(sum(len(m["content"]) for m in messages), max_len, engines.tokenizer, "messages")
    try:
        text = engines.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:
        raise APIError(400, f"messages could not be rendered with the model's chat template: {exc}",
                       param="messages") from None
    return _prompt_ids(await tokenize_text(engines.tokenizer, str(text)), len(engines.tokenizer))
