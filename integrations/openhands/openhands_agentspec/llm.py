"""An OpenHands ``LLM`` for ``agentspec serve``, or for several behind vLLM's router.

The returned object is a plain OpenHands ``LLM`` (no subclass: ``LLM.model_validate``
would turn one back into the base class), configured through its public fields only:

- ``base_url`` points at one ``agentspec serve`` or at a ``vllm-router`` in front of several;
- OpenHands itself names the session on every call (header ``x-litellm-session-id`` = the
  conversation id), which the server reads as the session;
- ``group_id`` (a task: every attempt at one SWE-bench instance) goes into ``X-Group-Id``
  and into ``X-Session-Id``, the header vllm-router's ``consistent_hash`` policy hashes, so
  all attempts of a task land on one server and draft from each other. agentspec's wire
  contract ranks ``x-litellm-session-id`` above ``X-Session-Id``, so routing by the group
  never renames a conversation's session (docs/wire.md, "Routers in front");
- sampling options that OpenHands drops for models it does not know (``temperature``)
  travel in ``litellm_extra_body``, which lands at the top level of the request body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openhands.sdk import LLM
from pydantic import SecretStr

from agentspec import wire

__all__ = ["agentspec_llm", "group_of", "routing_headers"]

#: litellm's provider prefix for OpenAI-compatible servers such as vLLM.
PROVIDER_PREFIX = "openai/"


def routing_headers(group_id: str) -> dict[str, str]:
    """Headers that pin every call of ``group_id`` to one server and name its group."""
    if not wire.is_valid_id(group_id):
        raise ValueError(f"group_id {group_id!r} must be {wire.ID_RULE}")
    return {wire.SESSION_HEADER: group_id, wire.GROUP_HEADER: group_id}


def group_of(llm: LLM) -> str | None:
    """The group an LLM built by :func:`agentspec_llm` pins its calls to, if any."""
    headers = {k.lower(): v for k, v in (llm.extra_headers or {}).items()}
    return headers.get(wire.GROUP_HEADER.lower())


def agentspec_llm(
    base_url: str,
    served_model: str,
    *,
    group_id: str | None = None,
    api_key: str | SecretStr | None = None,
    temperature: float | None = None,
    extra_body: Mapping[str, Any] | None = None,
    extra_headers: Mapping[str, str] | None = None,
    **llm_fields: Any,
) -> LLM:
    """An OpenHands ``LLM`` that talks to agentspec.

    Args:
        base_url: the server's or the router's address (``http://host:8000``, with or
            without ``/v1``).
        served_model: the name the server serves (vLLM's ``--served-model-name``, else
            the model path); ``openai/`` is put in front for litellm.
        group_id: the task every attempt belongs to (for instance a SWE-bench instance id).
            Pins the calls to one server behind vllm-router and shares drafts between the
            task's conversations. Without it, a router places calls by its own policy.
        api_key: the server's ``--api-key`` (also the tenant: docs/security.md).
        temperature: sent in the request body, where OpenHands does not drop it.
        extra_body: more request-body fields (vLLM sampling options, ``structured_outputs``).
        extra_headers: more headers; the routing headers are set after them.
        llm_fields: any other ``LLM`` field (``max_output_tokens``, ``num_retries``,
            ``usage_id``, …).
    """
    root = base_url.rstrip("/")
    body = dict(llm_fields.pop("litellm_extra_body", None) or {})
    body.update(extra_body or {})
    if temperature is not None:
        body["temperature"] = temperature
    headers = dict(extra_headers or {})
    if group_id is not None:
        headers.update(routing_headers(group_id))
    model = served_model if served_model.startswith(PROVIDER_PREFIX) else PROVIDER_PREFIX + served_model
    return LLM(
        model=model,
        base_url=root if root.endswith("/v1") else root + "/v1",
        api_key=SecretStr(api_key) if isinstance(api_key, str) else (api_key or SecretStr("EMPTY")),
        litellm_extra_body=body,
        extra_headers=headers or None,
        **llm_fields,
    )
