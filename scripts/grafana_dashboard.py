"""The Grafana dashboard for agentspec's Prometheus series (docs/grafana/agentspec.json).

The dashboard is built with the grafana-foundation-sdk builders (``pip install
grafana-foundation-sdk``), never written by hand. Regenerate the committed JSON after
changing this script::

    python scripts/grafana_dashboard.py > docs/grafana/agentspec.json

and check that the committed file is current (exit status 1 and one line when it is not)::

    python scripts/grafana_dashboard.py --check docs/grafana/agentspec.json

The dashboard has a ``datasource`` variable (any Prometheus data source), a ``model_name``
variable and a multi-valued ``engine`` variable; every query selects
``{model_name="$model_name", engine=~"$engine"}``, on agentspec's series and on vLLM's
``vllm:spec_decode_*`` counters alike. Rows: drafting, sessions and index, requests and
budget, seeds/security/policy, fleet exchange.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
    VariableSort,
)

#: Every panel and every query reads from the data source picked in the ``datasource`` variable.
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
#: The label matchers of every query.
SELECTOR = 'model_name="$model_name", engine=~"$engine"'
RATE_INTERVAL = "$__rate_interval"

# Units: Grafana's own where one fits, else a custom suffix.
TOKENS_PER_S = "suffix: tokens/s"
PER_S = "suffix: /s"
#: The legend of per-engine series: the scraped server and vLLM's data-parallel rank.
PER_ENGINE = "{{instance}} engine {{engine}}"

Builder = Any  # a grafana-foundation-sdk panel or row builder


def series(metric: str, labels: str = "") -> str:
    """``metric{model_name=..., engine=~...[, labels]}``."""
    return f"{metric}{{{SELECTOR}{', ' + labels if labels else ''}}}"


def rate(metric: str, labels: str = "") -> str:
    """``rate(metric{...}[$__rate_interval])``."""
    return f"rate({series(metric, labels)}[{RATE_INTERVAL}])"


def summed(expr: str, by: str = "") -> str:
    """``sum(expr)``, or ``sum by (by) (expr)``."""
    return f"sum by ({by}) ({expr})" if by else f"sum({expr})"


def quantile(q: float, bucket_metric: str) -> str:
    """The ``q`` quantile of a histogram over all selected series."""
    return f"histogram_quantile({q}, {summed(rate(bucket_metric), 'le')})"


def _targets(queries: list[tuple[str, str]]) -> list[prometheus.Dataquery]:
    """Prometheus range queries with ref ids A, B, ... and legends."""
    return [
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)).datasource(DATASOURCE).range()
        for i, (expr, legend) in enumerate(queries)
    ]


def graph(
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    unit: str,
    *,
    width: int = 8,
    min_val: float | None = 0,
    max_val: float | None = None,
) -> timeseries.Panel:
    """A time series panel; ``queries`` are (PromQL, legend) pairs."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .span(width)
        .height(8)
        .fill_opacity(10)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING)
        )
    )
    if min_val is not None:
        panel.min(min_val)
    if max_val is not None:
        panel.max(max_val)
    return panel


def single(
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    unit: str,
    *,
    width: int = 8,
    height: int = 5,
    red_from: float | None = None,
) -> stat.Panel:
    """A stat panel (last value, with a sparkline); red from ``red_from`` when given."""
    steps = [Threshold(value=None, color="green")]
    if red_from is not None:
        steps.append(Threshold(value=red_from, color="red"))
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .span(width)
        .height(height)
        .graph_mode(common.BigValueGraphMode.AREA)
        .color_mode(common.BigValueColorMode.VALUE if red_from is None else common.BigValueColorMode.BACKGROUND)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps))
    )


def _acceptance(accepted: str, drafted: str, by: str = "") -> str:
    return f"{summed(rate(accepted), by)} / {summed(rate(drafted), by)}"


