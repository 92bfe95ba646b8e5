"""End to end: ``agentspec bench`` on the bundled slice, through typer's CliRunner."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

RECORD_KEYS = {
    "proposer",
    "source",
    "calls",
    "output_tokens",
    "steps",
    "al",
    "acceptance_rate",
    "index_us_per_call",
    "propose_us_per_step",
}
PROPOSERS = ["none", "vllm-ngram", "vllm-suffix", "vllm-suffix-0.32", "agentspec", "oracle"]


def run(app: typer.Typer, tmp_path: Path, *args: str):
    result = CliRunner().invoke(
        app,
        ["bench", "--cache-dir", str(tmp_path / "cache"), "--ngram-impl", "numpy", "--quiet", *args],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


def test_bench_writes_table_json_and_plot(app: typer.Typer, tmp_path: Path) -> None:
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    result = run(
        app,
        tmp_path,
        "--sources",
        "tau_bench,codet",
        "--limit",
        "2",
        "--json",
        str(out_json),
        "--plot",
        str(out_png),
    )
    for name in PROPOSERS:
        assert name in result.output
    doc = json.loads(out_json.read_text())
    assert doc["settings"]["sources"] == ["tau_bench", "codet"]
    assert doc["settings"]["limit"] == 2
    records = doc["records"]
    assert {(r["proposer"], r["source"]) for r in records} == {
        (p, s) for p in PROPOSERS for s in ("tau_bench", "codet", "all")
    }
    for r in records:
        assert RECORD_KEYS <= r.keys()
        assert r["al"] >= 1.0 and 0.0 <= r["acceptance_rate"] <= 1.0
    by = {(r["proposer"], r["source"]): r for r in records}
    assert by[("none", "all")]["al"] == 1.0
    assert by[("none", "all")]["calls"] == by[("none", "tau_bench")]["calls"] + by[("none", "codet")]["calls"]
    # The oracle is the ceiling of what the index offers; vLLM's suffix method is below it.
    assert by[("oracle", "all")]["al"] >= by[("vllm-suffix", "all")]["al"] > 1.0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_replicas_routing_window_and_jobs(app: typer.Typer, tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    run(
        app,
        tmp_path,
        "--sources",
        "tau_bench,tot",
        "--limit",
        "1",
        "--proposers",
        "vllm-suffix,oracle",
        "--replicas",
        "4",
        "--routing",
        "oracle=group,vllm-suffix=spread",
        "--window",
        "1500",
        "--jobs",
        "2",
        "--json",
        str(out_json),
    )
    doc = json.loads(out_json.read_text())
    assert doc["settings"]["routing_effective"] == {"vllm-suffix": "spread", "oracle": "group"}
    assert doc["settings"]["window"] == 1500 and doc["settings"]["replicas"] == 4
    assert {r["routing"] for r in doc["records"] if r["proposer"] == "oracle"} == {"group"}


def test_bench_rejects_bad_options(app: typer.Typer, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "--routing", "nowhere", "--cache-dir", str(tmp_path)])
    assert result.exit_code != 0
    result = CliRunner().invoke(app, ["bench", "--proposers", "bogus", "--cache-dir", str(tmp_path), "-q"])
    assert result.exit_code != 0 and "unknown proposer" in result.output
    result = CliRunner().invoke(app, ["bench", "--seed-dropped", "--cache-dir", str(tmp_path), "-q"])
    assert result.exit_code != 0 and "give a window too" in result.output


def _bundled_bytes() -> bytes:
    from agentspec.replay.config import bundled_data

    return bundled_data().read_bytes()


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (lambda p: p.write_bytes(_bundled_bytes()[:2000]), [], "(a truncated or corrupt file?)"),
        (lambda p: p.write_bytes(b""), [], "holds no trajectories"),
        (lambda p: p.write_bytes(_bundled_bytes()), ["--sources", "nope"], "nope"),
        (
            lambda p: p.write_bytes(_bundled_bytes()),
            ["--baseline", "nope"],
            "baseline 'nope' is not among the proposers run",
        ),
        (lambda p: p.write_text('{"id": "x"}\n'), [], "data.jsonl.gz:1: trajectory 'x' names no source"),
        (lambda p: p.write_text("[1, 2]\n"), [], "data.jsonl.gz:1: a trajectory is a JSON object, got list"),
        (lambda p: p.write_text("\n{oops\n"), [], "data.jsonl.gz:2: not JSON"),
        (
            lambda p: p.write_text('{"id": "x", "source": "s", "kind": "agent", "turns": []}\n'),
            [],
            "data.jsonl.gz:1: trajectory 'x' has no turns",
        ),
        (
            lambda p: p.write_text('{"id": "x", "source": "s", "kind": "agent", "turns": [{"output": "y"}]}\n'),
            [],
            "data.jsonl.gz:1: turn 0: neither messages_in nor prefix_len",
        ),
    ],
    ids=[
        "truncated gzip",
        "empty file",
        "unknown source",
        "unknown baseline",
        "no source",
        "not an object",
        "not JSON",
        "no turns",
        "malformed turn",
    ],
)
def test_bad_input_gets_one_clear_line_and_a_non_zero_exit(
    app: typer.Typer, tmp_path: Path, make: Any, args: list[str], message: str
) -> None:
    data = tmp_path / "data.jsonl.gz"
    make(data)
    result = CliRunner().invoke(
        app, ["bench", "--data", str(data), "--cache-dir", str(tmp_path / "cache"), "-q", *args], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: agentspec bench: ") and message in lines[0], result.output


def test_the_baseline_defaults_to_a_proposer_that_runs(app: typer.Typer, tmp_path: Path) -> None:
    result = run(app, tmp_path, "--proposers", "none,agentspec", "--limit", "2")
    assert "vs none" in result.output.replace("\n", " ")


def test_a_missing_file_is_reported_before_the_heavy_imports(tmp_path: Path) -> None:
    """One line, exit 2, and neither vLLM nor torch imported by then: at once, not after the
    seconds they take to load."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from agentspec.cli import app\n"
        f"result = CliRunner().invoke(app, ['bench', '--data', {str(tmp_path / 'nope.jsonl')!r}])\n"
        "print(result.exit_code)\n"
        "print(result.output.strip())\n"
        "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    code_line, message, loaded = out.stdout.strip().splitlines()
    assert code_line == "2"
    assert message == f"error: agentspec bench: --data: no such file: {tmp_path / 'nope.jsonl'}"
    assert loaded == "[]"


