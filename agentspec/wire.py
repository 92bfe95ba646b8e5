"""The wire contract between agentspec clients and agentspec servers (docs/wire.md).

One module, pure Python and free of dependencies, imported by every side: the server's
middleware and proposer, the session-aware client, the stub test server, the framework
integrations and the draft index. What a request may carry (ids, seeds), in which order
the ecosystem's session ids are read, the limits, the error body and the statistics a
server returns are defined here and nowhere else.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

__all__ = [
    "BODY_SESSION_FIELD",
    "CACHE_SALT_FIELD",
    "CHARS_PER_TOKEN_BOUND",
    "GENERATION_PATHS",
    "GROUP_HEADER",
    "ID_PATTERN",
    "ID_RULE",
    "LITELLM_SESSION_HEADER",
    "MAX_SEEDS_PER_REQUEST",
    "MAX_SEED_TOKENS_PER_REQUEST",
    "POLICY_CONFLICT_STATUS",
    "POLICY_PATH",
    "POLICY_REQUEST_FIELDS",
    "PROMPT_CACHE_KEY_FIELD",
    "SEEDS_FIELD",
    "SEEDS_PATH",
    "SEEDS_REQUEST_FIELDS",
    "SEED_FIELDS",
    "SERVER_STATS_PATH",
    "SESSION_HEADER",
    "SESSION_STATS_FIELDS",
    "SESSION_STATS_PATH",
    "SMG_ROUTING_HEADER",
    "XARGS_FIELD",
    "XARG_ADMISSION",
    "XARG_GROUP",
    "XARG_KEEP_OLD_OUTPUTS",
    "XARG_POLICY_VERSION",
    "XARG_SEEDS",
    "XARG_SEED_ONLY",
    "XARG_SESSION",
    "XARG_TENANT",
    "SeedKind",
    "SeedScope",
    "SeedSpec",
    "WireError",
    "bad_id",
    "check_policy_request",
    "check_seeds_request",
    "check_vocabulary",
    "refuse_reserved_xargs",
    "error_body",
    "is_valid_id",
    "parse_seeds",
    "resolve_ids",
    "seed_tokens_over_limit",
    "seeds_response_body",
    "session_stats_body",
    "split_session_path",
]

# ---------------------------------------------------------------------------- ids

#: Session and group ids: 1 to 128 characters of ``[A-Za-z0-9._:@/-]``.
ID_PATTERN: Final = re.compile(r"[A-Za-z0-9._:@/-]{1,128}")
ID_RULE: Final = "1 to 128 characters of letters, digits and . _ : @ / -"


def is_valid_id(value: object) -> bool:
    """Whether ``value`` is a string that obeys :data:`ID_RULE`."""
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


# ---------------------------------------------------------------------------- names on the wire

#: Headers agentspec's client sends (and routers may hash).
SESSION_HEADER: Final = "X-Session-Id"
GROUP_HEADER: Final = "X-Group-Id"
#: Headers other clients send that name a session.
LITELLM_SESSION_HEADER: Final = "x-litellm-session-id"  # OpenHands (litellm)
SMG_ROUTING_HEADER: Final = "X-SMG-Routing-Key"  # slime / SGLang gateway

#: Body fields.
XARGS_FIELD: Final = "vllm_xargs"  # vLLM's per-request extra args (SamplingParams.extra_args)
SEEDS_FIELD: Final = "agentspec_seeds"
BODY_SESSION_FIELD: Final = "session_id"  # vLLM's own request field
PROMPT_CACHE_KEY_FIELD: Final = "prompt_cache_key"  # OpenAI SDK, OpenHands

#: Keys of ``vllm_xargs``: the internal form the middleware writes and the proposer reads.
XARG_SESSION: Final = "session_id"
XARG_GROUP: Final = "group_id"
XARG_SEEDS: Final = "agentspec_seeds"  # a JSON string: list of {"token_ids", "scope", "kind"}
XARG_SEED_ONLY: Final = "agentspec_seed_only"  # 1: apply the seeds, neither index nor draft the request
XARG_TENANT: Final = "agentspec_tenant"  # set by the server from the API key and cache_salt, never by a caller
XARG_POLICY_VERSION: Final = "agentspec_policy_version"  # set by POST POLICY_PATH only, never by a caller
XARG_KEEP_OLD_OUTPUTS: Final = "agentspec_keep_old_outputs"  # with XARG_POLICY_VERSION
#: The server's secret, stamped by the middleware on every request it admitted (after vLLM's
#: authentication); the engine honours the keys above only on stamped requests. Never a caller's.
XARG_ADMISSION: Final = "agentspec_admission"
#: vLLM's request field that isolates prefix caching; it narrows the tenant too.
CACHE_SALT_FIELD: Final = "cache_salt"

#: Endpoints whose body is an OpenAI-style generation request carrying ``vllm_xargs``.
GENERATION_PATHS: Final = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})
#: ``GET SESSION_STATS_PATH + <session id>``: one session's statistics.
SESSION_STATS_PATH: Final = "/agentspec/v1/sessions/"
#: ``GET``: server-wide totals.
SERVER_STATS_PATH: Final = "/agentspec/v1/stats"
#: ``POST``: seeds without generating (a seed-only request); the body is a generation
#: request's ids and ``agentspec_seeds`` alone (:data:`SEEDS_REQUEST_FIELDS`).
SEEDS_PATH: Final = "/agentspec/v1/seeds"
SEEDS_REQUEST_FIELDS: Final = frozenset(
    {"agentspec_seeds", "vllm_xargs", "session_id", "prompt_cache_key", "model", "cache_salt"}
)
#: ``POST``: the policy version now live (RL weight updates): ``{"version": N,
#: "keep_old_outputs": false}``. Later requests run under it; outputs of older versions stop
#: drafting at the group and global levels unless ``keep_old_outputs``. A version older than
#: the live one is refused with 409 (:data:`POLICY_CONFLICT_STATUS`); the live one again is a 200.
POLICY_PATH: Final = "/agentspec/v1/policy"
POLICY_REQUEST_FIELDS: Final = frozenset({"version", "keep_old_outputs", "model"})
POLICY_CONFLICT_STATUS: Final = 409

_SESSION_PATH: Final = re.compile(r"^/sessions/([^/]*)(/v1/.*)$")


def split_session_path(path: str) -> tuple[str, str] | None:
    """rLLM's ``/sessions/<id>/v1/...``: ``(id, "/v1/...")``, or None for any other path.

    The id is returned unvalidated; check it with :func:`is_valid_id`.
    """
    match = _SESSION_PATH.match(path)
    return (match.group(1), match.group(2)) if match else None


# ---------------------------------------------------------------------------- errors


class WireError(ValueError):
    """A request the server refuses with HTTP 400; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's (and OpenAI's) error shape, so every OpenAI client surfaces the message."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def bad_id(field_name: str) -> WireError:
    return WireError(f"{field_name} must be {ID_RULE}", field_name)


