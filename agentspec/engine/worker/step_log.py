"""The engine's step log: what the proposer saw and did at every step, for offline replay.

Off unless ``EngineSettings.step_log_dir`` names a folder (``agentspec serve
--agentspec-step-log-dir``). Each drafting worker appends JSON lines to
``steps-<worker>.jsonl`` there, in the order the engine's thread met them:

- ``{"e": "start", "k": K, "max_model_len": L}``: the worker started logging (``K``: the
  server's ``num_speculative_tokens``, the cap of a step the batch budget does not cut),
  with ``"calibrated": true`` where the steps' probability cuts compare calibrated path
  probabilities (the cost budget's, :mod:`agentspec.draft_budget.cost_budget`);
- ``{"e": "add", "req": ID, "session": S, "group": G, "max_tokens": N, "stops": [...]}``:
  a request reached the worker (session and group as the middleware resolved them; null
  when absent);
- ``{"e": "step", "batch": B, "rows": [[ID, SAMPLED, CAP, DRAFTED], ...]}``: one drafting
  step of ``B`` requests; per request in row order, the tokens the target emitted for it
  this step, the draft cap it was given (the batch budget, or less near the context end)
  and the length of the draft proposed; with ``"min_prob": P`` where the budget (the
  cost budget's price, or ``--agentspec-speed-model``'s cut) stopped the step's drafts at
  path probability ``P``;
- ``{"e": "end", "req": [ID, ...]}``: requests finished or aborted.

Together with the prompt and output token ids of each request (the client's transcript),
this is enough for :mod:`agentspec.replay.step_replay` to redo every step through the same
driver and compare it, step by step, with what the engine did: how far the replay
benchmark (one call at a time, no batch budget) stands from a busy server is measured
rather than guessed. Token ids are not logged: the log holds no user text. It grows by one
line per step (about 40 bytes per request in the batch); it is meant for fidelity checks
and tuning, not for always-on production use.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

STEP_LOG_PREFIX = "steps-"


def step_log_path(folder: str | Path, worker_name: str) -> Path:
    """Where worker ``worker_name`` (e.g. ``proposer-dp0``) writes its step log."""
    return Path(folder) / f"{STEP_LOG_PREFIX}{worker_name}.jsonl"


class StepLog:
    """Appends one worker's step log. Failing writes switch the log off (logged once):
    a full disk must not take the engine down."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[str] | None = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def started(self, num_speculative_tokens: int, max_model_len: int, calibrated_cut: bool = False) -> None:
        event: dict[str, object] = {"e": "start", "k": num_speculative_tokens, "max_model_len": max_model_len}
        if calibrated_cut:
            event["calibrated"] = True
        self._write(event, flush=True)

    def added(
        self, req_id: str, session: str | None, group: str | None, max_tokens: int | None, stops: Iterable[int]
    ) -> None:
        self._write(
            {
                "e": "add",
                "req": req_id,
                "session": session,
                "group": group,
                "max_tokens": max_tokens,
                "stops": sorted(stops),
            }
        )

    def step(self, batch: int, rows: Sequence[tuple[str, int, int, int]], min_prob: float = 0.0) -> None:
        """One drafting step; flushed, so that a reader sees every step once the engine idles."""
        event: dict[str, object] = {"e": "step", "batch": batch, "rows": [list(r) for r in rows]}
        if min_prob:
            event["min_prob"] = min_prob
        self._write(event, flush=True)

    def finished(self, req_ids: Sequence[str]) -> None:
        if req_ids:
            self._write({"e": "end", "req": list(req_ids)}, flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, event: dict[str, Any], flush: bool = False) -> None:
        if self._file is None:
            return
        try:
            self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
            if flush:
                self._file.flush()
        except OSError as exc:
            logger.warning("agentspec: step log %s is off: %s", self.path, exc)
            self.close()


def read_step_log(path: str | Path) -> list[dict[str, Any]]:
    """The events of a step log, in order (a torn last line, from a crash, is dropped)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    events: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if n < len(lines):  # not the last line: the log is damaged, say where
                raise ValueError(f"{path}:{n}: not a step log event: {exc}") from exc
    return events
