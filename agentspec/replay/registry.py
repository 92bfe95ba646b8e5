"""Which proposers a replay can name, and how one is built.

Three places, later ones overriding earlier ones:

1. the built-in proposers: ``none``, ``vllm-ngram``, ``vllm-suffix`` (vLLM 0.34's),
   ``vllm-suffix-0.32`` (0.32's tree), ``agentspec``, ``oracle``,
   and with a trained drafter (``ProposerSettings.drafter``) ``drafter``, ``agentspec-hybrid`` and
   ``agentspec-hybrid-arctic``;
2. factories other installed packages publish under the entry-point group
   ``agentspec.replay_proposers`` (so ``agentspec bench --proposers NAME`` finds them)::

       [project.entry-points."agentspec.replay_proposers"]
       my-drafter = "my_package.drafter:make_my_drafter"

3. factories the caller passes (``run_replay(config, proposers={"my-drafter": factory})``).
   With ``jobs > 1`` they travel to worker processes, so they must be picklable
   (module-level functions are).

Nothing is registered globally: every call builds its table afresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points

from agentspec.replay.proposer import Proposer, ProposerFactory, ProposerSettings

ENTRY_POINT_GROUP = "agentspec.replay_proposers"


def builtin_proposers() -> dict[str, ProposerFactory]:
    from agentspec.replay.baselines import make_none, make_oracle, make_vllm_ngram, make_vllm_suffix_tree
    from agentspec.replay.driver_proposer import make_agentspec
    from agentspec.replay.gpu_suffix import make_vllm_suffix
    from agentspec.replay.model_drafting import make_drafter_alone, make_hybrid, make_hybrid_arctic

    return {
        "none": make_none,
        "vllm-ngram": make_vllm_ngram,
        "vllm-suffix": make_vllm_suffix,
        "vllm-suffix-0.32": make_vllm_suffix_tree,
        "agentspec": make_agentspec,
        "oracle": make_oracle,
        "drafter": make_drafter_alone,
        "agentspec-hybrid": make_hybrid,
        "agentspec-hybrid-arctic": make_hybrid_arctic,
    }


def proposer_names(extra: Mapping[str, ProposerFactory] | None = None) -> list[str]:
    """Every name :func:`make_proposer` accepts."""
    names = [*builtin_proposers(), *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)), *(extra or {})]
    return list(dict.fromkeys(names))


def make_proposer(
    name: str, settings: ProposerSettings, extra: Mapping[str, ProposerFactory] | None = None
) -> Proposer:
    """Build the proposer called ``name`` (one server's drafter)."""
    if extra and name in extra:
        return extra[name](settings)
    published = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name in published:
        try:
            factory = published[name].load()
        except Exception as exc:  # noqa: BLE001 - a broken plug-in must say which one it is
            raise ValueError(f"proposer {name!r} ({published[name].value}) failed to load: {exc}") from exc
        return factory(settings)
    builtins = builtin_proposers()
    if name not in builtins:
        raise ValueError(f"unknown proposer {name!r}; known: {', '.join(proposer_names(extra))}")
    return builtins[name](settings)
