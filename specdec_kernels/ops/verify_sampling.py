"""Fused verification kernels (sampling and greedy) and their launcher.

One kernel family serves both :func:`specdec_kernels.verify_sampling` and, with ``GREEDY_ONLY``,
:func:`specdec_kernels.verify_greedy`. Logits are read in chunks of ``CHUNK`` tokens; per chunk
the max of ``x = logit / T``, the sum of ``exp(x - max)`` and the first argmax are computed by one
helper and merged in chunk order. Two launch strategies use that helper:

``row``   grid ``(B,)``: a program walks its row's positions in order and stops at the first
          rejection, so logits rows after it are never read. Best when B fills the GPU.
``split`` grid ``(B * (K+1), NCHUNK)``: every position's vocabulary is split across programs
          for the statistics and the resampling race; with top-k/top-p a ``(B * (K+1),)``
          launch before them estimates each position's gather cutoff and one after them
          selects its thresholds; a small ``(B,)`` kernel makes the decisions from the partials.
          Best for small batches. At most 5 launches.

Both merge the same partial values in the same order, so their results are identical. Nothing is
materialised beyond ``[B, K+1, NCHUNK]`` partials (and, with a filter, ``CAP`` candidates per
position); the only large cost is reading logits (and the draft probabilities of the rejected
position).

Top-k / top-p in one pass over the row (``_common``: :func:`sample_pivot`, :func:`gather`,
:func:`select_filter`, :func:`buffer_race`). A sample of the row (at most 1/16 of it) gives a
cutoff key aimed at ``CAP / 4`` tokens; the statistics pass appends every finite token at or above
it to the position's candidate buffer while the tiles are in registers; the thresholds are then
searched over the buffer in registers (exact integer masses: the atomic gather leaves the buffer
in any order), and the race runs over the buffer, so the row is not read again. The answer is the
reference's whenever the kept set lies in the buffer, which :func:`select_filter` checks (top-k:
``k`` candidates; top-p: survivors whose mass reaches ``top_p * Z_k``; no overflow); elsewhere the
position falls back to the pivot search over the row (``_common.thresholds``, 9 passes per filter)
and the race over the row. Both strategies take the same decision from the same buffer contents.

Acceptance rules (``METHOD``): the token rule below, or block verification (Sun et al. 2024;
:mod:`specdec_kernels.reference.verify_block` is the specification): the walk keeps the weight
``p_j`` from one position to the next, does not stop at a failed test (the stop ``tau`` is the
last position whose test ``eta_j < h_j`` passes; the walk ends at ``k_b`` or when the weight is 0),
and the recovered token is raced from ``max(0, p_tau P - Q)``. With draft probabilities the
residual mass ``R_j`` is one more pass over the row (row strategy) or a per-chunk partial of the
race kernel (split); one-hot drafts use the closed forms. A token bitmask (``HAS_MASK``, int32 rows
laid out like the logits') makes a disallowed token a ``-inf`` logit wherever a logit is read
(``_common.load_x``). Neither changes the launches.

Sparse logit edits and min-p (API.md section 10). With ``HAS_EDITS`` the same ``load_x`` reads an
edited token's logit from ``edit_vals [B, K+1, E]`` instead of the row (then the bitmask and the
temperature apply): a tile finds its edits from a ``[B, ceil(V / 32) + 1]`` granule table of the
sorted ``edit_ids`` that the launcher builds with ``torch.searchsorted``
(``_common.edit_logits``: a tile without edits costs two reductions and two cached scalar
loads), so no ``[B, K+1, V]`` copy is made. Min-p (``HAS_MINP``) is one more key threshold after
top-k / top-p (``_common.min_p_key``), a filter like them for the launches (no fused race; the
candidate buffer answers where it reaches down to min-p's key).

A reduced draft vocabulary (``HAS_DRAFT_MAP``, EAGLE-3's ``draft_vocab_map``): the draft rows are
``V_draft`` wide and every read of ``q`` (the accept test, block verification's weights and
residual mass, the residual race over the row or the candidate buffer) goes through the
launcher's ``[V]`` int32 inverse index (``_common.mapped_q``: one int32 gather a token, then a
gather of ``q``); no ``[B, K, V]`` scatter is made, and the launches do not change.

Log-probabilities of the emitted tokens in the same pass (``LP``, issue 52; ``logprobs`` of
:func:`verify`, the Triton kernel of ``specdec::verify_chain_logprobs``): the statistics pass
over each position's row runs ``logprobs.chunk_lp`` instead of its chunk helper, which loads each
tile once and computes the verifier's own numbers bit for bit (max, sum, argmax; the gather or
the fused race) and beside them, for the logprobs, the raw max and sum of ``exp`` of the logits
as given (``RAW``: ``"raw"`` mode; ``"processed"`` scores from the verifier's max, kept mass
and threshold, which greedy rows have at ``T = 1`` with their mask and edits) and a running
top-``n`` list of rank keys (``logprobs._rank_key``). The row strategy scores position ``j``
while it walks (the draft's ``log p`` and the list, from the statistics in registers), then the
stop's recovered or bonus token from the stop's statistics and pads the positions past it. In
the split strategy each statistics program writes its chunk's raw partials and top-``n`` keys
(``[B*(K+1), NCHUNK, n]``), and the decide kernel, once it knows the stop, merges them for
positions ``0 .. n_acc`` (raw statistics in chunk order; lists by rank key) and scores the
tokens (:func:`_score_emitted`). No row is read again: one logit load per emitted token and
listed entry. Without ``LP`` the kernels compile as before (its code is behind constexprs).

Vocabulary: a row's draft tokens are *accepted* in order until the first rejection; the token
emitted after them is the *recovered* token (sampled from the residual ``max(0, p - q)``) at a
rejected draft, or the *bonus* token (sampled from ``p``) when every draft was accepted; the
*emitted* tokens are the accepted ones and that one.

Stages. Host: :func:`verify` reads the input forms into :class:`_Args` (the rows' layout and
strides :func:`_rows`, the ``[B]`` controls ``_common.row_controls``, the tile sizes
``_common.launch_config``), allocates the outputs and launches one strategy
(:func:`_launch_row`, or :func:`_launch_split` with one function per kernel). Device, per
position: its rows (:func:`_row`), its statistics and filter threshold
(``_common.position_stats`` in the row kernel, :func:`_merged_stats` and :func:`_filter_state`
from the split partials), the step :func:`_decide` shared by both strategies (the token rule
:func:`_accepts`, or block verification's :func:`_block_fires` and :func:`_next_weight`), after
the walk the race :func:`_recovered_or_bonus` at the stop position (one-hot drafts without a
filter: :func:`_fused_race`, from the race the statistics pass ran), and the row's output
(:func:`_write_row`). Every logit is read through ``_common.load_x``.
"""

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from specdec_kernels.ops._common import (
    COMPILE,
    KEY_CEIL,
    KEY_FLOOR,
    PURPOSE_ACCEPT,
    PURPOSE_SAMPLE,
    WALK_COMPILE,
    EditArgs,
    RowControls,
    accept_draft,
    buffer_race,
    chunk_race,
    chunk_residual_mass,
    chunk_stats,
    chunk_stats_race,
    draft_prob,
    edit_args,
    edit_row,
    filter_active,
    launch,
    launch_config,
    merge_best,
    merge_race,
    merge_stats,
    position_filter_stats,
    position_stats,
    position_stats_race,
    race_choice,
    row_controls,
    row_count,
    row_filters,
    row_key,
    row_min_p,
    row_sampling,
    row_temperature,
    sample_pivot,
    select_filter,
    stream_key,
    thresholds,
    uniform_first,
)
from specdec_kernels.ops.logprobs import (
    chunk_lp,
    empty_top,
    merge_top_partial,
    write_logprob,
    write_padding,
    write_top_list,
)

#: The acceptance rules of the chain kernels (``METHOD``): token by token, or block verification.
METHOD_TOKEN = tl.constexpr(0)
METHOD_BLOCK = tl.constexpr(1)
METHODS = {"token": 0, "block": 1}


# The split strategy's threshold and decide kernels: under ptxas's default budget some masked
# variants spill a few bytes (at 64 and 32 registers); a 128-register cap removes every spill at
# sm_80 and sm_90 (tests/aot_compile.py --fail-on-spills).
SPLIT_COMPILE = {**COMPILE, "maxnreg": 128}
# The threshold kernel selects over a position's candidate buffer ([CAP] keys and masses in
# registers) besides the search: 128 registers spilled 8-48 bytes; one program a position, so
# occupancy is not what bounds it. The race kernel with the buffer's race beside the row's
# spilled 12-44 bytes at ptxas's own choice of 168 registers in its richest variants.
THRESHOLD_COMPILE = {**COMPILE, "maxnreg": 240}


def compile_options(kernel) -> dict:
    """The compile options a kernel of this module is launched with (for the AOT checks)."""
    if kernel is _verify_row_kernel:
        return WALK_COMPILE
    if kernel in (_split_threshold_kernel, _split_race_kernel):
        return THRESHOLD_COMPILE
    split = (_split_pivot_kernel, _split_decide_kernel)
    return SPLIT_COMPILE if kernel in split else COMPILE


@triton.jit
def _row(ptr, start_ptr, b, j, stride_b, stride_k, nrows, FLAT: tl.constexpr):
    """Pointer to the ``[V]`` row of position ``j`` of batch row ``b``: ``ptr + b * stride_b +
    j * stride_k`` (padded ``[B, *, V]``), or with ``FLAT`` row ``clamp(start[b] + j, 0,
    nrows - 1)`` of a flattened ``[nrows, V]`` tensor (bad offsets stay in bounds)."""
    if FLAT:
        r = tl.load(start_ptr + b).to(tl.int64) + j
        r = tl.minimum(tl.maximum(r, 0), nrows - 1)
        return ptr + r * stride_k
    return ptr + b * stride_b + j * stride_k


@triton.jit
def _draft(draft_ptr, stride_db, b, j, kb):  # draft_ptr: [B, K]
    """Draft token of position ``j`` of row ``b``, int32; -1 at the bonus position ``j == k_b``."""
    return tl.load(draft_ptr + b * stride_db + j, mask=j < kb, other=-1).to(tl.int32)


@triton.jit
def _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, base, NCHUNK):  # [B*(K+1), NCHUNK]
    """(max, sum of exp, first argmax) of one position from its chunk partials, in chunk order."""
    big_m = tl.full([], float("-inf"), tl.float32)
    big_s = tl.zeros([], tl.float32)
    big_a = tl.zeros([], tl.int32)
    for c in range(0, NCHUNK):
        big_m, big_s, big_a = merge_stats(
            big_m,
            big_s,
            big_a,
            tl.load(part_m_ptr + base + c),
            tl.load(part_s_ptr + base + c),
            tl.load(part_a_ptr + base + c),
        )
    return big_m, big_s, big_a


@triton.jit
def _filter_state(kappa_ptr, z_ptr, pos, big_s, HAS_FILTER: tl.constexpr):  # [B*(K+1)] each
    """(key threshold, kept mass) of position ``pos``: the threshold kernel's, or without a
    filter "keep everything" and ``Z = sum of exp``."""
    kappa = tl.full([], KEY_FLOOR, tl.int64)
    z = big_s
    if HAS_FILTER:
        kappa = tl.load(kappa_ptr + pos)
        z = tl.load(z_ptr + pos)
    return kappa, z


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _accepts(row_ptr,  # [V] logits row of position j
             q_row,  # [V] its draft probabilities (if HAS_Q)
             bits_row,  # [W] its token bitmask row (if HAS_MASK)
             draft, j, kb, V, temp, greedy, key, m, a, z, kappa,
             GREEDY_ONLY: tl.constexpr, HAS_Q: tl.constexpr, LOG_X: tl.constexpr,
             HAS_MASK: tl.constexpr,
             edits,  # (ids [E], vals [E], table [NG+1], NG) of its edits (if HAS_EDITS)
             HAS_EDITS: tl.constexpr,
             inv_ptr,  # [V] int32 draft_probs column of each target id (if HAS_DRAFT_MAP)
             HAS_DRAFT_MAP: tl.constexpr):
    """The token rule: is the draft at position ``j < k_b`` accepted? A greedy row accepts
    the argmax ``a``; a sampling row accepts when ``u * q(x) < p(x)`` (``_common.accept_draft``).
    The bonus position ``j == k_b`` never accepts."""
    accepted = draft == a
    if not GREEDY_ONLY:
        if (greedy == 0) & (j < kb):
            accepted = accept_draft(
                row_ptr, q_row, draft, V, temp, m, z, kappa, key, j, HAS_Q, LOG_X, bits_row,
                HAS_MASK, edits, HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
            )
    return accepted & (j < kb)
