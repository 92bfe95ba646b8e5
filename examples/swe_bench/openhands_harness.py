"""The SWE-bench-style harness with OpenHands' CodeAct agent on agentspec (Python >= 3.12).

    agentspec serve Qwen/Qwen2.5-Coder-7B-Instruct --port 8000 \\
        --enable-auto-tool-choice --tool-call-parser hermes
    pip install -e integrations/openhands openhands-tools
    python examples/swe_bench/openhands_harness.py --base-url http://localhost:8000 --attempts 2

The same instances as harness.py, solved by OpenHands' own agent (terminal and file-editor
tools, a summarising condenser) instead of a bash-only loop. agentspec's part is
openhands-agentspec's: every attempt of an instance is a new OpenHands conversation in
the instance's group (one server behind vllm-router, drafts shared between attempts);
what the condenser forgets and every failed command or edit are seeded; a failed
attempt's patch is seeded into the group before the next attempt. See README.md.
"""

from __future__ import annotations

import os

# Before OpenHands is imported: no network look-up of litellm's price list, no banner.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from harness import (
    DEFAULT_INSTANCES,
    DEFAULT_URL,
    Instance,
    Settings,
    _first_model,
    load_instances,
    read_repo,
    resolve_isolation,
    run_command,
    task_message,
    unified_diff,
    write_repo,
)
from openhands.sdk import Agent, Conversation, Tool
from openhands.sdk.context.condenser import LLMSummarizingCondenser
from openhands.sdk.conversation.exceptions import ConversationRunError
from openhands.sdk.event import ActionEvent, Event
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool
from rich.console import Console
from rich.table import Table

from agentspec.client import SessionNotFoundError
from openhands_agentspec import AgentspecTask

console = Console()
app = typer.Typer(add_completion=False, help=__doc__.splitlines()[0] if __doc__ else None)


@dataclasses.dataclass
class OpenHandsAttempt:
    """One conversation at an instance and what came of it."""

    instance_id: str
    attempt: int
    conversation_id: str
    steps: int = 0
    resolved: bool = False
    error: str | None = None
    """Why the conversation stopped short (a refused or failed model call), if it did."""
    patch: str = ""
    test_output: str = ""
    failed_calls_seeded: int = 0
    seeded_patch_tokens: int = 0
    """Tokens of the previous attempt's patch seeded into the group before this one."""
    stats: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class OpenHandsSettings:
    base_url: str
    model: str
    attempts: int = 2
    max_steps: int = 20
    max_tokens: int = 1024
    temperature: float = 0.7
    condense_after: int = 40
    """Events in the agent's view before the summarising condenser cuts the middle."""
    api_key: str | None = None
    system_prompt: str | None = None
    """Replaces OpenHands' own system prompt (for models with a short context)."""
    extra_body: dict[str, Any] = dataclasses.field(default_factory=dict)
    """More request-body fields for vLLM (``top_p``, ``structured_outputs``, ...)."""
    harness: Settings = Settings()
    """Test command runs: isolation, limits, timeout (harness.py's)."""


def run_attempt(
    task: AgentspecTask, instance: Instance, settings: OpenHandsSettings, number: int, seed: str
) -> OpenHandsAttempt:
    """One OpenHands conversation in a fresh copy of the instance's repository."""
    llm = task.llm()
    summariser = LLMSummarizingCondenser(
        llm=task.llm(usage_id="condenser"), max_size=settings.condense_after, keep_first=2
    )
    agent = Agent(
        llm=llm,
        tools=[Tool(name=TerminalTool.name), Tool(name=FileEditorTool.name)],
        condenser=task.condenser(summariser),
        system_prompt=settings.system_prompt,
    )
    attempt = task.attempt()
    result = OpenHandsAttempt(instance.instance_id, number, str(attempt.conversation_id))
    if seed:  # the previous attempt's failed patch: most of a fix rewrites that text
        result.seeded_patch_tokens = attempt.seed(seed)

    def count_steps(event: Event) -> None:
        if isinstance(event, ActionEvent):
            result.steps += 1

    with tempfile.TemporaryDirectory(prefix="openhands-attempt-") as tmp:
        root = write_repo(instance.repo, Path(tmp) / "repo")
        conversation = Conversation(
            agent=agent,
            workspace=str(root),
            conversation_id=attempt.conversation_id,
            callbacks=[*attempt.callbacks, count_steps],
            max_iteration_per_run=settings.max_steps,
            visualizer=None,
        )
        conversation.send_message(task_message(instance))
        try:
            conversation.run()
        except ConversationRunError as exc:  # e.g. the conversation outgrew the context
            result.error = str(exc.__cause__ or exc).splitlines()[0][:300]
        finally:
            conversation.close()
        h = settings.harness
        test = run_command(
            instance.test_command, root, timeout_s=h.command_timeout_s, limit=h.output_limit,
            isolation=h.isolation, limits=h.limits,
        )  # fmt: skip
        result.resolved = test.returncode == 0 and result.error is None
        result.test_output = test.output
        result.patch = unified_diff(instance.repo, read_repo(root))
    result.failed_calls_seeded = attempt.repair.failed_calls
    try:
        result.stats = attempt.stats().model_dump()
    except (SessionNotFoundError, httpx.HTTPError):  # plain vLLM has no session statistics
        result.stats = None
    return result


