"""Every accepted prompt form (text, texts, token ids, chat messages) → checked token id lists.

Shared by the OpenAI routes and k-CBS, so no route module imports another."""

from __future__ import annotations

import json
import re
from typing import Any

from cascade.api.errors import APIError
from cascade.api.input_bounds import check_fits
from cascade.api.input_bounds import tokenize as tokenize_text
from cascade.api.openai_protocol import ChatMessage, RefusalPart, ToolCall
from cascade.api.sampling import check_token_ids
from cascade.engine.manager import EngineManager


def _prompt_ids(ids: list[int], vocab_size: int) -> list[int]:
    if not ids:
        raise APIError(400, "prompt must not be empty", param="prompt")
    check_token_ids(ids, vocab_size, "prompt", "prompt token ids")
    return ids


async def _text_ids(engines: EngineManager, text: str, max_len: int, add_special_tokens: bool) -> list[int]:
    check_fits(len(text), max_len, engines.tokenizer, "prompt")
    return _prompt_ids(await tokenize_text(engines.tokenizer, text, add_special_tokens), len(engines.tokenizer))


async def completion_prompts(engines: EngineManager, value: str | list[Any], max_len: int,
                             max_prompts: int, add_special_tokens: bool = False) -> list[list[int]]:
    """Every accepted prompt form (text, texts, ids, lists of ids) as token id lists; text that cannot
    fit in ``max_len`` tokens is refused before it is tokenised. ``add_special_tokens`` adds what the
    tokenizer adds to a text (a BOS, for models that take one); ids are taken as they are."""
    vocab = len(engines.tokenizer)
    if isinstance(value, str):
        return [await _text_ids(engines, value, max_len, add_special_tokens)]
    if not value:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if all(isinstance(v, int) for v in value):
        return [_prompt_ids(list(value), vocab)]
    if len(value) > max_prompts:
        raise APIError(400, f"at most {max_prompts} prompts per request (max_prompts)", param="prompt")
    out = []
    for item in value:
        out.append(await _text_ids(engines, item, max_len, add_special_tokens) if isinstance(item, str)
                   else _prompt_ids(list(item), vocab))
    return out


def truncated(prompts: list[list[int]], keep: int | None, max_model_len: int, side: str | None = None,
              completion: int | None = None) -> list[list[int]]:
    """vLLM's ``truncate_prompt_tokens``: each prompt's last ``keep`` tokens, or its first with ``side``
    ``right``. −1 keeps as many as leave room for the ``completion`` tokens asked for (at least one):
    vLLM keeps ``max_model_len − 1`` and cuts ``max_tokens`` to what is left, where this service answers
    a ``max_tokens`` past the context with a 400, so "fit the prompt" must leave the room asked for."""
    if keep is None:
        return prompts
    if keep == 0 or keep > max_model_len:
        raise APIError(400, f"truncate_prompt_tokens must be -1 or 1..{max_model_len} (the context length), "
                            f"got {keep}", param="truncate_prompt_tokens", code="invalid_value")
    limit = max(max_model_len - max(completion or 1, 1), 1) if keep == -1 else keep
    return [p[:limit] if side == "right" else p[-limit:] for p in prompts]


def text_bound(keep: int | None, max_model_len: int, max_tokenize_chars: int, chars: int = 0,
               param: str = "prompt") -> int:
    """The most tokens prompt text may need before it is tokenised: the context, or when it is to be
    truncated, what the tokenizer endpoint accepts (``max_tokenize_chars``: the ``chars`` of text to
    truncate may not be more, a 400 naming ``param``)."""
    if keep is None:
        return max_model_len
    if chars > max_tokenize_chars:
        raise APIError(400, f"{param} has {chars} characters; a prompt to truncate may have at most "
                            f"{max_tokenize_chars} (max_tokenize_chars)", param=param, code="context_length_exceeded")
    return max(max_model_len, max_tokenize_chars)