def rows() -> list[tuple[str, list[Builder]]]:
    """The dashboard's rows: (title, panels), in order."""
    drafting = [
        graph(
            "Acceptance rate by level",
            "Accepted over proposed draft tokens for each index level the drafts came from; a level far below "
            "the others wastes verification work, so raise the draft policy's min_token_prob (docs/tuning.md).",
            [(_acceptance("agentspec_accepted_tokens_total", "agentspec_draft_tokens_total", "level"), "{{level}}")],
            "percentunit",
            width=12,
            max_val=1,
        ),
        graph(
            "Acceptance rate: agentspec vs vLLM",
            "agentspec's acceptance rate over all levels next to vLLM's own spec-decode counters; "
            "they should move together, and a lasting gap means drafts that agentspec does not count "
            "(check Unadmitted requests).",
            [
                (_acceptance("agentspec_accepted_tokens_total", "agentspec_draft_tokens_total"), "agentspec"),
                (
                    _acceptance(
                        "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"
                    ),
                    "vLLM",
                ),
            ],
            "percentunit",
            width=12,
            max_val=1,
        ),
        graph(
            "Accepted tokens per second by level",
            "Draft tokens the target model accepted, by the index level that proposed them; "
            "this is the speed-up itself, so a drop with steady traffic points to a policy change or evictions.",
            [(summed(rate("agentspec_accepted_tokens_total"), "level"), "{{level}}")],
            TOKENS_PER_S,
            width=12,
        ),
        graph(
            "Drafts per second by level",
            "Drafts proposed, by index level; zero for every level while requests run means drafting is off "
            "(see Draft steps limited by the budget).",
            [(summed(rate("agentspec_drafts_total"), "level"), "{{level}}")],
            "suffix: drafts/s",
            width=12,
        ),
        graph(
            "Mean accepted tokens per draft",
            "Average accepted tokens per non-empty draft; below about 1 drafting barely pays, "
            "so look at the acceptance by level and the draft length.",
            [
                (
                    " / ".join(
                        summed(rate(f"agentspec_accepted_tokens_per_draft_{part}")) for part in ("sum", "count")
                    ),
                    "mean",
                )
            ],
            "suffix: tokens",
        ),
        graph(
            "Accepted tokens per draft (p50, p90)",
            "Quantiles of accepted tokens per draft; a p90 far above the p50 means a few long matches carry the "
            "gain, which is normal for repetitive agent sessions.",
            [
                (quantile(0.5, "agentspec_accepted_tokens_per_draft_bucket"), "p50"),
                (quantile(0.9, "agentspec_accepted_tokens_per_draft_bucket"), "p90"),
            ],
            "suffix: tokens",
        ),
        graph(
            "Draft length (p50, p90)",
            "Quantiles of proposed draft lengths (zero when the index matched nothing); long drafts with a low "
            "accepted p50 waste verification, so raise min_token_prob or lower max_spec_factor (docs/tuning.md).",
            [
                (quantile(0.5, "agentspec_draft_length_bucket"), "p50"),
                (quantile(0.9, "agentspec_draft_length_bucket"), "p90"),
            ],
            "suffix: tokens",
        ),
    ]
    sessions = [
        single(
            "Sessions",
            "Sessions held by the draft index, summed over the selected engines; if it climbs while Index memory "
            "nears the host's limit, lower the budgets of --agentspec-index-config.",
            [(summed(series("agentspec_sessions")), "sessions")],
            "short",
        ),
        single(
            "Groups",
            "Groups held by the draft index; it should follow the number of concurrent tasks, "
            "so an unbounded climb points at clients minting a new group per request.",
            [(summed(series("agentspec_groups")), "groups")],
            "short",
        ),
        single(
            "Active calls",
            "Requests being drafted for right now; it should match vLLM's running requests, "
            "and a value stuck above zero when idle means calls were not released.",
            [(summed(series("agentspec_active_calls")), "calls")],
            "short",
        ),
        graph(
            "Index tokens by level",
            "Tokens held by the index for each level (session, group, global); a level pinned at its budget "
            "evicts constantly, so raise that budget of --agentspec-index-config if memory allows.",
            [(summed(series("agentspec_index_tokens"), "level"), "{{level}}")],
            "short",
            width=12,
        ),
        graph(
            "Index memory",
            "Estimated memory of the index's suffix trees, per engine; when it nears the host's free memory, "
            "lower the budgets of --agentspec-index-config.",
            [(summed(series("agentspec_index_memory_bytes"), "instance, engine"), PER_ENGINE)],
            "bytes",
            width=12,
        ),
        graph(
            "Evictions per second by scope",
            "Sessions and groups evicted from the index; session evictions rising under steady traffic mean "
            "sessions are evicted before their next call, so raise the index budgets or pin fewer sessions per server.",
            [(summed(rate("agentspec_evictions_total"), "scope"), "{{scope}}")],
            "suffix: evictions/s",
        ),
        graph(
            "Evicted tokens per second",
            "Tokens dropped by eviction; compare with Indexing, and if most indexed tokens are soon evicted "
            "the index is too small for the traffic.",
            [(summed(rate("agentspec_evicted_tokens_total")), "evicted")],
            TOKENS_PER_S,
        ),
        graph(
            "Indexing",
            "Prompt tokens newly indexed at call start versus tokens the session had already indexed; "
            "a high new share in multi-turn sessions means calls do not extend their session's earlier text "
            "(a missing session id, or a client that rewrites its history).",
            [
                (summed(rate("agentspec_index_new_tokens_total")), "new"),
                (summed(rate("agentspec_index_reused_tokens_total")), "reused"),
            ],
            TOKENS_PER_S,
        ),
    ]
    requests = [
        graph(
            "Calls per second",
            "Requests the proposer started drafting for and released; started well above finished for long "
            "means requests are piling up or being lost.",
            [
                (summed(rate("agentspec_calls_started_total")), "started"),
                (summed(rate("agentspec_calls_finished_total")), "finished"),
            ],
            "reqps",
            width=12,
        ),
        graph(
            "Draft steps limited by the budget",
            "Draft steps whose budget the batch size cut, or switched off; many off steps mean the batches are "
            "too large for speculation to pay, which is expected under heavy load (batch thresholds: docs/tuning.md).",
            [
                (summed(rate("agentspec_budget_limited_steps_total")), "limited"),
                (summed(rate("agentspec_budget_off_steps_total")), "off"),
            ],
            "suffix: steps/s",
            width=12,
        ),
        graph(
            "Batch size",
            "Requests in each engine's latest draft step; it drives the draft budget, "
            "so a batch size stuck high explains a low budget.",
            [(summed(series("agentspec_batch_size"), "instance, engine"), PER_ENGINE)],
            "short",
            width=12,
        ),
        graph(
            "Draft budget",
            "Draft tokens per request in each engine's latest step; zero means drafting is off at this batch size, "
            "set by --agentspec-full-draft-batch and --agentspec-no-draft-batch.",
            [(summed(series("agentspec_draft_budget"), "instance, engine"), PER_ENGINE)],
            "suffix: tokens",
            width=12,
        ),
        graph(
            "Draft probability cut",
            "Path probability below which each engine's latest drafts stopped; above zero only with "
            "--agentspec-speed-model, where the speed model found the drafts' unlikely tails cost more "
            "verification than they bring at this batch size.",
            [(summed(series("agentspec_draft_min_prob"), "instance, engine"), PER_ENGINE)],
            "short",
            width=12,
        ),
    ]
    seeds = [
        graph(
            "Seeded tokens per second",
            "Tokens seeded into sessions and groups from requests; zero while clients send seeds means "
            "the seeds are refused (see Seed requests and errors).",
            [(summed(rate("agentspec_seeded_tokens_total")), "seeded")],
            TOKENS_PER_S,
        ),
        graph(
            "Seed requests and errors",
            "Seed-only requests applied and seeds the index refused; errors mean seeds over the index's "
            "limits, so send shorter seeds or raise the index budgets.",
            [
                (summed(rate("agentspec_seed_only_requests_total")), "seed-only requests"),
                (summed(rate("agentspec_seed_errors_total")), "errors"),
            ],
            PER_S,
        ),
        single(
            "Unadmitted requests",
            "Requests that reached the engine without agentspec's middleware and ran as plain vLLM; any non-zero "
            "value means a route or caller bypasses agentspec, so find it (docs/security.md).",
            [(summed(rate("agentspec_unadmitted_requests_total")), "unadmitted")],
            "reqps",
            height=8,
            red_from=1e-9,
        ),
        single(
            "Policy version",
            "The live policy version (RL weight updates), lowest and highest over the selected engines; "
            "if they differ for long an engine missed a policy update.",
            [
                (f"min({series('agentspec_policy_version')})", "min"),
                (f"max({series('agentspec_policy_version')})", "max"),
            ],
            "none",
            height=8,
        ),
        graph(
            "Policy updates per second",
            "New policy versions announced; updates without the policy version advancing mean "
            "the announcements do not reach every engine.",
            [(summed(rate("agentspec_policy_updates_total")), "updates")],
            "suffix: updates/s",
        ),
        graph(
            "Retired output tokens per second",
            "Output tokens retired from group and global drafting by policy updates; it should spike at each "
            "update and return to zero, so a steady rate means updates arrive continuously.",
            [(summed(rate("agentspec_retired_output_tokens_total")), "retired")],
            TOKENS_PER_S,
        ),
    ]
    exchange = [
        graph(
            "Exchanged outputs per second",
            "Finished outputs published to the other replicas, received from them, and dropped as generated under "
            "a retired policy; published without received means the replicas do not share the exchange (folder "
            "or Redis stream).",
            [
                (summed(rate("agentspec_exchange_published_total")), "published"),
                (summed(rate("agentspec_exchange_received_total")), "received"),
                (summed(rate("agentspec_exchange_retired_total")), "retired"),
            ],
            "suffix: outputs/s",
            width=12,
        ),
        graph(
            "Exchanged tokens per second",
            "Tokens of other replicas' outputs indexed into the global corpus; zero with several replicas means "
            "the exchange is off or not shared (see --agentspec-exchange-dir and --agentspec-exchange).",
            [(summed(rate("agentspec_exchange_received_tokens_total")), "received")],
            TOKENS_PER_S,
            width=12,
        ),
        graph(
            "Redis: entries per second",
            "The Redis transport: outputs Redis took (sent), entries read from it, this replica's own earlier "
            "outputs read back after a restart (restored), and entries skipped by reason or dropped by a full "
            "queue. Skipped foreign entries mean another model writes to this stream.",
            [
                (summed(rate("agentspec_exchange_sent_total")), "sent"),
                (summed(rate("agentspec_exchange_read_total")), "read"),
                (summed(rate("agentspec_exchange_restored_total")), "restored"),
                (summed(rate("agentspec_exchange_skipped_total"), "reason"), "skipped {{reason}}"),
                (summed(rate("agentspec_exchange_dropped_total"), "direction"), "dropped {{direction}}"),
            ],
            "suffix: entries/s",
        ),
        graph(
            "Redis: connected and lag",
            "Per engine: whether it reaches Redis (1) or drafts from its own text alone (0), and the age of the "
            "latest entry it read (publication to reading, seconds; machine clocks apart add to it).",
            [
                (series("agentspec_exchange_connected"), "connected " + PER_ENGINE),
                (series("agentspec_exchange_lag_seconds"), "lag " + PER_ENGINE),
            ],
            "none",
        ),
        graph(
            "Redis: queued and outages",
            "Outputs waiting to be sent (they pile up while Redis is unreachable, up to a bound) and outages per hour.",
            [
                (summed(series("agentspec_exchange_pending")), "queued"),
                (f"sum(increase({series('agentspec_exchange_outages_total')}[1h]))", "outages/h"),
            ],
            "none",
        ),
    ]
    hybrid = [
        graph(
            "Accepted tokens per second by path",
            "Draft tokens the target model accepted, by the drafter that proposed them: the index (suffix) or "
            "the draft model (model); empty unless the server runs with --agentspec-drafter.",
            [(summed(rate("agentspec_path_accepted_tokens_total"), "path"), "{{path}}")],
            TOKENS_PER_S,
            width=8,
        ),
        graph(
            "Acceptance rate by path",
            "Accepted over proposed draft tokens for each drafter; a model path far below the suffix path means "
            "the draft model fits this traffic poorly (docs/engine.md, choosing a drafter).",
            [
                (
                    _acceptance("agentspec_path_accepted_tokens_total", "agentspec_path_draft_tokens_total", "path"),
                    "{{path}}",
                )
            ],
            "percentunit",
            width=8,
            max_val=1,
        ),
        graph(
            "Draft model passes",
            "Steps that ran the draft model's draft passes, steps that skipped them because every request took "
            "the index's draft, and steps without any draft (none); skipped steps cost only the first pass.",
            [
                (summed(rate("agentspec_drafter_runs_total")), "ran"),
                (summed(rate("agentspec_drafter_runs_skipped_total")), "skipped"),
                (summed(rate("agentspec_path_drafts_total", 'path="none"')), "none"),
            ],
            "suffix: steps/s",
            width=8,
        ),
        graph(
            "Time in the draft model",
            "Seconds per second the engine spends in the draft model (all its passes), per engine; compare with "
            "the accepted tokens it adds to judge whether the drafter pays.",
            [(summed(rate("agentspec_drafter_seconds_total"), "instance, engine"), PER_ENGINE)],
            "percentunit",
            width=24,
        ),
    ]
    return [
        ("Drafting", drafting),
        ("Hybrid drafting", hybrid),
        ("Sessions and index", sessions),
        ("Requests and budget", requests),
        ("Seeds, security, policy", seeds),
        ("Fleet exchange", exchange),
    ]