# ---------------------------------------------------------------------------- which session


def resolve_ids(
    body: Mapping[str, Any],
    header: Callable[[str], str | None],
    path_session: str | None = None,
) -> tuple[str | None, str | None]:
    """The session and group ids of a request, by the precedence of docs/wire.md.

    ``header(name)`` returns a header's value (case-insensitive) or None; ``path_session``
    is the id of a ``/sessions/<id>/v1/...`` URL. Only the first form found is validated
    (lower-precedence forms in the same request are ignored); an invalid one raises
    :class:`WireError` naming it.
    """
    xargs = body.get(XARGS_FIELD)
    if not isinstance(xargs, Mapping):
        xargs = {}
    session_forms: list[tuple[str, Any]] = [
        (f"{XARGS_FIELD}.{XARG_SESSION}", xargs.get(XARG_SESSION)),
        (BODY_SESSION_FIELD, body.get(BODY_SESSION_FIELD)),
        ("URL /sessions/<id>/", path_session),
        (f"header {LITELLM_SESSION_HEADER}", header(LITELLM_SESSION_HEADER)),
        # X-Session-Id is also the routing key that vllm-router hashes; a deployment may set
        # it to a group to keep a task's sessions on one server. It names the session only
        # where no finer form does, so routing by group never renames a session.
        (f"header {SESSION_HEADER}", header(SESSION_HEADER)),
        (PROMPT_CACHE_KEY_FIELD, body.get(PROMPT_CACHE_KEY_FIELD)),
        (f"header {SMG_ROUTING_HEADER}", header(SMG_ROUTING_HEADER)),
    ]
    group_forms: list[tuple[str, Any]] = [
        (f"{XARGS_FIELD}.{XARG_GROUP}", xargs.get(XARG_GROUP)),
        (f"header {GROUP_HEADER}", header(GROUP_HEADER)),
    ]
    return _first_id(session_forms), _first_id(group_forms)


