"""Estimated tokens/s at the concurrencies users run, from a replay and a speed model.

For each proposer the replay measured, :mod:`agentspec.draft_budget.speed_model` turns its draft outcomes,
mean context and measured drafter time into the engine's output tokens per second at each
concurrency, against no speculation on the same GPU and model:

- vLLM's methods and the oracle draft at full length at every concurrency (vLLM applies
  no batch-size rule to them);
- agentspec under its fixed rule (``agentspec serve``'s default budget,
  :class:`agentspec.draft_budget.batch_budget.BatchBudget`), and under a model budget
  (``agentspec serve --agentspec-speed-model``): at each concurrency the draft cap and
  probability cut that the speed model says are fastest, chosen by the server's own
  :func:`agentspec.draft_budget.speed_budget.fastest_limits` (a cap of 0, no drafting, is among the
  choices; agentspec still keeps its index up to date then, so that cost stays).

The oracle's drafter time is not a drafter's (it reads the future), so its row is left out.

The drafter times are measured on this machine, and a busy machine inflates them enough to
turn the ratios around (at high concurrency a few hundred microseconds per step matter), so
the table records the load the replay ran under (:class:`MeasuredOn`) and says when it was
busy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, computed_field

from agentspec.draft_budget.batch_budget import BatchBudget
from agentspec.draft_budget.speed_budget import fastest_limits
from agentspec.draft_budget.speed_model import DraftOutcomes, SpeedModel
from agentspec.replay.run import ALL, Record, ReplayResult

__all__ = ["CONCURRENCIES", "MeasuredOn", "SpeedRow", "SpeedTable", "speed_table"]

CONCURRENCIES: tuple[int, ...] = (1, 8, 32, 64, 128)
NO_SPECULATION = "no speculation"
#: Proposers whose drafts follow agentspec's batch budget in a server.
BUDGETED = ("agentspec",)


class SpeedRow(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    #: Estimated output tokens/s by concurrency.
    tokens_per_s: dict[int, float]
    #: Draft cap by concurrency (None: the drafter's own length).
    caps: dict[int, int | None]
    #: Probability cut by concurrency, where a model budget chose one above 0.
    min_probs: dict[int, float] = {}


class MeasuredOn(BaseModel):
    """The machine the drafter times were measured on: its CPUs and load average when the
    replay ended, and how much of that load was the replay's own processes."""

    model_config = ConfigDict(frozen=True)

    cpus: int
    load_1m: float
    load_5m: float
    own_processes: int = 1

    @classmethod
    def now(cls, own_processes: int = 1) -> MeasuredOn | None:
        """This machine now; None where the load average is not available."""
        try:
            load_1m, load_5m, _ = os.getloadavg()
        except (AttributeError, OSError):
            return None
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return cls(cpus=cpus, load_1m=load_1m, load_5m=load_5m, own_processes=own_processes)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def busy(self) -> bool:
        """Whether other work loaded more than half the CPUs while the replay ran."""
        return max(self.load_1m, self.load_5m) - self.own_processes > self.cpus / 2


class SpeedTable(BaseModel):
    model_config = ConfigDict(frozen=True)

    gpu: str
    model: str
    tensor_parallel: int
    context_tokens: float
    batch: dict[int, int]
    rows: list[SpeedRow]
    #: Where the drafter times came from (None: not recorded).
    measured_on: MeasuredOn | None = None

    def row(self, name: str) -> SpeedRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)


def _drafter_seconds(record: Record, drafting: bool) -> float:
    """The drafter's time per request and step: index upkeep always, proposing when drafting."""
    index_s = record.index_us_per_call * record.calls / record.steps / 1e6 if record.steps else 0.0
    return index_s + (record.propose_us_per_step / 1e6 if drafting else 0.0)


def _speed(model: SpeedModel, record: Record, outcomes: DraftOutcomes, concurrency: int, cap: int | None) -> float:
    drafting = cap is None or cap > 0
    return model.tokens_per_second(
        concurrency,
        record.context_tokens_per_step,
        emitted=outcomes.emitted(cap) if drafting else 1.0,
        verified=outcomes.verified(cap) if drafting else 1.0,
        drafter_s=_drafter_seconds(record, drafting),
    )


def speed_table(
    result: ReplayResult,
    model: SpeedModel,
    concurrencies: Sequence[int] = CONCURRENCIES,
    budget: BatchBudget | None = None,
    measured_on: MeasuredOn | None = None,
) -> SpeedTable:
    """The estimate for every proposer of ``result`` (its records over all sources).

    ``budget`` is agentspec's fixed rule (default: ``agentspec serve``'s, 8 and 64, with
    the longest draft the replay saw as its maximum).
    """
    records = [r for r in result.records if r.source == ALL and r.proposer not in ("oracle", "none")]
    if not records:
        raise ValueError("the replay has no proposer to estimate (the oracle is not a drafter)")
    context = records[0].context_tokens_per_step
    rows = [
        SpeedRow(
            name=NO_SPECULATION,
            tokens_per_s={c: model.tokens_per_second(c, context) for c in concurrencies},
            caps={c: 0 for c in concurrencies},
        )
    ]
    for record in records:
        outcomes = DraftOutcomes.of(record.draft_outcomes)
        if record.proposer not in BUDGETED:
            rows.append(
                SpeedRow(
                    name=record.proposer,
                    tokens_per_s={c: _speed(model, record, outcomes, c, None) for c in concurrencies},
                    caps={c: None for c in concurrencies},
                )
            )
            continue
        rule = budget or BatchBudget(outcomes.longest)
        fixed = {c: rule.tokens_for(model.batch_for(c, record.context_tokens_per_step)) for c in concurrencies}
        rows.append(
            SpeedRow(
                name=f"{record.proposer} (fixed rule)",
                tokens_per_s={c: _speed(model, record, outcomes, c, fixed[c]) for c in concurrencies},
                caps=fixed,
            )
        )
        by_cut = {float(cut): DraftOutcomes.of(rows) for cut, rows in record.draft_outcomes_by_cut.items()}
        drafter_s = {drafting: _drafter_seconds(record, drafting) for drafting in (True, False)}
        best = {
            c: fastest_limits(
                model,
                model.batch_for(c, record.context_tokens_per_step),
                record.context_tokens_per_step,
                by_cut or {0.0: outcomes},
                drafter_s,
                outcomes.longest,
            )
            for c in concurrencies
        }
        rows.append(
            SpeedRow(
                name=f"{record.proposer} (model budget)",
                tokens_per_s={c: limits.tokens_per_s for c, limits in best.items()},
                caps={c: limits.tokens for c, limits in best.items()},
                min_probs={c: limits.min_prob for c, limits in best.items() if limits.min_prob},
            )
        )
    return SpeedTable(
        gpu=model.gpu.name,
        model=model.model.name,
        tensor_parallel=model.gpus,
        context_tokens=context,
        batch={c: model.batch_for(c, context) for c in concurrencies},
        rows=rows,
        measured_on=measured_on,
    )
