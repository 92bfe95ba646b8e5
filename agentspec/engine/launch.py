"""Moved to :mod:`agentspec.engine.vllm.launch`; ``python -m agentspec.engine.launch`` keeps
working for a release."""

from agentspec.engine.vllm.launch import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
