"""Reference block verification: the specification of ``sk.verify_sampling(..., method="block")``.

Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block Verification Accelerates
Speculative Decoding" (ICLR 2025, https://arxiv.org/abs/2403.10444), Algorithm 2; vLLM's
model-runner-v2 sampler has it as ``use_block_verification``.

Vocabulary of this file (the paper's notation, 1-based draft index ``i``; the tensors are 0-based,
so draft ``X_i`` is ``draft_tokens[:, i - 1]`` and ``M_b(. | X^i)`` is target row ``i``):

* ``M_b(. | X^i)`` = ``P_i``: the filtered target distribution after ``i`` drafts (temperature,
  top-k, top-p exactly as :func:`.verify_sampling.filtered_probs`); ``M_s(. | X^i)`` = ``Q_i``:
  the draft distribution of ``X_{i+1}`` (``draft_probs[:, i]``, or one-hot at ``X_{i+1}``).
* the *weight* ``p_i``: ``p_0 = 1``, ``p_i = min(1, p_{i-1} P_{i-1}(X_i) / Q_{i-1}(X_i))``;
* the *threshold* ``h_i``: ``h_i = R_i / (R_i + 1 - p_i)`` for ``i < gamma`` with the residual
  mass ``R_i = sum_x max(0, p_i P_i(x) - Q_i(x))``, and ``h_gamma = p_gamma``;
* the *stop* ``tau = max{i in 1..gamma : eta_i < h_i}`` (``0`` when there is none): the drafts
  ``X_1 .. X_tau`` are *accepted*;
* the *recovered* token (``tau < gamma``) is drawn from the block residual
  ``norm(max(0, p_tau P_tau - Q_tau))``; the *bonus* token (``tau = gamma``) from ``P_gamma``.

Unlike token verification, a draft that fails its own ratio test can still be accepted when a
later threshold fires: the weights carry the "unused" acceptance mass forward. For ``gamma = 1``,
and at ``tau = 0`` (``p_0 = 1``), it is exactly the token rule and the token residual.

Written for clarity, in float32 on full ``[B, K+1, V]`` tensors, like :mod:`.verify_sampling`,
whose filtered distribution, accept uniforms and exponential race it reuses.
"""

from __future__ import annotations

import torch

from specdec_kernels.reference import rng
from specdec_kernels.reference.verify_greedy import emitted_tokens, with_greedy_rows
from specdec_kernels.reference.verify_sampling import race_uniforms, split_greedy_rows


