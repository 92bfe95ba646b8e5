"""Which agentspec session and group a LangChain call belongs to.

A chat model sees its call's context in three places: keyword arguments of the call
(``model.invoke(..., session_id="s1")`` or ``model.bind(session_id="s1")``), its own
fields, and the run's metadata (``run_manager.metadata`` inside ``_generate``).

LangGraph copies ``configurable.thread_id`` into the run metadata of everything a graph
runs. langchain-core (since 1.x) no longer copies ``configurable`` into run metadata by
itself, so for a model invoked outside a graph, ``with_session_metadata`` does the same
copy for the few keys that name a session; ``ChatAgentSpec`` applies it on its entry points.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config, var_child_runnable_config

from agentspec.wire import ID_RULE, is_valid_id

__all__ = [
    "GROUP_ARG",
    "GROUP_METADATA_KEY",
    "SESSION_ARG",
    "SESSION_METADATA_KEY",
    "THREAD_METADATA_KEY",
    "CallIds",
    "check_id",
    "derived_id",
    "resolve_ids",
    "run_metadata",
    "with_session_metadata",
]

#: The call arguments (``llm.invoke(..., session_id=...)``) and model fields naming the
#: session and group. The wire's names are agentspec.wire's, whatever these are called.
SESSION_ARG: Final = "session_id"
GROUP_ARG: Final = "group_id"
SESSION_METADATA_KEY: Final = "agentspec_session_id"
GROUP_METADATA_KEY: Final = "agentspec_group_id"
THREAD_METADATA_KEY: Final = "thread_id"


@dataclass(frozen=True)
class CallIds:
    """The ids one call travels with; both None for a call outside any session."""

    session_id: str | None
    group_id: str | None
    session_source: str | None = None
    """Where the session id came from: ``call``, ``model``, ``metadata``, ``thread_id``."""

    @property
    def pin_key(self) -> str | None:
        """The key a backend is chosen by: the group keeps its sessions together."""
        return self.group_id or self.session_id


def check_id(field: str, value: object) -> str:
    """``value`` as a wire id; :class:`ValueError` naming ``field`` when it breaks the rule.

    Ids the caller names explicitly are checked rather than rewritten: a silently changed
    id would make ``get_session_stats("my id")`` miss its own session.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        msg = f"{field} must be a string, got {type(value).__name__}"
        raise ValueError(msg)  # noqa: TRY004 - pydantic validators must raise ValueError
    text = str(value)
    if not is_valid_id(text):
        msg = f"{field} must be {ID_RULE}, got {text!r}"
        raise ValueError(msg)
    return text


def derived_id(value: object) -> str:
    """A wire id for an id another framework chose (LangGraph's ``thread_id``).

    Valid ids pass unchanged, so a thread's stats are found under its own name; anything
    else (spaces, unicode, over 128 chars) maps to a stable digest instead of failing
    the user's graph.
    """
    text = str(value)
    if is_valid_id(text):
        return text
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()
    return f"lg-{digest}"


def run_metadata(run_manager: Any | None) -> Mapping[str, Any]:
    """The metadata of the run a model call belongs to.

    ``run_manager.metadata`` holds the config's metadata (inherited from parent runs) plus
    the model's own; without a run manager (a direct ``_generate`` call inside a runnable)
    the config of the enclosing runnable, if any, is the best we have.
    """
    if run_manager is not None:
        metadata = getattr(run_manager, "metadata", None)
        if isinstance(metadata, Mapping) and metadata:
            return metadata
    config = var_child_runnable_config.get()
    if config:
        merged: dict[str, Any] = {}
        for key, value in (config.get("configurable") or {}).items():
            if isinstance(value, (str, int)) and not isinstance(value, bool):
                merged.setdefault(key, value)
        merged.update(config.get("metadata") or {})
        return merged
    return {}


_SESSION_KEYS: Final = (SESSION_METADATA_KEY, GROUP_METADATA_KEY, THREAD_METADATA_KEY)


def with_session_metadata(config: RunnableConfig | None) -> RunnableConfig:
    """``config`` (or the enclosing run's) with session-naming ``configurable`` keys in metadata.

    Only ``agentspec_session_id``, ``agentspec_group_id`` and ``thread_id`` are copied,
    and only where metadata does not already name them (an explicit metadata entry wins).
    """
    config = ensure_config(config)
    configurable = config.get("configurable") or {}
    metadata = config.get("metadata") or {}
    extra = {
        key: configurable[key]
        for key in _SESSION_KEYS
        if key not in metadata
        and isinstance(configurable.get(key), (str, int))
        and not isinstance(configurable.get(key), bool)
    }
    if not extra:
        return config
    return {**config, "metadata": {**metadata, **extra}}


def resolve_ids(
    *,
    call_session_id: object | None,
    call_group_id: object | None,
    model_session_id: str | None,
    model_group_id: str | None,
    metadata: Mapping[str, Any],
) -> CallIds:
    """Apply the resolution order of the issue: call, model, run metadata, LangGraph thread.

    The group follows the same order minus the thread (a thread is a session, not a group).
    """
    session_id: str | None
    source: str | None
    if call_session_id is not None:
        session_id, source = check_id(SESSION_ARG, call_session_id), "call"
    elif model_session_id is not None:
        session_id, source = model_session_id, "model"
    elif metadata.get(SESSION_METADATA_KEY) is not None:
        session_id = check_id(SESSION_METADATA_KEY, metadata[SESSION_METADATA_KEY])
        source = "metadata"
    elif metadata.get(THREAD_METADATA_KEY) not in (None, ""):
        session_id, source = derived_id(metadata[THREAD_METADATA_KEY]), "thread_id"
    else:
        session_id, source = None, None

    group_id: str | None
    if call_group_id is not None:
        group_id = check_id(GROUP_ARG, call_group_id)
    elif model_group_id is not None:
        group_id = model_group_id
    elif metadata.get(GROUP_METADATA_KEY) is not None:
        group_id = check_id(GROUP_METADATA_KEY, metadata[GROUP_METADATA_KEY])
    else:
        group_id = None
    return CallIds(session_id, group_id, source)
