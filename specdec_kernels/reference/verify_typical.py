"""Reference typical acceptance: the specification of :func:`specdec_kernels.verify_typical`.

Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads"
(2024, https://arxiv.org/abs/2401.10774), typical acceptance; vLLM V0's
``TypicalAcceptanceSampler``.
Written for clarity on full ``[B, K+1, V]`` float32 tensors, like :mod:`.verify_sampling`, whose
filtered target distribution and exponential race it reuses (same random numbers).
"""

from __future__ import annotations

import torch

from specdec_kernels.reference import rng
from specdec_kernels.reference.verify_greedy import (
    emitted_tokens,
    prefix_match_count,
    with_greedy_rows,
)
from specdec_kernels.reference.verify_sampling import race_uniforms, split_greedy_rows


def entropy(p: torch.Tensor) -> torch.Tensor:
    """``H(p) = -sum_x p(x) log p(x)`` over the last dim (``0 log 0 = 0``), in float32."""
    safe = torch.where(p > 0, p, torch.ones_like(p))
    return -(p * torch.log(safe)).sum(dim=-1)


def verify_typical(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seeds: torch.Tensor,
    posterior_threshold: float,
    posterior_alpha: float,
):
    """Typical acceptance; see :func:`specdec_kernels.verify_typical`.

    ``p_j`` is the filtered target distribution (:func:`filtered_probs`). Draft ``x_j`` is
    accepted when ``p_j(x_j) > min(posterior_threshold, posterior_alpha * exp(-H(p_j)))``, in
    order, stopping at the first rejection (no random number is used). The recovered token is
    drawn from ``p_J`` at the first rejection ``J``, the bonus token from ``p_{k_b}`` after ``k_b``
    acceptances, both by the exponential race of :mod:`.verify_sampling` with the same uniforms
    (so the bonus token is the one :func:`verify_sampling` draws with the same seed). Rows with
    temperature 0 are greedy.
    Returns ``(tokens [B, K+1] int64, num_accepted [B] int64, num_emitted [B] int64)``.
    """
    b, k1, v = target_logits.shape
    k = k1 - 1
    device = target_logits.device
    greedy_row, p = split_greedy_rows(target_logits, temperature, top_k, top_p)  # [B, K+1, V]

    drafts = draft_tokens.to(torch.int64)
    in_vocab = (drafts >= 0) & (drafts < v)
    safe = drafts.clamp(0, v - 1)  # [B, K]
    p_draft = p[:, :k].gather(-1, safe[..., None])[..., 0]  # [B, K]
    bound = torch.minimum(
        torch.full_like(p_draft, posterior_threshold),
        posterior_alpha * torch.exp(-entropy(p[:, :k])),
    )
    positions = torch.arange(k, device=device)
    valid = positions[None, :] < num_draft_tokens[:, None].to(torch.int64)
    accept = (p_draft > bound) & in_vocab
    num_accepted = prefix_match_count(accept, torch.ones_like(accept), valid)  # [B]

    rows = torch.arange(b, device=device)
    p_next = p[rows, num_accepted]  # [B, V]
    exponential = rng.exponential(race_uniforms(rng.row_key(seeds), num_accepted, v))
    recovered_or_bonus = torch.where(p_next > 0, p_next / exponential, -1.0).argmax(dim=-1)  # [B]

    padded = torch.cat([safe, recovered_or_bonus[:, None]], dim=1)  # [B, K+1]
    padded[rows, num_accepted] = recovered_or_bonus
    tokens = emitted_tokens(padded, num_accepted)

    # greedy rows (temperature 0): exactly verify_greedy's answer
    return with_greedy_rows(
        greedy_row, tokens, num_accepted, target_logits, draft_tokens, num_draft_tokens
    )
