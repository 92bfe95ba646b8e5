"""The text of OpenHands events as the model saw or wrote it, for seeds.

Seeds only guide drafting, so the text should look like what the model will write again:
tool calls in the hermes form most open models are trained on (``<tool_call>`` around
``{"name", "arguments"}``), observations and messages as their plain text.
"""

from __future__ import annotations

import json
from typing import Any

from openhands.sdk.event import LLMConvertibleEvent
from openhands.sdk.llm import Message, MessageToolCall, TextContent

__all__ = ["event_text", "tool_call_text"]


def tool_call_text(call: MessageToolCall) -> str:
    """A tool call as a hermes-style model writes it."""
    try:
        arguments: Any = json.loads(call.arguments)
    except (json.JSONDecodeError, TypeError):
        arguments = call.arguments  # malformed arguments are what the model wrote: keep them
    payload = json.dumps({"name": call.name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def message_text(message: Message) -> str:
    parts = [c.text for c in message.content if isinstance(c, TextContent) and c.text]
    parts += [tool_call_text(call) for call in message.tool_calls or ()]
    return "\n".join(parts)


def event_text(event: object) -> str:
    """The text an event puts into the model's context; empty for events that put none."""
    if not isinstance(event, LLMConvertibleEvent):
        return ""
    return message_text(event.to_llm_message())
