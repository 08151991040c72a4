"""Log-probabilities of the emitted tokens: the Triton kernel of
``torch.ops.specdec.emitted_logprobs`` and its launcher.

:mod:`specdec_kernels.reference.logprobs` is the specification (``"raw"``: ``log_softmax`` of the
logits; ``"processed"``: the log of the distribution verification samples from; top-``n`` most
likely first, ties by the lower id, only tokens with nonzero probability).

One launch, one program per emitted position ``(b, p)``: grid ``B * P``. A program reads its
scoring row ``target_logits[b, rows[b, p]]`` chunk by chunk, as the verification kernels do:

* the chunk statistics (max of ``x = logit / T``, sum of ``exp(x - max)``) are
  ``_common.chunk_stats`` merged in chunk order (``_common.merge_stats``), and a sampled row's
  top-k / top-p threshold ``kappa`` and kept mass ``Z`` are ``_common.thresholds``: bit for bit the
  numbers ``_common.position_stats`` gives the verifiers, so the kept set is the one they sample
  from. ``log p(x) = (x - max) - log Z`` where ``float_key(x) >= kappa``, ``-inf`` elsewhere;
* with ``num_logprobs = n`` the same chunk, still hot in cache, also feeds a running top-``n``
  (:func:`_chunk_top`): ``NBLOCK`` (the power of two ``>= n``) int64 *rank keys*
  (:func:`_rank_key`: the logit's order-preserving key above, ``2**31 - 1 - id`` below, so one
  ``max`` gives the most likely token with the lower id on ties). A chunk costs one ``max`` when
  nothing in it beats the list's worst entry, and two reductions per token that enters.
  The list ranks by logit: ``x = logit / T`` is monotone in the logit, so the kept set
  ``{float_key(x) >= kappa}`` is a prefix of that order and the list needs no threshold while it
  is built: its entries below ``kappa`` are written as ``-inf`` / ``-1`` at the end, after the
  kept ones (:func:`_write_top`).

A token the bitmask disallows is a ``-inf`` logit (``"processed"`` only; ``"raw"`` ignores the
mask); where it allows no finite logit the emitted token's log-probability is NaN, as
``log_softmax`` gives (``validate=True`` rejects such inputs before). The statistics and the
threshold search are ``_common``'s, reading the bitmask as the verification kernels do
(``HAS_MASK``), and so are min-p and the sparse logit edits (``HAS_MINP``, ``HAS_EDITS``: an edited
logit replaces the row's before the bitmask, the temperature, the filters and the top-n list).
Padding positions (``rows < 0`` or ``tokens < 0``) read nothing.
"""

import torch
import triton
import triton.language as tl

from specdec_kernels.ops._common import (
    COMPILE,
    KEY_FLOOR,
    chunk_stats,
    edit_args,
    edit_row,
    float_key,
    launch,
    launch_config,
    load_x,
    merge_stats,
    row_controls,
    row_filters,
    row_min_p,
    row_temperature,
    thresholds,
)

# Rank keys: every listed token's key is above NO_KEY + 2**32 (its logit is above -inf), so the
# empty slots' keys NO_KEY + 1 + s are distinct, below them and above the unlisted tokens' NO_KEY.
NO_KEY = tl.constexpr(-(2**63))
FULL_KEY = tl.constexpr(2**63 - 1)  # slots past n: never the worst entry, never replaced
TOP_ID = tl.constexpr(2**31 - 1)


# The verifiers' ``_common.COMPILE`` (no FMA contraction: the shared statistics round as theirs
# do). Under ptxas's own choice (80-96 registers at 4 warps) the filtered variants spill a few
# bytes; 128 registers remove every spill at sm_80 and sm_90 (tests/aot_compile.py
# --fail-on-spills).
LOGPROBS_COMPILE = {**COMPILE, "maxnreg": 128}


def compile_options(kernel) -> dict:
    """The compile options the kernel is launched with (for the AOT checks)."""
    return LOGPROBS_COMPILE


@triton.jit
def _allowed(word_ptr, idx, valid):  # word_ptr: [W] int32 bitmask row
    """Bit ``idx % 32`` of word ``idx // 32``: the bitmask allows token ``idx``."""
    word = tl.load(word_ptr + (idx >> 5), mask=valid, other=0)
    return ((word >> (idx & 31)) & 1) != 0


