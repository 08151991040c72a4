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

The verification kernels score what they emit in their own pass over the rows
(:mod:`specdec_kernels.ops.verify_sampling` with ``LP``) with the device functions here:
:func:`chunk_lp` (a verifier's chunk statistics, and from the same loads the raw statistics and
the running list), :func:`write_logprob` and :func:`write_top_list` (this kernel's outputs from
those statistics), :func:`merge_top_partial` (the split strategy's per-chunk lists merged) and
:func:`write_padding`; :func:`_chunk_top` and the list's merge are shared with this kernel.
"""

import torch
import triton
import triton.language as tl

from specdec_kernels.ops._common import (
    COMPILE,
    KEY_FLOOR,
    chunk_stats,
    edit_args,
    edit_logits,
    edit_row,
    float_key,
    gather,
    launch,
    launch_config,
    load_x,
    log_exponential,
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
        best = _merge_top(best, tl.where(listed, _rank_key(logit, idx), NO_KEY))
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


@triton.jit
def _merge_top(best, cand):
    """The running list ``best [NBLOCK]`` merged with the rank keys ``cand`` (``NO_KEY``: none):
    while the best candidate beats the list's worst entry, it replaces that entry."""
    top = tl.max(cand, axis=0)
    worst = tl.min(best, axis=0)
    while top > worst:
        best = tl.where(best == worst, top, best)
        cand = tl.where(cand == top, NO_KEY, cand)
        top = tl.max(cand, axis=0)
        worst = tl.min(best, axis=0)
    return best


@triton.jit
def empty_top(NTOP: tl.constexpr, NBLOCK: tl.constexpr):
    """An empty list: the distinct keys ``NO_KEY + 1 + s`` in its slots, ``FULL_KEY`` past ``n``."""
    slot = tl.arange(0, NBLOCK)
    return tl.where(slot < NTOP, NO_KEY + 1 + slot.to(tl.int64), FULL_KEY)


@triton.jit
def merge_top_partial(best, keys_ptr,  # [NTOP] int64: another list's keys (a chunk's)
                      NTOP: tl.constexpr, NBLOCK: tl.constexpr):  # fmt: skip
    """``best`` merged with a list another program wrote (its empty slots are skipped)."""
    slot = tl.arange(0, NBLOCK)
    keys = tl.load(keys_ptr + slot, mask=slot < NTOP, other=NO_KEY)
    return _merge_top(best, tl.where(keys > NO_KEY + NBLOCK, keys, NO_KEY))


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _lp_tile(row_ptr,  # [V] one logits row
             idx, V, temp,
             bits_row,  # [W] int32 token bitmask row (if HAS_MASK)
             HAS_MASK: tl.constexpr,
             edits,  # (ids [E], vals [E], csr [NG+1], NG): edit_row (if HAS_EDITS)
             HAS_EDITS: tl.constexpr, GATHER: tl.constexpr, pivot,
             cand,  # (count [1] int32, token ids [CAP] int32, x [CAP] float32) if GATHER
             CAP: tl.constexpr, RACE: tl.constexpr, stream, draft,
             m_vec, s_vec, i_vec, b_x, b_le, b_i, gap, RAW: tl.constexpr, rm_vec, rs_vec,
             NTOP: tl.constexpr, best):
    """One tile of :func:`chunk_lp`: one load of the logits, then the lanes' statistics of
    ``x`` (``_common.chunk_stats``'s arithmetic, with its gather, or ``_common._race_tile``'s
    race), the raw statistics of the logits (``RAW``) and the running top-``n`` list."""
    mask = idx < V
    raw = tl.load(row_ptr + idx, mask=mask, other=float("-inf")).to(tl.float32)
    logit = raw
    if HAS_EDITS:
        logit = edit_logits(raw, idx, mask, edits)
    x = logit / temp
    listed = logit > float("-inf")  # nonzero probability (NaN: never)
    if HAS_MASK:
        word = tl.load(bits_row + (idx >> 5), mask=mask, other=0)
        allowed = ((word >> (idx & 31)) & 1) != 0
        x = tl.where(allowed, x, float("-inf"))
        listed = listed & allowed
    if GATHER:
        gather(x, idx, mask, pivot, cand[0], cand[1], cand[2], CAP)
    i_vec = tl.where(x > m_vec, idx, i_vec)
    new_m = tl.maximum(m_vec, x)
    safe = tl.where(new_m == float("-inf"), 0.0, new_m)  # no (-inf) - (-inf)
    s_vec = s_vec * tl.exp(m_vec - safe) + tl.exp(x - safe)
    if RACE:
        le = log_exponential(stream, idx)
        live = (x > float("-inf")) & (idx != draft)
        margin = (tl.where(live, x, 0.0) - b_x) - (le - b_le)
        take = live & (margin > 0.0)
        gap = tl.where(take, margin, tl.where(live, tl.minimum(gap, -margin), gap))
        b_x = tl.where(take, x, b_x)
        b_le = tl.where(take, le, b_le)
        b_i = tl.where(take, idx, b_i)
    if RAW:  # log_softmax of the logits as given: x = logit / 1, no edits, no mask
        new_rm = tl.maximum(rm_vec, raw)
        rsafe = tl.where(new_rm == float("-inf"), 0.0, new_rm)
        rs_vec = rs_vec * tl.exp(rm_vec - rsafe) + tl.exp(raw - rsafe)
        rm_vec = new_rm
        logit = raw
        listed = raw > float("-inf")
    if NTOP > 0:
        best = _merge_top(best, tl.where(listed, _rank_key(logit, idx), NO_KEY))
    return new_m, s_vec, i_vec, b_x, b_le, b_i, gap, rm_vec, rs_vec, best
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def chunk_lp(row_ptr,  # [V] one logits row
             chunk_start, V, temp, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
             bits_row,  # [W] int32 token bitmask row (if HAS_MASK)
             HAS_MASK: tl.constexpr,
             edits,  # (ids [E], vals [E], csr [NG+1], NG): edit_row (if HAS_EDITS)
             HAS_EDITS: tl.constexpr, GATHER: tl.constexpr, pivot,
             cand,  # (count [1] int32, token ids [CAP] int32, x [CAP] float32) if GATHER
             CAP: tl.constexpr, RACE: tl.constexpr, stream, draft, UNROLL: tl.constexpr,
             RAW: tl.constexpr, NTOP: tl.constexpr, best):
    """What a verifier's statistics pass over one chunk computes (``_common.chunk_stats`` with
    its sum and optional gather, or with ``RACE`` ``_common.chunk_stats_race``: bit for bit
    their numbers) and, from the same loads, what the emitted positions' log-probabilities
    need: with ``RAW`` the max and sum of ``exp`` of the logits as given (``chunk_stats`` at
    ``T = 1`` without edits or mask: :func:`_emitted_logprobs_kernel`'s raw numbers) and the
    list ``best`` merged with the chunk's tokens (ranked by logit, edited and masked unless
    ``RAW``). Returns ``(max, sum, argmax, race best_x, best_index, gap, raw max, raw sum,
    best)``; the race's are ``-inf, 0, inf`` and the raw ones ``-inf, 0`` where off."""
    offs = tl.arange(0, BLOCK)
    m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
    s_vec = tl.zeros([BLOCK], tl.float32)
    i_vec = tl.zeros([BLOCK], tl.int32)
    b_x = tl.full([BLOCK], float("-inf"), tl.float32)  # the race's lanes (RACE)
    b_le = tl.zeros([BLOCK], tl.float32)
    b_i = tl.zeros([BLOCK], tl.int32)
    gap = tl.full([BLOCK], float("inf"), tl.float32)
    rm_vec = tl.full([BLOCK], float("-inf"), tl.float32)  # the raw lanes (RAW)
    rs_vec = tl.zeros([BLOCK], tl.float32)
    if UNROLL:
        for t in tl.static_range(0, CHUNK, BLOCK):
            m_vec, s_vec, i_vec, b_x, b_le, b_i, gap, rm_vec, rs_vec, best = _lp_tile(
                row_ptr, chunk_start + t + offs, V, temp, bits_row, HAS_MASK, edits, HAS_EDITS,
                GATHER, pivot, cand, CAP, RACE, stream, draft, m_vec, s_vec, i_vec, b_x, b_le,
                b_i, gap, RAW, rm_vec, rs_vec, NTOP, best,
            )
    else:  # the walking kernel: a tile's loads at a time keep its registers
        for t in range(0, CHUNK, BLOCK):
            m_vec, s_vec, i_vec, b_x, b_le, b_i, gap, rm_vec, rs_vec, best = _lp_tile(
                row_ptr, chunk_start + t + offs, V, temp, bits_row, HAS_MASK, edits, HAS_EDITS,
                GATHER, pivot, cand, CAP, RACE, stream, draft, m_vec, s_vec, i_vec, b_x, b_le,
                b_i, gap, RAW, rm_vec, rs_vec, NTOP, best,
            )
    m = tl.max(m_vec, axis=0)
    a = tl.min(tl.where(m_vec == m, i_vec, 2147483647), axis=0)
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(s_vec * tl.exp(m_vec - safe_m), axis=0)
    bx = tl.full([], float("-inf"), tl.float32)
    bi = tl.zeros([], tl.int32)
    g = tl.full([], float("inf"), tl.float32)
    if RACE:  # chunk_stats_race's reduction
        score = (b_x - safe_m) - b_le
        top = tl.max(score, axis=0)
        bi = tl.min(tl.where(score == top, b_i, 2147483647), axis=0)
        chosen = (score == top) & (b_i == bi)
        bx = tl.max(tl.where(chosen, b_x, float("-inf")), axis=0)
        g = tl.min(tl.where(chosen, gap, top - tl.where(chosen, 0.0, score)), axis=0)
    rm = tl.full([], float("-inf"), tl.float32)
    rs = tl.zeros([], tl.float32)
    if RAW:
        rm = tl.max(rm_vec, axis=0)
        safe_rm = tl.where(rm == float("-inf"), 0.0, rm)
        rs = tl.sum(rs_vec * tl.exp(rm_vec - safe_rm), axis=0)
    return m, s, a, bx, bi, g, rm, rs, best
# fmt: on


@triton.jit
def _normaliser(temp, m, z, kappa, rm, rs, RAW: tl.constexpr):
    """``(temperature, max, log Z, key threshold)`` that score a position: the processed
    distribution's, or with ``RAW`` the logits' own (``T = 1``, everything kept). A position
    with nothing allowed (max ``-inf``, ``Z = 0``) keeps the arithmetic finite."""
    if RAW:
        temp = tl.full([], 1.0, tl.float32)
        m = rm
        z = rs
        kappa = tl.full([], KEY_FLOOR, tl.int64)
    return temp, m, tl.log(tl.where(z > 0.0, z, 1.0)), kappa


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def write_logprob(row_ptr,  # [V] the logits row of one emitted position
                  bits_row,  # [W] its int32 token bitmask row (if HAS_MASK)
                  lp_ptr,  # [1] float32 out: log p of its token
                  tok, V, temp, m, z, kappa, rm, rs, RAW: tl.constexpr, HAS_MASK: tl.constexpr,
                  edits,  # (ids [E], vals [E], table [NG+1], NG) of its edits (if HAS_EDITS)
                  HAS_EDITS: tl.constexpr):
    """:func:`_emitted_logprobs_kernel`'s ``log p`` of token ``tok`` (``-inf`` outside
    ``[0, V)``) from the statistics its verifier kept: one logit load. ``m, z, kappa``: the
    processed distribution's max of ``x``, kept mass and key threshold; ``RAW``: the logits'
    own ``rm, rs``, at ``T = 1`` without filters, edits or mask. NaN where nothing is allowed,
    as ``log_softmax`` gives."""
    temp, m, log_z, kappa = _normaliser(temp, m, z, kappa, rm, rs, RAW)
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    in_vocab = (tok >= 0) & (tok < V)
    t = tl.minimum(tl.maximum(tok, 0), V - 1)
    if RAW:
        x = load_x(row_ptr + t, in_vocab, temp, False)
    else:
        x = load_x(row_ptr + t, in_vocab, temp, False, bits_row, t, HAS_MASK, edits, HAS_EDITS)
    kept = (x > float("-inf")) & (float_key(x) >= kappa)
    lp = tl.where(kept, (x - safe_m) - log_z, float("-inf"))
    nothing = in_vocab & (m == float("-inf"))
    tl.store(lp_ptr, tl.where(nothing, float("nan"), lp))
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def write_top_list(row_ptr,  # [V] the logits row of one emitted position
                   top_ptr, ids_ptr,  # [NTOP] float32 / int64 out: its top-n
                   temp, m, z, kappa, rm, rs, best, RAW: tl.constexpr, NTOP: tl.constexpr,
                   NBLOCK: tl.constexpr,
                   edits,  # (ids [E], vals [E], table [NG+1], NG) of its edits (if HAS_EDITS)
                   HAS_EDITS: tl.constexpr):
    """The list ``best`` (:func:`chunk_lp`) written as :func:`_write_top` writes it, from the
    statistics of :func:`write_logprob`: ``n`` logit loads."""
    temp, m, log_z, kappa = _normaliser(temp, m, z, kappa, rm, rs, RAW)
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    if RAW:
        _write_top(row_ptr, top_ptr, ids_ptr, best, temp, safe_m, log_z, kappa, NTOP, NBLOCK,
                   edits, False)
    else:
        _write_top(row_ptr, top_ptr, ids_ptr, best, temp, safe_m, log_z, kappa, NTOP, NBLOCK,
                   edits, HAS_EDITS)
# fmt: on


@triton.jit
def write_padding(lp_ptr, top_ptr, ids_ptr,  # [K+1] f32, [K+1, NTOP] f32 / int64: one row's
                  first, K, BLOCK_K: tl.constexpr, NTOP: tl.constexpr,
                  NBLOCK: tl.constexpr):  # fmt: skip
    """Positions ``first .. K`` of one row's outputs: ``-inf``, and ``-inf`` / ``-1`` lists."""
    p = tl.arange(0, BLOCK_K)
    pad = (p >= first) & (p < K + 1)
    tl.store(lp_ptr + p, tl.full([BLOCK_K], float("-inf"), tl.float32), mask=pad)
    if NTOP > 0:
        slot = tl.arange(0, NBLOCK)
        at = p[:, None] * NTOP + slot[None, :]
        out = pad[:, None] & (slot[None, :] < NTOP)
        tl.store(top_ptr + at, tl.full([BLOCK_K, NBLOCK], float("-inf"), tl.float32), mask=out)
        tl.store(ids_ptr + at, tl.full([BLOCK_K, NBLOCK], -1, tl.int64), mask=out)


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
