"""Sans-I/O helpers shared by the sync and async clients: ids, request bodies and the events
of a streamed chat completion (read by httpx-sse). What a request carries and how an answer
maps to the client's errors are :mod:`agentspec.client.protocol`'s, shared with integrations."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from agentspec.wire import is_valid_id

from .attempts import Attempt, Received
from .errors import BackendUnavailableError, InvalidIdError, ServerRefusedError
from .protocol import session_headers, with_session


def check_id(field: str, value: object) -> str:
    """Return ``value`` when it is a valid wire id, else raise :class:`InvalidIdError`."""
    if not is_valid_id(value) or not isinstance(value, str):
        raise InvalidIdError(field, value)
    return value


def new_session_id() -> str:
    """A fresh session id: random, so two processes never collide."""
    return f"sess-{uuid.uuid4().hex}"


def request_headers(
    session_id: str,
    group_id: str,
    base: Mapping[str, str],
    extra: Mapping[str, str] | None,
) -> dict[str, str]:
    """The client's headers, the call's ``extra`` ones, and the ids (set last)."""
    return session_headers(session_id, group_id, {**base, **(extra or {})})


def request_body(
    params: Mapping[str, Any],
    *,
    session_id: str,
    group_id: str,
    seeds: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The JSON body: the caller's params, the ids in ``vllm_xargs``, and any seeds."""
    # None means "not given" (as in the OpenAI SDK): leave the server default.
    body = {k: v for k, v in params.items() if v is not None}
    extra_body = body.pop("extra_body", None)
    if extra_body:
        body.update(extra_body)
    return with_session(body, session_id, group_id, seeds)


def stream_error(event: Mapping[str, Any], backend: str) -> Exception:
    """An ``{"error": ...}`` event inside a stream: a refusal (4xx code) or a failure."""
    err = event.get("error")
    message = err.get("message") if isinstance(err, Mapping) else str(err)
    code = err.get("code") if isinstance(err, Mapping) else None
    if isinstance(code, int) and 400 <= code < 500:
        return ServerRefusedError(code, str(message), backend=backend, body=dict(event))
    return BackendUnavailableError(backend, f"error event in stream: {message}")