def _first_id(forms: list[tuple[str, Any]]) -> str | None:
    for field_name, value in forms:
        if value is None:
            continue
        if not is_valid_id(value):
            raise bad_id(field_name)
        return value
    return None


# ---------------------------------------------------------------------------- seeds


class SeedKind(StrEnum):
    """Why text is put into a draft index without being generated."""

    PRIOR_TURN = "prior_turn"
    REPAIR_ATTEMPT = "repair_attempt"
    SIBLING_OUTPUT = "sibling_output"
    DOCUMENT = "document"


class SeedScope(StrEnum):
    """Which index a seed goes into: the request's session's, or its group's."""

    SESSION = "session"
    GROUP = "group"


SEED_FIELDS: Final = frozenset({"text", "token_ids", "scope", "kind"})

#: Default server limits (``EngineSettings`` may change them).
MAX_SEEDS_PER_REQUEST: Final = 16
MAX_SEED_TOKENS_PER_REQUEST: Final = 32768
#: No tokenizer makes fewer than one token per 32 characters, so a text seed longer than
#: ``CHARS_PER_TOKEN_BOUND * limit`` is over the token limit before it is tokenized.
CHARS_PER_TOKEN_BOUND: Final = 32


@dataclass(frozen=True, slots=True)
class SeedSpec:
    """One validated entry of ``agentspec_seeds``: exactly one of ``text`` or ``token_ids``."""

    scope: SeedScope
    kind: SeedKind
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    where: str = ""
    """Its place in the request (``agentspec_seeds[2]``), for error messages."""


def parse_seeds(
    raw: Any,
    *,
    session_id: str | None,
    group_id: str | None,
    max_seeds: int = MAX_SEEDS_PER_REQUEST,
    max_tokens: int = MAX_SEED_TOKENS_PER_REQUEST,
) -> list[SeedSpec]:
    """Validate ``agentspec_seeds`` as far as it can be without a tokenizer.

    Checks the shape of every seed, that its scope has a target in this request, that text
    is not so long it must be over ``max_tokens``, and that token ids are non-negative ints
    within ``max_tokens`` in all. The caller tokenizes text, checks token ids against its
    vocabulary and sums the tokens (:func:`seed_tokens_over_limit`).
    """
    if not isinstance(raw, list):
        raise WireError(f"{SEEDS_FIELD} must be a list of seed objects", SEEDS_FIELD)
    if len(raw) > max_seeds:
        raise WireError(
            f"{SEEDS_FIELD} has {len(raw)} seeds, over the limit max_seeds_per_request={max_seeds}", SEEDS_FIELD
        )
    out: list[SeedSpec] = []
    total_ids = 0
    for i, seed in enumerate(raw):
        where = f"{SEEDS_FIELD}[{i}]"
        if not isinstance(seed, dict):
            raise WireError(f"{where} must be an object", where)
        unknown = sorted(set(seed) - SEED_FIELDS)
        if unknown:
            raise WireError(
                f"{where} has unknown field(s) {', '.join(unknown)} (allowed: {', '.join(sorted(SEED_FIELDS))})",
                f"{where}.{unknown[0]}",
            )
        scope_name = seed.get("scope", SeedScope.SESSION.value)
        if scope_name not in SeedScope._value2member_map_:
            raise WireError(f"{where}.scope must be one of {', '.join(SeedScope)}", f"{where}.scope")
        scope = SeedScope(scope_name)
        if scope is SeedScope.SESSION and session_id is None:
            raise WireError(f"{where} has scope session but the request names no session", f"{where}.scope")
        if scope is SeedScope.GROUP and group_id is None and session_id is None:
            raise WireError(f"{where} has scope group but the request names no group or session", f"{where}.scope")
        kind_name = seed.get("kind", SeedKind.PRIOR_TURN.value)
        if kind_name not in SeedKind._value2member_map_:
            raise WireError(f"{where}.kind must be one of {', '.join(SeedKind)}", f"{where}.kind")
        kind = SeedKind(kind_name)
        has_text, has_ids = "text" in seed, "token_ids" in seed
        if has_text == has_ids:
            raise WireError(f"{where} needs exactly one of text and token_ids", where)
        if has_text:
            text = seed["text"]
            if not isinstance(text, str):
                raise WireError(f"{where}.text must be a string", f"{where}.text")
            if len(text) > CHARS_PER_TOKEN_BOUND * max_tokens:
                raise seed_tokens_over_limit(max_tokens, where)
            out.append(SeedSpec(scope, kind, text=text, where=where))
        else:
            ids = seed["token_ids"]
            # bool is an int subclass; True as a token id is a bug at the caller.
            if not isinstance(ids, list) or not all(type(t) is int and t >= 0 for t in ids):
                raise WireError(f"{where}.token_ids must be a list of non-negative integers", f"{where}.token_ids")
            total_ids += len(ids)
            if total_ids > max_tokens:
                raise seed_tokens_over_limit(max_tokens, where)
            out.append(SeedSpec(scope, kind, token_ids=tuple(ids), where=where))
    return out


