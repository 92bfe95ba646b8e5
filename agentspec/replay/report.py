"""Reports of a replay: a rich table, a JSON file and a bar chart."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentspec.replay.run import ALL, ReplayResult
from agentspec.replay.speed_table import NO_SPECULATION, SpeedTable


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


#: Below this console width the table leaves out the cost columns (they stay in the JSON).
COMPACT_BELOW = 130


def render_table(result: ReplayResult, baseline: str | None = None, compact: bool = False) -> Table:
    """One row per (source, proposer); sources are separated, "all" comes last."""
    baseline = baseline or result.settings.get("baseline", "vllm-suffix")
    s = result.settings
    multi = (s.get("replicas") or 1) > 1
    from_profile = s["cost"].get("source") == "profile"
    batch = s["cost"].get("batch", 1)
    profiled = (
        f" (the server's measured cost profile; tok/s: the server's, {batch} request"
        f"{'s' if batch > 1 else ''} decoding at once)"
        if from_profile
        else ""
    )
    exchanging = ""
    if s.get("exchange") and multi:
        lag = s.get("exchange_lag") or 0
        exchanging = " exchanging outputs" + (f" {lag} calls late" if lag else "")
    caption = (
        f"AL = output tokens per decoding step (1.00 = no speculation); accept = accepted / "
        f"drafted tokens; vs oracle (/oracle), vs {baseline} (/base): AL ratios. replicas={s.get('replicas')}"
        f"{exchanging}, window={s.get('window')}{' with condenser seeding' if s.get('seed_dropped') else ''}, "
        f"concurrency={s.get('concurrency')}{' in lockstep' if s.get('lockstep') else ''}. Speedup estimate: "
        f"{s['cost']['step_ms']:.4g} ms/step + {s['cost']['draft_token_ms']:.4g} ms/draft token + "
        f"measured drafter time{profiled}."
    )
    table = Table(title="agentspec bench", caption=caption, caption_justify="left")
    right = {"justify": "right", "no_wrap": True}
    columns: list[tuple[str, dict[str, object]]] = [
        ("source", {"overflow": "fold", "min_width": min(14, max(map(len, result.sources()), default=6))}),
        ("proposer", {"no_wrap": True}),
    ]
    if multi:
        columns.append(("routing", {}))
    if not compact:
        columns.append(("calls", right))
    columns += [
        ("AL", {**right, "style": "bold"}),
        ("acc" if compact else "accept", right),
        ("/oracle" if compact else "vs oracle", right),
        ("/base" if compact else f"vs {baseline}", right),
    ]
    if not compact:
        columns += [("index µs/call", right), ("propose µs/step", right), ("peak MB", right)]
    columns.append(("speedup", {**right, "style": "bold"}))
    if from_profile:
        columns.append(("tok/s", right))
    for name, kw in columns:
        table.add_column(name, **kw)  # type: ignore[arg-type]
    sources = result.sources()
    for i, source in enumerate(sources):
        rows = [r for r in result.records if r.source == source]
        best = max((r.al for r in rows if r.proposer not in ("oracle", "none")), default=None)
        for k, r in enumerate(rows):
            al = f"{r.al:.3f}"
            if r.al == best:
                al = f"[green]{al}[/green]"
            cells = [source if k == 0 else "", r.proposer]
            if multi:
                cells.append(r.routing)
            if not compact:
                cells.append(f"{r.calls:,}")
            cells += [
                al,
                f"{r.acceptance_rate:.0%}" if r.drafted_tokens else "—",
                f"{r.al_vs_oracle:.0%}" if r.al_vs_oracle is not None else "—",
                _ratio(r.al_vs_baseline),
            ]
            if not compact:
                cells += [
                    f"{r.index_us_per_call:,.0f}",
                    f"{r.propose_us_per_step:,.1f}",
                    f"{r.peak_index_mb:,.1f}",
                ]
            cells.append(f"{r.est_speedup:.2f}×")
            if from_profile:
                cells.append(f"{r.est_tokens_per_s:,.1f}")
            table.add_row(
                *cells,
                end_section=i < len(sources) - 1 and k == len(rows) - 1,
                style="bold" if source == ALL else None,
            )
    return table


def print_report(result: ReplayResult, console: Console | None = None, baseline: str | None = None) -> None:
    console = console or Console()
    console.print(render_table(result, baseline, compact=console.width < COMPACT_BELOW))
    calls = result.record(result.proposers()[0]).calls if result.records else 0
    console.print(
        f"{sum(result.trajectories.values())} trajectories, {calls:,} calls, replayed in {result.wall_s:.1f} s"
    )
    for record in result.records:
        if record.source == ALL and record.counters:
            console.print(counters_line(record.proposer, record.counters))


def counters_line(proposer: str, c: dict[str, int]) -> str:
    """A proposer's own counters in words: the hybrid's choices, or a plain list."""
    if "drafter_runs" in c:
        return hybrid_line(proposer, c)
    return f"{proposer}: " + ", ".join(f"{key.replace('_', ' ')} {n:,}" for key, n in sorted(c.items()))


def hybrid_line(proposer: str, c: dict[str, int]) -> str:
    """What a hybrid's choices delivered (its counters, summed over sources)."""
    steps = c.get("drafter_runs", 0) + c.get("drafter_runs_skipped", 0)
    hard = c.get("hard_step_tokens", 0)
    drafted = c.get("model_draft_tokens", 0)
    return (
        f"{proposer}: model drafts on {c.get('model_drafts', 0):,} of {steps:,} steps"
        f" (its passes skipped on {c.get('drafter_runs_skipped', 0) / steps if steps else 0:.1%}),"
        f" {c.get('model_accepted_tokens', 0):,} of {drafted:,} model-drafted tokens accepted"
        f" ({c.get('model_accepted_tokens', 0) / drafted if drafted else 0:.1%}); share recovered"
        f" {c.get('hard_step_model_accepted_tokens', 0) / hard if hard else 0:.1%} (model-accepted tokens on the"
        f" {c.get('hard_steps', 0):,} steps the index expected < 2, over the {hard:,} tokens those steps decoded)"
    )