def variables() -> list[Builder]:
    """``datasource``, ``model_name`` and ``engine`` (multi-valued, with All)."""
    return [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        dashboard.QueryVariable("model_name")
        .label("Model")
        .datasource(DATASOURCE)
        .query("label_values(agentspec_calls_started_total, model_name)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC),
        dashboard.QueryVariable("engine")
        .label("Engine")
        .datasource(DATASOURCE)
        .query('label_values(agentspec_calls_started_total{model_name="$model_name"}, engine)')
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
    ]


def build() -> dict[str, Any]:
    """The dashboard as a JSON-able dict."""
    ids = itertools.count(1)
    board = (
        dashboard.Dashboard("agentspec")
        .uid("agentspec")
        .description("Session-aware speculative decoding on vLLM: drafting, index, budget, seeds, policy, exchange.")
        .tags(["agentspec", "vllm"])
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .variables(variables())
    )
    for title, panels in rows():
        board.with_row(dashboard.Row(title).id(next(ids)))
        for panel in panels:
            board.with_panel(panel.id(next(ids)))
    # The encoder turns the SDK's models into plain JSON; a round trip makes it a dict.
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render() -> str:
    """The dashboard's JSON text, as committed."""
    return json.dumps(build(), indent=2) + "\n"


_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w.:$])[A-Za-z_:][\w:]*")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})


