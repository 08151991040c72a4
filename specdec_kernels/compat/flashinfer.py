"""Drop-in ``flashinfer.sampling.chain_speculative_sampling`` on this package's kernels.

Follows FlashInfer at commit ``fb28d724`` (``flashinfer/sampling.py`` and the CUDA kernel
``ChainSpeculativeSampling`` in ``include/flashinfer/sampling.cuh``, August 2026; the signature
is unchanged since v0.2). Switch over with one line::

    from specdec_kernels.compat.flashinfer import chain_speculative_sampling
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from specdec_kernels import _validate as check
from specdec_kernels._dispatch import check_backend, resolve_backend
from specdec_kernels.compat._common import as_int64_bits, mixed_seeds, require
from specdec_kernels.reference import rng
from specdec_kernels.verification import ChainCall

__all__ = ["chain_speculative_sampling"]

_SEED_DTYPES = (torch.int64, torch.uint64)


def chain_speculative_sampling(
    draft_probs: Tensor,
    draft_token_ids: Tensor,
    target_probs: Tensor,
    maybe_output_accepted_token_num: Tensor | None = None,
    maybe_output_emitted_draft_token_num: Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | Tensor | None = None,
    offset: int | Tensor | None = None,
    *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Chain speculative sampling with FlashInfer's signature, outputs and counters.

    Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling" (2023,
    https://arxiv.org/abs/2302.01318). Draft token ``x_i`` is accepted when ``u_i * q_i(x_i) <
    p_i(x_i)`` (``q`` = ``draft_probs``, ``p`` = ``target_probs``), in order; at the first
    rejection ``pos`` the token is drawn from ``norm(max(0, p_pos - q_pos))``; after ``n``
    acceptances the bonus token is drawn from ``p_n``. Runs on
    :func:`specdec_kernels.verify_sampling`'s kernels (Triton on CUDA, native C++ on CPU) through
    an entry point that takes probabilities: the kernels read ``target_probs`` in place and take
    ``x = log p`` as they load it (``softmax(log p) = p``), so no ``[B, n+1, V]`` tensor is
    made; ``draft_probs`` is read in place too.

    Upstream semantics kept: ``output_token_ids`` int32 `[B, n+1]`, the accepted draft tokens
    then the recovered or bonus token, then ``-1``; ``output_emitted_draft_token_num[b]`` = the
    accepted prefix length (the tokens actually used); ``output_accepted_token_num[b]`` counts every
    position whose accept test passes, also after the first rejection (it measures draft /
    target alignment, not tokens used); both counters are *added* to the given buffers in place
    (``+=``) and returned; fresh zero buffers are used when None. ``seed`` and ``offset`` are used
    only when both are given, otherwise the seeds come from ``generator`` (default: torch's
    default generator of the device), as upstream.

    Deliberate differences:

    * Seeds are honoured per row: with `[B]` ``seed`` / ``offset`` tensors row ``b`` depends only
      on ``(seed[b], offset[b])`` and its own inputs (batch invariance); upstream reads element 0
      of a tensor seed for every row. With ints or one-element tensors (``B > 1``) the rows
      mix in their index and so still draw different numbers, as upstream's per-row Philox
      subsequences do. The random numbers are
      this package's counter-based ones, so tokens differ from FlashInfer's for the same seed;
      the distribution is the same.
    * Draft ids outside ``[0, V)`` are never read (upstream reads out of bounds): such a draft is
      rejected, and its position does not count as accepted.
    * A draft token with ``q_i(x_i) = 0`` is never accepted (upstream accepts it whenever
      ``p_i(x_i) > 0``: ``u * 0 < p``); it cannot have been sampled from ``q``.
    * The accepted counter tests each position once, with that position's own uniform; upstream
      re-tests the first rejected position with a fresh uniform, which biases the counter up.
    * The kernels use ``target_probs`` rows renormalised (``p / sum(p)``; identical for rows
      that sum to 1), in float32 whatever the input dtype (float32, bfloat16, float16 accepted);
      the accepted counter's tests after the first rejection use ``p(x)`` as given.
    * When the residual ``max(0, p - q)`` has no mass the recovered token is drawn from ``p``
      (upstream returns its last valid index).
    * ``deterministic`` is accepted and ignored: the kernels are always deterministic.
    * Values are not validated (no host synchronisation, as upstream); bad values never cause
      out-of-bounds reads and never emit ids outside ``[0, V)``.

    Parameters
    ----------
    draft_probs : Tensor
        `[B, n, V]` float32/bfloat16/float16, last dim stride 1: the draft distributions.
    draft_token_ids : Tensor
        `[B, n]` int32/int64: the draft tokens.
    target_probs : Tensor
        `[B, n+1, V]` float (same dtype family), last dim stride 1: the target distributions.
    maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num : Tensor, optional
        `[B]` int32 (or int64) buffers accumulated into in place.
    deterministic : bool
        Ignored (always deterministic).
    generator : torch.Generator, optional
        Draws the per-row seeds when ``seed`` or ``offset`` is None.
    seed, offset : int or Tensor, optional
        Ints, or int64/uint64 tensors of shape `[1]` or `[B]`.
    backend : {None, "triton", "native", "reference"}
        Keyword-only, not in the upstream signature: the implementation of this package's
        verification kernels (as :func:`specdec_kernels.verify_sampling`'s ``backend``); ``None``
        (default): the automatic choice. A bad name raises ``ValueError`` before any work.

    Returns
    -------
    tuple of Tensor
        ``(output_token_ids [B, n+1] int32, output_accepted_token_num [B],
        output_emitted_draft_token_num [B])``.

    Raises
    ------
    TypeError, ValueError
        An argument has the wrong type, dtype, shape or device.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels.compat.flashinfer import chain_speculative_sampling
    >>> draft_probs = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
    >>> draft_token_ids = torch.tensor([[2, 1]], dtype=torch.int32)
    >>> target_probs = torch.tensor([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0],
    ...                               [0.7, 0.1, 0.1, 0.1]]])
    >>> out, accepted, emitted = chain_speculative_sampling(
    ...     draft_probs, draft_token_ids, target_probs, seed=42, offset=0)
    >>> out  # 2 accepted (p = 0.6 >= q = 0.3); 1 rejected (p = 0); 0 from max(0, p - q)
    tensor([[ 2,  0, -1]], dtype=torch.int32)
    >>> accepted.tolist(), emitted.tolist()
    ([1], [1])
    """
    check_backend(backend)
    q = require("draft_probs", draft_probs, 3, check.FLOAT_DTYPES)
    device = q.device
    b, n, v = q.shape
    require("draft_token_ids", draft_token_ids, 2, check.INT_DTYPES, device)
    require("target_probs", target_probs, 3, check.FLOAT_DTYPES, device)
    check.require_shape("draft_token_ids", draft_token_ids, (b, n), "[B, n] (from draft_probs)")
    check.require_shape("target_probs", target_probs, (b, n + 1, v), "[B, n+1, V]")
    for name, t in (("draft_probs", q), ("target_probs", target_probs)):
        if v > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must have stride 1 in its last dim, got {t.stride()}")
    counters = []
    for name, buf in (
        ("maybe_output_accepted_token_num", maybe_output_accepted_token_num),
        ("maybe_output_emitted_draft_token_num", maybe_output_emitted_draft_token_num),
    ):
        if buf is None:
            buf = torch.zeros(b, dtype=torch.int32, device=device)
        else:
            require(name, buf, 1, (torch.int32, torch.int64), device)
            check.require_shape(name, buf, (b,), "[B]")
        counters.append(buf)
    seeds = row_seeds(b, device, generator, seed, offset)
    drafts = draft_token_ids.contiguous()
    resolved = resolve_backend(backend, device)

    ver = ChainCall(
        target_probs,
        drafts,
        draft_probs=q,
        num_draft_tokens=torch.full((b,), n, dtype=torch.int64, device=device),
        temperature=torch.ones(b, dtype=torch.float32, device=device),
        seeds=seeds,
        mode="sampling",
        log_input=True,  # probability inputs: x = log p, read in place
        backend=resolved,
    ).run()
    tokens, emitted = ver.tokens, ver.num_accepted
    # the positions after the first rejection that pass their own accept test (one kernel:
    # specdec::accept_tests_passed, the reference's ~60 small ops were most of this call's time)
    accepted = emitted + torch.ops.specdec.accept_tests_passed(
        q, drafts, target_probs, seeds, emitted, resolved
    )
    counters[0] += accepted.to(counters[0].dtype)
    counters[1] += emitted.to(counters[1].dtype)
    return tokens.to(torch.int32), counters[0], counters[1]


def row_seeds(b: int, device, generator, seed, offset) -> Tensor:
    """``[B]`` int64 per-row seeds from FlashInfer's ``generator`` / ``seed`` / ``offset``."""
    if seed is None or offset is None:
        return rng.seeds_for_batch(b, device, None, generator)
    tensors = []
    per_row = False
    for name, value in (("seed", seed), ("offset", offset)):
        if isinstance(value, Tensor):
            check.require_dtype(name, value, _SEED_DTYPES)
            if value.dim() != 1 or value.shape[0] not in (1, b):
                raise ValueError(f"{name} must have shape [1] or [B] = [{b}], got {value.shape}")
            per_row |= value.shape[0] == b
            tensors.append(as_int64_bits(value).to(device).expand(b))
        elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
            as_int = int(value) & 0xFFFFFFFFFFFFFFFF
            as_int -= (as_int >> 63) << 64  # two's complement into int64
            tensors.append(torch.full((b,), as_int, dtype=torch.int64, device=device))
        else:
            raise TypeError(f"{name} must be an int or an int64 tensor, got {type(value).__name__}")
    rows = None if per_row else torch.arange(b, device=device)
    return mixed_seeds(tensors[0], tensors[1], rows)
