"""Prompt-lookup (n-gram) drafting: propose the tokens that followed the latest earlier
occurrence of the sequence's last ``n`` tokens (Saxena 2023, "Prompt Lookup Decoding";
``transformers``' ``prompt_lookup_num_tokens``). Needs no draft model; the drafts are
deterministic, so verification treats them as one-hot (``draft_probs=None``)."""

from __future__ import annotations

import torch


def ngram_draft(
    tokens: torch.Tensor,
    seq_len: torch.Tensor,
    num_draft: int,
    max_ngram: int = 3,
    min_ngram: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft ``num_draft`` tokens per row by n-gram lookup in the row's own sequence.

    Parameters
    ----------
    tokens : Tensor
        ``[B, C]`` int64 buffer; row ``b`` holds its sequence in ``[:seq_len[b]]`` (the rest is
        ignored).
    seq_len : Tensor
        ``[B]`` int64.
    num_draft : int
        Draft slots ``K``.
    max_ngram, min_ngram : int
        The longest match (from ``max_ngram`` down to ``min_ngram``) wins; ties go to the most
        recent occurrence.

    Returns
    -------
    drafts : Tensor
        ``[B, K]`` int64, ``-1`` past a row's count.
    num_draft_tokens : Tensor
        ``[B]`` int64 in ``[0, K]``: 0 where nothing matched.

    Examples
    --------
    >>> t = torch.tensor([[1, 2, 3, 4, 1, 2]])
    >>> ngram_draft(t, torch.tensor([6]), 3)
    (tensor([[3, 4, 1]]), tensor([3]))
    """
    B, C = tokens.shape
    device = tokens.device
    rows = torch.arange(B, device=device)
    best_start = torch.full((B,), -1, dtype=torch.int64, device=device)
    for n in range(min_ngram, max_ngram + 1):  # larger n overrides smaller
        if n >= C:
            break
        suffix_pos = (seq_len[:, None] - n + torch.arange(n, device=device)).clamp(0, C - 1)
        suffix = tokens[rows[:, None], suffix_pos]  # [B, n]
        windows = tokens.unfold(1, n, 1)  # [B, C-n+1, n]
        starts = torch.arange(windows.shape[1], device=device)  # [W]
        # a match must end before the suffix starts being itself: start + n < seq_len
        ok = (windows == suffix[:, None, :]).all(-1) & (starts[None] + n < seq_len[:, None])
        ok &= (seq_len >= n + 1)[:, None]
        last = torch.where(ok, starts[None], -1).amax(-1)  # [B]
        best_start = torch.where(last >= 0, last + n, best_start)
    j = torch.arange(num_draft, device=device)
    src = best_start[:, None] + j  # [B, K] continuation positions
    count = torch.where(best_start >= 0, (seq_len - best_start).clamp(0, num_draft), 0)
    drafts = tokens[rows[:, None], src.clamp(0, C - 1)]
    drafts = torch.where(j[None] < count[:, None], drafts, -1)
    return drafts, count
