"""What runs in vLLM's model-worker processes, beside the model: the proposers' decisions
each step (:mod:`~agentspec.engine.worker.drafting`, and with a model drafter
:mod:`~agentspec.engine.worker.hybrid_drafting`) and the step log
(:mod:`~agentspec.engine.worker.step_log`). No vLLM is imported here: the subclasses vLLM
loads live in :mod:`agentspec.engine.vllm.proposers` and call into these."""