def run_instance(instance: Instance, settings: OpenHandsSettings) -> list[OpenHandsAttempt]:
    """The instance's attempts, one after another in one group: each drafts from the earlier."""
    task = AgentspecTask(
        settings.base_url,
        settings.model,
        instance.instance_id,
        api_key=settings.api_key,
        temperature=settings.temperature,
        extra_body=settings.extra_body,
        max_output_tokens=settings.max_tokens,
        usage_id="agent",
    )
    results: list[OpenHandsAttempt] = []
    seed = ""
    for number in range(1, settings.attempts + 1):
        result = run_attempt(task, instance, settings, number, seed)
        results.append(result)
        if result.resolved:
            break
        seed = result.patch
    return results


def _row(r: OpenHandsAttempt) -> list[str]:
    stats = r.stats or {}
    kinds = stats.get("seeded_tokens_by_kind") or {}
    outcome = "[green]resolved" if r.resolved else ("[red]failed" if r.error else "[yellow]unresolved")
    return [
        r.instance_id,
        str(r.attempt),
        outcome,
        str(r.steps),
        str(stats.get("calls", "n/a")),
        f"{stats['acceptance_rate']:.2f}" if stats.get("acceptance_rate") is not None else "n/a",
        str(kinds.get("prior_turn", 0)),
        str(kinds.get("repair_attempt", 0)),
    ]


@app.command()
def main(
    base_url: Annotated[str, typer.Option(help="agentspec serve, or vllm-router in front of several.")] = DEFAULT_URL,
    model: Annotated[str | None, typer.Option(help="Served model name (default: the server's first).")] = None,
    instances: Annotated[Path, typer.Option(help="JSONL file of task instances.")] = DEFAULT_INSTANCES,
    attempts: Annotated[int, typer.Option(min=1, help="Attempts per instance (one group).")] = 2,
    max_steps: Annotated[int, typer.Option(min=1, help="Agent steps per attempt.")] = 20,
    max_tokens: Annotated[int, typer.Option(min=1)] = 1024,
    temperature: Annotated[float, typer.Option(min=0.0)] = 0.7,
    condense_after: Annotated[int, typer.Option(min=8, help="Events before the condenser summarises.")] = 40,
    api_key: Annotated[str | None, typer.Option(envvar="AGENTSPEC_API_KEY", help="The server's --api-key.")] = None,
    extra_body: Annotated[str, typer.Option(help="JSON object of more request-body fields for vLLM.")] = "{}",
    system_prompt: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="File replacing OpenHands' system prompt.")
    ] = None,
    isolation: Annotated[str, typer.Option(help="How the test command is confined: auto, bwrap, none.")] = "auto",
    results: Annotated[Path | None, typer.Option(help="Write one JSON line per attempt here.")] = None,
) -> None:
    """Run every instance with OpenHands' CodeAct agent; exit 1 when a model call failed."""
    try:
        body = json.loads(extra_body)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--extra-body") from None
    if not isinstance(body, dict):
        raise typer.BadParameter("must be a JSON object", param_hint="--extra-body")
    chosen = model or _first_model(base_url)
    settings = OpenHandsSettings(
        base_url=base_url, model=chosen, attempts=attempts, max_steps=max_steps, max_tokens=max_tokens,
        temperature=temperature, condense_after=condense_after, api_key=api_key, extra_body=body,
        system_prompt=system_prompt.read_text(encoding="utf-8") if system_prompt else None,
        harness=Settings(isolation=resolve_isolation(isolation)),
    )  # fmt: skip
    table = Table("instance", "attempt", "outcome", "steps", "calls", "acceptance", "seeded prior", "seeded repair")
    everything: list[OpenHandsAttempt] = []
    for instance in load_instances(instances):
        for result in run_instance(instance, settings):
            everything.append(result)
            table.add_row(*_row(result))
            if result.error:
                console.print(f"[red]call failed: {instance.instance_id} attempt {result.attempt}: {result.error}")
    console.print(table)
    if results is not None:
        results.write_text("".join(json.dumps(r.to_json()) + "\n" for r in everything))
    if any(r.error for r in everything):
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
