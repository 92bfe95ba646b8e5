"""A fix for a vLLM defect that breaks speculative sampling on the CPU backend.

vLLM's rejection sampler spreads each request's temperature (and top-k / top-p) over its
draft positions with ``expand_batch_to_tokens``, a Triton kernel. On the CPU backend the
kernel is a C++ stand-in (``vllm.utils.cpu_triton_utils._expand_kernel_impl``) that casts
its output to int64 before writing, so for a floating-point tensor it writes into a
temporary copy and leaves the real output as allocated (``new_empty``): the verified
positions get an arbitrary temperature. Greedy requests are unaffected; sampled ones
are not drawn from the target's distribution, whatever the drafter (vLLM 0.32's own
suffix and draft_model methods included).

:func:`apply` checks the stand-in on a small float tensor and, only if it leaves the
output unwritten, replaces the module-level ``expand_batch_to_tokens`` of vLLM's
rejection sampler with the same computation in plain torch. The plugin calls it in the
processes that run the model.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger("vllm.agentspec.fixes")

__all__ = ["apply", "expand_batch_to_tokens"]


def expand_batch_to_tokens(
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> torch.Tensor:
    """vLLM's ``expand_batch_to_tokens`` in torch: ``x[i]`` repeated for each of request
    ``i``'s tokens (``cu_num_tokens`` is cumulative), ``replace_from`` values replaced
    by ``replace_to``."""
    counts = torch.diff(
        cu_num_tokens.to(torch.long),
        prepend=cu_num_tokens.new_zeros(1, dtype=torch.long),
    )
    out = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return out.masked_fill(out == replace_from, replace_to)


def _cpu_expand_is_broken() -> bool:
    from vllm.utils import cpu_triton_utils

    out = torch.full((3,), -1.0)
    cpu_triton_utils._expand_kernel_impl(out, torch.tensor([2.0, 3.0]), torch.tensor([1, 3], dtype=torch.int32), 0, 1)
    return not torch.equal(out, torch.tensor([2.0, 3.0, 3.0]))


def apply() -> bool:
    """Install the fix where it is needed; True if installed."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    try:
        if not _cpu_expand_is_broken():
            return False
    except Exception as exc:  # noqa: BLE001 - no working stand-in at all: the fix is needed
        logger.debug("agentspec: vLLM's CPU expand kernel failed its check: %s", exc)
    from vllm.v1.sample import rejection_sampler

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    logger.info("agentspec: replaced vLLM's CPU expand_batch_to_tokens (it left sampling temperatures unset)")
    return True
