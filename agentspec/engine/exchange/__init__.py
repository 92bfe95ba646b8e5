"""Corpus exchange: the replicas of one model index each other's finished outputs into
their global corpus, so that group-pinned replicas draft as well as one server.

One interface (:class:`Exchange`), two transports:

- the folder (:mod:`.folder`, ``--agentspec-exchange-dir``): replicas on one machine;
- Redis Streams (:mod:`.redis_streams`, ``--agentspec-exchange redis://...``): replicas on
  many machines, through a Redis server the operator runs.

Both keep tenants apart (every output carries its tenant, and is indexed into that
tenant's corpus only), carry the policy version an output was generated under and the
model fingerprint (:mod:`.fingerprint`: only replicas of one model and tokenizer
exchange), and never raise into the engine.
"""

from __future__ import annotations

from agentspec.engine.exchange.base import Exchange, PeerOutput, close_at_exit
from agentspec.engine.exchange.fingerprint import model_fingerprint, tokenizer_digest
from agentspec.engine.exchange.folder import (
    HEADER_BYTES,
    MAX_RECORD_TOKENS,
    CorpusExchange,
    TenantExchange,
    tenant_of,
)
from agentspec.engine.exchange.redis_streams import RedisExchange
from agentspec.engine.exchange_config import RedisExchangeConfig

__all__ = [
    "HEADER_BYTES",
    "MAX_RECORD_TOKENS",
    "CorpusExchange",
    "Exchange",
    "PeerOutput",
    "RedisExchange",
    "RedisExchangeConfig",
    "TenantExchange",
    "close_at_exit",
    "model_fingerprint",
    "open_exchange",
    "tenant_of",
    "tokenizer_digest",
]


def open_exchange(
    *, exchange_dir: str | None, exchange_url: str | None, replica_id: str, model: str
) -> Exchange | None:
    """The transport the settings name (None: neither). ``replica_id`` names this replica
    to the others (the folder uses it as its file name); ``model`` is the model
    fingerprint: outputs of other fingerprints are skipped as foreign."""
    if exchange_url is not None:
        return RedisExchange(RedisExchangeConfig.parse(exchange_url), replica_id, model)
    if exchange_dir is not None:
        return TenantExchange(exchange_dir, replica_id, model=model)
    return None
