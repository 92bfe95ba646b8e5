"""Switching a LangChain / LangGraph agent from ChatOpenAI to agentspec: one line.

    agentspec serve Qwen/Qwen2.5-7B-Instruct --enable-auto-tool-choice --tool-call-parser hermes
    python examples/langchain_switch.py --base-url http://localhost:8000 --model Qwen/Qwen2.5-7B-Instruct

Each LangGraph thread becomes one agentspec session: the server's draft index keeps the
thread's earlier turns and speculates them into the next ones. Nothing else changes.
"""

from __future__ import annotations

import argparse

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import create_react_agent

# Before:
#   from langchain_openai import ChatOpenAI
#   llm = ChatOpenAI(model=MODEL, base_url=URL + "/v1", api_key="EMPTY")
# After:
from langchain_agentspec import ChatAgentSpec


@tool
def read_file(path: str) -> str:
    """Return the contents of a file of the project."""
    return {"utils.py": "def add(a, b):\n    return a - b\n"}.get(path, "no such file")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://localhost:8000")
    parser.add_argument("--model", required=True)
    args = parser.parse_args()

    llm = ChatAgentSpec(model=args.model, base_url=args.base_url, temperature=0, max_tokens=256)
    # Several servers? ChatAgentSpec(model=..., backends=["http://gpu1:8000", "http://gpu2:8000"])
    # pins each thread to one of them.

    agent = create_react_agent(llm, [read_file], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "fix-utils"}}
    for question in ("What does utils.py contain?", "Fix the bug in add and show the file."):
        state = agent.invoke({"messages": [HumanMessage(question)]}, config)
        print(f"> {question}\n{state['messages'][-1].content}\n")

    stats = llm.get_session_stats("fix-utils")
    print(f"session fix-utils: {stats.calls} calls, acceptance {stats.acceptance_rate}")


if __name__ == "__main__":
    main()
