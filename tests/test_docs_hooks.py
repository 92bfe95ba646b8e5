"""The docs site's link rewriting (scripts/mkdocs_hooks.py): links written for the
repository become links between the site's pages. The whole site is built strictly by
scripts/build_docs.sh."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed")
_spec = importlib.util.spec_from_file_location(
    "mkdocs_hooks", Path(__file__).parents[1] / "scripts" / "mkdocs_hooks.py"
)
assert _spec is not None and _spec.loader is not None
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)


@pytest.mark.parametrize(
    ("markdown", "page", "source_dir", "expected"),
    [
        ("see [wire](docs/wire.md#seeds)", "index.md", "", "see [wire](wire.md#seeds)"),
        ("[rl](integrations/rl/README.md)", "index.md", "", "[rl](integrations/rl.md)"),
        ("[home](../../README.md)", "integrations/rl.md", "integrations/rl", "[home](../index.md)"),
        ("[wire](../../docs/wire.md#policy)", "integrations/rl.md", "integrations/rl", "[wire](../wire.md#policy)"),
        ("[pkg](../integrations/rl/README.md#measured)", "rl.md", "docs", "[pkg](integrations/rl.md#measured)"),
        ("[script](examples/rl/verl_agent_loop.py)", "index.md", "", "script (`examples/rl/verl_agent_loop.py`)"),
        ("[json](grafana/agentspec.json)", "metrics.md", "docs", "[json](grafana/agentspec.json)"),
        (
            "[out](https://x.org/a.md) [here](#top) ![img](a.png)",
            "faq.md",
            "docs",
            "[out](https://x.org/a.md) [here](#top) ![img](a.png)",
        ),
    ],
)
def test_repository_links_become_site_links(markdown: str, page: str, source_dir: str, expected: str) -> None:
    assert hooks.rewrite_links(markdown, page, source_dir) == expected


def test_the_cli_reference_comes_from_the_cli() -> None:
    text = hooks._cli_reference()
    assert "## `agentspec serve`" in text and "--agentspec-exchange-dir" in text and "--version" in text


def test_the_metrics_page_lists_every_series() -> None:
    from agentspec.engine.api_server.prometheus import SERIES

    table = hooks.series_table()
    assert hooks.SERIES_MARKER in (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    for series in SERIES:
        assert f"| `{series.exposed_name}` | {series.kind} |" in table
    assert "labels besides `model_name` and `engine`" in table
    assert "| `agentspec_drafts_total` | counter | `level` |" in table
    assert "`agentspec_draft_length` | histogram |  |" in table


def test_the_report_renders_the_speed_estimate_from_benchs_json() -> None:
    import json

    from agentspec.replay.speed_table import SpeedRow, SpeedTable

    table = SpeedTable(
        gpu="H100 SXM",
        model="Llama-3-8B shape",
        tensor_parallel=1,
        context_tokens=4042.4,
        batch={1: 1, 128: 102},
        rows=[SpeedRow(name="no speculation", tokens_per_s={1: 132.2, 128: 3530.4}, caps={1: 0, 128: 0})],
    )
    lines = hooks._speed_lines(json.loads(json.dumps(table.model_dump(mode="json"))))
    assert "## Estimated tokens/s: H100 SXM, Llama-3-8B shape" in lines
    assert "| proposer | c=1 | c=128 |" in lines and "| no speculation | 132 | 3,530 |" in lines


def test_benchs_table_of_the_slice_comes_from_the_reports_run() -> None:
    def rec(
        proposer: str, al: float, acceptance: float, drafted: int, vs_oracle: float, vs_base: float
    ) -> dict[str, object]:
        return {
            "proposer": proposer,
            "source": "all",
            "al": al,
            "acceptance_rate": acceptance,
            "drafted_tokens": drafted,
            "al_vs_oracle": vs_oracle,
            "al_vs_baseline": vs_base,
        }

    result = {
        "settings": {"baseline": "vllm-suffix", "proposers": ["none", "vllm-suffix", "agentspec"]},
        "records": [
            rec("none", 1.0, 0.0, 0, 0.26, 0.37),
            rec("vllm-suffix", 2.683, 0.55, 900, 0.68, 1.0),
            rec("agentspec", 3.024, 0.404, 1400, 0.77, 1.127),
            {**rec("agentspec", 9.0, 0.9, 1, 0.9, 9.0), "source": "tau_bench"},
        ],
    }
    assert hooks.SLICE_MARKER in (Path(__file__).parents[1] / "docs" / "bench.md").read_text()
    assert hooks.slice_table(result).splitlines() == [
        "| proposer | AL | acceptance | vs oracle | vs vllm-suffix |",
        "|---|---|---|---|---|",
        "| none | 1.000 | — | 26% | 0.37× |",
        "| vllm-suffix | 2.683 | 55% | 68% | 1.00× |",
        "| agentspec | 3.024 | 40% | 77% | 1.13× |",
    ]


def test_marked_tables_are_made_from_the_measured_results() -> None:
    text = hooks.figures.render_tables("<!-- agentspec:table dev-set -->", hooks.figures.Results())
    assert text.startswith("| source | trajectories | calls |")
    assert "| **all** |" in text and "benchmarks/results/dev-replay-targets.json" in text


def test_engines_table_of_options_is_every_option_serve_h_lists() -> None:
    import re

    from typer.testing import CliRunner

    from agentspec.cli import app

    help_text = CliRunner().invoke(app, ["serve", "-h"], env={"COLUMNS": "240"}, terminal_width=240).output
    listed = set(re.findall(r"(--agentspec-[a-z-]+)", help_text))
    table = hooks.serve_options_table()
    shown = set(re.findall(r"^\| `(--agentspec-[a-z-]+)", table, re.MULTILINE))
    assert listed and shown == listed
    assert hooks.SERVE_OPTIONS_MARKER in (Path(__file__).parents[1] / "docs" / "engine.md").read_text()
    # Defaults and metavars as serve -h shows them; help text stays inside its cell.
    assert "| `--agentspec-full-draft-batch INT` | `8` | Full-length drafts up to" in table
    assert "| `--agentspec-share-across-tenants` | off |" in table
    assert "`--agentspec-drafter-method draft_model|eagle|eagle3`" in table
    assert "(secrets shown as \\*\\*\\*)" in table and "[docs/security.md](security.md)" in table


def test_engines_table_of_options_follows_the_settings_help() -> None:
    import dataclasses

    from agentspec.engine.launcher.options import setting_options

    changed = [
        dataclasses.replace(o, help="A changed help | with a pipe.") if o.flag == "--agentspec-max-seeds" else o
        for o in setting_options()
    ]
    line = next(line for line in hooks.serve_options_table(changed).splitlines() if "--agentspec-max-seeds " in line)
    assert line == "| `--agentspec-max-seeds INT` | `16` | A changed help \\| with a pipe. |"


def test_the_generated_pages_kept_in_docs_are_current() -> None:
    """docs/cli.md and the generated tables in metrics.md and engine.md read in the
    repository as on the site."""
    import typer

    stale = hooks.stale_docs()
    if stale == ["cli.md"] and hooks.kept_cli_typer() != typer.__version__:
        # typer's docs generator lays the page out; another typer writes another page.
        pytest.skip(f"docs/cli.md was written by typer {hooks.kept_cli_typer()}, this is typer {typer.__version__}")
    assert not stale, f"stale: {', '.join(stale)}; write them anew: .venv/bin/python scripts/mkdocs_hooks.py"


def test_generated_tables_are_made_anew_between_their_markers() -> None:
    blocks = {"t": lambda: "| new |"}
    kept = "a\n\n<!-- agentspec:t -->\n\n| old |\n\n<!-- /agentspec:t -->\n\nb"
    assert hooks.refresh_blocks(kept, blocks) == "a\n\n<!-- agentspec:t -->\n\n| new |\n\n<!-- /agentspec:t -->\n\nb"
    lone = "a\n\n<!-- agentspec:t -->\n\nb"
    assert hooks.refresh_blocks(lone, blocks) == "a\n\n<!-- agentspec:t -->\n\n| new |\n\n<!-- /agentspec:t -->\n\nb"
    with pytest.raises(ValueError, match="lost its <!-- agentspec:t --> marker"):
        hooks.refresh_blocks("a", blocks)
