"""How much to draft: per request and step, and by which drafter.

- :mod:`~agentspec.draft_budget.batch_budget`: the :class:`DraftBudget` protocol the request
  driver applies, and :class:`BatchBudget`, the default rule (full drafts at small batches,
  halving as the batch grows, none above a ceiling);
- :mod:`~agentspec.draft_budget.speed_model`: :class:`SpeedModel`, an estimate of a vLLM
  engine's decoding step on a GPU (tokens/s at a batch size, draft length and context);
- :mod:`~agentspec.draft_budget.speed_budget`: :class:`SpeedBudget`, draft limits chosen by
  the speed model from the engine's own drafts (``--agentspec-speed-model``);
- :mod:`~agentspec.draft_budget.drafter_choice`: the hybrid's choice between the draft
  index and a draft model for each request's step.

Pure Python and pydantic: no numpy, no vLLM.
"""
