"""The expected accepts of a verified chain: what the decoding loop's acceptance estimate counts
where a step sampled (:func:`specdec_kernels.tuning.expected_accepts`). The specification of
``specdec::native_expected_accepts`` and the fallback where it does not apply (filters, another
device, an extension without it).
"""

from __future__ import annotations

import torch

from specdec_kernels.reference.verify_sampling import filtered_probs_alike


def expected_accepts(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor,
    num_accepted: torch.Tensor,
    num_drafted: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """``[B]`` float32: each row's expected number of passed accept tests over the positions
    its verification tested (``i < min(num_accepted + 1, num_drafted)``): the sum of
    ``sum_x min(p_i(x), q_i(x))`` (Leviathan et al. 2023, section 3.1), ``p_i`` the target's
    distribution after ``temperature`` (``> 0``), ``top_k`` and ``top_p``, ``q_i``
    ``draft_probs[:, i]``; a position whose ``p_i`` cannot be formed (non-finite logits, a NaN in
    ``q``) counts its outcome. ``target_logits`` ``[B, >= K, V]``, ``draft_probs`` ``[B, K, V]``,
    ``num_accepted`` and ``num_drafted`` ``[B]`` integers.

    >>> logits = torch.tensor([[[0.0, 0.0], [0.0, 0.0]]])  # p = (1/2, 1/2) at both positions
    >>> q = torch.tensor([[[1.0, 0.0], [0.25, 0.75]]])
    >>> expected_accepts(logits, q, torch.tensor([1]), torch.tensor([2]), 1.0)  # 1/2 + 3/4
    tensor([1.2500])
    """
    b, k = draft_probs.shape[:2]
    dev = target_logits.device
    if k == 0:
        return torch.zeros(b, device=dev)

    p = filtered_probs_alike(target_logits[:, :k], temperature, top_k, top_p)
    a = torch.minimum(p, draft_probs.float()).sum(-1).clamp(0.0, 1.0)  # [B, K] (NaN stays)
    j = torch.arange(k, device=dev)
    n = num_accepted.to(dev).long()[:, None]
    outcome = (j < n).float()
    a = torch.where(a.isnan(), outcome, a)
    tried = j < torch.minimum(n + 1, num_drafted.to(dev).long()[:, None])
    return (a * tried).sum(-1)
