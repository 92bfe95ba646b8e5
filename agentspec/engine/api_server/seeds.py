"""Seeds as the engine takes them: validated against the server's limits and turned into
token ids with the server's own tokenizer, off the event loop."""

from __future__ import annotations

from typing import Any

from agentspec import wire
from agentspec.engine.api_server.asgi import Scope
from agentspec.engine.settings import EngineSettings
from agentspec.wire import WireError

#: Text seeds are tokenized this many characters at a time (cut after a newline or space
#: where there is one, so chunk seams rarely split what would be one token).
TOKENIZE_CHUNK_CHARS = 16_384
#: Seed tokenizations at once; the others wait (threads, not the event loop).
TOKENIZE_THREADS = 2


class SeedReader:
    """``agentspec_seeds`` of a request, checked and tokenized."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self._tokenizers: Any = None  # an anyio CapacityLimiter, made inside the event loop

    async def read(self, scope: Scope, raw: Any, session_id: str | None, group_id: str | None) -> list[dict[str, Any]]:
        """Validate ``raw`` seeds; return them as token ids (the internal form)."""
        limit_tokens = self.settings.max_seed_tokens_per_request
        specs = wire.parse_seeds(
            raw,
            session_id=session_id,
            group_id=group_id,
            max_seeds=self.settings.max_seeds_per_request,
            max_tokens=limit_tokens,
        )
        state = app_state(scope) if specs else None
        out: list[dict[str, Any]] = []
        total = 0
        for spec in specs:
            if spec.text is not None:
                token_ids = await self._tokenize(state, spec.text, limit_tokens - total)
            else:
                token_ids = list(spec.token_ids or ())
                wire.check_vocabulary(spec, token_ids, _vocab_size(state))
            total += len(token_ids)
            if total > limit_tokens:
                raise wire.seed_tokens_over_limit(limit_tokens, spec.where)
            out.append({"token_ids": token_ids, "scope": spec.scope.value, "kind": spec.kind.value})
        return out

    async def _tokenize(self, state: Any, text: str, budget: int) -> list[int]:
        """``text``'s tokens, computed off the event loop a chunk at a time and abandoned
        once over ``budget``: a flood of maximal seeds costs each at most its budget's worth
        of tokenizing, and never stalls other requests or ``/health``."""
        import anyio
        import anyio.to_thread

        if self._tokenizers is None:
            self._tokenizers = anyio.CapacityLimiter(TOKENIZE_THREADS)
        tokenizer = state.engine_client.get_tokenizer()

        def encode(chunk: str) -> list[int]:
            return list(tokenizer.encode(chunk, add_special_tokens=False))

        out: list[int] = []
        for chunk in chunks(text, TOKENIZE_CHUNK_CHARS):
            out += await anyio.to_thread.run_sync(encode, chunk, limiter=self._tokenizers)
            if len(out) > budget:
                break  # the caller refuses it; the rest is not worth tokenizing
        return out


def app_state(scope: Scope) -> Any:
    """vLLM's app state (its engine client tokenizes); refused where there is none."""
    app = scope.get("app")
    state = getattr(app, "state", None)
    if state is None or getattr(state, "engine_client", None) is None:
        raise WireError("this server cannot take seeds (no engine client)", wire.SEEDS_FIELD)
    return state


def chunks(text: str, size: int) -> list[str]:
    """``text`` in pieces of at most ``size`` characters, cut after a newline or a space
    in the piece's second half where there is one."""
    out: list[str] = []
    start = 0
    while len(text) - start > size:
        end = start + size
        cut = max(text.rfind("\n", start + size // 2, end), text.rfind(" ", start + size // 2, end))
        end = cut + 1 if cut > 0 else end
        out.append(text[start:end])
        start = end
    out.append(text[start:])
    return out


def _vocab_size(state: Any) -> int:
    return int(state.engine_client.model_config.get_vocab_size())