# fmt: on


@triton.jit
def _next_weight(weight, p_x, q_x, in_vocab):
    """Block verification's weight of the next position, ``min(weight * p(x), q(x)) / q(x)``:
    ``min(1, weight * p / q)`` without the ratio, 0 when ``q(x) = 0`` or ``x`` is outside the
    vocabulary (the reference's ``block_weights``)."""
    p_x = tl.where(in_vocab, p_x, 0.0)
    q_x = tl.where(in_vocab, q_x, 0.0)
    safe_q = tl.where(q_x > 0.0, q_x, 1.0)
    return tl.where(q_x > 0.0, tl.minimum(weight * p_x, q_x) / safe_q, 0.0)


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _residual_mass(row_ptr,  # [V] logits row of position j (unless PARTIALS)
                   q_row,  # [V] its draft probabilities (unless PARTIALS)
                   bits_row,  # [W] its token bitmask row (if HAS_MASK, unless PARTIALS)
                   mass_ptr,  # [B*(K+1), NCHUNK] residual mass partials (PARTIALS)
                   V, temp, m, z, kappa, weight, pos, NCHUNK, PARTIALS: tl.constexpr,
                   CHUNK: tl.constexpr, BLOCK: tl.constexpr, LOG_X: tl.constexpr,
                   HAS_MASK: tl.constexpr,
                   edits,  # (ids [E], vals [E], table [NG+1], NG) of its edits (if HAS_EDITS)
                   HAS_EDITS: tl.constexpr,
                   inv_ptr,  # [V] int32 draft_probs columns (if HAS_DRAFT_MAP, unless PARTIALS)
                   HAS_DRAFT_MAP: tl.constexpr):
    """Block verification's ``R_j = sum max(0, weight * p - q)`` of one position with draft
    probabilities: chunk by chunk over the row, or with ``PARTIALS`` the split race kernel's
    chunk values of position ``pos``; added in chunk order either way."""
    total = tl.zeros([], tl.float32)
    for c in range(0, NCHUNK):
        if PARTIALS:
            total += tl.load(mass_ptr + pos * NCHUNK + c)
        else:
            total += chunk_residual_mass(
                row_ptr, q_row, c * CHUNK, V, temp, m, z, kappa, weight, V, CHUNK, BLOCK, LOG_X,
                bits_row, HAS_MASK, edits, HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
            )
    return total
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _block_fires(row_ptr,  # [V] logits row of position j (unless PARTIALS)
                 q_row,  # [V] its draft probabilities (if HAS_Q, unless PARTIALS)
                 bits_row,  # [W] its token bitmask row (if HAS_MASK, unless PARTIALS)
                 mass_ptr,  # [B*(K+1), NCHUNK] residual mass partials (HAS_Q and PARTIALS)
                 j, kb, V, temp, key, m, z, kappa, weight, p_next, pos, NCHUNK,
                 HAS_Q: tl.constexpr, PARTIALS: tl.constexpr, CHUNK: tl.constexpr,
                 BLOCK: tl.constexpr, LOG_X: tl.constexpr, HAS_MASK: tl.constexpr,
                 edits,  # (ids [E], vals [E], table [NG+1], NG) of its edits (if HAS_EDITS)
                 HAS_EDITS: tl.constexpr,
                 inv_ptr,  # [V] int32 draft_probs columns (if HAS_DRAFT_MAP, unless PARTIALS)
                 HAS_DRAFT_MAP: tl.constexpr):
    """Block verification's test of the stop ``tau = j`` (``1 <= j <= k_b``, ``weight = p_j``):
    ``eta_j < h_j`` with ``eta_j`` the accept uniform of position ``j - 1`` and ``h_j =
    R_j / (R_j + 1 - p_j)`` (``1`` when that denominator is 0), ``h_{k_b} = p_{k_b}``. ``R_j``
    is :func:`_residual_mass` with draft probabilities and ``p_j (1 - p(X_{j+1}))`` for one-hot
    drafts (``p_next`` = ``p(X_{j+1})``, 0 outside the vocabulary)."""
    r = weight * (1.0 - p_next)
    if HAS_Q:
        r = tl.zeros([], tl.float32)
        if j < kb:
            r = _residual_mass(
                row_ptr, q_row, bits_row, mass_ptr, V, temp, m, z, kappa, weight, pos, NCHUNK,
                PARTIALS, CHUNK, BLOCK, LOG_X, HAS_MASK, edits, HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
            )
    denom = r + (1.0 - weight)
    safe = tl.where(denom > 0.0, denom, 1.0)
    h = tl.where(denom > 0.0, r / safe, 1.0)
    h = tl.where(j == kb, weight, h)
    eta = uniform_first(stream_key(key, j - 1, PURPOSE_ACCEPT))
    return eta < h
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _decide(row_ptr,  # [V] logits row of position j
            q_row,  # [V] its draft probabilities (if HAS_Q)
            bits_row,  # [W] its token bitmask row (if HAS_MASK)
            mass_ptr,  # [B*(K+1), NCHUNK] block residual mass partials (PARTIALS)
            draft, j, kb, V, temp, greedy, key, m, a, z, kappa, weight, pos, NCHUNK,
            GREEDY_ONLY: tl.constexpr, HAS_Q: tl.constexpr, PARTIALS: tl.constexpr,
            METHOD: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
            LOG_X: tl.constexpr, HAS_MASK: tl.constexpr,
            edits,  # (ids [E], vals [E], table [NG+1], NG) of its edits (if HAS_EDITS)
            HAS_EDITS: tl.constexpr,
            inv_ptr,  # [V] int32 draft_probs column of each target id (if HAS_DRAFT_MAP)
            HAS_DRAFT_MAP: tl.constexpr):
    """One position of a row's walk: ``(is j the stop so far, does the walk go on, the weight
    of position j + 1)``. Token rule (and greedy rows): ``j`` is the stop when its draft is
    rejected (:func:`_accepts`), and the walk ends there. Block verification (sampling rows):
    ``j`` is the stop so far when ``j = 0`` or its test fires (:func:`_block_fires`); the walk
    goes on to ``k_b`` unless the weight falls to 0 (no later test can fire then). Both
    strategies decide here; they differ only in where ``R_j`` comes from (``PARTIALS``)."""
    accepted = (draft == a) & (j < kb)  # greedy rows, whatever the method
    if METHOD == METHOD_TOKEN:
        accepted = _accepts(
            row_ptr, q_row, bits_row, draft, j, kb, V, temp, greedy, key, m, a, z, kappa,
            GREEDY_ONLY, HAS_Q, LOG_X, HAS_MASK, edits, HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
        )
    stop = accepted == 0
    go_on = accepted
    if METHOD == METHOD_BLOCK:
        if greedy == 0:
            p_x, q_x, in_vocab = draft_prob(
                row_ptr, q_row, draft, V, temp, m, z, kappa, HAS_Q, LOG_X, bits_row, HAS_MASK,
                edits, HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
            )
            live = in_vocab & (j < kb)
            stop = j == 0
            if j > 0:
                stop = _block_fires(
                    row_ptr, q_row, bits_row, mass_ptr, j, kb, V, temp, key, m, z, kappa,
                    weight, tl.where(live, p_x, 0.0), pos, NCHUNK, HAS_Q, PARTIALS, CHUNK,
                    BLOCK, LOG_X, HAS_MASK, edits, HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
                )
            weight = _next_weight(weight, p_x, q_x, live)
            go_on = (j < kb) & (weight > 0.0)
    return stop, go_on, weight
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _recovered_or_bonus(row_ptr,  # [V] logits row of the stop position j (unless PARTIALS)
                        q_row,  # [V] its draft probabilities (if HAS_Q, unless PARTIALS)
                        bits_row,  # [W] its token bitmask row (if HAS_MASK, unless PARTIALS)
                        race_rb_ptr, race_ri_ptr,  # [B*(K+1), NCHUNK] residual race (PARTIALS)
                        race_pb_ptr, race_pi_ptr,  # [B*(K+1), NCHUNK] plain race (PARTIALS)
                        draft, j, kb, V, temp, key, m, z, kappa, weight, pos, NCHUNK,
                        PARTIALS: tl.constexpr, HAS_Q: tl.constexpr, CHUNK: tl.constexpr,
                        BLOCK: tl.constexpr, LOG_X: tl.constexpr, HAS_MASK: tl.constexpr,
                        edits,  # (ids [E], vals [E], table [NG+1], NG) of its edits (if HAS_EDITS)
                        HAS_EDITS: tl.constexpr,
                        inv_ptr,  # [V] int32 draft_probs columns (HAS_DRAFT_MAP, unless PARTIALS)
                        HAS_DRAFT_MAP: tl.constexpr):
    """The token a sampling row emits at its stop position ``j``: the recovered token (the race
    over ``max(0, weight * p - q)``: ``weight`` is 1 but for block verification with draft
    probabilities) at a rejected draft, else the bonus token (the race over ``p``). The chunks'
    race winners are merged in chunk order; they are run here over the row, or with
    ``PARTIALS`` read from the split race kernel's partials of position ``pos``."""
    stream = stream_key(key, j, PURPOSE_SAMPLE)
    r_best = tl.zeros([], tl.float32)
    r_idx = tl.zeros([], tl.int32)
    p_best = tl.full([], -1.0, tl.float32)
    p_idx = tl.zeros([], tl.int32)
    for c in range(0, NCHUNK):
        if PARTIALS:
            at = pos * NCHUNK + c
            rb = tl.load(race_rb_ptr + at)
            ri = tl.load(race_ri_ptr + at)
            pb = tl.load(race_pb_ptr + at)
            pi = tl.load(race_pi_ptr + at)
        else:
            rb, ri, pb, pi = chunk_race(
                row_ptr, q_row, draft, c * CHUNK, V, temp, m, z, kappa, stream,
                tl.where(j < kb, V, 0), HAS_Q, CHUNK, BLOCK, LOG_X, weight, bits_row, HAS_MASK,
                edits, HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
            )
        r_best, r_idx = merge_best(r_best, r_idx, rb, ri)
        p_best, p_idx = merge_best(p_best, p_idx, pb, pi)
    return tl.where((j < kb) & (r_best > 0.0), r_idx, p_idx)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _fused_race(row_ptr,  # [V] logits row of the stop position j
                bits_row,  # [W] its token bitmask row (if HAS_MASK)
                token, sure, draft, j, kb, V, temp, key, m, z, NCHUNK, CHUNK: tl.constexpr,
                BLOCK: tl.constexpr, LOG_X: tl.constexpr, HAS_MASK: tl.constexpr,
                edits,  # (ids [E], vals [E], table [NG+1], NG) of its edits (if HAS_EDITS)
                HAS_EDITS: tl.constexpr):
    """:func:`_recovered_or_bonus` of a one-hot draft without a filter from the race its
    statistics pass ran (``_common.chunk_stats_race``, ``_common.race_choice``): its ``token``
    where it is ``sure``, else the race over the row in ``CHUNK``s of ``NCHUNK`` (the same token:
    the race picks the first best score, whatever the tiles)."""
    if sure == 0:  # a near-tie: the race over the row, as without the fused race
        token = _recovered_or_bonus(
            row_ptr, row_ptr, bits_row, row_ptr, row_ptr, row_ptr, row_ptr, draft, j, kb, V,
            temp, key, m, z, KEY_FLOOR, 1.0, 0, NCHUNK, False, False, CHUNK, BLOCK, LOG_X,
            HAS_MASK, edits, HAS_EDITS, row_ptr, False,
        )
    return token
# fmt: on