def check_vocabulary(spec: SeedSpec, token_ids: Sequence[int], vocab_size: int) -> None:
    """Refuse a token-id seed holding ids the model's vocabulary lacks."""
    if spec.token_ids is not None and any(t >= vocab_size for t in token_ids):
        raise WireError(
            f"{spec.where}.token_ids must be a list of integers in [0, {vocab_size})", f"{spec.where}.token_ids"
        )


def refuse_reserved_xargs(xargs: dict[str, Any]) -> None:
    """Raise :class:`WireError` when a caller's ``vllm_xargs`` holds a key only the server
    may set (seeds, the seed-only mark, policy versions, the tenant, the admission token),
    saying where that data goes instead."""
    where = {key: f"vllm_xargs.{key}" for key in xargs}
    if XARG_SEEDS in xargs:
        raise WireError(
            f"{where[XARG_SEEDS]} is reserved; send seeds in the top-level field {SEEDS_FIELD}", where[XARG_SEEDS]
        )
    if XARG_SEED_ONLY in xargs:
        raise WireError(
            f"{where[XARG_SEED_ONLY]} is reserved; send seeds alone to POST {SEEDS_PATH}", where[XARG_SEED_ONLY]
        )
    for key in (XARG_POLICY_VERSION, XARG_KEEP_OLD_OUTPUTS):
        if key in xargs:
            raise WireError(f"{where[key]} is reserved; announce a policy with POST {POLICY_PATH}", where[key])
    if XARG_TENANT in xargs:
        raise WireError(
            f"{where[XARG_TENANT]} is reserved: the server derives the tenant from the API key and {CACHE_SALT_FIELD}",
            where[XARG_TENANT],
        )
    if XARG_ADMISSION in xargs:
        raise WireError(f"{where[XARG_ADMISSION]} is reserved for the server", where[XARG_ADMISSION])


def seed_tokens_over_limit(limit: int, where: str) -> WireError:
    """The error for seeds whose tokens exceed ``max_seed_tokens_per_request``."""
    return WireError(
        f"{SEEDS_FIELD} exceed the limit max_seed_tokens_per_request={limit} tokens (at {where})", SEEDS_FIELD
    )


# ---------------------------------------------------------------------------- statistics


def check_seeds_request(data: Any) -> dict[str, Any]:
    """``data`` when it is a valid body of ``POST /agentspec/v1/seeds`` (seeds not yet checked)."""
    if not isinstance(data, dict):
        raise WireError(f"the body must be a JSON object with {SEEDS_FIELD}")
    unknown = sorted(set(data) - SEEDS_REQUEST_FIELDS)
    if unknown:
        allowed = ", ".join(sorted(SEEDS_REQUEST_FIELDS))
        raise WireError(f"unknown field(s) {', '.join(unknown)} (allowed: {allowed})", unknown[0])
    xargs = data.get(XARGS_FIELD, {})
    if not isinstance(xargs, dict) or set(xargs) - {XARG_SESSION, XARG_GROUP}:
        raise WireError(f"{XARGS_FIELD} may hold only {XARG_SESSION} and {XARG_GROUP} here", XARGS_FIELD)
    if not data.get(SEEDS_FIELD):
        raise WireError(f"{SEEDS_FIELD} must hold at least one seed", SEEDS_FIELD)
    return data


