"""mkdocs hooks: the site's pages that are made at build time from the repository itself,
so they stay in step with the code (mkdocs.yml names this file).

- ``index.md``: the README;
- ``integrations/<name>.md``: each integration package's README;
- ``changelog.md``: CHANGELOG.md;
- ``cli.md``: the command-line reference, generated from the CLI (typer's docs generator);
- the table of Prometheus series in ``metrics.md``, from ``agentspec.engine.api_server.prometheus.SERIES``;
- the table of ``agentspec serve``'s ``--agentspec-*`` options in ``engine.md``, from the
  settings' generated options (``agentspec.engine.launcher.options``), as ``serve -h`` shows them;
- ``report.md`` and ``replay-al.png``: ``agentspec bench --speed-model h100:8b`` on the bundled slice, run now
  (or read from the folder named by ``AGENTSPEC_DOCS_REPORT``: replay.json and al.png); bench.md's
  table of the slice comes from the same run;
- every table marked ``<!-- agentspec:table NAME -->``: made from the measured results in
  ``benchmarks/results/`` (``scripts/check_doc_figures.py``, which also checks the figures the
  pages quote in their text against them).

The last three are kept in ``docs/`` too, so they read in the repository as on the site
(the tables between ``<!-- agentspec:NAME -->`` and ``<!-- /agentspec:NAME -->``); the build
makes them anew either way, and tests/test_docs_hooks.py fails when the kept copy is stale.
Write them anew with::

    .venv/bin/python scripts/mkdocs_hooks.py

Links written for the repository (``docs/wire.md``, ``../../README.md``) are rewritten to
the site's pages; a link to a file that is not a page (an example script) becomes its path
in code type, so ``mkdocs build --strict`` finds no broken link.
"""

from __future__ import annotations

import importlib.util
import json
import os
import posixpath
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


