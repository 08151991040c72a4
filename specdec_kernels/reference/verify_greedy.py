"""Reference greedy verification: the specification of :func:`specdec_kernels.verify_greedy`."""

from __future__ import annotations

import torch


def prefix_match_count(
    a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Length of the longest prefix along the last dim where ``a == b`` (and ``valid``)."""
    match = a == b
    if valid is not None:
        match = match & valid
    return torch.cumprod(match.to(torch.int64), dim=-1).sum(dim=-1)


def emitted_tokens(accepted_then_extra: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
    """Keep ``tokens[b, :num_accepted[b] + 1]`` of a ``[B, K+1]`` tensor; pad the rest with -1."""
    positions = torch.arange(accepted_then_extra.shape[-1], device=accepted_then_extra.device)
    keep = positions[None, :] <= num_accepted[:, None]
    return torch.where(keep, accepted_then_extra, torch.full_like(accepted_then_extra, -1))


def verify_greedy(
    target_logits: torch.Tensor, draft_tokens: torch.Tensor, num_draft_tokens: torch.Tensor
):
    """Greedy verification of ``[B, K]`` drafts against ``[B, K+1, V]`` target logits.

    Returns ``(tokens [B, K+1] int64, num_accepted [B] int64, num_emitted [B] int64)``.
    ``t = argmax(logits)`` (first index on ties); a row accepts its longest draft prefix equal to
    ``t`` among its first ``num_draft_tokens[b]`` positions, then emits ``t`` at the first mismatch
    (or the bonus position).
    """
    k = draft_tokens.shape[1]
    target = target_logits.argmax(dim=-1)  # [B, K+1]
    positions = torch.arange(k, device=draft_tokens.device)
    valid = positions[None, :] < num_draft_tokens[:, None].to(torch.int64)  # [B, K]
    num_accepted = prefix_match_count(draft_tokens.to(torch.int64), target[:, :k], valid)
    tokens = emitted_tokens(target, num_accepted)
    return tokens, num_accepted, num_accepted + 1


def with_greedy_rows(
    greedy_row: torch.Tensor,
    tokens: torch.Tensor,
    num_accepted: torch.Tensor,
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor,
):
    """A chain rule's ``(tokens [B, K+1], num_accepted [B], num_emitted [B])`` with the greedy
    rows (``greedy_row [B]``, temperature 0) replaced by exactly :func:`verify_greedy`'s."""
    g_tokens, g_accepted, _ = verify_greedy(target_logits, draft_tokens, num_draft_tokens)
    tokens = torch.where(greedy_row[:, None], g_tokens, tokens)
    num_accepted = torch.where(greedy_row, g_accepted, num_accepted)
    return tokens, num_accepted, num_accepted + 1