class StreamReader:
    """One attempt's streamed chat completion: the ``data`` of each server-sent event in,
    the chunks to hand to the caller out.

    Role-only chunks are held back until the first chunk with output, so a failure before
    the first token stays retryable; what is handed out is recorded on the attempt
    (:meth:`Attempt.output`, and the token ids of the output when the server sends them),
    which is how the retry machine knows a retry would repeat it and whether it can resume.

    ``resumable``: the request is one a cut stream can be resumed from (see
    :func:`stream_params`); ``strip``: the token ids were asked for by the client, not the
    caller, and are taken out of the chunks handed out. An attempt that resumes a cut
    stream reads a streamed *text* completion (``completion=True``), continuing the earlier
    attempts' accumulator: its chunks are turned into chat chunks, so the caller sees one
    chat stream.
    """

    def __init__(
        self,
        attempt: Attempt,
        *,
        resumable: bool = False,
        strip: bool = False,
        completion: bool = False,
    ) -> None:
        self.attempt = attempt
        resume = attempt.resume_from
        acc = resume.state if resume is not None else None
        self.acc = acc if isinstance(acc, ChatAccumulator) else ChatAccumulator()
        self.done = False
        """Whether ``[DONE]`` arrived."""
        self._resumable = resumable
        self._strip = strip
        self._completion = completion
        self._delivered = len(resume.token_ids) if resume is not None else 0
        self._template = dict(self.acc.last_chunk or {})
        self._held: list[dict[str, Any]] = []
        self._held_ids: list[int] = []
        self._prompt_ids: list[int] | None = None
        self._reported = len(self.acc.text)  # characters of acc.text recorded on the attempt

    def feed(self, data: str) -> list[dict[str, Any]]:
        """The chunks an event releases (none while held back)."""
        if data == "[DONE]":
            self.done = True
            return []
        if not data:
            return []
        try:
            event = json.loads(data)
        except json.JSONDecodeError as exc:
            raise BackendUnavailableError(self.attempt.backend, f"malformed stream event: {exc}") from exc
        if not isinstance(event, dict):
            return []
        if "error" in event:
            raise stream_error(event, self.attempt.backend)
        if self._completion:
            event = chat_chunk_of_completion(event, self._template, self._delivered)
        self._take_ids(event)
        self.acc.feed(event)
        self._held.append(event)
        if not self.attempt.received and not self.acc.carries_output(event):
            return []
        return self._release()

    def finish(self) -> list[dict[str, Any]]:
        """The chunks still held once the stream ended; raises when it broke off."""
        if not self.done and self.acc.finish_reason is None:
            raise BackendUnavailableError(self.attempt.backend, "stream ended without [DONE]")
        return self._release()

    def _take_ids(self, event: dict[str, Any]) -> None:
        prompt = event.get("prompt_token_ids")
        if isinstance(prompt, list) and self._prompt_ids is None:
            self._prompt_ids = [int(t) for t in prompt]
        for choice in event.get("choices") or ():
            if choice.get("index", 0) == 0 and isinstance(choice.get("token_ids"), list):
                self._held_ids.extend(int(t) for t in choice["token_ids"])
        if self._strip:
            event.pop("prompt_token_ids", None)
            event.pop("prompt_text", None)
            for choice in event.get("choices") or ():
                choice.pop("token_ids", None)

    def _release(self) -> list[dict[str, Any]]:
        out, self._held = self._held, []
        if out:
            text = self.acc.text
            self.attempt.output(text[self._reported :], len(out))
            self._reported = len(text)
            received = self.attempt.received
            received.token_ids.extend(self._held_ids)
            self._held_ids = []
            if received.prompt_token_ids is None:
                received.prompt_token_ids = self._prompt_ids
            received.state = self.acc
            # Exact only for plain text: a tool call or reasoning in progress is parsed by
            # the chat endpoint, which a text completion cannot continue.
            received.resumable = (
                self._resumable
                and received.prompt_token_ids is not None
                and not self.acc.tool_calls
                and not self.acc.reasoning
            )
        return out


# Requests whose streams are not resumed: their output is shaped by the chat endpoint
# (tools, grammars) or per choice/token data the text completion would not reproduce.
_NOT_RESUMABLE = (
    "tools",
    "functions",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "echo",
)
# Chat-only fields, dropped from the text completion that resumes a stream.
_CHAT_ONLY = (
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "response_format",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "documents",
    "reasoning_effort",
    "include_reasoning",
    "logprobs",
    "top_logprobs",
    "n",
    "echo",
    "extra_body",
    "max_completion_tokens",
    "return_token_ids",
)


def _merged(params: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in params.items() if v is not None}
    extra = out.pop("extra_body", None)
    if isinstance(extra, Mapping):
        out.update({k: v for k, v in extra.items() if v is not None})
    return out


def stream_params(params: Mapping[str, Any], resume: bool) -> tuple[dict[str, Any], bool, bool]:
    """A streamed chat call's params, whether its stream can be resumed, and whether the
    client asked for the token ids itself (then they are stripped from the chunks).

    Resumable: plain text generation (no tools, no structured output, one choice, no
    log-probabilities); then ``return_token_ids`` is asked for, so the output's ids are
    known when the stream breaks."""
    merged = _merged(params)
    if not resume or any(merged.get(k) for k in _NOT_RESUMABLE) or int(merged.get("n") or 1) != 1:
        return dict(params), False, False
    if merged.get("return_token_ids"):
        return dict(params), True, False
    return {**params, "return_token_ids": True}, True, True


