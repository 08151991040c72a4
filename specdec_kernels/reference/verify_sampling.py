"""Reference sampling verification: the specification of :func:`specdec_kernels.verify_sampling`.

Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (ICML 2023) and
Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling" (2023).

Written for clarity, in float32 on full ``[B, K+1, V]`` tensors; the Triton kernels compute the same
quantities with the same formulas and the same random numbers (:mod:`.rng`) without materialising
them, so the two agree token for token except where float rounding decides a near-tie.
"""

from __future__ import annotations

import torch

from specdec_kernels.reference import rng
from specdec_kernels.reference.verify_greedy import (
    emitted_tokens,
    prefix_match_count,
    with_greedy_rows,
)


def filtered_probs(
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """The target distribution ``p`` of every position after temperature, top-k, top-p and
    ``min_p``.

    Parameters
    ----------
    target_logits : `[B, K+1, V]` float tensor.
    temperature : `[B]` float32, all ``> 0`` (greedy rows are handled by the caller).
    top_k : `[B]` int64 or None; ``0`` or ``>= V`` disables it for that row.
    top_p : `[B]` float32 or None; ``1`` disables it for that row.
    min_p : `[B]` float32 or None; ``0`` disables it for that row.

    Returns
    -------
    `[B, K+1, V]` float32 probabilities: ``exp(x - max x) / Z`` over the kept tokens, 0 elsewhere,
    with ``x = logits / temperature``. Top-k keeps every token whose ``x`` is at least the k-th
    largest (ties kept); top-p then keeps every token whose strictly-larger mass (in the
    renormalised top-k distribution) is below ``top_p``, as transformers' TopK/TopP warpers do;
    ``min_p`` then keeps the tokens with ``exp(x - max x) >= min_p`` (probability at least
    ``min_p`` times the largest, transformers' and vLLM's rule).
    """
    x = target_logits.float() / temperature.float()[:, None, None]  # [B, K+1, V]
    m = x.amax(dim=-1, keepdim=True)
    e = torch.exp(x - m) * filter_mask(x, top_k, top_p, min_p)  # unnormalised kept probs
    return e / e.sum(dim=-1, keepdim=True)


def split_greedy_rows(
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(greedy_row [B] bool, p)``: the rows with ``temperature == 0`` (greedy rows, decided by
    argmax: the caller takes :func:`.verify_greedy.verify_greedy`'s answer for them) and the
    :func:`filtered_probs` of every row, the greedy ones at temperature 1 (finite, unused)."""
    greedy_row = temperature == 0  # [B]
    temp = torch.where(greedy_row, torch.ones_like(temperature), temperature)
    return greedy_row, filtered_probs(target_logits, temp, top_k, top_p, min_p)


def filtered_probs_alike(
    target_logits: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> torch.Tensor:
    """:func:`filtered_probs` with one host value of each filter for every row (``None``: off).

    >>> filtered_probs_alike(torch.tensor([[[2.0, 0.0, -1e9]]]), 1.0, top_k=1).tolist()
    [[[1.0, 0.0, 0.0]]]
    """
    b, dev = target_logits.shape[0], target_logits.device
    temp = torch.full((b,), float(temperature), dtype=torch.float32, device=dev)
    minp = None if min_p is None else torch.full((b,), min_p, dtype=torch.float32, device=dev)
    return filtered_probs(target_logits, temp, *filters_alike(b, dev, top_k, top_p), minp)


def filters_alike(b: int, device, top_k: int | None, top_p: float | None) -> tuple:
    """``(top_k [B] int64, top_p [B] float32)`` of one host value each for ``b`` rows, ``None``
    where the value is ``None``: the filters of :func:`filtered_probs` and :func:`filter_mask`."""
    return (
        None if top_k is None else torch.full((b,), top_k, dtype=torch.int64, device=device),
        None if top_p is None else torch.full((b,), top_p, dtype=torch.float32, device=device),
    )


def filter_mask(
    x: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None = None,
):
    """``[B, K+1, V]`` bool: the tokens that top-k, top-p and ``min_p`` keep, from the float32
    scaled logits
    ``x = logits / temperature`` (the kept set of :func:`filtered_probs`, which the logprobs
    reference reuses so that both see the same support)."""
    b, k1, v = x.shape
    keep = torch.ones_like(x, dtype=torch.bool)
    if top_k is not None or top_p is not None:
        m = x.amax(dim=-1, keepdim=True)
        xs = x.sort(dim=-1, descending=True).values  # [B, K+1, V]
        kept_sorted = torch.ones_like(xs, dtype=torch.bool)
        if top_k is not None:
            kk = top_k.to(torch.int64)
            active = ((kk > 0) & (kk < v))[:, None, None]
            index = (kk.clamp(1, v) - 1)[:, None, None].expand(b, k1, 1)
            kth = xs.gather(-1, index)  # [B, K+1, 1]
            keep &= (x >= kth) | ~active
            kept_sorted &= (xs >= kth) | ~active
        if top_p is not None:
            es = torch.exp(xs - m) * kept_sorted
            total = es.sum(dim=-1, keepdim=True)
            mass_above = es.cumsum(dim=-1) - es  # exclusive: mass of strictly earlier tokens
            inside = (mass_above < top_p.float()[:, None, None] * total) & kept_sorted
            last = inside.sum(dim=-1, keepdim=True) - 1  # kept tokens form a prefix
            threshold = xs.gather(-1, last.clamp(min=0))
            active = (top_p < 1)[:, None, None]
            keep &= (x >= threshold) | ~active
    if min_p is not None:  # after top-p; the largest probability survives every filter
        m = x.amax(dim=-1, keepdim=True)
        keep &= torch.exp(x - m) >= min_p.float()[:, None, None]
    return keep


def race_uniforms(key: torch.Tensor, position: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The ``[B, V]`` uniforms of the resampling race of each row (``key = rng.row_key(seeds)``)
    at ``position[b]``."""
    stream = rng.stream_key(key, position, rng.PURPOSE_SAMPLE)  # [B]
    index = torch.arange(vocab_size, device=key.device)
    return rng.uniform(stream[:, None], index[None, :])


def match_exponentials(seeds: torch.Tensor, position: int, vocab_size: int) -> torch.Tensor:
    """``[B, V]``: the Exp(1) draws of ``method="match"``'s race at ``position`` of a call with
    ``seeds [B]``: the bonus race of a call with no drafts and the seeds ``seeds + position``
    (mod ``2**63``). A coupled drafter draws its draft at ``position`` with them
    (``argmax q / E``), so that where ``q`` is close to the target's ``p`` it picks the token
    the target's own sample will be."""
    shifted = (seeds.to(torch.int64) + position) & 0x7FFFFFFFFFFFFFFF
    key = rng.row_key(shifted)
    zero = torch.zeros_like(shifted)
    return rng.exponential(race_uniforms(key, zero, vocab_size))


def verify_sampling(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seeds: torch.Tensor,
    min_p: torch.Tensor | None = None,
):
    """Rejection-sampling verification; see :func:`specdec_kernels.verify_sampling`.

    All per-row arguments are tensors here (``temperature [B]`` float32, ``top_k [B]`` int64 or
    None, ``top_p [B]`` float32 or None, ``seeds [B]`` int64). Returns
    ``(tokens [B, K+1] int64, num_accepted [B] int64, num_emitted [B] int64)``.

    Draft token ``x_j`` is accepted when ``u_j * q_j(x_j) < p_j(x_j)`` with ``u_j`` the accept
    uniform of ``(seed, j)``: probability ``min(1, p/q)``, and never when ``p`` or ``q`` is 0.
    At the first rejection ``J`` the recovered token is ``argmax_x w(x) / E_x`` with
    ``w = max(0, p_J - q_J)`` and ``E_x = -log(1 - u_x)`` exponential (:func:`rng.exponential`):
    the exponential race, which samples ``x`` with probability ``w(x) / sum w``. If ``w`` has
    no mass, ``w = p_J``. After ``k_b`` acceptances ``w = p_{k_b}`` (the bonus token).
    """
    b, k1, v = target_logits.shape
    k = k1 - 1
    device = target_logits.device
    greedy_row, p = split_greedy_rows(target_logits, temperature, top_k, top_p, min_p)

    drafts = draft_tokens.to(torch.int64)
    in_vocab = (drafts >= 0) & (drafts < v)
    safe = drafts.clamp(0, v - 1)  # [B, K]
    p_draft = p[:, :k].gather(-1, safe[..., None])[..., 0] * in_vocab  # [B, K]
    if draft_probs is not None:
        q_draft = draft_probs.float().gather(-1, safe[..., None])[..., 0]
    else:
        q_draft = torch.ones_like(p_draft)
    positions = torch.arange(k, device=device)
    key = rng.row_key(seeds)  # [B]
    u = rng.accept_uniforms(seeds, k)  # [B, K]
    valid = positions[None, :] < num_draft_tokens[:, None].to(torch.int64)
    accept = (u * q_draft < p_draft) & (q_draft > 0) & in_vocab
    num_accepted = prefix_match_count(accept, torch.ones_like(accept), valid)  # [B]

    # The recovered token (the residual race at the first rejection) or the bonus (the plain race).
    rows = torch.arange(b, device=device)
    p_extra = p[rows, num_accepted]  # [B, V]
    rejected = num_accepted < num_draft_tokens.to(torch.int64)
    if k > 0:
        j = num_accepted.clamp(max=k - 1)
        if draft_probs is not None:
            q_extra = draft_probs[rows, j].float()
        else:
            q_extra = torch.zeros_like(p_extra)
            q_extra[rows, safe[rows, j]] = in_vocab[rows, j].float()
        residual = (p_extra - q_extra).clamp(min=0)
    else:
        residual = torch.zeros_like(p_extra)
    exponential = rng.exponential(race_uniforms(key, num_accepted, v))  # [B, V], > 0
    # Only tokens with positive weight score above the floor (0 / -1), so a token with no mass
    # never wins a race; the comparisons are false for NaN, as in the kernels.
    residual_score = torch.where(residual > 0, residual / exponential, 0.0)
    plain_score = torch.where(p_extra > 0, p_extra / exponential, -1.0)
    residual_best, residual_token = residual_score.max(dim=-1)
    plain_token = plain_score.argmax(dim=-1)
    use_residual = rejected & (residual_best > 0)
    recovered_or_bonus = torch.where(use_residual, residual_token, plain_token)  # [B]

    padded = torch.cat([drafts.clamp(0, v - 1), recovered_or_bonus[:, None]], dim=1)  # [B, K+1]
    padded[rows, num_accepted] = recovered_or_bonus
    tokens = emitted_tokens(padded, num_accepted)

    # greedy rows (temperature 0): exactly verify_greedy's answer
    return with_greedy_rows(
        greedy_row, tokens, num_accepted, target_logits, draft_tokens, num_draft_tokens
    )