def echo_texts(value: str | list[Any], prompts: list[list[int]], tokenizer: Any) -> list[str]:
    """What ``echo`` puts before each prompt's completions: the prompt text as sent, token ids decoded."""
    items = [value] if isinstance(value, str) or all(isinstance(v, int) for v in value) else value
    return [item if isinstance(item, str) else str(tokenizer.decode(ids))
            for item, ids in zip(items, prompts, strict=True)]


def _tool_call(call: ToolCall, structured: bool) -> dict[str, Any]:
    """A replayed tool call: Hugging Face's shape (arguments as an object when they parse as one,
    as tool-aware templates expect) for a template that reads ``tool_calls``, otherwise one JSON
    line of text."""
    arguments: Any = call.function.arguments
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):  # nested past the parser's depth: kept as the text it is
        parsed = None
    if isinstance(parsed, dict):
        arguments = parsed
    if structured:
        return {"id": call.id, "type": call.type, "function": {"name": call.function.name, "arguments": arguments}}
    return {"name": call.function.name, "arguments": arguments}


_READS_NAMES = re.compile(r"""\b(message|msg|m)\s*(\[\s*['"]name['"]\s*\]|\.name\b)""")
"""A template reading a message's ``name`` (``message['name']``, ``message.name``), not just any "name"
(SmolLM2's default system prompt says "assistant named SmolLM")."""


_NAMES_DEVELOPER = re.compile(r"""['"]developer['"]""")
"""A template with a developer role compares a message's role with the string ``'developer'``."""


