"""Reference accept-test count: the specification of ``specdec::accept_tests_passed``, the
accepted-token counter of the FlashInfer drop-in (:mod:`specdec_kernels.compat.flashinfer`)."""

from __future__ import annotations

import torch

from specdec_kernels.reference import rng


def accept_tests_passed(
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    seeds: torch.Tensor,
    after: torch.Tensor,
) -> torch.Tensor:
    """``[B]`` int64: how many positions ``i > after[b]`` pass their own accept test
    ``u_i * q_i(x_i) < p_i(x_i)`` with ``q_i(x_i) > 0`` and ``x_i`` in ``[0, V)``.

    ``draft_probs`` ``[B, n, V]`` (``q``) and ``target_probs`` ``[B, >= n, V]`` (``p``, as given:
    not renormalised), any float dtype, read at the draft tokens ``[B, n]`` only; ``u_i`` are the
    verification kernels' accept uniforms of ``seeds`` ``[B]`` (:func:`rng.accept_uniforms`);
    ``after`` ``[B]`` int64 (the accepted prefix: positions up to it are not counted)."""
    b, n, v = draft_probs.shape
    if n == 0:
        return torch.zeros(b, dtype=torch.int64, device=draft_probs.device)
    ids = draft_tokens.to(torch.int64)
    in_vocab = (ids >= 0) & (ids < v)
    safe = ids.clamp(0, v - 1)[..., None]  # [B, n, 1]
    p = target_probs[:, :n].gather(-1, safe)[..., 0].float()
    qx = draft_probs.gather(-1, safe)[..., 0].float()
    passed = (rng.accept_uniforms(seeds, n) * qx < p) & (qx > 0) & in_vocab
    later = torch.arange(n, device=draft_probs.device)[None, :] > after[:, None]
    return (passed & later).sum(dim=-1)