def _load_figures() -> Any:
    spec = importlib.util.spec_from_file_location("check_doc_figures", ROOT / "scripts" / "check_doc_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_doc_figures", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


figures = _load_figures()
INTEGRATIONS = ("langchain", "openhands", "rl")
_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")

# Site page -> the repository folder its Markdown was written in (for its relative links).
_SOURCES: dict[str, str] = {"index.md": "", "changelog.md": ""} | {
    f"integrations/{name}.md": f"integrations/{name}" for name in INTEGRATIONS
}


#: Repository files shown as site pages (besides docs/*.md, which keep their names).
_PAGES_OF: dict[str, str] = {"README.md": "index.md", "CHANGELOG.md": "changelog.md"} | {
    f"integrations/{name}/README.md": f"integrations/{name}.md" for name in INTEGRATIONS
}


def _site_page(repo_path: str) -> str | None:
    """The site page (or file the site serves) that shows the repository file
    ``repo_path``, if any."""
    if repo_path.startswith("docs/") and (repo_path.endswith(".md") or (ROOT / repo_path).is_file()):
        return repo_path.removeprefix("docs/")
    return _PAGES_OF.get(repo_path)


def rewrite_links(markdown: str, page: str, source_dir: str) -> str:
    """Relative links of ``markdown`` (written in the repository folder ``source_dir``) as
    links between the site's pages, seen from ``page``."""

    def fix(match: re.Match[str]) -> str:
        text, target = match.groups()
        if re.match(r"^[a-z]+:|^#|^/", target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        repo_path = posixpath.normpath(posixpath.join(source_dir, path))
        site = _site_page(repo_path)
        if site is None:
            return f"{text} (`{repo_path}`)"
        relative = posixpath.relpath(site, posixpath.dirname(page) or ".")
        return f"[{text}]({relative}{'#' + anchor if anchor else ''})"

    return _LINK.sub(fix, markdown)


def _cli_reference() -> str:
    import typer
    from typer.cli import get_docs_for_click

    from agentspec.cli import app

    command = typer.main.get_command(app)
    ctx = command.make_context("agentspec", [], resilient_parsing=True)
    body = get_docs_for_click(obj=command, ctx=ctx, name="agentspec")
    head = (
        "# Command-line reference\n\nGenerated from the `agentspec` command itself (`scripts/mkdocs_hooks.py`,"
        f" typer {typer.__version__}).\n\n"
    )
    return head + body.replace("# `agentspec`", "## `agentspec`", 1).rstrip("\n") + "\n"


#: Where metrics.md wants the table of series.
SERIES_MARKER = "<!-- agentspec:series -->"


def series_table() -> str:
    """The Markdown table of every agentspec Prometheus series."""
    from agentspec.engine.api_server.prometheus import LABELS, SERIES

    every = " and ".join(f"`{label}`" for label in LABELS)
    lines = [f"| series | kind | labels besides {every} | meaning |", "|---|---|---|---|"]
    for series in SERIES:
        labels = ", ".join(f"`{label}`" for label in series.labels)
        lines.append(f"| `{series.exposed_name}` | {series.kind} | {labels} | {series.help} |")
    return "\n".join(lines)


#: Where engine.md wants the table of serve's own options.
SERVE_OPTIONS_MARKER = "<!-- agentspec:serve-options -->"
_DOCS_MENTION = re.compile(r"\bdocs/([\w-]+\.md)\b")


def serve_options_table(options: list[Any] | None = None) -> str:
    """The Markdown table of ``agentspec serve``'s ``--agentspec-*`` options: the
    settings' ``options`` (default: serve's own, :data:`SETTING_OPTIONS`) and the dry run,
    each with the default and help that ``serve -h`` shows."""
    from agentspec.engine.launcher import serve

    def cell(text: str) -> str:
        # Help is plain text: a pipe would split the cell, a star start emphasis.
        text = text.replace("|", "\\|").replace("*", "\\*")
        return _DOCS_MENTION.sub(r"[docs/\1](\1)", text)

    lines = ["| option | default | meaning |", "|---|---|---|"]
    for option in serve.SETTING_OPTIONS if options is None else options:
        flag = f"{option.flag} {option.metavar}" if option.metavar else option.flag
        default = "off" if option.is_flag else (f"`{option.default}`" if option.default is not None else "—")
        lines.append(f"| `{flag}` | {default} | {cell(option.help)} |")
    lines.append(f"| `--agentspec-dry-run` | off | {cell(serve.DRY_RUN_HELP)} |")
    return "\n".join(lines)


#: Page -> its generated tables, by marker name (kept in the page between the markers).
BLOCKS: dict[str, dict[str, Any]] = {
    "metrics.md": {"series": series_table},
    "engine.md": {"serve-options": serve_options_table},
}
#: Pages generated whole (kept in docs/ as well).
PAGES: dict[str, Any] = {"cli.md": _cli_reference}


def refresh_blocks(markdown: str, blocks: dict[str, Any]) -> str:
    """``markdown`` with each generated table made anew between its markers (a lone
    start marker gets its table and end marker). Raises ``ValueError`` for a lost marker."""
    for name, make in blocks.items():
        start, end = f"<!-- agentspec:{name} -->", f"<!-- /agentspec:{name} -->"
        block = re.compile(re.escape(start) + r"(?:.*?" + re.escape(end) + ")?", re.DOTALL)
        if block.search(markdown) is None:
            raise ValueError(f"a page lost its {start} marker")
        filled = f"{start}\n\n{make()}\n\n{end}"
        markdown = block.sub(lambda _m, filled=filled: filled, markdown, count=1)
    return markdown


def generated_docs(docs: Path = ROOT / "docs") -> dict[Path, str]:
    """What the kept generated pages and tables in ``docs`` should hold, by file."""
    out = {docs / page: make() for page, make in PAGES.items()}
    for page, blocks in BLOCKS.items():
        out[docs / page] = refresh_blocks((docs / page).read_text(), blocks)
    return out


def kept_cli_typer(docs: Path = ROOT / "docs") -> str | None:
    """The typer version that wrote the kept docs/cli.md (its generator's layout is typer's)."""
    found = re.search(r"typer ([\w.+-]+)\)", (docs / "cli.md").read_text()) if (docs / "cli.md").exists() else None
    return found.group(1) if found else None


def stale_docs(docs: Path = ROOT / "docs") -> list[str]:
    """The kept generated files in ``docs`` whose text is not what the code makes now."""
    return [path.name for path, text in generated_docs(docs).items() if not path.exists() or path.read_text() != text]


#: Where bench.md wants the table of the bundled slice (from the report's run).
SLICE_MARKER = "<!-- agentspec:slice-table -->"
_SLICE: dict[str, Any] = {}


def slice_table(result: dict[str, Any]) -> str:
    """bench.md's summary of ``agentspec bench`` on the bundled slice (its JSON), summed
    over sources."""
    settings = result["settings"]
    baseline = settings["baseline"]
    by = {r["proposer"]: r for r in result["records"] if r["source"] == "all"}
    lines = [f"| proposer | AL | acceptance | vs oracle | vs {baseline} |", "|---|---|---|---|---|"]
    for proposer in settings["proposers"]:
        r = by[proposer]
        acceptance = f"{r['acceptance_rate']:.0%}" if r["drafted_tokens"] else "—"
        vs_oracle = f"{r['al_vs_oracle']:.0%}" if r.get("al_vs_oracle") else ""
        vs_base = f"{r['al_vs_baseline']:.2f}×" if r.get("al_vs_baseline") else ""
        lines.append(f"| {proposer} | {r['al']:.3f} | {acceptance} | {vs_oracle} | {vs_base} |")
    return "\n".join(lines)


def _report(folder: Path) -> tuple[str, bytes]:
    """The benchmark report page and its plot, from ``agentspec bench``'s outputs."""
    result = json.loads((folder / "replay.json").read_text())
    _SLICE["result"] = result
    settings = result["settings"]
    baseline = settings["baseline"]
    proposers = settings["proposers"]
    rows = {}
    for record in result["records"]:
        rows.setdefault(record["source"], {})[record["proposer"]] = record
    lines = [
        "# Benchmark report",
        "",
        "Made when this site was built, by `agentspec bench --plot` on the slice of recorded",
        "trajectories bundled with the package (the same code the server runs; see",
        "[the benchmark](bench.md) for what is measured). AL is output tokens per decoding",
        f"step; the last column is agentspec's AL over {baseline}'s on the same calls.",
        "",
        "![AL by source](replay-al.png)",
        "",
        "| source | trajectories | " + " | ".join(proposers) + f" | agentspec / {baseline} |",
        "|---" * (len(proposers) + 3) + "|",
    ]
    for source, by in rows.items():
        count = settings["trajectories"].get(source, sum(settings["trajectories"].values()))
        ratio = by.get("agentspec", {}).get("al_vs_baseline")
        cells = [f"{by[p]['al']:.2f}" if p in by else "" for p in proposers]
        cells.append(f"{ratio:.2f}×" if ratio else "")
        lines.append(f"| {source} | {count} | " + " | ".join(cells) + " |")
    lines += ["", f"Replayed in {settings['wall_s']:.1f} s."]
    for table in result.get("speed", []):
        lines += _speed_lines(table)
    return "\n".join(lines) + "\n", (folder / "al.png").read_bytes()


def _speed_lines(table: dict[str, Any]) -> list[str]:
    """The report's tokens/s estimate (``agentspec bench --speed-model``; speed.md)."""
    concurrencies = list(table["batch"])
    lines = [
        "",
        f"## Estimated tokens/s: {table['gpu']}, {table['model']}",
        "",
        (
            f"From the same replay, by [the roofline model](speed.md): tensor parallel {table['tensor_parallel']}, "
            f"{table['context_tokens']:,.0f} context tokens per step; the drafter times are this build machine's."
        ),
        "",
        "| proposer | " + " | ".join(f"c={c}" for c in concurrencies) + " |",
        "|---" * (len(concurrencies) + 1) + "|",
    ]
    for row in table["rows"]:
        lines.append(f"| {row['name']} | " + " | ".join(f"{row['tokens_per_s'][c]:,.0f}" for c in concurrencies) + " |")
    return lines


def _run_bench(folder: Path) -> None:
    command = [sys.executable, "-m", "agentspec.cli", "bench", "--quiet", "--json", str(folder / "replay.json")]
    command += ["--speed-model", "h100:8b"]
    subprocess.run([*command, "--plot", str(folder / "al.png")], check=True, stdout=subprocess.DEVNULL)


def on_files(files: Files, config: Any) -> Files:
    pages = {
        "index.md": (ROOT / "README.md").read_text(),
        "changelog.md": (ROOT / "CHANGELOG.md").read_text(),
    }
    for name in INTEGRATIONS:
        pages[f"integrations/{name}.md"] = (ROOT / "integrations" / name / "README.md").read_text()
    given = os.environ.get("AGENTSPEC_DOCS_REPORT")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(given) if given else Path(scratch)
        if not (folder / "replay.json").exists():
            _run_bench(folder)
        pages["report.md"], plot = _report(folder)
    for path, content in pages.items():
        files.append(File.generated(config, path, content=content))
    files.append(File.generated(config, "replay-al.png", content=plot))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    path = page.file.src_uri
    source_dir = _SOURCES.get(path, "docs")
    # Made anew from the code, whatever the kept copy says (the tests catch a stale one).
    if path in PAGES:
        markdown = PAGES[path]()
    if path in BLOCKS:
        markdown = refresh_blocks(markdown, BLOCKS[path])
    if SLICE_MARKER in markdown:
        markdown = markdown.replace(SLICE_MARKER, slice_table(_SLICE["result"]))
    markdown = figures.render_tables(markdown, figures.Results())
    return rewrite_links(markdown, path, source_dir)


if __name__ == "__main__":
    for file, text in generated_docs().items():
        if not file.exists() or file.read_text() != text:
            file.write_text(text)
            print(f"wrote {file.relative_to(ROOT)}")