def block_weights(p_draft: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """The weights ``p_0 .. p_K`` (``[B, K+1]`` float32) from ``P_{i-1}(X_i)`` and
    ``Q_{i-1}(X_i)`` (``[B, K]`` each, 0-based column ``i - 1``).

    ``p_i = min(p_{i-1} P(X_i), Q(X_i)) / Q(X_i)``: ``min(1, p_{i-1} P / Q)`` without forming the
    ratio (no overflow for a tiny ``Q``, no ``0 * inf``), and ``p_i = 0`` when ``Q(X_i) = 0`` or
    ``P(X_i) = 0``: such a draft is never accepted (section 1), and neither is any later one.
    """
    b, k = p_draft.shape
    weights = [torch.ones(b, dtype=torch.float32, device=p_draft.device)]
    for j in range(k):
        q = q_draft[:, j]
        prev = weights[-1] * p_draft[:, j]
        safe_q = torch.where(q > 0, q, torch.ones_like(q))
        weights.append(torch.where(q > 0, torch.minimum(prev, q) / safe_q, 0.0))
    return torch.stack(weights, dim=1)


def block_residual(weight: torch.Tensor, p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """``max(0, p_i P_i - Q_i)``, unnormalised (``weight [B]``, rows ``[B, V]`` or ``[B, K, V]``
    with ``weight [B, K]``): the residual whose mass enters ``h_i`` and from which the recovered
    token is drawn at the stop."""
    return (weight[..., None] * p_row - q_row).clamp(min=0)


def stop_residual(weight: torch.Tensor, p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """The ``[B, V]`` weights the recovered token is raced from at the stop ``tau``: the block
    residual ``max(0, p_tau P_tau - Q_tau)`` (a stage of its own so that the tests can plant the
    token-level residual ``max(0, P_tau - Q_tau)`` here and see the chi-square test reject it)."""
    return block_residual(weight, p_row, q_row)


def block_thresholds(
    weights: torch.Tensor, residual_mass: torch.Tensor, num_draft_tokens: torch.Tensor
) -> torch.Tensor:
    """``[B, K]`` float32: column ``i - 1`` holds ``h_i`` for ``i = 1 .. K``.

    ``h_i = R_i / (R_i + 1 - p_i)`` (``residual_mass [B, K]``: column ``i - 1`` is ``R_i``, unused
    at ``i = k_b``), ``h_i = 1`` when the denominator is 0 (``p_i = 1`` and ``R_i = 0``: the
    limit of the formula at ``p_i = 1``), and ``h_{k_b} = p_{k_b}``. Columns ``>= k_b`` are not
    used.
    """
    p = weights[:, 1:]  # [B, K]: p_1 .. p_K
    denom = residual_mass + (1.0 - p)
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    h = torch.where(denom > 0, residual_mass / safe, 1.0)
    last = torch.arange(p.shape[1], device=p.device)[None, :] == (num_draft_tokens[:, None] - 1)
    return torch.where(last, p, h)


def block_stop(h: torch.Tensor, u: torch.Tensor, num_draft_tokens: torch.Tensor) -> torch.Tensor:
    """``tau = max{i <= k_b : u_{i-1} < h_i}``, 0 when no threshold fires (``[B]`` int64)."""
    k = h.shape[1]
    i = torch.arange(1, k + 1, device=h.device)[None, :]  # [1, K]
    fires = (u < h) & (i <= num_draft_tokens[:, None])
    return torch.where(fires, i, 0).amax(dim=1) if k > 0 else torch.zeros_like(num_draft_tokens)


def verify_block(
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
    """Block verification; the signature and return convention of
    :func:`.verify_sampling.verify_sampling`.

    ``target_logits [B, K+1, V]``, ``draft_tokens [B, K]``, ``draft_probs [B, K, V]`` or None
    (one-hot at the draft), ``num_draft_tokens [B]`` (``gamma = k_b`` per row), ``temperature
    [B]`` float32 (``0`` = greedy row), ``top_k [B]`` int64 or None, ``top_p [B]`` float32 or
    None, ``seeds [B]`` int64. Returns ``(tokens [B, K+1] int64, num_accepted [B] int64,
    num_emitted [B] int64)``.

    Algorithm (per row, notation of the module docstring; Algorithm 2 of Sun et al.):

    1. ``P_0 .. P_K`` = the filtered target distributions; ``Q_0 .. Q_{K-1}`` the draft's.
    2. ``p_0 = 1``; for ``i = 1 .. gamma``: ``p_i = min(1, p_{i-1} P_{i-1}(X_i) / Q_{i-1}(X_i))``,
       ``0`` if ``Q_{i-1}(X_i) = 0`` or ``P_{i-1}(X_i) = 0`` (:func:`block_weights`).
    3. ``h_i = R_i / (R_i + 1 - p_i)`` with ``R_i = sum_x max(0, p_i P_i(x) - Q_i(x))`` for
       ``i < gamma`` (``1`` when ``R_i + 1 - p_i = 0``), ``h_gamma = p_gamma``.
    4. ``eta_i`` = the accept uniform of position ``i - 1``,
       ``uniform(stream_key(row_key(seed), i - 1, PURPOSE_ACCEPT), 0)``: the very numbers of
       token verification. ``tau = max{i : eta_i < h_i}`` or 0; accept ``X_1 .. X_tau``.
    5. ``tau < gamma``: the recovered token ``argmax_x w(x) / E_x`` with
       ``w = max(0, p_tau P_tau - Q_tau)`` (``w = P_tau`` if it has no mass, as the token method
       falls back) and ``E_x`` the race's exponentials at position ``tau``
       (``PURPOSE_SAMPLE``, index ``x``). ``tau = gamma``: the bonus token, the same race over
       ``P_gamma``.

    One-hot drafts (``draft_probs=None``, ``Q_i`` one-hot at ``X_{i+1}``) use the closed forms
    ``R_i = p_i (1 - P_i(X_{i+1}))`` and ``w = max(0, P_tau - Q_tau)`` (``P_tau`` without
    ``X_{tau+1}``: the block residual divided by ``p_tau``, which the race's argmax ignores), so
    a kernel needs no pass over the vocabulary for ``R_i`` and its recovered token is the token
    method's formula at ``tau``.

    Corner cases (decided here; the kernels do the same):

    * ``Q_{i-1}(X_i) = 0`` (a draft not drawn from ``Q``) or ``P_{i-1}(X_i) = 0`` (``-inf``
      logit, filtered out, out-of-vocabulary id): ``p_i = 0``, so ``p_j = 0`` and ``h_j = 0`` for
      every ``j >= i``: ``X_i`` is never accepted, as section 1 promises for token verification.
      (vLLM's log-space ``min(log p + log P - log Q, 0)`` gives ``p_i = 1`` for ``Q = 0``.)
    * ``p_i = 1``: ``h_i = 1`` (``R_i / R_i``; ``1`` also for ``R_i = 0``, vLLM's convention).
    * The test is strict, ``eta_i < h_i`` (vLLM: ``<=``): with ``eta`` strictly inside (0, 1),
      ``h = 0`` never fires and ``h = 1`` always does.
    * A residual with no mass at the stop (only by rounding: in exact arithmetic ``h_tau = 0``
      there) falls back to ``P_tau``, as the token method does.
    * ``top_k = 1`` or a tiny ``top_p`` (point-mass targets): ``p_i`` is 1 while the drafts equal
      the argmax and 0 after, every ``h_i`` with ``p_i = 1`` is 1: the greedy prefix is
      accepted and the argmax emitted, as for token verification.

    Greedy rows (temperature 0) return exactly :func:`.verify_greedy.verify_greedy`'s answer.
    The expected ``tau`` is never below token verification's on the same inputs (Theorem 2 of
    the paper), and the emitted tokens follow the target exactly (Theorem 1).
    """
    b, k1, v = target_logits.shape
    k = k1 - 1
    device = target_logits.device
    nd = num_draft_tokens.to(torch.int64)
    # p: [B, K+1, V], P_0 .. P_K
    greedy_row, p = split_greedy_rows(target_logits, temperature, top_k, top_p, min_p)

    drafts = draft_tokens.to(torch.int64)
    in_vocab = (drafts >= 0) & (drafts < v)
    safe = drafts.clamp(0, v - 1)  # [B, K]
    if draft_probs is not None:
        q = draft_probs.float()  # [B, K, V]: Q_0 .. Q_{K-1}
    else:
        q = torch.zeros((b, k, v), dtype=torch.float32, device=device)
        q.scatter_(-1, safe[..., None], in_vocab[..., None].float())
    p_draft = p[:, :k].gather(-1, safe[..., None])[..., 0] * in_vocab  # [B, K]: P_{i-1}(X_i)
    q_draft = q.gather(-1, safe[..., None])[..., 0] * in_vocab  # [B, K]: Q_{i-1}(X_i)

    weights = block_weights(p_draft, q_draft)  # [B, K+1]: p_0 .. p_K
    # R_i for i = 1 .. K-1 (column i - 1); the last column (i = K) is never a non-final i.
    residual_mass = torch.zeros((b, k), dtype=torch.float32, device=device)
    if k > 1 and draft_probs is not None:
        residual_mass[:, :-1] = block_residual(weights[:, 1:k], p[:, 1:k], q[:, 1:]).sum(-1)
    elif k > 1:  # one-hot Q_i at X_{i+1}: R_i = p_i (1 - P_i(X_{i+1})), no pass over V
        residual_mass[:, :-1] = weights[:, 1:k] * (1.0 - p_draft[:, 1:])
    h = block_thresholds(weights, residual_mass, nd)  # [B, K]

    u = rng.accept_uniforms(seeds, k)  # [B, K]
    key = rng.row_key(seeds)  # [B]: the race's below
    num_accepted = block_stop(h, u, nd)  # [B]: tau

    # The recovered token (block residual at tau) or the bonus (P_gamma), by the same race.
    rows = torch.arange(b, device=device)
    p_extra = p[rows, num_accepted]  # [B, V]: P_tau
    rejected = num_accepted < nd
    if k > 0:
        q_extra = q[rows, num_accepted.clamp(max=k - 1)]  # [B, V]: Q_tau
        if draft_probs is not None:
            residual = stop_residual(weights[rows, num_accepted], p_extra, q_extra)
        else:  # one-hot: p_tau P_tau without X_{tau+1}; the race ignores the factor p_tau
            residual = (p_extra - q_extra).clamp(min=0)
    else:
        residual = torch.zeros_like(p_extra)
    exponential = rng.exponential(race_uniforms(key, num_accepted, v))  # [B, V], > 0
    residual_score = torch.where(residual > 0, residual / exponential, 0.0)
    plain_score = torch.where(p_extra > 0, p_extra / exponential, -1.0)
    residual_best, residual_token = residual_score.max(dim=-1)
    plain_token = plain_score.argmax(dim=-1)
    use_residual = rejected & (residual_best > 0)
    recovered_or_bonus = torch.where(use_residual, residual_token, plain_token)  # [B]

    padded = torch.cat([safe, recovered_or_bonus[:, None]], dim=1)  # [B, K+1]
    padded[rows, num_accepted] = recovered_or_bonus
    tokens = emitted_tokens(padded, num_accepted)

    # greedy rows (temperature 0): exactly verify_greedy's answer
    return with_greedy_rows(
        greedy_row, tokens, num_accepted, target_logits, draft_tokens, num_draft_tokens
    )
