"""HTTP helpers for the engine's server tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

MODEL = "tiny"

#: Distinct user messages: the tiny random model turns each into a different output.
PROMPTS: list[str] = [
    "def parse(text):\n    tokens = text.split()\n",
    "import os\nimport sys\n\nclass Config:\n",
    "The quick brown fox jumps over the lazy dog.",
    "for i in range(10):\n    print(i * i)\n",
    "SELECT name, value FROM settings WHERE key = ?",
    'Traceback (most recent call last):\n  File "main.py", line 3',
    "git commit -m 'fix: handle empty input'",
    '{"tool": "bash", "arguments": {"command": "ls -la"}}',
    "async def fetch(session, url):\n    async with session.get(url) as r:",
    "Summarize the previous steps and decide the next action.",
    'raise ValueError(f"bad value: {value!r}")',
    "with open(path, 'rb') as f:\n    data = f.read()",
    "def __init__(self, name, *, timeout=None):",
    "assert result == expected, (result, expected)",
    "return sorted(items, key=lambda item: item.priority)",
    "logging.basicConfig(level=logging.INFO)",
]


def chat(
    base: str,
    messages: list[dict[str, str]],
    *,
    max_tokens: int = 48,
    headers: dict[str, str] | None = None,
    path: str = "/v1/chat/completions",
    **body: Any,
) -> httpx.Response:
    payload = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        **body,
    }
    return httpx.post(base + path, json=payload, headers=headers or {}, timeout=120)


def chat_ok(base: str, messages: list[dict[str, str]], **kwargs: Any) -> dict[str, Any]:
    r = chat(base, messages, **kwargs)
    assert r.status_code == 200, r.text
    return r.json()


def completion_ok(
    base: str, prompt: Any, *, max_tokens: int = 48, headers: dict[str, str] | None = None, **body: Any
) -> dict[str, Any]:
    payload = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        **body,
    }
    r = httpx.post(base + "/v1/completions", json=payload, headers=headers or {}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def wait_for(fetch: Callable[[], Any], ok: Callable[[Any], bool], timeout: float = 10.0) -> Any:
    """Poll ``fetch`` until ``ok(value)``; the proposer publishes statistics asynchronously."""
    deadline = time.monotonic() + timeout
    value = fetch()
    while not ok(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s; last value: {value!r}")
        time.sleep(0.1)
        value = fetch()
    return value


def session_stats(base: str, session_id: str) -> dict[str, Any] | None:
    r = httpx.get(f"{base}/agentspec/v1/sessions/{session_id}", timeout=10)
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    return r.json()


def wait_session(base: str, session_id: str, calls: int, timeout: float = 10.0) -> dict[str, Any]:
    """The session's stats once the proposer has published at least ``calls`` calls."""
    return wait_for(lambda: session_stats(base, session_id), lambda s: s is not None and s["calls"] >= calls, timeout)


def server_stats(base: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/agentspec/v1/stats", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def idle_stats(base: str, timeout: float = 10.0) -> dict[str, Any]:
    """Server statistics once every started call has been released."""
    return wait_for(
        lambda: server_stats(base),
        lambda s: (
            s["index"].get("active_calls", 1) == 0
            and s["engine"].get("calls_started_total", 0) == s["engine"].get("calls_finished_total", 0)
        ),
        timeout,
    )


def vllm_config_stand_in(num_speculative_tokens: int) -> Any:
    """What the in-process proposer tests give ``AgentspecProposer`` for vLLM's config:
    only the speculative, model and parallel settings it reads."""
    from types import SimpleNamespace

    spec = SimpleNamespace(
        num_speculative_tokens=num_speculative_tokens,
        suffix_decoding_max_tree_depth=24,
        suffix_decoding_max_spec_factor=1.0,
        suffix_decoding_min_token_prob=0.1,
    )
    return SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(max_model_len=4096, served_model_name="m", get_vocab_size=lambda: 512),
        parallel_config=SimpleNamespace(data_parallel_rank=0),
    )