def resume_params(params: Mapping[str, Any], resume: Received) -> dict[str, Any] | None:
    """The streamed ``/v1/completions`` params that continue a cut chat stream: the prompt's
    token ids plus the output's, the output budget less what was delivered, the other
    sampling params unchanged. None when the budget is spent (only the end was lost)."""
    assert resume.prompt_token_ids is not None
    merged = _merged(params)
    delivered = len(resume.token_ids)
    out = {k: v for k, v in merged.items() if k not in _CHAT_ONLY}
    budget = merged.get("max_tokens", merged.get("max_completion_tokens"))
    if budget is not None:
        if int(budget) - delivered <= 0:
            return None
        out["max_tokens"] = int(budget) - delivered
    if merged.get("min_tokens"):
        out["min_tokens"] = max(0, int(merged["min_tokens"]) - delivered)
    out["prompt"] = list(resume.prompt_token_ids) + list(resume.token_ids)
    out["stream"] = True
    out["return_token_ids"] = True
    return out


def chat_chunk_of_completion(event: Mapping[str, Any], template: Mapping[str, Any], delivered: int) -> dict[str, Any]:
    """A streamed text-completion chunk as the chat chunk that continues the stream
    ``template`` (its last chunk) came from; usage counts the ``delivered`` tokens as
    output, not prompt."""
    choices = []
    for ch in event.get("choices") or ():
        choice: dict[str, Any] = {
            "index": ch.get("index", 0),
            "delta": {"content": ch.get("text") or ""},
            "logprobs": None,
            "finish_reason": ch.get("finish_reason"),
        }
        if "stop_reason" in ch:
            choice["stop_reason"] = ch["stop_reason"]
        if ch.get("token_ids") is not None:
            choice["token_ids"] = list(ch["token_ids"])
        choices.append(choice)
    out: dict[str, Any] = {
        "id": template.get("id", event.get("id")),
        "object": "chat.completion.chunk",
        "created": template.get("created", event.get("created")),
        "model": template.get("model", event.get("model")),
        "choices": choices,
    }
    usage = event.get("usage")
    if isinstance(usage, Mapping):
        usage = dict(usage)
        if isinstance(usage.get("prompt_tokens"), int):
            usage["prompt_tokens"] = max(0, usage["prompt_tokens"] - delivered)
        if isinstance(usage.get("completion_tokens"), int):
            usage["completion_tokens"] += delivered
        out["usage"] = usage
    return out


def finish_chunk(reason: str = "length") -> str:
    """The closing text-completion chunk of a stream whose whole output budget was
    delivered before it broke (only its end was lost): what a resumption would have sent."""
    return json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": reason}]})


class ChatAccumulator:
    """Rebuilds the first choice's message from streamed chat-completion chunks."""

    def __init__(self) -> None:
        self.role = "assistant"
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chunks = 0
        self.last_chunk: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return "".join(self.content)

    @staticmethod
    def carries_output(chunk: Mapping[str, Any]) -> bool:
        """Whether the chunk holds anything beyond a role header.

        A stream's first chunk is usually ``{"role": "assistant", "content": ""}``; holding such
        chunks back until real output arrives lets a failure before the first token be retried
        transparently.
        """
        if chunk.get("usage"):
            return True
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason"):
                return True
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
                return True
            if delta.get("reasoning"):
                return True
        return False

    def feed(self, chunk: Mapping[str, Any]) -> None:
        self.chunks += 1
        self.last_chunk = dict(chunk)
        if chunk.get("usage"):
            self.usage = dict(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("role"), str):
                self.role = delta["role"]
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str):
                self.reasoning.append(reasoning)
            for call in delta.get("tool_calls") or ():
                slot = self.tool_calls.setdefault(
                    int(call.get("index", len(self.tool_calls))),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                if call.get("type"):
                    slot["type"] = call["type"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return msg


def first_choice(body: Mapping[str, Any], backend: str) -> Mapping[str, Any]:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise BackendUnavailableError(backend, "response has no choices")
    return choices[0]
