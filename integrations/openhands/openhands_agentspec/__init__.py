"""agentspec for OpenHands: CodeAct agents drafting from their own sessions on vLLM.

- :func:`agentspec_llm`: an OpenHands ``LLM`` for ``agentspec serve`` (or vllm-router in
  front of several), pinned by task;
- :class:`SeedingCondenser`: wraps a condenser; what it forgets is seeded into the session;
- :class:`RepairSeeder`: a conversation callback seeding failed tool calls as repair attempts;
- :class:`AgentspecTask`: all of it for one task and its attempts;
- :func:`conversation_stats`: a conversation's draft statistics from the server.

Needs Python >= 3.12 (openhands-sdk) and agentspec's light client only: no vLLM here.
"""

from openhands_agentspec.condenser import SeedingCondenser, forgotten_text
from openhands_agentspec.llm import agentspec_llm, group_of, routing_headers
from openhands_agentspec.repair import RepairSeeder, failed
from openhands_agentspec.task import AgentspecTask, TaskAttempt, conversation_stats

__all__ = [
    "AgentspecTask",
    "RepairSeeder",
    "SeedingCondenser",
    "TaskAttempt",
    "agentspec_llm",
    "conversation_stats",
    "failed",
    "forgotten_text",
    "group_of",
    "routing_headers",
]