def check_policy_request(data: Any) -> tuple[int, bool]:
    """``(version, keep_old_outputs)`` of a ``POST POLICY_PATH`` body; :class:`WireError`
    naming the field otherwise."""
    if not isinstance(data, Mapping):
        raise WireError("the body must be a JSON object")
    unknown = sorted(set(data) - POLICY_REQUEST_FIELDS)
    if unknown:
        raise WireError(
            f"unknown field {unknown[0]!r}; a policy request has {', '.join(sorted(POLICY_REQUEST_FIELDS))}", unknown[0]
        )
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version < 2**63:
        raise WireError("version must be a non-negative integer", "version")
    keep = data.get("keep_old_outputs", False)
    if not isinstance(keep, bool):
        raise WireError("keep_old_outputs must be true or false", "keep_old_outputs")
    return version, keep


def seeds_response_body(session_id: str | None, group_id: str | None, seeded_tokens: int) -> dict[str, Any]:
    """The body of a successful ``POST /agentspec/v1/seeds``.

    ``seeded_tokens`` counts the tokens the server took; the index may still refuse a seed
    over its own per-session budget (counted in ``agentspec_seed_errors_total``).
    """
    return {"session_id": session_id, "group_id": group_id, "seeded_tokens": int(seeded_tokens)}


#: The fields of ``GET /agentspec/v1/sessions/{id}``, in order.
SESSION_STATS_FIELDS: Final = (
    "session_id",
    "group_id",
    "calls",
    "draft_steps",
    "draft_tokens",
    "accepted_tokens",
    "acceptance_rate",
    "indexed_tokens",
    "seeded_tokens",
    "last_index_new_tokens",
    "held_tokens",
    "accepted_tokens_by_level",
    "seeded_tokens_by_kind",
    "policy_version",
    "draft_tokens_by_policy_version",
    "accepted_tokens_by_policy_version",
    "model_draft_steps",
    "model_draft_tokens",
    "model_accepted_tokens",
)


def session_stats_body(
    session_id: str,
    group_id: str | None,
    *,
    calls: int = 0,
    draft_steps: int = 0,
    draft_tokens: int = 0,
    accepted_tokens: int = 0,
    indexed_tokens: int = 0,
    seeded_tokens: int = 0,
    last_index_new_tokens: int = 0,
    held_tokens: int = 0,
    accepted_tokens_by_level: Mapping[str, int] | None = None,
    seeded_tokens_by_kind: Mapping[str, int] | None = None,
    policy_version: int | None = None,
    draft_tokens_by_policy_version: Mapping[str, int] | None = None,
    accepted_tokens_by_policy_version: Mapping[str, int] | None = None,
    model_draft_steps: int = 0,
    model_draft_tokens: int = 0,
    model_accepted_tokens: int = 0,
) -> dict[str, Any]:
    """The body of ``GET /agentspec/v1/sessions/{id}`` (fields :data:`SESSION_STATS_FIELDS`)."""
    return {
        "session_id": session_id,
        "group_id": group_id,
        "calls": int(calls),
        "draft_steps": int(draft_steps),
        "draft_tokens": int(draft_tokens),
        "accepted_tokens": int(accepted_tokens),
        "acceptance_rate": round(accepted_tokens / draft_tokens, 4) if draft_tokens else 0.0,
        "indexed_tokens": int(indexed_tokens),
        "seeded_tokens": int(seeded_tokens),
        "last_index_new_tokens": int(last_index_new_tokens),
        "held_tokens": int(held_tokens),
        # Which level drafted what the target accepted: call, session, group, global.
        "accepted_tokens_by_level": dict(accepted_tokens_by_level or {}),
        # Seeded tokens by seed kind: prior_turn, repair_attempt, sibling_output, document.
        "seeded_tokens_by_kind": dict(seeded_tokens_by_kind or {}),
        # RL: the policy version of the session's latest call (None before any was
        # announced), and its draft and accepted tokens by the version they ran under.
        "policy_version": policy_version,
        "draft_tokens_by_policy_version": dict(draft_tokens_by_policy_version or {}),
        "accepted_tokens_by_policy_version": dict(accepted_tokens_by_policy_version or {}),
        # Hybrid drafting (--agentspec-drafter): the draft model's drafts for the session;
        # the draft and accepted tokens above are the index's.
        "model_draft_steps": int(model_draft_steps),
        "model_draft_tokens": int(model_draft_tokens),
        "model_accepted_tokens": int(model_accepted_tokens),
    }