def test_flags_show_no_type_in_help(app: typer.Typer) -> None:
    result = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert result.exit_code == 0, result.output
    for flag in ("--exchange ", "--seed-dropped", "--lockstep", "--hybrid-share", "--quiet"):
        (line,) = [line for line in result.output.splitlines() if flag in line]
        assert "<bool>" not in line, line
    assert "spread|session|group|client" in result.output


def _commands() -> list[list[str]]:
    from agentspec.cli import app

    return [[], *([name] for name in sorted(typer.main.get_command(app).commands))]


@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(["agentspec", *c]))
def test_no_help_shows_a_type_after_a_flag_or_an_int_range(command: list[str]) -> None:
    """Every command's help (the root's too): a flag, --help and --version included, takes
    no value so shows no type; a bounded count shows N, not typer's "<int range>"; other
    values are labelled in capitals (TEXT, INT, FILE), as serve's and vLLM's are."""
    from agentspec.cli import app

    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "240"}, terminal_width=240)
    assert result.exit_code == 0, result.output
    for flag in ("--help", *(["--version"] if not command else [])):
        (line,) = [line for line in result.output.splitlines() if re.search(rf"{flag}\b(?!-)", line) and "│" in line]
        assert re.search(rf"{flag}\s+(-h\s+)?[A-Z]", line), line  # the help text right after the names
    assert "<bool>" not in result.output and "range>" not in result.output
    assert not re.search(r"<(str|int|float|file|dir)>", result.output), result.output
    if command == ["bench"]:
        assert re.search(r"--limit\s+N\s+\[x>=1\]", result.output)