@triton.jit
def _race_weight(weight, HAS_Q: tl.constexpr, METHOD: tl.constexpr):
    """The residual's weight at the stop: block verification's ``p_tau`` with draft
    probabilities; 1 for the token rule and for one-hot drafts (the block residual divided by
    ``p_tau``, which the race's argmax ignores: the reference's closed form)."""
    w = tl.full([], 1.0, tl.float32)
    if METHOD == METHOD_BLOCK:
        if HAS_Q:
            w = weight
    return w


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _write_row(draft_ptr, stride_db,  # [B, K] draft token ids
               tokens_ptr, nacc_ptr,  # [B, K+1] int64 out, [B] int64 out
               b, n_acc, recovered_or_bonus, V, K,
               BLOCK_K: tl.constexpr):
    """tokens[b] = accepted drafts, then the recovered or bonus token, then -1."""
    offs = tl.arange(0, BLOCK_K)
    drafts = tl.load(draft_ptr + b * stride_db + offs, mask=offs < n_acc, other=-1).to(tl.int64)
    recovered_or_bonus = tl.minimum(tl.maximum(recovered_or_bonus, 0), V - 1).to(tl.int64)
    out = tl.where(offs < n_acc, drafts, tl.where(offs == n_acc, recovered_or_bonus, -1))
    tl.store(tokens_ptr + b * (K + 1) + offs, out, mask=offs < K + 1)
    tl.store(nacc_ptr + b, n_acc.to(tl.int64))
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _position_lp(row_ptr,  # [V] one position's logits row
                 V, temp, greedy, top_k, top_p, stream, draft, HAS_TOPK: tl.constexpr,
                 HAS_TOPP: tl.constexpr, NPIV: tl.constexpr, CHUNK: tl.constexpr,
                 BLOCK: tl.constexpr, TBLOCK: tl.constexpr, NCHUNK,
                 bits_row,  # [W] int32 token bitmask row (if HAS_MASK)
                 HAS_MASK: tl.constexpr,
                 cand,  # (count [1] int32 (zeroed), ids [CAP] int32, x [CAP] float32) (GATHER)
                 CAP: tl.constexpr, SB: tl.constexpr, SW: tl.constexpr, min_p,
                 HAS_MINP: tl.constexpr,
                 edits,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
                 HAS_EDITS: tl.constexpr, GATHER: tl.constexpr, RACE: tl.constexpr,
                 RAW: tl.constexpr, NTOP: tl.constexpr, NBLOCK: tl.constexpr):
    """The row kernel's statistics of one position with what its log-probabilities need, from
    one pass over the row (``logprobs.chunk_lp``): ``_common.position_stats`` (its sum always),
    with ``GATHER`` ``_common.position_filter_stats``, with ``RACE``
    ``_common.position_stats_race``, bit for bit. Returns ``(max, argmax, kappa, Z,
    from_buffer, race best_x, best_index, gap, raw max, raw sum, top-n list)``."""
    pivot = tl.full([], KEY_CEIL, tl.int64)
    if GATHER:
        if filter_active(V, greedy, top_k, top_p, HAS_TOPK, HAS_TOPP, min_p, HAS_MINP):
            pivot = sample_pivot(row_ptr, V, temp, top_k, HAS_TOPK, False, bits_row, HAS_MASK,
                                 CAP, SB, SW, NPIV, edits, HAS_EDITS)
        tl.debug_barrier()  # the previous position's readers are done with the buffer
    big_m = tl.full([], float("-inf"), tl.float32)
    big_s = tl.zeros([], tl.float32)
    big_a = tl.zeros([], tl.int32)
    best_x = tl.full([], float("-inf"), tl.float32)
    best_i = tl.zeros([], tl.int32)
    gap = tl.full([], float("inf"), tl.float32)
    raw_m = tl.full([], float("-inf"), tl.float32)
    raw_s = tl.zeros([], tl.float32)
    no_a = tl.zeros([], tl.int32)
    best = empty_top(NTOP, NBLOCK)
    for c in range(0, NCHUNK):
        m, s, a, bx, bi, g, rm, rs, best = chunk_lp(
            row_ptr, c * CHUNK, V, temp, CHUNK, BLOCK, bits_row, HAS_MASK, edits, HAS_EDITS,
            GATHER, pivot, cand, CAP, RACE, stream, draft, False, RAW, NTOP, best,
        )
        big_m, big_s, big_a = merge_stats(big_m, big_s, big_a, m, s, a)
        if RACE:
            best_x, best_i, gap = merge_race(best_x, best_i, gap, bx, bi, g, stream)
        if RAW:
            raw_m, raw_s, no_a = merge_stats(raw_m, raw_s, no_a, rm, rs, no_a)
    kappa = tl.full([], KEY_FLOOR, tl.int64)
    z = big_s
    exact = greedy != 0  # False for the sampling rows: searched unless the buffer answers
    if GATHER:
        tl.debug_barrier()  # every gathered candidate is visible
        if greedy == 0:
            exact, kappa, z = select_filter(
                tl.load(cand[0]), cand[1], cand[2], V, big_m, big_s, top_k, top_p, pivot,
                HAS_TOPK, HAS_TOPP, CAP, NPIV, min_p, HAS_MINP,
            )
            if not exact:
                kappa, z = thresholds(
                    row_ptr, V, temp, big_m, big_s, top_k, top_p, HAS_TOPK, HAS_TOPP, NPIV,
                    CHUNK, TBLOCK, NCHUNK, False, bits_row, HAS_MASK, min_p, HAS_MINP, edits,
                    HAS_EDITS,
                )
    elif not RACE:
        if greedy == 0:
            kappa, z = thresholds(
                row_ptr, V, temp, big_m, big_s, top_k, top_p, HAS_TOPK, HAS_TOPP, NPIV, CHUNK,
                TBLOCK, NCHUNK, False, bits_row, HAS_MASK, min_p, HAS_MINP, edits, HAS_EDITS,
            )
    return (big_m, big_a, kappa, z, exact & (greedy == 0), best_x, best_i, gap, raw_m, raw_s,
            best)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _verify_row_kernel(
    logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits, vocab stride 1
    draft_ptr, stride_db,  # [B, K] draft token ids
    q_ptr, stride_qb, stride_qk,  # [B, K, V] (V_draft: HAS_DRAFT_MAP) draft probs (if HAS_Q)
    bits_ptr, stride_mb, stride_mk,  # [B, K+1, W] int32 token bitmask (unused without HAS_MASK)
    nd_ptr,  # [B] num_draft_tokens
    temp_ptr, topk_ptr, topp_ptr,  # [B] temperature, top_k, top_p (used as flagged)
    seed_ptr,  # [B] int64 seeds
    tokens_ptr,  # [B, K+1] int64 out: emitted tokens, -1 padded
    nacc_ptr,  # [B] int64 out: num_accepted
    lstart_ptr, qstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V] / [QROWS, V]
    cnt_ptr,  # [B, K+2] int32 zeros: candidates gathered per position (+1: the block re-read)
    cidx_ptr, cx_ptr,  # [B, CAP] int32, float32: the row's candidate buffer (GATHER)
    minp_ptr,  # [B] float32 min_p (if HAS_MINP)
    eids_ptr, evals_ptr, etab_ptr,  # [B, E] int32, [B, K+1, E] f32, [B, NG+1] int32 (HAS_EDITS)
    inv_ptr,  # [V] int32 draft_probs column of each target id, -1 outside (HAS_DRAFT_MAP)
    lp_ptr,  # [B, K+1] float32 out: log p of each emitted token (LP)
    top_ptr, ids_ptr,  # [B, K+1, NTOP] float32 / int64 out: the top-n (LP)
    V, K, NCHUNK, NROWS, QROWS, E, NG,
    GREEDY_ONLY: tl.constexpr, HAS_Q: tl.constexpr, HAS_TOPK: tl.constexpr,
    HAS_TOPP: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, TBLOCK: tl.constexpr,
    NPIV: tl.constexpr, BLOCK_K: tl.constexpr, FLAT: tl.constexpr, LOG_X: tl.constexpr,
    METHOD: tl.constexpr, HAS_MASK: tl.constexpr, GATHER: tl.constexpr, CAP: tl.constexpr,
    SB: tl.constexpr, SW: tl.constexpr, FUSED: tl.constexpr, HAS_MINP: tl.constexpr,
    HAS_EDITS: tl.constexpr, HAS_DRAFT_MAP: tl.constexpr, LP: tl.constexpr = False,
    RAW: tl.constexpr = False, NTOP: tl.constexpr = 0, NBLOCK: tl.constexpr = 1,
):
    b = tl.program_id(0).to(tl.int64)
    kb = row_count(nd_ptr, b, 0, K)
    temp, greedy, key = row_sampling(temp_ptr, seed_ptr, b, GREEDY_ONLY)
    top_k, top_p = row_filters(topk_ptr, topp_ptr, b, HAS_TOPK, HAS_TOPP)
    min_p = row_min_p(minp_ptr, b, HAS_MINP)
    j = 0
    weight = tl.full([], 1.0, tl.float32)  # block verification's p_j
    go_on = kb >= 0
    # the stop so far: its position (= num_accepted), statistics and weight
    n_acc = 0
    stop_m = tl.zeros([], tl.float32)
    stop_a = tl.zeros([], tl.int32)
    stop_kappa = tl.full([], KEY_FLOOR, tl.int64)
    stop_z = tl.zeros([], tl.float32)
    stop_w = tl.full([], 1.0, tl.float32)
    stop_buf = kb < 0  # the stop's filter came from the candidate buffer (False so far)
    # FUSED: the race's token at the stop, from its statistics pass, and whether it is sure
    stop_race = tl.zeros([], tl.int32)
    stop_sure = kb < 0
    stop_raw_m = tl.zeros([], tl.float32)  # LP with RAW: the stop's raw max and sum of exp
    stop_raw_s = tl.zeros([], tl.float32)
    cidx_row = cidx_ptr + b * CAP
    cx_row = cx_ptr + b * CAP
    for _ in range(0, K + 1):  # each position is decided in order until the walk ends
        if go_on:
            jj = j.to(tl.int64)
            row = _row(logits_ptr, lstart_ptr, b, jj, stride_lb, stride_lk, NROWS, FLAT)
            q_row = _row(q_ptr, qstart_ptr, b, jj, stride_qb, stride_qk, QROWS, FLAT)
            bits_row = _row(bits_ptr, lstart_ptr, b, jj, stride_mb, stride_mk, NROWS, FLAT)
            edits = edit_row(eids_ptr, evals_ptr, etab_ptr, b, b * (K + 1) + jj, E, NG)
            from_buf = kb < 0
            draft = _draft(draft_ptr, stride_db, b, j, kb)
            race = tl.zeros([], tl.int32)
            sure = kb < 0
            if LP:  # the same pass keeps what the emitted positions' log-probabilities need
                m, a, kappa, z, from_buf, bx, bi, gap, raw_m, raw_s, best = _position_lp(
                    row, V, temp, greedy, top_k, top_p, stream_key(key, j, PURPOSE_SAMPLE),
                    draft, HAS_TOPK, HAS_TOPP, NPIV, CHUNK, BLOCK, TBLOCK, NCHUNK, bits_row,
                    HAS_MASK, (cnt_ptr + b * (K + 2) + jj, cidx_row, cx_row), CAP, SB, SW, min_p,
                    HAS_MINP, edits, HAS_EDITS, GATHER, FUSED, RAW, NTOP, NBLOCK,
                )
                if FUSED:
                    race, sure = race_choice(
                        row, bx, bi, gap, m, z, draft, j < kb, V, temp,
                        stream_key(key, j, PURPOSE_SAMPLE), LOG_X, bits_row, HAS_MASK, edits,
                        HAS_EDITS,
                    )
                at = b * (K + 1) + jj
                # the draft's log p (the stop's token is scored after the walk) and the list
                write_logprob(row, bits_row, lp_ptr + at, draft, V, temp, m, z, kappa, raw_m,
                              raw_s, RAW, HAS_MASK, edits, HAS_EDITS)
                if NTOP > 0:
                    write_top_list(row, top_ptr + at * NTOP, ids_ptr + at * NTOP, temp, m, z,
                                   kappa, raw_m, raw_s, best, RAW, NTOP, NBLOCK, edits,
                                   HAS_EDITS)
            elif FUSED:  # one-hot drafts, no filter: the race rides on the statistics pass
                stream = stream_key(key, j, PURPOSE_SAMPLE)
                m, a, z, bx, bi, gap = position_stats_race(
                    row, V, temp, stream, draft, NCHUNK, CHUNK, BLOCK, LOG_X, bits_row, HAS_MASK,
                    edits, HAS_EDITS,
                )
                kappa = tl.full([], KEY_FLOOR, tl.int64)
                race, sure = race_choice(
                    row, bx, bi, gap, m, z, draft, j < kb, V, temp, stream, LOG_X, bits_row,
                    HAS_MASK, edits, HAS_EDITS,
                )
            elif GATHER:
                m, a, kappa, z, from_buf = position_filter_stats(
                    row, V, temp, greedy, top_k, top_p, HAS_TOPK, HAS_TOPP, NPIV, CHUNK, BLOCK,
                    TBLOCK, NCHUNK, LOG_X, bits_row, HAS_MASK,
                    (cnt_ptr + b * (K + 2) + jj, cidx_row, cx_row), CAP, SB, SW, min_p, HAS_MINP,
                    edits, HAS_EDITS,
                )
            else:
                m, a, kappa, z = position_stats(
                    row, V, temp, greedy, top_k, top_p, not GREEDY_ONLY, HAS_TOPK, HAS_TOPP,
                    NPIV, CHUNK, BLOCK, TBLOCK, NCHUNK, LOG_X, bits_row, HAS_MASK, min_p, HAS_MINP,
                    edits, HAS_EDITS,
                )
            stop, go_on, next_weight = _decide(
                row, q_row, bits_row, row,  # no mass partials: R_j is summed over the row
                draft, j, kb, V, temp, greedy, key, m, a, z, kappa, weight, 0, NCHUNK,
                GREEDY_ONLY, HAS_Q, False, METHOD, CHUNK, BLOCK, LOG_X, HAS_MASK, edits, HAS_EDITS,
                inv_ptr, HAS_DRAFT_MAP,
            )
            if stop:
                n_acc = j
                stop_w = weight
                if LP:
                    if RAW:
                        stop_raw_m = raw_m
                        stop_raw_s = raw_s
                if METHOD == METHOD_TOKEN:  # block verification: recomputed after the walk
                    stop_m = m
                    stop_a = a
                    stop_kappa = kappa
                    stop_z = z
                    stop_buf = from_buf  # the walk ends here: the buffer is this position's
                    stop_race = race
                    stop_sure = sure
            weight = next_weight
            j += 1
    jj = n_acc.to(tl.int64)
    row = _row(logits_ptr, lstart_ptr, b, jj, stride_lb, stride_lk, NROWS, FLAT)
    bits_row = _row(bits_ptr, lstart_ptr, b, jj, stride_mb, stride_mk, NROWS, FLAT)
    edits = edit_row(eids_ptr, evals_ptr, etab_ptr, b, b * (K + 1) + jj, E, NG)
    if METHOD == METHOD_BLOCK:
        # Block verification's walk goes on past its stop: carrying the stop's statistics through
        # it spills registers, so the stop position's row is read once more.
        if GATHER:
            stop_m, stop_a, stop_kappa, stop_z, stop_buf = position_filter_stats(
                row, V, temp, greedy, top_k, top_p, HAS_TOPK, HAS_TOPP, NPIV, CHUNK, BLOCK,
                TBLOCK, NCHUNK, LOG_X, bits_row, HAS_MASK,
                (cnt_ptr + b * (K + 2) + K + 1, cidx_row, cx_row), CAP, SB, SW, min_p, HAS_MINP,
                edits, HAS_EDITS,
            )
        else:
            stop_m, stop_a, stop_kappa, stop_z = position_stats(
                row, V, temp, greedy, top_k, top_p, True, HAS_TOPK, HAS_TOPP, NPIV, CHUNK,
                BLOCK, TBLOCK, NCHUNK, LOG_X, bits_row, HAS_MASK, min_p, HAS_MINP, edits,
                HAS_EDITS,
            )
    recovered_or_bonus = stop_a
    if not GREEDY_ONLY:
        if greedy == 0:
            q_row = _row(q_ptr, qstart_ptr, b, jj, stride_qb, stride_qk, QROWS, FLAT)
            draft = _draft(draft_ptr, stride_db, b, n_acc, kb)
            race_w = _race_weight(stop_w, HAS_Q, METHOD)
            if FUSED:
                recovered_or_bonus = _fused_race(
                    row, bits_row, stop_race, stop_sure, draft, n_acc, kb, V, temp, key, stop_m,
                    stop_z, NCHUNK, CHUNK, BLOCK, LOG_X, HAS_MASK, edits, HAS_EDITS,
                )
            elif stop_buf:  # the kept set is in the buffer: race over it, not the row
                slot = jj
                if METHOD == METHOD_BLOCK:
                    slot = jj * 0 + K + 1
                rb, ri, pb, pi = buffer_race(
                    tl.load(cnt_ptr + b * (K + 2) + slot), cidx_row, cx_row, q_row, draft,
                    stop_m, stop_z, stop_kappa, stream_key(key, n_acc, PURPOSE_SAMPLE),
                    tl.where(n_acc < kb, V, 0), HAS_Q, race_w, CAP, inv_ptr, HAS_DRAFT_MAP,
                )
                recovered_or_bonus = tl.where((n_acc < kb) & (rb > 0.0), ri, pi)
            else:
                recovered_or_bonus = _recovered_or_bonus(
                    row, q_row, bits_row, row, row, row, row,  # no race partials: over the row
                    draft, n_acc, kb, V, temp, key, stop_m, stop_z, stop_kappa, race_w, 0,
                    NCHUNK, False, HAS_Q, CHUNK, BLOCK, LOG_X, HAS_MASK, edits, HAS_EDITS, inv_ptr,
                    HAS_DRAFT_MAP,
                )
    if LP:  # the stop's token replaces its draft's log p; the positions past it are padding
        tl.debug_barrier()  # after the walk's writes
        at = b * (K + 1) + jj
        write_logprob(row, bits_row, lp_ptr + at, tl.minimum(tl.maximum(recovered_or_bonus, 0),
                      V - 1), V, temp, stop_m, stop_z, stop_kappa, stop_raw_m, stop_raw_s, RAW,
                      HAS_MASK, edits, HAS_EDITS)
        write_padding(lp_ptr + b * (K + 1), top_ptr + b * (K + 1) * NTOP,
                      ids_ptr + b * (K + 1) * NTOP, n_acc + 1, K, BLOCK_K, NTOP, NBLOCK)
    _write_row(
        draft_ptr, stride_db, tokens_ptr, nacc_ptr, b, n_acc, recovered_or_bonus, V, K, BLOCK_K
    )
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _split_stats_kernel(
    logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits, vocab stride 1
    bits_ptr, stride_mb, stride_mk,  # [B, K+1, W] int32 token bitmask (unused without HAS_MASK)
    nd_ptr, temp_ptr,  # [B] num_draft_tokens, temperature
    part_m_ptr, part_s_ptr, part_a_ptr,  # [B*(K+1), NCHUNK] out: chunk max, sum-exp, argmax
    lstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V]
    pivot_ptr, cnt_ptr,  # [B*(K+1)] gather cutoff keys, zeroed candidate counts (GATHER)
    cidx_ptr, cx_ptr,  # [B*(K+1), CAP] out: candidate token ids, x (GATHER)
    draft_ptr, stride_db, seed_ptr,  # [B, K] draft token ids, [B] int64 seeds (FUSED)
    race_rb_ptr, race_ri_ptr,  # [B*(K+1), NCHUNK] out: race winner's x, token (FUSED)
    race_pb_ptr,  # [B*(K+1), NCHUNK] out: its gap (FUSED)
    eids_ptr, evals_ptr, etab_ptr,  # [B, E] int32, [B, K+1, E] f32, [B, NG+1] int32 (HAS_EDITS)
    raw_m_ptr, raw_s_ptr,  # [B*(K+1), NCHUNK] out: raw chunk max, sum-exp (LP with RAW)
    key_ptr,  # [B*(K+1), NCHUNK, NTOP] int64 out: the chunk's top-n rank keys (LP)
    V, K, NCHUNK, NROWS, E, NG,
    GREEDY_ONLY: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, FLAT: tl.constexpr,
    LOG_X: tl.constexpr, HAS_MASK: tl.constexpr, GATHER: tl.constexpr, CAP: tl.constexpr,
    FUSED: tl.constexpr, HAS_EDITS: tl.constexpr, LP: tl.constexpr = False,
    RAW: tl.constexpr = False, NTOP: tl.constexpr = 0, NBLOCK: tl.constexpr = 1,
):
    """One chunk's statistics of one position; with ``GATHER`` it also fills the position's
    filter candidates, with ``FUSED`` (one-hot drafts, no filter) it also runs the chunk's race
    (``_common.chunk_stats_race``): no race launch, one read of the row."""
    pid = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    b = pid // (K + 1)
    j = pid % (K + 1)
    kb = row_count(nd_ptr, b, 0, K)
    if j <= kb:
        temp, greedy = row_temperature(temp_ptr, b, GREEDY_ONLY)
        row = _row(logits_ptr, lstart_ptr, b, j, stride_lb, stride_lk, NROWS, FLAT)
        bits_row = _row(bits_ptr, lstart_ptr, b, j, stride_mb, stride_mk, NROWS, FLAT)
        edits = edit_row(eids_ptr, evals_ptr, etab_ptr, b, pid, E, NG)
        if LP:  # the same loads keep the raw statistics and the chunk's top-n list
            pivot = tl.full([], KEY_CEIL, tl.int64)
            if GATHER:
                pivot = tl.load(pivot_ptr + pid)
            m, s, a, bx, bi, gap, rm, rs, best = chunk_lp(
                row, c * CHUNK, V, temp, CHUNK, BLOCK, bits_row, HAS_MASK, edits, HAS_EDITS,
                GATHER, pivot, (cnt_ptr + pid, cidx_ptr + pid * CAP, cx_ptr + pid * CAP), CAP,
                FUSED, stream_key(row_key(tl.load(seed_ptr + b)), j, PURPOSE_SAMPLE),
                _draft(draft_ptr, stride_db, b, j, kb), True, RAW, NTOP,
                empty_top(NTOP, NBLOCK),
            )
            at = pid * NCHUNK + c
            if FUSED:
                tl.store(race_rb_ptr + at, bx)
                tl.store(race_ri_ptr + at, bi)
                tl.store(race_pb_ptr + at, gap)
            if RAW:
                tl.store(raw_m_ptr + at, rm)
                tl.store(raw_s_ptr + at, rs)
            if NTOP > 0:
                slot = tl.arange(0, NBLOCK)
                tl.store(key_ptr + at * NTOP + slot, best, mask=slot < NTOP)
        elif FUSED:
            m, s, a, bx, bi, gap = chunk_stats_race(
                row, c * CHUNK, V, temp, stream_key(row_key(tl.load(seed_ptr + b)), j,
                                                    PURPOSE_SAMPLE),
                _draft(draft_ptr, stride_db, b, j, kb), CHUNK, BLOCK, LOG_X, bits_row, HAS_MASK,
                True, edits, HAS_EDITS,
            )
            at = pid * NCHUNK + c
            tl.store(race_rb_ptr + at, bx)
            tl.store(race_ri_ptr + at, bi)
            tl.store(race_pb_ptr + at, gap)
        elif GATHER:  # the statistics pass also fills the position's candidate buffer
            m, s, a = chunk_stats(
                row, c * CHUNK, V, temp, True, CHUNK, BLOCK, LOG_X, bits_row, HAS_MASK, True,
                tl.load(pivot_ptr + pid), (cnt_ptr + pid, cidx_ptr + pid * CAP, cx_ptr + pid * CAP),
                CAP, edits, HAS_EDITS,
            )
        else:
            m, s, a = chunk_stats(
                row, c * CHUNK, V, temp, not GREEDY_ONLY, CHUNK, BLOCK, LOG_X, bits_row, HAS_MASK,
                edits=edits, HAS_EDITS=HAS_EDITS,
            )
        out = pid * NCHUNK + c
        tl.store(part_m_ptr + out, m)
        tl.store(part_s_ptr + out, s)
        tl.store(part_a_ptr + out, a)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _split_pivot_kernel(
    logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits, vocab stride 1
    bits_ptr, stride_mb, stride_mk,  # [B, K+1, W] int32 token bitmask (unused without HAS_MASK)
    nd_ptr, temp_ptr, topk_ptr, topp_ptr,  # [B] num_draft_tokens, temperature, top_k, top_p
    pivot_ptr, cnt_ptr,  # [B*(K+1)] out: gather cutoff keys, candidate counts (zeroed)
    lstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V]
    minp_ptr,  # [B] float32 min_p (if HAS_MINP)
    eids_ptr, evals_ptr, etab_ptr,  # [B, E] int32, [B, K+1, E] f32, [B, NG+1] int32 (HAS_EDITS)
    V, K, NROWS, E, NG,
    HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr, FLAT: tl.constexpr, LOG_X: tl.constexpr,
    HAS_MASK: tl.constexpr, CAP: tl.constexpr, SB: tl.constexpr, SW: tl.constexpr,
    NPIV: tl.constexpr, HAS_MINP: tl.constexpr, HAS_EDITS: tl.constexpr,
):
    """The gather cutoff of one position from a sample of its row (``_common.sample_pivot``,
    ``SB * SW`` tokens: 3% of a 128k row), ``KEY_CEIL`` (gather nothing) where no filter is on;
    the candidate count is zeroed for the statistics pass."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // (K + 1)
    j = pid % (K + 1)
    kb = row_count(nd_ptr, b, 0, K)
    temp, greedy = row_temperature(temp_ptr, b, False)
    top_k, top_p = row_filters(topk_ptr, topp_ptr, b, HAS_TOPK, HAS_TOPP)
    min_p = row_min_p(minp_ptr, b, HAS_MINP)
    pivot = tl.full([], KEY_CEIL, tl.int64)
    if (j <= kb) & filter_active(V, greedy, top_k, top_p, HAS_TOPK, HAS_TOPP, min_p, HAS_MINP):
        row = _row(logits_ptr, lstart_ptr, b, j, stride_lb, stride_lk, NROWS, FLAT)
        bits_row = _row(bits_ptr, lstart_ptr, b, j, stride_mb, stride_mk, NROWS, FLAT)
        edits = edit_row(eids_ptr, evals_ptr, etab_ptr, b, pid, E, NG)
        pivot = sample_pivot(row, V, temp, top_k, HAS_TOPK, LOG_X, bits_row, HAS_MASK, CAP, SB,
                             SW, NPIV, edits, HAS_EDITS)
    tl.store(pivot_ptr + pid, pivot)
    tl.store(cnt_ptr + pid, 0)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _split_threshold_kernel(
    logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits, vocab stride 1
    bits_ptr, stride_mb, stride_mk,  # [B, K+1, W] int32 token bitmask (unused without HAS_MASK)
    nd_ptr, temp_ptr, topk_ptr, topp_ptr,  # [B] num_draft_tokens, temperature, top_k, top_p
    part_m_ptr, part_s_ptr, part_a_ptr,  # [B*(K+1), NCHUNK] chunk statistics
    kappa_ptr, z_ptr,  # [B*(K+1)] out: key threshold, kept mass
    lstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V]
    pivot_ptr, cnt_ptr,  # [B*(K+1)] gather cutoff keys, candidate counts
    cidx_ptr, cx_ptr,  # [B*(K+1), CAP] candidate token ids, x
    mode_ptr,  # [B*(K+1)] int32 out: 1 where the filter came from the buffer (race over it)
    minp_ptr,  # [B] float32 min_p (if HAS_MINP)
    eids_ptr, evals_ptr, etab_ptr,  # [B, E] int32, [B, K+1, E] f32, [B, NG+1] int32 (HAS_EDITS)
    V, K, NCHUNK, NROWS, E, NG,
    HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr, NPIV: tl.constexpr, CHUNK: tl.constexpr,
    TBLOCK: tl.constexpr, FLAT: tl.constexpr, LOG_X: tl.constexpr, HAS_MASK: tl.constexpr,
    CAP: tl.constexpr, HAS_MINP: tl.constexpr, HAS_EDITS: tl.constexpr,
):
    """The top-k / top-p threshold of one position: selected from the candidates its statistics
    pass gathered (``_common.select_filter``, the row strategy's rule on the same buffer), or,
    where the buffer misses the kept set, the search over the row (``_common.thresholds``, chunk
    partials added in chunk order), so both strategies find the same ``kappa`` and ``Z``."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // (K + 1)
    j = pid % (K + 1)
    kb = row_count(nd_ptr, b, 0, K)
    temp, greedy = row_temperature(temp_ptr, b, False)
    big_m, big_s, big_a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pid * NCHUNK, NCHUNK)
    kappa = tl.full([], KEY_FLOOR, tl.int64)
    z = big_s
    from_buf = kb < 0
    if (j <= kb) & (greedy == 0):
        top_k, top_p = row_filters(topk_ptr, topp_ptr, b, HAS_TOPK, HAS_TOPP)
        min_p = row_min_p(minp_ptr, b, HAS_MINP)
        from_buf, kappa, z = select_filter(
            tl.load(cnt_ptr + pid), cidx_ptr + pid * CAP, cx_ptr + pid * CAP, V, big_m, big_s,
            top_k, top_p, tl.load(pivot_ptr + pid), HAS_TOPK, HAS_TOPP, CAP, NPIV, min_p,
            HAS_MINP,
        )
        if not from_buf:
            row = _row(logits_ptr, lstart_ptr, b, j, stride_lb, stride_lk, NROWS, FLAT)
            bits_row = _row(bits_ptr, lstart_ptr, b, j, stride_mb, stride_mk, NROWS, FLAT)
            edits = edit_row(eids_ptr, evals_ptr, etab_ptr, b, pid, E, NG)
            kappa, z = thresholds(
                row, V, temp, big_m, big_s, top_k, top_p, HAS_TOPK, HAS_TOPP, NPIV, CHUNK,
                TBLOCK, NCHUNK, LOG_X, bits_row, HAS_MASK, min_p, HAS_MINP, edits, HAS_EDITS,
            )
    tl.store(kappa_ptr + pid, kappa)
    tl.store(z_ptr + pid, z)
    tl.store(mode_ptr + pid, from_buf.to(tl.int32))
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _split_weight(logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits
                  draft_ptr, stride_db,  # [B, K] draft token ids
                  q_ptr, stride_qb, stride_qk,  # [B, K, V] (V_draft: HAS_DRAFT_MAP) draft probs
                  bits_ptr, stride_mb, stride_mk,  # [B, K+1, W] token bitmask (if HAS_MASK)
                  part_m_ptr, part_s_ptr, part_a_ptr,  # [B*(K+1), NCHUNK] chunk statistics
                  kappa_ptr, z_ptr,  # [B*(K+1)] key threshold, kept mass
                  lstart_ptr, qstart_ptr,  # [B] FLAT only: rows of position 0
                  eids_ptr, evals_ptr, etab_ptr,  # [B, E], [B, K+1, E], [B, NG+1] (HAS_EDITS)
                  inv_ptr,  # [V] int32 draft_probs column of each target id (HAS_DRAFT_MAP)
                  b, j, kb, V, K, NCHUNK, NROWS, QROWS, E, NG, temp,
                  HAS_FILTER: tl.constexpr, FLAT: tl.constexpr, LOG_X: tl.constexpr,
                  HAS_MASK: tl.constexpr, HAS_EDITS: tl.constexpr, HAS_DRAFT_MAP: tl.constexpr):
    """Block verification's weight ``p_j`` of position ``j`` in a split race program: the decide
    kernel's recursion (:func:`_next_weight` over positions ``0 .. j-1``) from the same partials,
    so that both find the same number."""
    weight = tl.full([], 1.0, tl.float32)
    for i in range(0, j):
        pos = b * (K + 1) + i
        m, s, a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pos * NCHUNK, NCHUNK)
        kappa, z = _filter_state(kappa_ptr, z_ptr, pos, s, HAS_FILTER)
        row = _row(logits_ptr, lstart_ptr, b, i, stride_lb, stride_lk, NROWS, FLAT)
        q_row = _row(q_ptr, qstart_ptr, b, i, stride_qb, stride_qk, QROWS, FLAT)
        bits_row = _row(bits_ptr, lstart_ptr, b, i, stride_mb, stride_mk, NROWS, FLAT)
        edits = edit_row(eids_ptr, evals_ptr, etab_ptr, b, pos, E, NG)
        p_x, q_x, in_vocab = draft_prob(
            row, q_row, _draft(draft_ptr, stride_db, b, i, kb), V, temp, m, z, kappa, True,
            LOG_X, bits_row, HAS_MASK, edits, HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
        )
        weight = _next_weight(weight, p_x, q_x, in_vocab & (i < kb))
    return weight
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _split_race_kernel(
    logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits, vocab stride 1
    draft_ptr, stride_db,  # [B, K] draft token ids
    q_ptr, stride_qb, stride_qk,  # [B, K, V] (V_draft: HAS_DRAFT_MAP) draft probs (if HAS_Q)
    bits_ptr, stride_mb, stride_mk,  # [B, K+1, W] int32 token bitmask (unused without HAS_MASK)
    nd_ptr, temp_ptr, seed_ptr,  # [B] num_draft_tokens, temperature, int64 seeds
    part_m_ptr, part_s_ptr, part_a_ptr,  # [B*(K+1), NCHUNK] chunk statistics
    kappa_ptr, z_ptr,  # [B*(K+1)] key threshold, kept mass
    race_rb_ptr, race_ri_ptr,  # [B*(K+1), NCHUNK] out: residual race best score, token
    race_pb_ptr, race_pi_ptr,  # [B*(K+1), NCHUNK] out: plain race best score, token
    mass_ptr,  # [B*(K+1), NCHUNK] out: block residual mass (METHOD block with HAS_Q)
    lstart_ptr, qstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V] / [QROWS, V]
    mode_ptr, cnt_ptr,  # [B*(K+1)] 1 where the filter came from the buffer, candidate counts
    cidx_ptr, cx_ptr,  # [B*(K+1), CAP] candidate token ids, x (HAS_FILTER)
    eids_ptr, evals_ptr, etab_ptr,  # [B, E] int32, [B, K+1, E] f32, [B, NG+1] int32 (HAS_EDITS)
    inv_ptr,  # [V] int32 draft_probs column of each target id, -1 outside (HAS_DRAFT_MAP)
    V, K, NCHUNK, NROWS, QROWS, E, NG,
    HAS_Q: tl.constexpr, HAS_FILTER: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
    FLAT: tl.constexpr, LOG_X: tl.constexpr, METHOD: tl.constexpr, HAS_MASK: tl.constexpr,
    CAP: tl.constexpr, HAS_EDITS: tl.constexpr, HAS_DRAFT_MAP: tl.constexpr,
):
    """One chunk's race winners of one position (what :func:`_recovered_or_bonus` merges); for
    block verification with draft probabilities the race is over the weighted residual and the
    chunk's residual mass (what :func:`_residual_mass` adds) is written too. A position whose
    filter came from its candidate buffer races over the buffer in its chunk-0 program (the
    other chunks' partials are the race's neutral values): its row is not read again."""
    pid = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    b = pid // (K + 1)
    j = pid % (K + 1)
    kb = row_count(nd_ptr, b, 0, K)
    temp, greedy = row_temperature(temp_ptr, b, False)
    if (j <= kb) & (greedy == 0):
        big_m, big_s, big_a = _merged_stats(
            part_m_ptr, part_s_ptr, part_a_ptr, pid * NCHUNK, NCHUNK
        )
        kappa, z = _filter_state(kappa_ptr, z_ptr, pid, big_s, HAS_FILTER)
        draft = _draft(draft_ptr, stride_db, b, j, kb)
        stream = stream_key(row_key(tl.load(seed_ptr + b)), j, PURPOSE_SAMPLE)
        row = _row(logits_ptr, lstart_ptr, b, j, stride_lb, stride_lk, NROWS, FLAT)
        q_row = _row(q_ptr, qstart_ptr, b, j, stride_qb, stride_qk, QROWS, FLAT)
        bits_row = _row(bits_ptr, lstart_ptr, b, j, stride_mb, stride_mk, NROWS, FLAT)
        edits = edit_row(eids_ptr, evals_ptr, etab_ptr, b, pid, E, NG)
        weight = tl.full([], 1.0, tl.float32)
        if METHOD == METHOD_BLOCK:
            if HAS_Q:
                weight = _split_weight(
                    logits_ptr, stride_lb, stride_lk, draft_ptr, stride_db, q_ptr, stride_qb,
                    stride_qk, bits_ptr, stride_mb, stride_mk, part_m_ptr, part_s_ptr,
                    part_a_ptr, kappa_ptr, z_ptr, lstart_ptr, qstart_ptr, eids_ptr, evals_ptr,
                    etab_ptr, inv_ptr, b, j, kb, V, K, NCHUNK, NROWS, QROWS, E, NG, temp,
                    HAS_FILTER, FLAT, LOG_X, HAS_MASK, HAS_EDITS, HAS_DRAFT_MAP,
                )
                mass = chunk_residual_mass(
                    row, q_row, c * CHUNK, V, temp, big_m, z, kappa, weight,
                    tl.where(j < kb, V, 0), CHUNK, BLOCK, LOG_X, bits_row, HAS_MASK, edits,
                    HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
                )
                tl.store(mass_ptr + pid * NCHUNK + c, mass)
        rb = tl.zeros([], tl.float32)
        ri = tl.zeros([], tl.int32)
        pb = tl.full([], -1.0, tl.float32)
        pi = tl.zeros([], tl.int32)
        from_buf = kb < 0
        if HAS_FILTER:
            # block verification with draft probabilities reads the row for R_j anyway: it
            # races over the row (the same winners: the buffer holds the kept set), which keeps
            # the buffer's race out of that variant's registers
            if (METHOD == METHOD_TOKEN) or (not HAS_Q):
                if tl.load(mode_ptr + pid) != 0:
                    from_buf = kb >= 0
                    if c == 0:
                        rb, ri, pb, pi = buffer_race(
                            tl.load(cnt_ptr + pid), cidx_ptr + pid * CAP, cx_ptr + pid * CAP,
                            q_row, draft, big_m, z, kappa, stream, tl.where(j < kb, V, 0), HAS_Q,
                            weight, CAP, inv_ptr, HAS_DRAFT_MAP,
                        )
        if not from_buf:
            rb, ri, pb, pi = chunk_race(
                row, q_row, draft, c * CHUNK, V, temp, big_m, z, kappa, stream,
                tl.where(j < kb, V, 0), HAS_Q, CHUNK, BLOCK, LOG_X, weight, bits_row, HAS_MASK,
                edits, HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
            )
        out = pid * NCHUNK + c
        tl.store(race_rb_ptr + out, rb)
        tl.store(race_ri_ptr + out, ri)
        tl.store(race_pb_ptr + out, pb)
        tl.store(race_pi_ptr + out, pi)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _score_emitted(logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits
                   draft_ptr, stride_db,  # [B, K] draft token ids
                   bits_ptr, stride_mb, stride_mk,  # [B, K+1, W] token bitmask (if HAS_MASK)
                   part_m_ptr, part_s_ptr, part_a_ptr,  # [B*(K+1), NCHUNK] chunk statistics
                   kappa_ptr, z_ptr,  # [B*(K+1)] key threshold, kept mass (HAS_FILTER)
                   raw_m_ptr, raw_s_ptr,  # [B*(K+1), NCHUNK] raw chunk statistics (RAW)
                   key_ptr,  # [B*(K+1), NCHUNK, NTOP] int64: the chunks' top-n rank keys
                   lp_ptr,  # [B, K+1] float32 out
                   top_ptr, ids_ptr,  # [B, K+1, NTOP] float32 / int64 out
                   lstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V]
                   eids_ptr, evals_ptr, etab_ptr,  # [B, E], [B, K+1, E], [B, NG+1] (HAS_EDITS)
                   b, kb, n_acc, recovered_or_bonus, V, K, NCHUNK, NROWS, E, NG, temp,
                   HAS_FILTER: tl.constexpr, BLOCK_K: tl.constexpr, FLAT: tl.constexpr,
                   HAS_MASK: tl.constexpr, HAS_EDITS: tl.constexpr, RAW: tl.constexpr,
                   NTOP: tl.constexpr, NBLOCK: tl.constexpr):
    """The split strategy's log-probabilities of row ``b``'s emitted positions ``0 .. n_acc``
    from the statistics partials (the chunks' raw statistics merged in chunk order as the row
    kernel merges them, the chunks' top-n lists merged into one) and one logit load per token
    and listed entry; padding past ``n_acc``."""
    token = tl.minimum(tl.maximum(recovered_or_bonus, 0), V - 1)
    for p in range(0, K + 1):
        if p <= n_acc:
            pos = b * (K + 1) + p
            m, s, a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pos * NCHUNK, NCHUNK)
            kappa, z = _filter_state(kappa_ptr, z_ptr, pos, s, HAS_FILTER)
            raw_m = tl.full([], float("-inf"), tl.float32)
            raw_s = tl.zeros([], tl.float32)
            if RAW:
                raw_m, raw_s, _ = _merged_stats(raw_m_ptr, raw_s_ptr, part_a_ptr, pos * NCHUNK,
                                                NCHUNK)
            jj = b * 0 + p  # int64
            row = _row(logits_ptr, lstart_ptr, b, jj, stride_lb, stride_lk, NROWS, FLAT)
            bits_row = _row(bits_ptr, lstart_ptr, b, jj, stride_mb, stride_mk, NROWS, FLAT)
            edits = edit_row(eids_ptr, evals_ptr, etab_ptr, b, pos, E, NG)
            tok = tl.where(p < n_acc, _draft(draft_ptr, stride_db, b, p, kb).to(tl.int64), token)
            write_logprob(row, bits_row, lp_ptr + pos, tok, V, temp, m, z, kappa, raw_m, raw_s,
                          RAW, HAS_MASK, edits, HAS_EDITS)
            if NTOP > 0:
                best = empty_top(NTOP, NBLOCK)
                for c in range(0, NCHUNK):
                    best = merge_top_partial(best, key_ptr + (pos * NCHUNK + c) * NTOP, NTOP,
                                             NBLOCK)
                write_top_list(row, top_ptr + pos * NTOP, ids_ptr + pos * NTOP, temp, m, z,
                               kappa, raw_m, raw_s, best, RAW, NTOP, NBLOCK, edits, HAS_EDITS)
    write_padding(lp_ptr + b * (K + 1), top_ptr + b * (K + 1) * NTOP,
                  ids_ptr + b * (K + 1) * NTOP, n_acc + 1, K, BLOCK_K, NTOP, NBLOCK)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _split_decide_kernel(
    logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits, vocab stride 1
    draft_ptr, stride_db,  # [B, K] draft token ids
    q_ptr, stride_qb, stride_qk,  # [B, K, V] (V_draft: HAS_DRAFT_MAP) draft probs (if HAS_Q)
    bits_ptr, stride_mb, stride_mk,  # [B, K+1, W] int32 token bitmask (unused without HAS_MASK)
    nd_ptr, temp_ptr, seed_ptr,  # [B] num_draft_tokens, temperature, int64 seeds
    part_m_ptr, part_s_ptr, part_a_ptr,  # [B*(K+1), NCHUNK] chunk statistics
    kappa_ptr, z_ptr,  # [B*(K+1)] key threshold, kept mass
    race_rb_ptr, race_ri_ptr,  # [B*(K+1), NCHUNK] residual race partials (FUSED: winner x, id)
    race_pb_ptr, race_pi_ptr,  # [B*(K+1), NCHUNK] plain race partials (FUSED: the winner's gap)
    mass_ptr,  # [B*(K+1), NCHUNK] block residual mass partials (METHOD block with HAS_Q)
    tokens_ptr,  # [B, K+1] int64 out: emitted tokens, -1 padded
    nacc_ptr,  # [B] int64 out: num_accepted
    lstart_ptr, qstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V] / [QROWS, V]
    eids_ptr, evals_ptr, etab_ptr,  # [B, E] int32, [B, K+1, E] f32, [B, NG+1] int32 (HAS_EDITS)
    inv_ptr,  # [V] int32 draft_probs column of each target id, -1 outside (HAS_DRAFT_MAP)
    raw_m_ptr, raw_s_ptr,  # [B*(K+1), NCHUNK] raw chunk max, sum-exp (LP with RAW)
    key_ptr,  # [B*(K+1), NCHUNK, NTOP] int64: the chunks' top-n rank keys (LP)
    lp_ptr,  # [B, K+1] float32 out: log p of each emitted token (LP)
    top_ptr, ids_ptr,  # [B, K+1, NTOP] float32 / int64 out: the top-n (LP)
    V, K, NCHUNK, NROWS, QROWS, E, NG,
    GREEDY_ONLY: tl.constexpr, HAS_Q: tl.constexpr, HAS_FILTER: tl.constexpr,
    BLOCK_K: tl.constexpr, FLAT: tl.constexpr, LOG_X: tl.constexpr, METHOD: tl.constexpr,
    HAS_MASK: tl.constexpr, FUSED: tl.constexpr, TBLOCK: tl.constexpr, HAS_EDITS: tl.constexpr,
    HAS_DRAFT_MAP: tl.constexpr, LP: tl.constexpr = False, RAW: tl.constexpr = False,
    NTOP: tl.constexpr = 0, NBLOCK: tl.constexpr = 1,
):
    """The walk of row ``b`` over its positions' merged partials (:func:`_decide`), then the
    token at its stop: the race kernel's partials merged, or with ``FUSED`` the statistics
    pass's race winners (:func:`_fused_race`; where it is not sure, this program races the
    stop's row in ``TBLOCK`` tiles)."""
    b = tl.program_id(0).to(tl.int64)
    kb = row_count(nd_ptr, b, 0, K)
    temp, greedy, key = row_sampling(temp_ptr, seed_ptr, b, GREEDY_ONLY)
    j = 0
    weight = tl.full([], 1.0, tl.float32)  # block verification's p_j
    go_on = kb >= 0
    n_acc = 0  # the stop so far (= num_accepted) and its argmax
    stop_a = tl.zeros([], tl.int32)
    while go_on:
        pos = b * (K + 1) + j
        m, s, a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pos * NCHUNK, NCHUNK)
        kappa, z = _filter_state(kappa_ptr, z_ptr, pos, s, HAS_FILTER)
        jj = j.to(tl.int64)
        row = _row(logits_ptr, lstart_ptr, b, jj, stride_lb, stride_lk, NROWS, FLAT)
        q_row = _row(q_ptr, qstart_ptr, b, jj, stride_qb, stride_qk, QROWS, FLAT)
        bits_row = _row(bits_ptr, lstart_ptr, b, jj, stride_mb, stride_mk, NROWS, FLAT)
        draft = _draft(draft_ptr, stride_db, b, j, kb)
        edits = edit_row(eids_ptr, evals_ptr, etab_ptr, b, pos, E, NG)
        stop, go_on, next_weight = _decide(
            row, q_row, bits_row, mass_ptr,
            draft, j, kb, V, temp, greedy, key, m, a, z, kappa, weight, pos, NCHUNK,
            GREEDY_ONLY, HAS_Q, True, METHOD, 1, 1, LOG_X, HAS_MASK,  # CHUNK, BLOCK: unused
            edits, HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
        )
        if stop:
            n_acc = j
            stop_a = a
        weight = next_weight
        j += 1
    recovered_or_bonus = stop_a
    if not GREEDY_ONLY:
        if greedy == 0:  # the race winners of the stop position are the partials
            pos = b * (K + 1) + n_acc
            if FUSED:
                m, s, a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pos * NCHUNK, NCHUNK)
                stream = stream_key(key, n_acc, PURPOSE_SAMPLE)
                bx = tl.full([], float("-inf"), tl.float32)
                bi = tl.zeros([], tl.int32)
                gap = tl.full([], float("inf"), tl.float32)
                for c in range(0, NCHUNK):
                    bx, bi, gap = merge_race(
                        bx, bi, gap, tl.load(race_rb_ptr + pos * NCHUNK + c),
                        tl.load(race_ri_ptr + pos * NCHUNK + c),
                        tl.load(race_pb_ptr + pos * NCHUNK + c), stream,
                    )
                jj = n_acc.to(tl.int64)
                row = _row(logits_ptr, lstart_ptr, b, jj, stride_lb, stride_lk, NROWS, FLAT)
                bits_row = _row(bits_ptr, lstart_ptr, b, jj, stride_mb, stride_mk, NROWS, FLAT)
                draft = _draft(draft_ptr, stride_db, b, n_acc, kb)
                edits = edit_row(eids_ptr, evals_ptr, etab_ptr, b, pos, E, NG)
                race, sure = race_choice(
                    row, bx, bi, gap, m, s, draft, n_acc < kb, V, temp, stream, LOG_X, bits_row,
                    HAS_MASK, edits, HAS_EDITS,
                )
                recovered_or_bonus = _fused_race(
                    row, bits_row, race, sure, draft, n_acc, kb, V, temp, key, m, s,
                    tl.cdiv(V, TBLOCK), TBLOCK, TBLOCK, LOG_X, HAS_MASK, edits, HAS_EDITS,
                )
            else:
                recovered_or_bonus = _recovered_or_bonus(
                    logits_ptr, q_ptr, bits_ptr, race_rb_ptr, race_ri_ptr, race_pb_ptr,
                    race_pi_ptr, 0, n_acc, kb, V, temp, key, 0.0, 1.0, 0, 1.0, pos, NCHUNK, True,
                    HAS_Q, 1, 1, LOG_X, HAS_MASK, None, False, None, False,
                )
    if LP:
        _score_emitted(
            logits_ptr, stride_lb, stride_lk, draft_ptr, stride_db, bits_ptr, stride_mb, stride_mk,
            part_m_ptr, part_s_ptr, part_a_ptr, kappa_ptr, z_ptr, raw_m_ptr, raw_s_ptr, key_ptr,
            lp_ptr, top_ptr, ids_ptr, lstart_ptr, eids_ptr, evals_ptr, etab_ptr, b, kb, n_acc,
            recovered_or_bonus, V, K, NCHUNK, NROWS, E, NG, temp, HAS_FILTER, BLOCK_K, FLAT,
            HAS_MASK, HAS_EDITS, RAW, NTOP, NBLOCK,
        )
    _write_row(
        draft_ptr, stride_db, tokens_ptr, nacc_ptr, b, n_acc, recovered_or_bonus, V, K, BLOCK_K
    )