def expr_series(expr: str) -> set[str]:
    """The metric names a PromQL expression reads, exactly as written (``_bucket`` kept)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors
    text = _GROUPING.sub(" ", text)  # by (...), on (...), ...: label names
    names = set()
    for match in _NAME.finditer(text):
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation: rate(, sum(, histogram_quantile(
        if match.group().lower() not in _KEYWORDS:
            names.add(match.group())
    return names


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # a collapsed row holds its panels


def dashboard_series(dashboard: dict[str, Any]) -> set[str]:
    """Every metric name in the ``expr`` of every panel target of ``dashboard``."""
    return {
        name
        for panel in _panels(dashboard.get("panels") or [])
        for target in panel.get("targets") or []
        for name in expr_series(target.get("expr", ""))
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", metavar="FILE", type=Path, help="exit 1 if FILE differs from the generated JSON")
    args = parser.parse_args(argv)
    text = render()
    if args.check is None:
        sys.stdout.write(text)
        return 0
    try:
        current = args.check.read_text()
    except OSError as e:
        print(
            f"{args.check}: cannot read ({e.strerror}); run: python scripts/grafana_dashboard.py > {args.check}",
            file=sys.stderr,
        )
        return 1
    if current != text:
        print(f"{args.check} is out of date; run: python scripts/grafana_dashboard.py > {args.check}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
