"""The one wrap of vLLM's Model Runner V2 (``vllm.v1.worker.gpu.model_runner``) agentspec needs.

A V2 speculator learns of a new request only by its slot (``add_request(req_index)``); the
request's sampling parameters, whose ``extra_args`` carry the session, group, tenant,
seeds and admission stamp the API server's middleware put there (``vllm_xargs``), stay
with the runner. So ``GPUModelRunner.add_requests`` is wrapped: before the runner's own
bookkeeping, each new request's id and sampling parameters go to agentspec's speculator
(:meth:`~agentspec.engine.worker.drafting.SessionDrafting.on_request_added`), which applies
the seeds before the request's first draft. The CPU runner subclasses the GPU runner, so
the one wrap serves both. With any other speculator, or none, the wrap only calls through.

``GPUModelRunner.__init__`` is wrapped too, to check what only a built runner shows: with
speculative decoding on, its speculator must be agentspec's (``--speculative-config``
with ``method: agentspec``; ``agentspec serve`` sets it). Otherwise vLLM's own method would
draft with the plugin loaded and agentspec nowhere in the loop, so the server stops, saying so.

Once built, an agentspec runner's draft-token handler is narrowed
(:func:`narrow_draft_widths`): V2's runner tells the scheduler one draft width for every
request, and the scheduler has the target verify that many slots of each; agentspec knows
each request's real draft length on the host, so each request's width becomes its own.

Where the wrap cannot be made (a vLLM whose runner lacks ``add_requests``), the plugin
refuses to start rather than draft without sessions: requests would still be served, but
every tenant would draft from one shared pool, which agentspec never does unasked.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import Any

from agentspec.engine import settings as engine_settings
from agentspec.engine.vllm import surface
from agentspec.engine.vllm.errors import UnsupportedVLLMError
from agentspec.engine.vllm.import_hook import is_patched, mark_patched
from agentspec.engine.vllm.surface import supported_series_text

logger = logging.getLogger("vllm.agentspec.plugin")

RUNNER_MODULE = surface.module_of("v2_runner_module")


def patch_runner(module: ModuleType) -> None:
    """Wrap ``GPUModelRunner.__init__`` and ``add_requests`` of the V2 runner module (see
    the module's docstring)."""
    if is_patched(module):
        return
    runner_cls = surface.find(module, "v2_runner")
    original_init = surface.find(module, "v2_runner.__init__")
    original = surface.find(module, "v2_runner.add_requests")
    missing = [
        name
        for name, found in (("GPUModelRunner", runner_cls), ("__init__", original_init), ("add_requests", original))
        if found is None
    ]
    if missing:
        raise UnsupportedVLLMError(
            f"{RUNNER_MODULE} lacks {', '.join(missing)} (GPUModelRunner.add_requests is where agentspec"
            f" learns each request's session); this vLLM's internals differ from the supported vLLM"
            f" {supported_series_text()}."
        )
    from agentspec.engine.worker.drafting import SessionDrafting

    @functools.wraps(original_init)  # type: ignore[arg-type]
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)  # type: ignore[misc]
        speculator = getattr(self, "speculator", None)
        check_speculator(getattr(self, "speculative_config", None), speculator)
        if isinstance(speculator, SessionDrafting):
            narrow_draft_widths(getattr(self, "draft_tokens_handler", None), speculator)

    @functools.wraps(original)  # type: ignore[arg-type]
    def add_requests(self: Any, scheduler_output: Any) -> Any:
        speculator = getattr(self, "speculator", None)
        if isinstance(speculator, SessionDrafting):
            speculator.ensure_bound()  # type: ignore[attr-defined]
            for new_req in scheduler_output.scheduled_new_reqs:
                speculator.on_request_added(new_req.req_id, new_req.sampling_params)
        return original(self, scheduler_output)  # type: ignore[misc]

    runner_cls.__init__ = __init__  # type: ignore[union-attr]
    runner_cls.add_requests = add_requests  # type: ignore[union-attr]
    mark_patched(module)
    logger.info("agentspec: request sessions reach the speculator through %s", RUNNER_MODULE)


def check_speculator(speculative_config: Any, speculator: Any) -> None:
    """Raise :class:`UnsupportedVLLMError` when a runner with speculative decoding built a
    speculator other than agentspec's (only the last pipeline-parallel rank has one)."""
    from agentspec.engine.worker.drafting import SessionDrafting

    if speculative_config is None or speculator is None or isinstance(speculator, SessionDrafting):
        return
    method = getattr(speculative_config, "custom_method", None) or getattr(speculative_config, "method", None)
    built = type(speculator)
    raise UnsupportedVLLMError(
        f"vLLM's speculator here is {built.__module__}.{built.__qualname__} (speculative method {method!r}),"
        f" not agentspec's, so agentspec would not draft: on vLLM's Model Runner V2 it drafts through"
        f' --speculative-config \'{{"method": "{surface.V2_METHOD}"}}\' (agentspec serve sets it). Use it, or'
        f" unset {engine_settings.ENV_CONFIG} to run vLLM without agentspec."
    )


def narrow_draft_widths(handler: Any, speculator: Any) -> None:
    """Make ``handler`` (the runner's ``DraftTokensHandler``) report each request's real
    draft length, ``speculator.draft_widths``, to the scheduler instead of the batch's width.

    The handler keeps, per request, the width (an int) or, when the scheduler checks drafts
    against a grammar, the draft row; both are cut to the real draft. The rows past it hold
    padding the target would otherwise verify (and reject or accept like any token).
    """
    drafts_by_req = getattr(handler, "_draft_tokens_by_req", None)
    set_draft_tokens = getattr(handler, "set_draft_tokens", None)
    if not isinstance(drafts_by_req, dict) or set_draft_tokens is None:
        # Drafting would still be lossless, but every step would verify k slots per request.
        raise UnsupportedVLLMError(
            f"this vLLM's model runner has no draft_tokens_handler with set_draft_tokens and"
            f" _draft_tokens_by_req (found {type(handler).__qualname__}), where agentspec sets each"
            f" request's draft width; agentspec supports vLLM {supported_series_text()}."
        )

    @functools.wraps(set_draft_tokens)
    def narrowed(input_batch: Any, draft_tokens: Any) -> None:
        set_draft_tokens(input_batch, draft_tokens)
        widths = speculator.draft_widths
        for req_id in input_batch.req_ids:
            width, held = widths.get(req_id), drafts_by_req.get(req_id)
            if width is None or held is None:
                continue
            drafts_by_req[req_id] = min(held, width) if isinstance(held, int) else held[:width]

    handler.set_draft_tokens = narrowed