# fmt: on


@functools.cache
def _row_strategy_min_batch(device: torch.device) -> int:
    """Batch size from which one program per row keeps the device busy."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 64


def pick_strategy(batch_size: int, device: torch.device) -> str:
    """``"row"`` when the batch alone fills the device, else ``"split"``."""
    return "row" if batch_size >= _row_strategy_min_batch(device) else "split"


@dataclasses.dataclass(frozen=True)
class _Rows:
    """The input forms as kernel arguments: where position ``j`` of row ``b`` reads its ``[V]``
    rows (padded ``[B, *, V]`` tensors, or ``FLAT`` rows ``start[b] + j`` of ``[R, V]`` ones)."""

    logits: tuple  # (target_logits, stride_lb, stride_lk): [B, K+1, V], or FLAT [NROWS, V]
    q: tuple  # (draft_probs, stride_qb, stride_qk): [B, K, V], or FLAT [QROWS, V] (V_draft)
    bits: tuple  # (token_bitmask, stride_mb, stride_mk): int32 [B, K+1, W], or FLAT [NROWS, W]
    lstart: torch.Tensor  # [B] int64, FLAT only: logits_row_start
    qstart: torch.Tensor  # [B] int64, FLAT only: probs_row_start
    inv: torch.Tensor  # [V] int32, HAS_DRAFT_MAP only: draft_vocab_inv
    nrows: int  # NROWS (FLAT)
    qrows: int  # QROWS (FLAT with draft probabilities)
    flat: bool
    has_q: bool
    has_mask: bool
    has_map: bool


def _rows(
    target_logits,
    draft_probs,
    logits_row_start,
    probs_row_start,
    token_bitmask,
    placeholder,
    draft_vocab_inv=None,
) -> _Rows:
    """:class:`_Rows` of one call. A pointer a mode never reads still needs a tensor: the logits
    stand in for absent draft probabilities and an absent token bitmask, ``placeholder`` (a
    ``[B]`` tensor) for absent start rows and an absent ``draft_vocab_inv``. The bitmask rows
    follow the logits' (``FLAT``: row ``start[b] + j`` of ``[NROWS, W]``). With
    ``draft_vocab_inv`` the draft rows are ``V_draft`` wide: their strides are the tensor's."""
    flat = logits_row_start is not None
    has_q = draft_probs is not None
    has_mask = token_bitmask is not None
    has_map = has_q and draft_vocab_inv is not None
    q = draft_probs if has_q else target_logits  # never read when HAS_Q is false
    bits = token_bitmask if has_mask else target_logits  # never read when HAS_MASK is false
    if flat:  # position j of row b reads row start[b] + j: only the row stride counts
        logits = (target_logits, 0, target_logits.stride(0))
        q_args = (q, 0, q.stride(0) if has_q else 0)
        bits_args = (bits, 0, bits.stride(0) if has_mask else 0)
        lstart = logits_row_start
        qstart = probs_row_start if has_q else logits_row_start
    else:
        logits = (target_logits, target_logits.stride(0), target_logits.stride(1))
        q_args = (q, q.stride(0), q.stride(1)) if has_q else (q, 0, 0)
        bits_args = (bits, bits.stride(0), bits.stride(1)) if has_mask else (bits, 0, 0)
        lstart = qstart = placeholder  # never read when FLAT is false
    return _Rows(
        logits,
        q_args,
        bits_args,
        lstart,
        qstart,
        inv=draft_vocab_inv if has_map else placeholder,  # never read without HAS_DRAFT_MAP
        nrows=target_logits.shape[0] if flat else 0,
        qrows=q.shape[0] if flat and has_q else 0,
        flat=flat,
        has_q=has_q,
        has_mask=has_mask,
        has_map=has_map,
    )


