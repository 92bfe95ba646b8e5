"""Reading the vLLM options ``agentspec serve`` passes through, with vLLM's own parser.

vLLM takes the model as a positional argument or as ``--model``, anywhere on the line; its
server module (what ``agentspec serve`` runs) only reads ``--model``. :func:`split_model`
finds the model either way with the parser vLLM builds for ``vllm serve``, checks every
other option against it, and returns the options without the positional model. A mistake
is one line (:class:`VllmArgsError`), not vLLM's several hundred lines of usage.

Imports vLLM when called (the ``serve`` extra); where vLLM is not installed,
:func:`split_model_without_vllm` reads only the model, for ``--agentspec-dry-run``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["VllmArgsError", "split_model", "split_model_without_vllm"]


class VllmArgsError(ValueError):
    """vLLM's parser refused the options; the message is its one-line reason."""


def _parser() -> Any:
    from agentspec.engine.vllm.surface import load

    class _Parser(load("FlexibleArgumentParser")):  # type: ignore[misc]
        def error(self, message: str) -> NoReturn:
            raise VllmArgsError(f"vLLM's options: {message}")

    return load("make_arg_parser")(_Parser(prog="agentspec serve", add_help=False))


def _model_of(ns: argparse.Namespace) -> str | None:
    tag, option = getattr(ns, "model_tag", None), getattr(ns, "model", None)
    if tag is not None and option not in (None, tag) and _given_model(option):
        raise VllmArgsError(f"two models: {tag!r} and --model {option!r}")
    return tag or (option if _given_model(option) else None)


def _given_model(value: object) -> bool:
    # vLLM's --model has a default (a small public model); only one the user gave counts.
    from agentspec.engine.vllm.surface import load

    return isinstance(value, str) and value != load("EngineArgs.model")


def split_model(args: Sequence[str]) -> tuple[str, list[str]]:
    """``(model, the other options)`` of an ``agentspec serve`` command line's vLLM part.

    Raises :class:`VllmArgsError` with vLLM's reason when its parser refuses the options
    (an unknown option, a missing value), or when no model or two models are given.
    """
    args = list(args)
    parser = _parser()
    ns = parser.parse_args(args)
    model = _model_of(ns)
    if model is None:
        raise VllmArgsError("no model: give it first (agentspec serve MODEL ...) or as --model MODEL")
    if ns.model_tag is None:
        _, rest = _take_model_option(args)
        return model, rest
    # The positional is the occurrence whose removal leaves vLLM without one.
    for i, token in enumerate(args):
        if token == ns.model_tag:
            rest = args[:i] + args[i + 1 :]
            try:
                if parser.parse_args(rest).model_tag is None:
                    return model, rest
            except VllmArgsError:
                continue
    raise VllmArgsError(f"cannot tell where the model {model!r} is on the command line")


def _take_model_option(args: list[str]) -> tuple[str | None, list[str]]:
    """``--model``'s value (None without one) and the options without it."""
    for i, token in enumerate(args):
        if token == "--model" and i + 1 < len(args):
            return args[i + 1], args[:i] + args[i + 2 :]
        if token.startswith("--model="):
            return token.split("=", 1)[1], args[:i] + args[i + 1 :]
    return None, args


def split_model_without_vllm(args: Sequence[str]) -> tuple[str, list[str]]:
    """:func:`split_model` for a machine without vLLM: the model is the first argument or
    ``--model``'s value; nothing else is checked."""
    model, rest = _take_model_option(list(args))
    if model is not None:
        return model, rest
    if rest and not rest[0].startswith("-"):
        return rest[0], rest[1:]
    raise VllmArgsError("no model: give it first (agentspec serve MODEL ...) or as --model MODEL")
