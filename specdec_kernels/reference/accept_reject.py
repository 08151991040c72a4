"""Reference prefix-match count: the specification of :func:`specdec_kernels.accept_reject`."""

from __future__ import annotations

import torch

from specdec_kernels.reference.verify_greedy import prefix_match_count


def accept_reject(draft_tokens: torch.Tensor, verifier_tokens: torch.Tensor) -> torch.Tensor:
    """Length of the longest common prefix of ``[..., K]`` token tensors, as int64 ``[...]``."""
    return prefix_match_count(draft_tokens.to(torch.int64), verifier_tokens.to(torch.int64))