@dataclasses.dataclass(frozen=True)
class _Logprobs:
    """The log-probability outputs of one call (``logprobs`` of :func:`verify`)."""

    processed: bool
    num_logprobs: int  # n
    logprobs: torch.Tensor  # [B, K+1] float32
    top: torch.Tensor  # [B, K+1, n] float32
    ids: torch.Tensor  # [B, K+1, n] int64

    @property
    def outputs(self) -> tuple:
        return self.logprobs, self.top, self.ids


@dataclasses.dataclass(frozen=True)
class _Args:
    """One call's kernel arguments; the properties give them in the kernels' groups."""

    rows: _Rows
    drafts: tuple  # (draft_tokens, stride_db): [B, K]
    num_draft_tokens: torch.Tensor  # [B]
    controls: RowControls  # [B] temperature, top_k, top_p, min_p, seeds and the filter flags
    edits: EditArgs  # the sparse logit edits (placeholders without)
    cfg: dict  # tile sizes: _common.launch_config(V)
    greedy_only: bool
    log_input: bool
    method: int  # METHODS[...]: the acceptance rule of the sampling rows
    race_in_stats: bool = True  # False: statistics only (the tree's split strategy)
    lp: "_Logprobs | None" = None  # the emitted positions' log-probabilities, if asked for

    @property
    def sizes(self) -> tuple:
        """``V, K, NCHUNK, NROWS`` (the kernels that read draft rows add ``QROWS``)."""
        vocab = self.rows.logits[0].shape[-1]
        return vocab, self.drafts[0].shape[1], self.cfg["NCHUNK"], self.rows.nrows

    @property
    def block_k(self) -> int:
        return triton.next_power_of_2(self.drafts[0].shape[1] + 1)

    @property
    def has_filter(self) -> bool:
        return self.controls.has_filter

    @property
    def edit_ptrs(self) -> tuple:
        """The edits' kernel arguments: ``eids_ptr, evals_ptr, etab_ptr``."""
        return self.edits.ids, self.edits.vals, self.edits.table

    @property
    def edit_sizes(self) -> tuple:
        """``E, NG``."""
        return self.edits.num_edits, self.edits.num_granules

    @property
    def fused_race(self) -> bool:
        """Does the statistics pass run the race too (sampling, one-hot drafts, no filter)?

        It compares tokens by their log-score margins, never by an absolute ``x - log E``
        (which at ``T = 1e-6``, ``x ~ 1e7``, rounds the noise away), and takes its winner only
        where the margin over every other token leaves no doubt; a near-tie races the row again
        (``_common.chunk_stats_race``): the same tokens as the race over the row."""
        return self.race_in_stats and not (self.greedy_only or self.rows.has_q or self.has_filter)

    @property
    def gather(self) -> bool:
        """Do the statistics passes gather filter candidates (sampling with top-k / top-p)?"""
        return self.has_filter and not self.greedy_only

    @property
    def layout(self) -> dict:
        """The layout constexprs every kernel takes."""
        return {
            "FLAT": self.rows.flat,
            "LOG_X": self.log_input,
            "HAS_MASK": self.rows.has_mask,
            "HAS_EDITS": self.edits.has_edits,
        }

    @property
    def lp_flags(self) -> dict:
        """The log-probability constexprs (all off without ``lp``)."""
        if self.lp is None:
            return {"LP": False, "RAW": False, "NTOP": 0, "NBLOCK": 1}
        n = self.lp.num_logprobs
        return {
            "LP": True,
            "RAW": not self.lp.processed,
            "NTOP": n,
            "NBLOCK": triton.next_power_of_2(max(n, 1)),
        }

    @property
    def lp_outs(self) -> tuple:
        """``lp_ptr, top_ptr, ids_ptr`` (the draft tokens stand in without ``lp``)."""
        if self.lp is None:
            return (self.drafts[0],) * 3
        return self.lp.logprobs, self.lp.top, self.lp.ids

    def tiles(self, *names) -> dict:
        """The tile-size constexprs ``names`` of :func:`_common.launch_config`."""
        return {name: self.cfg[name] for name in names}


