"""The two thin shells around :class:`~agentspec.client.attempts.CallAttempts`: they sleep
and probe when the machine asks, and hand out its attempts. All decisions are the machine's,
so the sync and async paths cannot drift apart."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

import anyio

from .attempts import Attempt, CallAttempts, Probe, Wait

__all__ = ["AsyncAttemptIterator", "AttemptIterator"]


class AttemptIterator:
    """``for attempt in AttemptIterator(machine): with attempt: ...`` (sync).

    Ends when the call is over; a call that stops on an error raises it from the ``with``
    block (or, for no healthy backend, from the iteration).
    """

    def __init__(
        self,
        machine: CallAttempts,
        *,
        probe: Callable[[Sequence[str]], object] | None = None,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self.machine = machine
        self._probe = probe
        self._sleep = sleep if sleep is not None else time.sleep

    def __iter__(self) -> AttemptIterator:
        return self

    def __next__(self) -> Attempt:
        while not self.machine.done:
            action = self.machine.next_action()
            if isinstance(action, Wait):
                self._sleep(action.seconds)
            elif isinstance(action, Probe):
                if self._probe is not None:
                    self._probe(action.backends)
            else:
                return action
        raise StopIteration


class AsyncAttemptIterator:
    """``async for attempt in AsyncAttemptIterator(machine): with attempt: ...`` (anyio)."""

    def __init__(
        self,
        machine: CallAttempts,
        *,
        probe: Callable[[Sequence[str]], Awaitable[object]] | None = None,
        sleep: Callable[[float], Awaitable[object]] | None = None,
    ) -> None:
        self.machine = machine
        self._probe = probe
        self._sleep = sleep if sleep is not None else anyio.sleep

    def __aiter__(self) -> AsyncAttemptIterator:
        return self

    async def __anext__(self) -> Attempt:
        while not self.machine.done:
            action = self.machine.next_action()
            if isinstance(action, Wait):
                await self._sleep(action.seconds)
            elif isinstance(action, Probe):
                if self._probe is not None:
                    await self._probe(action.backends)
            else:
                return action
        raise StopAsyncIteration