def _template_messages(tokenizer: Any, chat: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages for the chat template; a ``name`` goes to the template when the template reads
    names, and is refused otherwise (dropping it would silently change the conversation).

    A replayed tool exchange (an assistant turn with ``tool_calls``, then ``tool`` turns) is history
    this model never produces but can read: a template that reads ``tool_calls`` / ``tool_call_id``
    gets them as such, any other template gets each call as a JSON line after the assistant's text.
    A ``developer`` message is OpenAI's newer name for the system instruction: it reaches a template
    that knows no developer role as ``system`` (ChatML would render an ``<|im_start|>developer`` turn
    the model never saw)."""
    template = str(getattr(tokenizer, "chat_template", None) or "")
    reads_names = _READS_NAMES.search(template) is not None
    developer_role = "developer" if _NAMES_DEVELOPER.search(template) else "system"
    messages = []
    for i, message in enumerate(chat):
        if (media := message.media()) is not None:
            raise APIError(400, f"{media} content parts are not supported: this model reads text only",
                           param=f"messages.{i}.content", code="unsupported_content")
        parts = message.content if isinstance(message.content, list) else []
        if message.role != "assistant" and any(isinstance(part, RefusalPart) for part in parts):
            raise APIError(400, "only assistant messages carry refusal parts", param=f"messages.{i}.content")
        if message.audio is not None:
            raise APIError(400, "audio replies are not supported: this model reads text only",
                           param=f"messages.{i}.audio", code="unsupported_content")
        thought = message.reasoning if message.reasoning is not None else message.reasoning_content
        if thought is not None and message.role != "assistant":
            raise APIError(400, "only assistant messages carry reasoning", param=f"messages.{i}.reasoning")
        if message.function_call is not None:
            raise APIError(400, "function_call (deprecated) is not supported: replay the call as tool_calls",
                           param=f"messages.{i}.function_call", code="unsupported_parameter")
        if message.tool_calls is not None and message.role != "assistant":
            raise APIError(400, "only assistant messages carry tool_calls", param=f"messages.{i}.tool_calls")
        if message.role == "tool" and message.tool_call_id is None:
            raise APIError(400, "a tool message needs the tool_call_id of the call it answers",
                           param=f"messages.{i}.tool_call_id", code="missing_required_parameter")
        if message.tool_call_id is not None and message.role != "tool":
            raise APIError(400, "only tool messages carry a tool_call_id", param=f"messages.{i}.tool_call_id")
        if message.content is None and message.role != "assistant":
            raise APIError(400, f"a {message.role} message needs content (only an assistant turn may have none)",
                           param=f"messages.{i}.content", code="invalid_value")
        role = developer_role if message.role == "developer" else message.role
        rendered: dict[str, Any] = {"role": role, "content": message.text() or message.refusal or ""}
        if message.name is not None:
            if not reads_names:
                raise APIError(400, "message names are not supported: this model's chat template does not use "
                                    "them", param=f"messages.{i}.name", code="unsupported_parameter")
            rendered["name"] = message.name
        if message.tool_calls:
            if "tool_calls" in template:
                rendered["tool_calls"] = [_tool_call(call, True) for call in message.tool_calls]
            else:
                lines = [json.dumps(_tool_call(call, False)) for call in message.tool_calls]
                rendered["content"] = "\n".join(filter(None, [rendered["content"], *lines]))
        if message.tool_call_id is not None and "tool_call_id" in template:
            rendered["tool_call_id"] = message.tool_call_id
        if thought:
            rendered["reasoning_content"] = thought
        messages.append(rendered)
    return messages


_RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs"})
"""``apply_chat_template``'s own parameters: set by the request's fields, never through ``chat_template_kwargs``."""


def _template_options(chat: list[ChatMessage], add_generation_prompt: bool, continue_final_message: bool,
                      template_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    if continue_final_message:
        if add_generation_prompt:
            raise APIError(400, "continue_final_message continues the last assistant message, so it needs "
                                "add_generation_prompt false", param="continue_final_message", code="invalid_value")
        if not chat or chat[-1].role != "assistant":
            raise APIError(400, "continue_final_message needs an assistant message last",
                           param="continue_final_message", code="invalid_value")
    reserved = sorted(_RESERVED_TEMPLATE_KWARGS.intersection(template_kwargs or {}))
    if reserved:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(reserved)}: "
                            + ("use the request field of that name" if reserved[0] in
                               ("add_generation_prompt", "continue_final_message", "tools")
                               else "the service sets it"),
                       param=f"chat_template_kwargs.{reserved[0]}", code="invalid_value")
    return {**(template_kwargs or {}), "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message}


async def chat_prompt_from_messages(engines: EngineManager, chat: list[ChatMessage], max_len: int, *,
                                    add_generation_prompt: bool = True, continue_final_message: bool = False,
                                    template_kwargs: dict[str, Any] | None = None,
                                    add_special_tokens: bool = False,
                                    tools: list[dict[str, object]] | None = None) -> list[int]:
    """Render messages with the model's chat template, then tokenise (refused first when the
    messages alone cannot fit in ``max_len`` tokens). ``template_kwargs`` (vLLM's
    ``chat_template_kwargs``) reach the template as variables, e.g. a template's ``enable_thinking``.
    ``tools`` (sent with ``tool_choice: "none"``) reach a template that reads them, as vLLM renders
    them: the model sees what it may not call."""
    if not getattr(engines.tokenizer, "chat_template", None):
        raise APIError(400, "this model has no chat template, so chat messages cannot be rendered; use "
                            "/v1/completions with a prompt", param="messages", code="no_chat_template")
    options = _template_options(chat, add_generation_prompt, continue_final_message, template_kwargs)
    if tools and "tools" in str(engines.tokenizer.chat_template):
        options["tools"] = tools
    messages = _template_messages(engines.tokenizer, chat)
    check_fits(sum(len(m["content"]) for m in messages), max_len, engines.tokenizer, "messages")
    try:
        text = engines.tokenizer.apply_chat_template(messages, tokenize=False, **options)
    except Exception as exc:
        raise APIError(400, f"messages could not be rendered with the model's chat template: {exc}",
                       param="messages") from None
    return _prompt_ids(await tokenize_text(engines.tokenizer, str(text), add_special_tokens), len(engines.tokenizer))