# launch arguments in the kernel signature's groups, one line each: no reformatting
# fmt: off
def _launch_row(a: _Args, tokens, num_accepted):
    """The row strategy: one program per row walks its positions (:func:`_verify_row_kernel`)."""
    c = a.controls
    batch, k1 = tokens.shape
    cand = _candidates(batch, k1 + 1, a.cfg["CAP"] if a.gather else 0, tokens.device)
    launch(
        _verify_row_kernel, (tokens.shape[0],),
        *a.rows.logits,
        *a.drafts,
        *a.rows.q,
        *a.rows.bits,
        a.num_draft_tokens,
        c.temperature, c.top_k, c.top_p,
        c.seeds,
        tokens,
        num_accepted,
        a.rows.lstart, a.rows.qstart,
        cand.count,
        cand.ids, cand.x,
        c.min_p,
        *a.edit_ptrs,
        a.rows.inv,
        *a.lp_outs,
        *a.sizes, a.rows.qrows, *a.edit_sizes,
        GREEDY_ONLY=a.greedy_only, HAS_Q=a.rows.has_q, HAS_TOPK=c.has_top_k, HAS_TOPP=c.has_top_p,
        **a.tiles("CHUNK", "BLOCK", "TBLOCK", "NPIV"), BLOCK_K=a.block_k, **a.layout,
        METHOD=a.method, GATHER=a.gather, **a.tiles("CAP", "SB", "SW"),
        FUSED=a.fused_race and a.method == METHODS["token"], HAS_MINP=c.has_min_p,
        HAS_DRAFT_MAP=a.rows.has_map, **a.lp_flags, **WALK_COMPILE,
    )