@triton.jit
def _rank_key(logit, idx):
    """int64 key ordered as ``(logit, -idx)``: larger means more likely, then lower id."""
    return (float_key(logit) << 32) | (TOP_ID - idx.to(tl.int64))


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _chunk_top(row_ptr,  # [V] one logits row
               word_ptr,  # [W] its bitmask row (if HAS_MASK)
               chunk_start, V, best, HAS_MASK: tl.constexpr, CHUNK: tl.constexpr,
               BLOCK: tl.constexpr,
               edits,  # (ids [E], vals [E], table [NG+1], NG) of its edits (if HAS_EDITS)
               HAS_EDITS: tl.constexpr):
    """The running list ``best [NBLOCK]`` of rank keys merged with one chunk's tokens: while
    the chunk's best token beats the list's worst entry, it replaces that entry."""
    offs = tl.arange(0, BLOCK)
    for t in range(0, CHUNK, BLOCK):
        idx = chunk_start + t + offs
        valid = idx < V
        logit = load_x(row_ptr + idx, valid, 1.0, False, None, idx, False, edits, HAS_EDITS)
        listed = logit > float("-inf")  # nonzero probability (NaN: never)
        if HAS_MASK:
            listed = listed & _allowed(word_ptr, idx, valid)
        cand = tl.where(listed, _rank_key(logit, idx), NO_KEY)
        top = tl.max(cand, axis=0)
        worst = tl.min(best, axis=0)
        while top > worst:
            best = tl.where(best == worst, top, best)
            cand = tl.where(cand == top, NO_KEY, cand)
            top = tl.max(cand, axis=0)
            worst = tl.min(best, axis=0)
    return best
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _write_top(row_ptr,  # [V] one logits row
               top_ptr, ids_ptr,  # [n] this position's outputs
               best, temp, m, log_z, kappa, NTOP: tl.constexpr, NBLOCK: tl.constexpr,
               edits,  # (ids [E], vals [E], table [NG+1], NG) of its edits (if HAS_EDITS)
               HAS_EDITS: tl.constexpr):
    """The list in rank order: ``log p`` and id of its kept entries, then ``-inf`` / ``-1``."""
    slot = tl.arange(0, NBLOCK)
    real = slot < NTOP
    listed = real & (best > NO_KEY + NBLOCK)  # not an empty slot
    token = tl.where(listed, TOP_ID - (best & 0xFFFFFFFF), 0)
    # as the verifiers compute it
    x = load_x(row_ptr + token, listed, temp, False, None, token, False, edits, HAS_EDITS)
    kept = listed & (x > float("-inf")) & (float_key(x) >= kappa)
    above = (best[None, :] > best[:, None]) & real[None, :]  # [NBLOCK, NBLOCK]
    rank = tl.sum(above.to(tl.int32), axis=1)  # 0 .. n-1 over the real slots: distinct keys
    tl.store(top_ptr + rank, tl.where(kept, (x - m) - log_z, float("-inf")), mask=real)
    tl.store(ids_ptr + rank, tl.where(kept, token, -1), mask=real)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _emitted_logprobs_kernel(
    logits_ptr, stride_lb, stride_ln,  # [B, N, V] target logits, vocab stride 1
    rows_ptr, tokens_ptr,  # [B, P] int64: the row scoring position p (< 0: padding), its token
    mask_ptr, stride_mb, stride_mn,  # [B, N, W] int32 token bitmask, word stride 1 (if HAS_MASK)
    temp_ptr, topk_ptr, topp_ptr,  # [B] temperature, top_k, top_p (used as flagged)
    lp_ptr,  # [B, P] float32 out: log p of the emitted token
    top_ptr, ids_ptr,  # [B, P, NTOP] float32 / int64 out: the top-n log p and ids
    minp_ptr,  # [B] float32 min_p (if HAS_MINP)
    eids_ptr, evals_ptr, etab_ptr,  # [B, E] int32, [B, P, E] f32, [B, NG+1] int32 (HAS_EDITS)
    P, N, V, NCHUNK, E, NG,
    GREEDY_ONLY: tl.constexpr, HAS_MASK: tl.constexpr, HAS_TOPK: tl.constexpr,
    HAS_TOPP: tl.constexpr, NTOP: tl.constexpr, NBLOCK: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK: tl.constexpr, TBLOCK: tl.constexpr, NPIV: tl.constexpr, HAS_MINP: tl.constexpr,
    HAS_EDITS: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // P
    r = tl.load(rows_ptr + pid)
    tok = tl.load(tokens_ptr + pid)
    live = (r >= 0) & (tok >= 0)
    r = tl.minimum(tl.maximum(r, 0), N - 1)  # as the reference clamps it
    row_ptr = logits_ptr + b * stride_lb + r * stride_ln
    word_ptr = mask_ptr + b * stride_mb + r * stride_mn
    nchunk = tl.where(live, NCHUNK, 0)  # padding reads nothing
    temp, greedy = row_temperature(temp_ptr, b, GREEDY_ONLY)
    top_k, top_p = row_filters(topk_ptr, topp_ptr, b, HAS_TOPK, HAS_TOPP)
    min_p = row_min_p(minp_ptr, b, HAS_MINP)
    edits = edit_row(eids_ptr, evals_ptr, etab_ptr, b, pid, E, NG)  # edit_vals[b, p]

    big_m = tl.full([], float("-inf"), tl.float32)
    big_s = tl.zeros([], tl.float32)
    big_a = tl.zeros([], tl.int32)  # the verifiers' argmax: unused here
    slot = tl.arange(0, NBLOCK)
    best = tl.where(slot < NTOP, NO_KEY + 1 + slot.to(tl.int64), FULL_KEY)  # empty list
    for c in range(0, nchunk):
        m, s, a = chunk_stats(row_ptr, c * CHUNK, V, temp, True, CHUNK, BLOCK, False, word_ptr,
                              HAS_MASK, edits=edits, HAS_EDITS=HAS_EDITS)
        big_m, big_s, big_a = merge_stats(big_m, big_s, big_a, m, s, a)
        if NTOP > 0:
            best = _chunk_top(row_ptr, word_ptr, c * CHUNK, V, best, HAS_MASK, CHUNK, BLOCK,
                              edits, HAS_EDITS)

    kappa = tl.full([], KEY_FLOOR, tl.int64)
    z = big_s
    if not GREEDY_ONLY:
        if live & (greedy == 0):
            kappa, z = thresholds(
                row_ptr, V, temp, big_m, big_s, top_k, top_p, HAS_TOPK, HAS_TOPP, NPIV, CHUNK,
                TBLOCK, NCHUNK, False, word_ptr, HAS_MASK, min_p, HAS_MINP, edits, HAS_EDITS,
            )
    # Rows with nothing allowed (and padding) have max -inf and z = 0: nothing is kept there,
    # and these keep the unused arithmetic finite.
    safe_m = tl.where(big_m == float("-inf"), 0.0, big_m)
    log_z = tl.log(tl.where(z > 0.0, z, 1.0))

    in_vocab = live & (tok < V)
    t = tl.minimum(tok, V - 1)
    x = load_x(row_ptr + t, in_vocab, temp, False, word_ptr, t, HAS_MASK, edits, HAS_EDITS)
    kept = (x > float("-inf")) & (float_key(x) >= kappa)
    lp = tl.where(kept, (x - safe_m) - log_z, float("-inf"))
    nothing = in_vocab & (big_m == float("-inf"))  # no finite logit allowed: NaN, as log_softmax
    tl.store(lp_ptr + pid, tl.where(nothing, float("nan"), lp))
    if NTOP > 0:
        _write_top(row_ptr, top_ptr + pid * NTOP, ids_ptr + pid * NTOP, best, temp, safe_m, log_z,
                   kappa, NTOP, NBLOCK, edits, HAS_EDITS)
# fmt: on


def emitted_logprobs(
    target_logits: torch.Tensor,
    rows: torch.Tensor,
    tokens: torch.Tensor,
    token_bitmask: torch.Tensor | None,
    temperature: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    processed: bool,
    num_logprobs: int,
    min_p: torch.Tensor | None = None,
    edit_ids: torch.Tensor | None = None,
    edit_vals: torch.Tensor | None = None,
):
    """The Triton kernel of ``torch.ops.specdec.emitted_logprobs`` (same arguments, less
    ``backend``; see :mod:`specdec_kernels.logprobs`).

    Parameters
    ----------
    target_logits : Tensor
        `[B, N, V]` float32 / bfloat16 / float16, any strides with the last 1 (a flat `[R, V]`
        arrives as the view ``expand(B, R, V)``).
    rows, tokens : Tensor
        `[B, P]` int64: the row of ``target_logits[b]`` scoring emitted position ``p`` and its
        token (either ``< 0``: padding).
    token_bitmask : Tensor or None
        `[B, N, W]` int32 (``W = ceil(V / 32)``, word stride 1), read in ``processed`` mode only.
    temperature : Tensor or None
        `[B]` float32, ``0`` a greedy row; None: every row greedy.
    top_k, top_p : Tensor or None
        `[B]` int64 / float32 (``0`` / ``1``: off).
    processed : bool
        The distribution verification samples from; else ``log_softmax`` of the logits.
    num_logprobs : int
        ``n`` in ``[0, 20]``.
    min_p : Tensor or None
        `[B]` float32 (``0``: off), ``processed`` sampling rows only: after top-k / top-p keep
        the tokens with ``exp(x - max x) >= min_p``.
    edit_ids, edit_vals : Tensor or None
        `[B, E]` int32 (sorted, unique, padded with ``V``) and `[B, P, E]` float32, both or
        neither, ``processed`` only: the logit of token ``edit_ids[b, e]`` in the row scoring
        position ``p`` is ``edit_vals[b, p, e]``, before the bitmask, the temperature and the
        filters (API.md section 10).

    Returns
    -------
    tuple of Tensor
        ``(logprobs [B, P] float32, top_logprobs [B, P, n] float32, top_ids [B, P, n] int64)``.

    Examples
    --------
    >>> logits = torch.tensor([[[0.0, 0.0, 2.0]]])
    >>> lp, top, ids = emitted_logprobs(logits, torch.tensor([[0]]), torch.tensor([[2]]),
    ...                                 None, None, None, None, False, 2)
    >>> round(float(lp), 4), ids.tolist()
    (-0.2395, [[[2, 0]]])
    """
    b, n_rows, v = target_logits.shape
    p = tokens.shape[1]
    n = int(num_logprobs)
    device = target_logits.device
    logprobs = torch.empty((b, p), dtype=torch.float32, device=device)
    top = torch.empty((b, p, n), dtype=torch.float32, device=device)
    ids = torch.empty((b, p, n), dtype=torch.int64, device=device)
    if b * p == 0:
        return logprobs, top, ids
    if target_logits.stride(-1) != 1:
        target_logits = target_logits.contiguous()
    rows, tokens = rows.contiguous(), tokens.contiguous()
    mask = token_bitmask if processed else None
    if mask is not None and mask.stride(-1) != 1:
        mask = mask.contiguous()
    words, stride_mb, stride_mn = (
        (mask, mask.stride(0), mask.stride(1)) if mask is not None else (tokens, 0, 0)
    )
    greedy_only = not processed or temperature is None
    c = row_controls(tokens, temperature, top_k, top_p, None, greedy_only=greedy_only, min_p=min_p)
    e = edit_args(edit_ids if processed else None, edit_vals, v, tokens)
    cfg = launch_config(v)
    launch(
        _emitted_logprobs_kernel,
        (b * p,),
        target_logits,
        target_logits.stride(0),
        target_logits.stride(1),
        rows,
        tokens,
        words,
        stride_mb,
        stride_mn,
        c.temperature,
        c.top_k,
        c.top_p,
        logprobs,
        top,
        ids,
        c.min_p,
        e.ids,
        e.vals,
        e.table,
        p,
        n_rows,
        v,
        cfg["NCHUNK"],
        e.num_edits,
        e.num_granules,
        GREEDY_ONLY=greedy_only,
        HAS_MASK=mask is not None,
        HAS_TOPK=c.has_top_k,
        HAS_TOPP=c.has_top_p,
        NTOP=n,
        NBLOCK=triton.next_power_of_2(max(n, 1)),
        CHUNK=cfg["CHUNK"],
        BLOCK=cfg["BLOCK"],
        TBLOCK=cfg["TBLOCK"],
        NPIV=cfg["NPIV"],
        HAS_MINP=c.has_min_p,
        HAS_EDITS=e.has_edits,
        **LOGPROBS_COMPILE,
    )
    return logprobs, top, ids