def render_speed_table(table: SpeedTable, baseline: str = "vllm-suffix") -> Table:
    """Estimated tokens/s by concurrency; each cell also gives the ratio to ``baseline``'s
    row (when there is one) and the draft cap it ran with."""
    concurrencies = list(table.batch)
    try:
        ref = table.row(baseline).tokens_per_s
    except KeyError:
        ref = None
    out = Table(
        title=f"Estimated tokens/s: {table.gpu}, {table.model}, tensor parallel {table.tensor_parallel}",
        caption=(
            f"Roofline of the decoding step (agentspec.draft_budget.speed_model; docs/speed.md) at "
            f"{table.context_tokens:,.0f} context tokens per step, with the replay's drafts and measured drafter "
            f"time. Batch by concurrency (what the KV cache holds): "
            f"{', '.join(f'{c}→{b}' for c, b in table.batch.items())}. (×: vs {baseline}; k: draft cap; "
            "p: probability cut)"
        ),
        caption_justify="left",
    )
    out.add_column("proposer", no_wrap=True)
    for c in concurrencies:
        out.add_column(f"c={c}", justify="right")
    for row in table.rows:
        cells = []
        for c in concurrencies:
            cell = f"{row.tokens_per_s[c]:,.0f}"
            if ref is not None and row.name != baseline:
                cell += f" {row.tokens_per_s[c] / ref[c]:.2f}×"
            if row.name != NO_SPECULATION and row.caps[c] is not None:
                cell += f" k={row.caps[c]}"
            if c in row.min_probs:
                cell += f" p≥{row.min_probs[c]:g}"
            cells.append(cell)
        out.add_row(row.name, *cells)
    return out


def load_note(table: SpeedTable) -> str | None:
    """A warning when the drafter times were measured on a busy machine, else where they
    were measured; None when that was not recorded."""
    on = table.measured_on
    if on is None:
        return None
    load = f"load average {on.load_1m:.1f} (1 min) / {on.load_5m:.1f} (5 min) on {on.cpus} CPUs"
    if on.busy:
        return (
            f"warning: drafter times measured on a busy machine ({load}, {on.own_processes} of it this replay):"
            " they are inflated and can turn the ratios around; re-run on a quiet machine"
        )
    return f"Drafter times measured at {load}."


def print_speed_table(table: SpeedTable, console: Console | None = None, baseline: str = "vllm-suffix") -> None:
    console = console or Console()
    console.print(render_speed_table(table, baseline))
    if (note := load_note(table)) is not None:
        console.print(note, style="bold red" if table.measured_on and table.measured_on.busy else None, markup=False)


def write_json(result: ReplayResult, path: Path, speed: Sequence[SpeedTable] = ()) -> None:
    """``{"settings": {...}, "records": [{"proposer", "source", "al", ...}, ...]}``, and
    ``"speed"``: the speed tables (:class:`SpeedTable`) when there are some."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = result.to_json_dict()
    if speed:
        data["speed"] = [table.model_dump(mode="json") for table in speed]
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_plot(result: ReplayResult, path: Path) -> None:
    """Grouped bars: AL per source (groups) per proposer (bars)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    sources = result.sources()
    proposers = result.proposers()
    width = 0.8 / max(1, len(proposers))
    fig, ax = plt.subplots(figsize=(min(16.0, 2.0 + 0.25 * len(sources) * max(1, len(proposers))), 4.8))
    for j, name in enumerate(proposers):
        xs = [i + (j - (len(proposers) - 1) / 2) * width for i in range(len(sources))]
        ys = [result.record(name, s).al for s in sources]
        bars = ax.bar(
            xs,
            ys,
            width,
            label=name,
            hatch="//" if name == "oracle" else None,
            alpha=0.55 if name == "oracle" else 1.0,
        )
        ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
    ax.set_xticks(range(len(sources)), sources, rotation=20, ha="right")
    ax.set_ylabel("AL (tokens per step)")
    ax.axhline(1.0, color="grey", linewidth=0.6)
    s = result.settings
    ax.set_title(f"Replay AL by source (replicas={s.get('replicas')}, window={s.get('window')})")
    ax.legend(fontsize=7, ncols=min(5, len(proposers)))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