# fmt: on


@dataclasses.dataclass(frozen=True)
class _Candidates:
    """The filters' candidate buffers (``_common.gather``): per position (split) or per row
    (row strategy, reused along the walk) ``CAP`` token ids and ``x``, a count per position,
    the split strategy's cutoff key and "filter from the buffer" flag per position. One-element
    placeholders when nothing is gathered."""

    count: torch.Tensor  # int32 [slots], zeroed (the split pivot kernel zeroes its own)
    ids: torch.Tensor  # int32 [buffers, CAP]
    x: torch.Tensor  # float32 [buffers, CAP]
    pivot: torch.Tensor  # int64 [slots]
    mode: torch.Tensor  # int32 [slots]


def _candidates(buffers: int, slots_per_buffer: int, cap: int, device) -> _Candidates:
    if cap == 0:
        one = torch.zeros(1, dtype=torch.int32, device=device)
        return _Candidates(one, one, one.float(), one.long(), one)
    slots = buffers * slots_per_buffer
    return _Candidates(
        count=torch.zeros(slots, dtype=torch.int32, device=device),
        ids=torch.empty(buffers, cap, dtype=torch.int32, device=device),
        x=torch.empty(buffers, cap, dtype=torch.float32, device=device),
        pivot=torch.empty(slots, dtype=torch.int64, device=device),
        mode=torch.empty(slots, dtype=torch.int32, device=device),
    )


@dataclasses.dataclass(frozen=True)
class _Partials:
    """The split strategy's workspaces, one entry per position (``[B*(K+1)]``) or per position
    and chunk (``[B*(K+1), NCHUNK]``)."""

    stats: tuple  # [B*(K+1), NCHUNK] chunk max, sum-exp (float32), first argmax (int32)
    filter: tuple  # [B*(K+1)] key threshold (int64), kept mass (float32)
    # [B*(K+1), NCHUNK] residual best, token, plain best, token, block residual mass
    race: tuple  # (f32, i32, f32, i32, f32)
    cand: _Candidates  # [B*(K+1)] buffers (or placeholders without a filter)
    # [B*(K+1), NCHUNK] raw max, sum-exp (f32), [B*(K+1), NCHUNK, n] top-n keys (int64):
    # logprobs only (placeholders otherwise)
    lp: tuple = ()


