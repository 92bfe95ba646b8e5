"""Errors raised by the draft index. Each leaves the index usable."""

from __future__ import annotations


class DraftIndexError(ValueError):
    """Bad input to the draft index (the message names what was wrong)."""


class UnknownCallError(DraftIndexError, KeyError):
    """A call id that is not active in the index (never started, or already finished)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class SeedLimitError(DraftIndexError):
    """A seed over the size limits of :class:`agentspec.index.policy.IndexConfig`."""
