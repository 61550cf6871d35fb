"""Chat messages → what the chat template receives (replayed tool calls, names)."""

from __future__ import annotations

from types import SimpleNamespace

from cascade.api.openai_protocol import ChatMessage
from cascade.api.prompts import _template_messages

CALL = {"id": "call_7", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"x\"}"}}


def test_a_tool_aware_template_receives_calls_as_objects_and_the_call_id() -> None:
    tokenizer = SimpleNamespace(chat_template="{{ m.tool_calls }} {{ m.tool_call_id }}")
    chat = [ChatMessage(role="assistant", content="Looking.", tool_calls=[CALL]),  # type: ignore[list-item]
            ChatMessage(role="tool", tool_call_id="call_7", content="found")]
    assistant, tool = _template_messages(tokenizer, chat)
    assert assistant == {"role": "assistant", "content": "Looking.",
                         "tool_calls": [{"id": "call_7", "type": "function",
                                         "function": {"name": "lookup", "arguments": {"q": "x"}}}]}
    assert tool == {"role": "tool", "content": "found", "tool_call_id": "call_7"}


def test_a_template_without_tools_reads_each_call_as_a_json_line_after_the_text() -> None:
    tokenizer = SimpleNamespace(chat_template="{{ m.content }}")
    bad_json = {**CALL, "function": {"name": "lookup", "arguments": "not json"}}
    chat = [ChatMessage(role="assistant", content="Looking.", tool_calls=[CALL, bad_json]),  # type: ignore[list-item]
            ChatMessage(role="tool", tool_call_id="call_7", content="found")]
    assistant, tool = _template_messages(tokenizer, chat)
    assert assistant["content"] == ('Looking.\n{"name": "lookup", "arguments": {"q": "x"}}\n'
                                    '{"name": "lookup", "arguments": "not json"}')
    assert tool == {"role": "tool", "content": "found"}


def test_a_name_is_refused_unless_the_template_reads_a_messages_name_not_just_the_word() -> None:
    import pytest
    from cascade.api.errors import APIError

    chat = [ChatMessage(role="user", content="hi", name="bob")]
    prose = SimpleNamespace(chat_template="You are a helpful AI assistant named SmolLM. {{ message['content'] }}")
    with pytest.raises(APIError) as refused:
        _template_messages(prose, chat)
    assert refused.value.param == "messages.0.name"
    reading = SimpleNamespace(chat_template="{% if message['name'] %}{{ message['name'] }}: {% endif %}")
    assert _template_messages(reading, chat) == [{"role": "user", "content": "hi", "name": "bob"}]