def _partials(positions: int, nchunk: int, device, cap: int = 0, lp=None) -> _Partials:
    def empty(*shape, dtype):
        return torch.empty(shape, dtype=dtype, device=device)

    f32, i32 = torch.float32, torch.int32
    return _Partials(
        stats=(
            empty(positions, nchunk, dtype=f32),
            empty(positions, nchunk, dtype=f32),
            empty(positions, nchunk, dtype=i32),
        ),
        filter=(empty(positions, dtype=torch.int64), empty(positions, dtype=f32)),
        race=tuple(empty(positions, nchunk, dtype=dt) for dt in (f32, i32, f32, i32, f32)),
        cand=_candidates(positions, 1, cap, device),
        lp=_lp_partials(positions, nchunk, device, lp),
    )


def _lp_partials(positions: int, nchunk: int, device, lp) -> tuple:
    """The log-probabilities' partials: raw chunk statistics (``"raw"``) and the chunks' top-n
    keys; one-element placeholders for what is not asked for."""
    one = torch.zeros(1, dtype=torch.float32, device=device)
    raw = lp is not None and not lp.processed
    shape = (positions, nchunk)
    raw_m = torch.empty(shape, dtype=torch.float32, device=device) if raw else one
    raw_s = torch.empty(shape, dtype=torch.float32, device=device) if raw else one
    n = 0 if lp is None else lp.num_logprobs
    keys = torch.empty((*shape, n), dtype=torch.int64, device=device) if n else one.long()
    return raw_m, raw_s, keys


# launch arguments in the kernel signature's groups, one line each: no reformatting
# fmt: off
def _launch_split_pivot(a: _Args, parts: _Partials, positions: int):
    c = a.controls
    vocab, k, _, nrows = a.sizes
    launch(
        _split_pivot_kernel, (positions,),
        *a.rows.logits,
        *a.rows.bits,
        a.num_draft_tokens, c.temperature, c.top_k, c.top_p,
        parts.cand.pivot, parts.cand.count,
        a.rows.lstart,
        c.min_p,
        *a.edit_ptrs,
        vocab, k, nrows, *a.edit_sizes,
        HAS_TOPK=c.has_top_k, HAS_TOPP=c.has_top_p, **a.layout,
        **a.tiles("CAP", "SB", "SW", "NPIV"), HAS_MINP=c.has_min_p, **SPLIT_COMPILE,
    )


def _launch_split_stats(a: _Args, parts: _Partials, positions: int):
    launch(
        _split_stats_kernel, (positions, a.cfg["NCHUNK"]),
        *a.rows.logits,
        *a.rows.bits,
        a.num_draft_tokens, a.controls.temperature,
        *parts.stats,
        a.rows.lstart,
        parts.cand.pivot, parts.cand.count,
        parts.cand.ids, parts.cand.x,
        *a.drafts, a.controls.seeds,
        *parts.race[:3],
        *a.edit_ptrs,
        *parts.lp,
        *a.sizes, *a.edit_sizes,
        GREEDY_ONLY=a.greedy_only, **a.tiles("CHUNK", "BLOCK"), **a.layout, GATHER=a.gather,
        **a.tiles("CAP"), FUSED=a.fused_race, **a.lp_flags, **COMPILE,
    )


def _launch_split_thresholds(a: _Args, parts: _Partials, positions: int):
    c = a.controls
    launch(
        _split_threshold_kernel, (positions,),
        *a.rows.logits,
        *a.rows.bits,
        a.num_draft_tokens, c.temperature, c.top_k, c.top_p,
        *parts.stats,
        *parts.filter,
        a.rows.lstart,
        parts.cand.pivot, parts.cand.count,
        parts.cand.ids, parts.cand.x,
        parts.cand.mode,
        c.min_p,
        *a.edit_ptrs,
        *a.sizes, *a.edit_sizes,
        HAS_TOPK=c.has_top_k, HAS_TOPP=c.has_top_p, **a.tiles("NPIV", "CHUNK", "TBLOCK"),
        **a.layout, **a.tiles("CAP"), HAS_MINP=c.has_min_p, **THRESHOLD_COMPILE,
    )


def _launch_split_race(a: _Args, parts: _Partials, positions: int):
    launch(
        _split_race_kernel, (positions, a.cfg["NCHUNK"]),
        *a.rows.logits,
        *a.drafts,
        *a.rows.q,
        *a.rows.bits,
        a.num_draft_tokens, a.controls.temperature, a.controls.seeds,
        *parts.stats,
        *parts.filter,
        *parts.race,
        a.rows.lstart, a.rows.qstart,
        parts.cand.mode, parts.cand.count,
        parts.cand.ids, parts.cand.x,
        *a.edit_ptrs,
        a.rows.inv,
        *a.sizes, a.rows.qrows, *a.edit_sizes,
        HAS_Q=a.rows.has_q, HAS_FILTER=a.has_filter, **a.tiles("CHUNK", "BLOCK"), **a.layout,
        METHOD=a.method, **a.tiles("CAP"), HAS_DRAFT_MAP=a.rows.has_map, **THRESHOLD_COMPILE,
    )


def _launch_split_decide(a: _Args, parts: _Partials, tokens, num_accepted):
    launch(
        _split_decide_kernel, (tokens.shape[0],),
        *a.rows.logits,
        *a.drafts,
        *a.rows.q,
        *a.rows.bits,
        a.num_draft_tokens, a.controls.temperature, a.controls.seeds,
        *parts.stats,
        *parts.filter,
        *parts.race,
        tokens,
        num_accepted,
        a.rows.lstart, a.rows.qstart,
        *a.edit_ptrs,
        a.rows.inv,
        *parts.lp,
        *a.lp_outs,
        *a.sizes, a.rows.qrows, *a.edit_sizes,
        GREEDY_ONLY=a.greedy_only, HAS_Q=a.rows.has_q, HAS_FILTER=a.has_filter, BLOCK_K=a.block_k,
        **a.layout, METHOD=a.method, FUSED=a.fused_race, **a.tiles("TBLOCK"),
        HAS_DRAFT_MAP=a.rows.has_map, **a.lp_flags, **SPLIT_COMPILE,
    )
# fmt: on


def split_statistics(a: _Args, positions: int, device) -> _Partials:
    """The split strategy's statistics of every position (``B * (K+1)``), each row spread over
    ``NCHUNK`` programs: the chunk partials (max, sum of exp, first argmax) and, with a filter,
    each position's threshold and kept mass from its candidate buffer (or the search). Also
    what the tree's walk reads instead of the rows (:mod:`specdec_kernels.ops.verify_tree`)."""
    parts = _partials(positions, a.cfg["NCHUNK"], device, a.cfg["CAP"] if a.gather else 0, a.lp)
    if a.gather:
        _launch_split_pivot(a, parts, positions)
    _launch_split_stats(a, parts, positions)
    if a.has_filter and not a.greedy_only:
        _launch_split_thresholds(a, parts, positions)
    return parts


def _launch_split(a: _Args, tokens, num_accepted):
    """The split strategy: statistics, then (sampling) thresholds and race, then the decisions."""
    parts = split_statistics(a, tokens.numel(), tokens.device)  # B * (K+1) positions
    if not (a.greedy_only or a.fused_race):
        _launch_split_race(a, parts, tokens.numel())
    _launch_split_decide(a, parts, tokens, num_accepted)


_STRATEGIES = {"row": _launch_row, "split": _launch_split}


def verify(
    target_logits,
    draft_tokens,
    draft_probs,
    num_draft_tokens,
    temperature,
    top_k,
    top_p,
    seeds,
    *,
    greedy_only: bool,
    strategy: str | None = None,
    logits_row_start=None,
    probs_row_start=None,
    log_input: bool = False,
    method: str = "token",
    token_bitmask=None,
    min_p=None,
    edit_ids=None,
    edit_vals=None,
    draft_vocab_inv=None,
    logprobs=None,
):
    """Launch the verification kernels; see :func:`specdec_kernels.verify_sampling`.

    Inputs are already checked: ``target_logits [B, K+1, V]`` (last stride 1), ``draft_tokens
    [B, K]``, ``draft_probs [B, K, V]`` (last stride 1) or None, ``num_draft_tokens [B]``,
    ``temperature [B]`` float32, ``top_k [B]`` int64 or None, ``top_p [B]`` float32 or None,
    ``seeds [B]`` int64. ``greedy_only`` ignores the sampling arguments (they may be None).
    Flattened layout: with ``logits_row_start [B]`` int64, ``target_logits`` is ``[R, V]`` and
    position ``j`` of row ``b`` reads row ``logits_row_start[b] + j`` (clamped into ``[0, R)``);
    ``probs_row_start [B]`` does the same for a ``[R', V]`` ``draft_probs``. ``log_input``: the
    inputs are probabilities (``x = log p``; temperature must be 1 or 0). ``method``: the
    acceptance rule of the sampling rows, ``"token"`` or ``"block"``
    (:mod:`specdec_kernels.reference.verify_block`). ``token_bitmask``: None or int32 with the
    logits' row layout (``[B, K+1, W]``, or ``[R, W]`` read through ``logits_row_start``); a
    disallowed token is a ``-inf`` logit. ``min_p``: None or ``[B]`` float32 (0: off; greedy
    rows ignore it): after top-k / top-p keep the tokens with ``exp(x - max x) >= min_p``.
    ``edit_ids [B, E]`` int32 (sorted, unique, padded with ``V``) and ``edit_vals [B, K+1, E]``
    float32, both or neither (never with ``log_input``): the logit of token ``edit_ids[b, e]`` at
    position ``j`` of row ``b`` (flat layout: row ``logits_row_start[b] + j``) is
    ``edit_vals[b, j, e]``, before the bitmask, the temperature and the filters (API.md
    section 10); nothing ``[B, K+1, V]`` is written. ``draft_vocab_inv``: None or ``[V]`` int32
    (a reduced draft vocabulary, ``draft_vocab_map``): ``draft_probs`` is then ``[B, K, V_draft]``
    (flat: ``[R', V_draft]``) and ``q(t) = draft_probs[..., inv[t]]``, 0 where ``inv[t] < 0``,
    read through the index (``_common.mapped_q``): nothing ``[B, K, V]`` is written.
    ``logprobs``: None or ``(processed, n)``: the same pass also scores what it emits
    (:mod:`specdec_kernels.ops.logprobs`'s numbers, ``torch.ops.specdec.emitted_logprobs``'s
    contract; not with ``log_input``).
    Returns ``(tokens [B, K+1] int64, num_accepted [B] int64)``, with ``logprobs`` also
    ``(logprobs [B, K+1] float32, top_logprobs [B, K+1, n] float32, top_ids [B, K+1, n]
    int64)``.
    """
    batch, k = draft_tokens.shape
    device = target_logits.device
    tokens = torch.empty((batch, k + 1), dtype=torch.int64, device=device)
    num_accepted = torch.empty((batch,), dtype=torch.int64, device=device)
    lp = None
    if logprobs is not None:
        if log_input:
            raise ValueError("logprobs are scored from logits, not from log_input probabilities")
        processed, n = bool(logprobs[0]), int(logprobs[1])
        lp = _Logprobs(
            processed,
            n,
            torch.empty((batch, k + 1), dtype=torch.float32, device=device),
            torch.empty((batch, k + 1, n), dtype=torch.float32, device=device),
            torch.empty((batch, k + 1, n), dtype=torch.int64, device=device),
        )
    if batch == 0:
        return (tokens, num_accepted) if lp is None else (tokens, num_accepted, lp.outputs)
    strategy = strategy or pick_strategy(batch, device)
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy must be 'row', 'split' or None, got {strategy!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {method!r}")
    args = _Args(
        rows=_rows(
            target_logits,
            draft_probs,
            logits_row_start,
            probs_row_start,
            token_bitmask,
            num_draft_tokens,
            draft_vocab_inv,
        ),
        drafts=(draft_tokens, draft_tokens.stride(0)),
        num_draft_tokens=num_draft_tokens,
        controls=row_controls(
            num_draft_tokens, temperature, top_k, top_p, seeds, greedy_only=greedy_only, min_p=min_p
        ),
        edits=edit_args(edit_ids, edit_vals, target_logits.shape[-1], num_draft_tokens),
        cfg=launch_config(target_logits.shape[-1]),
        greedy_only=greedy_only,
        log_input=log_input,
        method=METHODS[method],
        lp=lp,
    )
    _STRATEGIES[strategy](args, tokens, num_accepted)
    if lp is None:
        return tokens, num_accepted
    return tokens, num_accepted, lp.outputs
