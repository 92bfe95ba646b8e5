"""Which replicas exchange: the model fingerprint.

Exchanged outputs are token ids, which mean the same text only under the same tokenizer,
and are worth drafting from only for the same model. A replica's fingerprint is
``<served model name>:<vocabulary size>:<tokenizer digest>``; both transports carry it
(the Redis entry's model field and default stream name, the folder file's header) and
skip what carries another as foreign.

The tokenizer digest is taken over the vocabulary as loaded (every token with its id, and
the special ids), not over the files: replicas that load one tokenizer agree, whatever
copy, format or chat template they load it from.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

__all__ = ["model_digest", "model_fingerprint", "tokenizer_digest"]

logger = logging.getLogger("vllm.agentspec.exchange")

#: Hex digits of a tokenizer digest in a fingerprint (64 bits: no accidental match).
DIGEST_HEX = 16


def tokenizer_digest(tokenizer: Any) -> str:
    """A digest of what ``tokenizer``'s ids mean: every token of its vocabulary (added
    tokens included) with its id, and its special ids."""
    h = hashlib.sha256()
    entries = sorted((int(i), _as_bytes(token)) for token, i in tokenizer.get_vocab().items())
    for i, token in entries:
        h.update(b"%d\t%d\t" % (i, len(token)))
        h.update(token)
    special = sorted({int(i) for i in getattr(tokenizer, "all_special_ids", None) or ()})
    h.update(("special:" + ",".join(map(str, special))).encode())
    return h.hexdigest()[:DIGEST_HEX]


def model_fingerprint(model_config: Any) -> str:
    """The fingerprint of the model a vLLM ``ModelConfig`` describes.

    Without a tokenizer (``--skip-tokenizer-init``) or where it cannot be loaded, the
    fingerprint has no digest: such replicas exchange only with each other, and a warning
    says so.
    """
    base = f"{model_config.served_model_name}:{model_config.get_vocab_size()}"
    try:
        # The engine loaded this tokenizer already (lru-cached per process): cheap here.
        from agentspec.engine.vllm.surface import load

        tokenizer = load("cached_tokenizer_from_config")(model_config)
        if tokenizer is None:
            raise ValueError("the server runs without a tokenizer")
        return f"{base}:{tokenizer_digest(tokenizer)}"
    except Exception as exc:  # noqa: BLE001 - a fingerprint is never worth failing the engine
        logger.warning(
            "agentspec exchange: cannot fingerprint the tokenizer (%s); exchanging only with"
            " replicas that cannot either (fingerprint %s)",
            exc,
            base,
        )
        return base


def model_digest(fingerprint: str) -> bytes:
    """16 bytes standing for ``fingerprint`` where room is fixed (the folder's file header)."""
    return hashlib.sha256(fingerprint.encode()).digest()[:16]


def _as_bytes(token: Any) -> bytes:
    if isinstance(token, bytes):
        return token
    return str(token).encode("utf-8", "surrogatepass")
