"""agentspec's series on a real ``agentspec serve``'s ``/metrics``: registered where vLLM's
handler collects (one API server, and Prometheus multiprocess mode with two), with vLLM's
``model_name``/``engine`` labels, histograms that agree with the counters, and every series
the Grafana dashboard queries."""

from __future__ import annotations

import importlib.util
import json
import re
import time
import uuid
from pathlib import Path

import httpx
import pytest
from engine_helpers import MODEL, PROMPTS, chat_ok

from agentspec import wire
from agentspec.engine.api_server.prometheus import SERIES
from agentspec.testing.pytest_plugin import SECURED_API_KEYS
from agentspec.testing.stats import metric_value, scrape

pytestmark = pytest.mark.server

ROOT = Path(__file__).parents[2]
LABELS = f'model_name="{MODEL}",engine="0"'


def _sample_names(text: str) -> set[str]:
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def _repeat_a_session(base: str, headers: dict[str, str] | None = None) -> None:
    """Two turns of one session that repeat text, so the index drafts and the target accepts."""
    sid = f"metrics-{uuid.uuid4().hex[:8]}"
    messages = [{"role": "user", "content": PROMPTS[0]}]
    first = chat_ok(base, messages, max_tokens=48, headers={wire.SESSION_HEADER: sid, **(headers or {})})
    messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                 {"role": "user", "content": PROMPTS[0]}]  # fmt: skip
    chat_ok(base, messages, max_tokens=48, headers={wire.SESSION_HEADER: sid, **(headers or {})})


def _settled(base: str, name: str, labels: str = LABELS, timeout: float = 15.0) -> str:
    """A scrape once ``name`` has samples (the proposer publishes shortly after a step)."""
    deadline = time.monotonic() + timeout
    while True:
        text = scrape(base)
        try:
            if metric_value(text, name, labels) > 0:
                return text
        except KeyError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}{{{labels}}} stayed empty:\n{text[-2000:]}")
        time.sleep(0.3)


def test_every_series_is_on_vllms_metrics_with_its_labels(agentspec_server) -> None:
    base = agentspec_server.url
    _repeat_a_session(base)
    text = _settled(base, "agentspec_accepted_tokens_per_draft_count")
    for series in SERIES:
        assert f"# TYPE {series.exposed_name} {series.kind}" in text, series.name
        sample = series.exposed_name + ("_count" if series.kind == "histogram" else "")
        assert f"{sample}{{" in text and metric_value(text, sample, LABELS) >= 0, series.name
    # The histograms count the same drafts and verifications as the counters by level.
    assert metric_value(text, "agentspec_draft_length_sum", LABELS) == metric_value(
        text, "agentspec_draft_tokens_total", LABELS
    )
    assert metric_value(text, "agentspec_accepted_tokens_per_draft_sum", LABELS) == metric_value(
        text, "agentspec_accepted_tokens_total", LABELS
    )
    # One registry: each family once, next to vLLM's own series with the same labels.
    assert text.count("# TYPE agentspec_drafts_total counter") == 1
    assert metric_value(text, "vllm:spec_decode_num_draft_tokens_total", LABELS) > 0


def test_the_dashboards_queries_name_series_the_server_exports(agentspec_server) -> None:
    spec = importlib.util.spec_from_file_location("grafana_dashboard", ROOT / "scripts" / "grafana_dashboard.py")
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        pytest.skip("grafana-foundation-sdk is not installed (the dev extra has it)")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dashboard = json.loads((ROOT / "docs" / "grafana" / "agentspec.json").read_text())
    queried = module.dashboard_series(dashboard)
    assert len(queried) > 30
    _repeat_a_session(agentspec_server.url)
    exported = _sample_names(_settled(agentspec_server.url, "agentspec_draft_length_count"))
    assert queried <= exported, sorted(queried - exported)


def test_two_api_servers_serve_the_series_from_the_multiprocess_folder(agentspec_secured_server) -> None:
    server = agentspec_secured_server
    base = server.url
    assert "ApiServer_1" in server.log_path.read_text(errors="replace")  # really two of them
    _repeat_a_session(base, {"Authorization": f"Bearer {SECURED_API_KEYS[0]}"})
    _settled(base, "agentspec_calls_started_total")
    # Scrapes land on either API server; each answers every series, and a counter never
    # goes back from one scrape to the next.
    started = []
    with httpx.Client(timeout=10) as client:
        for _ in range(8):
            client.headers["Connection"] = "close"  # a new connection: either server may take it
            text = client.get(base + "/metrics").raise_for_status().text
            for series in SERIES:
                assert f"# TYPE {series.exposed_name} {series.kind}" in text, series.name
            assert text.count("# TYPE agentspec_drafts_total counter") == 1
            started.append(metric_value(text, "agentspec_calls_started_total", LABELS))
            assert metric_value(text, "vllm:num_requests_running", LABELS) >= 0
    assert started == sorted(started) and started[0] >= 2
