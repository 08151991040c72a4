"""Fused verification kernels (sampling and greedy) and their launcher.

One kernel family serves both :func:`specdec_kernels.verify_sampling` and, with ``GREEDY_ONLY``,
:func:`specdec_kernels.verify_greedy`. Logits are read in chunks of ``CHUNK`` tokens; per chunk
the max of ``x = logit / T``, the sum of ``exp(x - max)`` and the first argmax are computed by one
helper and merged in chunk order. Two launch strategies use that helper:

``row``   grid ``(B,)``: a program walks its row's positions in order and stops at the first
          rejection, so logits rows after it are never read. Best when B fills the GPU.
``split`` grid ``(B * (K+1), NCHUNK)``: every position's vocabulary is split across programs
          for the statistics and the resampling race; with top-k/top-p one ``(B * (K+1),)``
          launch in between runs each position's threshold search; a small ``(B,)`` kernel makes
          the decisions from the partials. Best for small batches. At most 4 launches.

Both merge the same partial values in the same order, so their results are identical. Nothing is
materialised beyond ``[B, K+1, NCHUNK]`` partials; the only large cost is reading logits (and the
draft probabilities of the rejected position).

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
from the split partials), the decision :func:`_decide` shared by both strategies (the acceptance
rule :func:`_accepts`, then at the stop position the race :func:`_recovered_or_bonus`), and the
row's output (:func:`_write_row`). Every logit is read through ``_common.load_x``.
"""

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from specdec_kernels.ops._common import (
    COMPILE,
    KEY_FLOOR,
    PURPOSE_SAMPLE,
    WALK_COMPILE,
    RowControls,
    accept_draft,
    chunk_race,
    chunk_stats,
    launch,
    launch_config,
    merge_best,
    merge_stats,
    position_stats,
    row_controls,
    row_count,
    row_filters,
    row_key,
    row_sampling,
    row_temperature,
    stream_key,
    thresholds,
)


def compile_options(kernel) -> dict:
    """The compile options a kernel of this module is launched with (for the AOT checks)."""
    return WALK_COMPILE if kernel is _verify_row_kernel else COMPILE


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
             draft, j, kb, V, temp, greedy, key, m, a, z, kappa,
             GREEDY_ONLY: tl.constexpr, HAS_Q: tl.constexpr, LOG_X: tl.constexpr):
    """The acceptance rule: is the draft at position ``j < k_b`` accepted? A greedy row accepts
    the argmax ``a``; a sampling row accepts when ``u * q(x) < p(x)`` (``_common.accept_draft``).
    The bonus position ``j == k_b`` never accepts."""
    accepted = draft == a
    if not GREEDY_ONLY:
        if (greedy == 0) & (j < kb):
            accepted = accept_draft(
                row_ptr, q_row, draft, V, temp, m, z, kappa, key, j, HAS_Q, LOG_X
            )
    return accepted & (j < kb)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _recovered_or_bonus(row_ptr,  # [V] logits row of the stop position j (unless PARTIALS)
                        q_row,  # [V] its draft probabilities (if HAS_Q, unless PARTIALS)
                        race_rb_ptr, race_ri_ptr,  # [B*(K+1), NCHUNK] residual race (PARTIALS)
                        race_pb_ptr, race_pi_ptr,  # [B*(K+1), NCHUNK] plain race (PARTIALS)
                        draft, j, kb, V, temp, key, m, z, kappa, pos, NCHUNK,
                        PARTIALS: tl.constexpr, HAS_Q: tl.constexpr, CHUNK: tl.constexpr,
                        BLOCK: tl.constexpr, LOG_X: tl.constexpr):
    """The token a sampling row emits at its stop position ``j``: the recovered token (the race
    over ``max(0, p - q)``) at a rejected draft, else the bonus token (the race over ``p``). The
    chunks' race winners are merged in chunk order; they are run here over the row, or with
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
                tl.where(j < kb, V, 0), HAS_Q, CHUNK, BLOCK, LOG_X,
            )
        r_best, r_idx = merge_best(r_best, r_idx, rb, ri)
        p_best, p_idx = merge_best(p_best, p_idx, pb, pi)
    return tl.where((j < kb) & (r_best > 0.0), r_idx, p_idx)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _decide(row_ptr,  # [V] logits row of position j
            q_row,  # [V] its draft probabilities (if HAS_Q)
            race_rb_ptr, race_ri_ptr,  # [B*(K+1), NCHUNK] residual race partials (PARTIALS)
            race_pb_ptr, race_pi_ptr,  # [B*(K+1), NCHUNK] plain race partials (PARTIALS)
            draft, j, kb, V, temp, greedy, key, m, a, z, kappa, pos, NCHUNK,
            GREEDY_ONLY: tl.constexpr, HAS_Q: tl.constexpr, PARTIALS: tl.constexpr,
            CHUNK: tl.constexpr, BLOCK: tl.constexpr, LOG_X: tl.constexpr):
    """(is the draft at position ``j`` accepted, the token emitted at ``j`` if not): the argmax
    ``a`` for a greedy row, :func:`_recovered_or_bonus` for a sampling one. Both strategies
    decide here; they differ only in where the race winners come from (``PARTIALS``)."""
    accepted = _accepts(
        row_ptr, q_row, draft, j, kb, V, temp, greedy, key, m, a, z, kappa, GREEDY_ONLY, HAS_Q,
        LOG_X,
    )
    token = a
    if not GREEDY_ONLY:
        if (accepted == 0) & (greedy == 0):
            token = _recovered_or_bonus(
                row_ptr, q_row, race_rb_ptr, race_ri_ptr, race_pb_ptr, race_pi_ptr, draft, j, kb,
                V, temp, key, m, z, kappa, pos, NCHUNK, PARTIALS, HAS_Q, CHUNK, BLOCK, LOG_X,
            )
    return accepted, token
# fmt: on


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
def _verify_row_kernel(
    logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits, vocab stride 1
    draft_ptr, stride_db,  # [B, K] draft token ids
    q_ptr, stride_qb, stride_qk,  # [B, K, V] draft probabilities (unused without HAS_Q)
    nd_ptr,  # [B] num_draft_tokens
    temp_ptr, topk_ptr, topp_ptr,  # [B] temperature, top_k, top_p (used as flagged)
    seed_ptr,  # [B] int64 seeds
    tokens_ptr,  # [B, K+1] int64 out: emitted tokens, -1 padded
    nacc_ptr,  # [B] int64 out: num_accepted
    lstart_ptr, qstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V] / [QROWS, V]
    V, K, NCHUNK, NROWS, QROWS,
    GREEDY_ONLY: tl.constexpr, HAS_Q: tl.constexpr, HAS_TOPK: tl.constexpr,
    HAS_TOPP: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, TBLOCK: tl.constexpr,
    NPIV: tl.constexpr, BLOCK_K: tl.constexpr, FLAT: tl.constexpr, LOG_X: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kb = row_count(nd_ptr, b, 0, K)
    temp, greedy, key = row_sampling(temp_ptr, seed_ptr, b, GREEDY_ONLY)
    top_k, top_p = row_filters(topk_ptr, topp_ptr, b, HAS_TOPK, HAS_TOPP)
    j = 0
    recovered_or_bonus = 0
    go_on = kb >= 0
    for _ in range(0, K + 1):  # each position accepts (and moves on) or stops the row
        if go_on:
            row = _row(logits_ptr, lstart_ptr, b, j.to(tl.int64), stride_lb, stride_lk, NROWS, FLAT)
            q_row = _row(q_ptr, qstart_ptr, b, j.to(tl.int64), stride_qb, stride_qk, QROWS, FLAT)
            m, a, kappa, z = position_stats(
                row, V, temp, greedy, top_k, top_p, not GREEDY_ONLY, HAS_TOPK, HAS_TOPP, NPIV,
                CHUNK, BLOCK, TBLOCK, NCHUNK, LOG_X,
            )
            draft = _draft(draft_ptr, stride_db, b, j, kb)
            accepted, token = _decide(
                row, q_row, row, row, row, row,  # no race partials: the race runs over the row
                draft, j, kb, V, temp, greedy, key, m, a, z, kappa, 0, NCHUNK, GREEDY_ONLY, HAS_Q,
                False, CHUNK, BLOCK, LOG_X,
            )
            if accepted:
                j += 1
            else:
                recovered_or_bonus = token
                go_on = False
    _write_row(draft_ptr, stride_db, tokens_ptr, nacc_ptr, b, j, recovered_or_bonus, V, K, BLOCK_K)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _split_stats_kernel(
    logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits, vocab stride 1
    nd_ptr, temp_ptr,  # [B] num_draft_tokens, temperature
    part_m_ptr, part_s_ptr, part_a_ptr,  # [B*(K+1), NCHUNK] out: chunk max, sum-exp, argmax
    lstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V]
    V, K, NCHUNK, NROWS,
    GREEDY_ONLY: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, FLAT: tl.constexpr,
    LOG_X: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    b = pid // (K + 1)
    j = pid % (K + 1)
    kb = row_count(nd_ptr, b, 0, K)
    if j <= kb:
        temp, greedy = row_temperature(temp_ptr, b, GREEDY_ONLY)
        row = _row(logits_ptr, lstart_ptr, b, j, stride_lb, stride_lk, NROWS, FLAT)
        m, s, a = chunk_stats(row, c * CHUNK, V, temp, not GREEDY_ONLY, CHUNK, BLOCK, LOG_X)
        out = pid * NCHUNK + c
        tl.store(part_m_ptr + out, m)
        tl.store(part_s_ptr + out, s)
        tl.store(part_a_ptr + out, a)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _split_threshold_kernel(
    logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits, vocab stride 1
    nd_ptr, temp_ptr, topk_ptr, topp_ptr,  # [B] num_draft_tokens, temperature, top_k, top_p
    part_m_ptr, part_s_ptr, part_a_ptr,  # [B*(K+1), NCHUNK] chunk statistics
    kappa_ptr, z_ptr,  # [B*(K+1)] out: key threshold, kept mass
    lstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V]
    V, K, NCHUNK, NROWS,
    HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr, NPIV: tl.constexpr, CHUNK: tl.constexpr,
    TBLOCK: tl.constexpr, FLAT: tl.constexpr, LOG_X: tl.constexpr,
):
    """The top-k / top-p threshold of one position, in one program: the same search as the row
    strategy (``_common.thresholds``, chunk partials added in chunk order) started from the
    merged chunk statistics, so both strategies find the same ``kappa`` and ``Z``. One launch
    for every filter and every round (a launch per round cost 36 launches)."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // (K + 1)
    j = pid % (K + 1)
    kb = row_count(nd_ptr, b, 0, K)
    temp, greedy = row_temperature(temp_ptr, b, False)
    big_m, big_s, big_a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pid * NCHUNK, NCHUNK)
    kappa = tl.full([], KEY_FLOOR, tl.int64)
    z = big_s
    if (j <= kb) & (greedy == 0):
        top_k, top_p = row_filters(topk_ptr, topp_ptr, b, HAS_TOPK, HAS_TOPP)
        row = _row(logits_ptr, lstart_ptr, b, j, stride_lb, stride_lk, NROWS, FLAT)
        kappa, z = thresholds(
            row, V, temp, big_m, big_s, top_k, top_p, HAS_TOPK, HAS_TOPP, NPIV, CHUNK, TBLOCK,
            NCHUNK, LOG_X,
        )
    tl.store(kappa_ptr + pid, kappa)
    tl.store(z_ptr + pid, z)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _split_race_kernel(
    logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits, vocab stride 1
    draft_ptr, stride_db,  # [B, K] draft token ids
    q_ptr, stride_qb, stride_qk,  # [B, K, V] draft probabilities (unused without HAS_Q)
    nd_ptr, temp_ptr, seed_ptr,  # [B] num_draft_tokens, temperature, int64 seeds
    part_m_ptr, part_s_ptr, part_a_ptr,  # [B*(K+1), NCHUNK] chunk statistics
    kappa_ptr, z_ptr,  # [B*(K+1)] key threshold, kept mass
    race_rb_ptr, race_ri_ptr,  # [B*(K+1), NCHUNK] out: residual race best score, token
    race_pb_ptr, race_pi_ptr,  # [B*(K+1), NCHUNK] out: plain race best score, token
    lstart_ptr, qstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V] / [QROWS, V]
    V, K, NCHUNK, NROWS, QROWS,
    HAS_Q: tl.constexpr, HAS_FILTER: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
    FLAT: tl.constexpr, LOG_X: tl.constexpr,
):
    """One chunk's race winners of one position (what :func:`_recovered_or_bonus` merges)."""
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
        rb, ri, pb, pi = chunk_race(
            row, q_row, draft, c * CHUNK, V, temp, big_m, z, kappa, stream,
            tl.where(j < kb, V, 0), HAS_Q, CHUNK, BLOCK, LOG_X,
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
def _split_decide_kernel(
    logits_ptr, stride_lb, stride_lk,  # [B, K+1, V] target logits, vocab stride 1
    draft_ptr, stride_db,  # [B, K] draft token ids
    q_ptr, stride_qb, stride_qk,  # [B, K, V] draft probabilities (unused without HAS_Q)
    nd_ptr, temp_ptr, seed_ptr,  # [B] num_draft_tokens, temperature, int64 seeds
    part_m_ptr, part_s_ptr, part_a_ptr,  # [B*(K+1), NCHUNK] chunk statistics
    kappa_ptr, z_ptr,  # [B*(K+1)] key threshold, kept mass
    race_rb_ptr, race_ri_ptr,  # [B*(K+1), NCHUNK] residual race partials
    race_pb_ptr, race_pi_ptr,  # [B*(K+1), NCHUNK] plain race partials
    tokens_ptr,  # [B, K+1] int64 out: emitted tokens, -1 padded
    nacc_ptr,  # [B] int64 out: num_accepted
    lstart_ptr, qstart_ptr,  # [B] FLAT only: row of position 0 in [NROWS, V] / [QROWS, V]
    V, K, NCHUNK, NROWS, QROWS,
    GREEDY_ONLY: tl.constexpr, HAS_Q: tl.constexpr, HAS_FILTER: tl.constexpr,
    BLOCK_K: tl.constexpr, FLAT: tl.constexpr, LOG_X: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kb = row_count(nd_ptr, b, 0, K)
    temp, greedy, key = row_sampling(temp_ptr, seed_ptr, b, GREEDY_ONLY)
    j = 0
    recovered_or_bonus = 0
    go_on = kb >= 0
    while go_on:
        pos = b * (K + 1) + j
        m, s, a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pos * NCHUNK, NCHUNK)
        kappa, z = _filter_state(kappa_ptr, z_ptr, pos, s, HAS_FILTER)
        jj = j.to(tl.int64)
        row = _row(logits_ptr, lstart_ptr, b, jj, stride_lb, stride_lk, NROWS, FLAT)
        q_row = _row(q_ptr, qstart_ptr, b, jj, stride_qb, stride_qk, QROWS, FLAT)
        draft = _draft(draft_ptr, stride_db, b, j, kb)
        accepted, token = _decide(
            row, q_row, race_rb_ptr, race_ri_ptr, race_pb_ptr, race_pi_ptr,
            draft, j, kb, V, temp, greedy, key, m, a, z, kappa, pos, NCHUNK, GREEDY_ONLY, HAS_Q,
            True, 1, 1, LOG_X,  # CHUNK, BLOCK: unused, the race winners are the partials
        )
        if accepted:
            j += 1
        else:
            recovered_or_bonus = token
            go_on = False
    _write_row(draft_ptr, stride_db, tokens_ptr, nacc_ptr, b, j, recovered_or_bonus, V, K, BLOCK_K)
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
    q: tuple  # (draft_probs, stride_qb, stride_qk): [B, K, V], or FLAT [QROWS, V]
    lstart: torch.Tensor  # [B] int64, FLAT only: logits_row_start
    qstart: torch.Tensor  # [B] int64, FLAT only: probs_row_start
    nrows: int  # NROWS (FLAT)
    qrows: int  # QROWS (FLAT with draft probabilities)
    flat: bool
    has_q: bool


def _rows(target_logits, draft_probs, logits_row_start, probs_row_start, placeholder) -> _Rows:
    """:class:`_Rows` of one call. A pointer a mode never reads still needs a tensor: the logits
    stand in for absent draft probabilities, ``placeholder`` (a ``[B]`` tensor) for absent start
    rows."""
    flat = logits_row_start is not None
    has_q = draft_probs is not None
    q = draft_probs if has_q else target_logits  # never read when HAS_Q is false
    if flat:  # position j of row b reads row start[b] + j: only the row stride counts
        logits = (target_logits, 0, target_logits.stride(0))
        q_args = (q, 0, q.stride(0) if has_q else 0)
        lstart = logits_row_start
        qstart = probs_row_start if has_q else logits_row_start
    else:
        logits = (target_logits, target_logits.stride(0), target_logits.stride(1))
        q_args = (q, q.stride(0), q.stride(1)) if has_q else (q, 0, 0)
        lstart = qstart = placeholder  # never read when FLAT is false
    return _Rows(
        logits,
        q_args,
        lstart,
        qstart,
        nrows=target_logits.shape[0] if flat else 0,
        qrows=q.shape[0] if flat and has_q else 0,
        flat=flat,
        has_q=has_q,
    )


@dataclasses.dataclass(frozen=True)
class _Args:
    """One call's kernel arguments; the properties give them in the kernels' groups."""

    rows: _Rows
    drafts: tuple  # (draft_tokens, stride_db): [B, K]
    num_draft_tokens: torch.Tensor  # [B]
    controls: RowControls  # [B] temperature, top_k, top_p, seeds and the filter flags
    cfg: dict  # tile sizes: _common.launch_config(V)
    greedy_only: bool
    log_input: bool

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
        return self.controls.has_top_k or self.controls.has_top_p

    @property
    def layout(self) -> dict:
        """The layout constexprs every kernel takes."""
        return {"FLAT": self.rows.flat, "LOG_X": self.log_input}

    def tiles(self, *names) -> dict:
        """The tile-size constexprs ``names`` of :func:`_common.launch_config`."""
        return {name: self.cfg[name] for name in names}


# launch arguments in the kernel signature's groups, one line each: no reformatting
# fmt: off
def _launch_row(a: _Args, tokens, num_accepted):
    """The row strategy: one program per row walks its positions (:func:`_verify_row_kernel`)."""
    c = a.controls
    launch(
        _verify_row_kernel, (tokens.shape[0],),
        *a.rows.logits,
        *a.drafts,
        *a.rows.q,
        a.num_draft_tokens,
        c.temperature, c.top_k, c.top_p,
        c.seeds,
        tokens,
        num_accepted,
        a.rows.lstart, a.rows.qstart,
        *a.sizes, a.rows.qrows,
        GREEDY_ONLY=a.greedy_only, HAS_Q=a.rows.has_q, HAS_TOPK=c.has_top_k, HAS_TOPP=c.has_top_p,
        **a.tiles("CHUNK", "BLOCK", "TBLOCK", "NPIV"), BLOCK_K=a.block_k, **a.layout,
        **WALK_COMPILE,
    )
# fmt: on


@dataclasses.dataclass(frozen=True)
class _Partials:
    """The split strategy's workspaces, one entry per position (``[B*(K+1)]``) or per position
    and chunk (``[B*(K+1), NCHUNK]``)."""

    stats: tuple  # [B*(K+1), NCHUNK] chunk max, sum-exp (float32), first argmax (int32)
    filter: tuple  # [B*(K+1)] key threshold (int64), kept mass (float32)
    race: tuple  # [B*(K+1), NCHUNK] residual best, token, plain best, token (f32, i32, f32, i32)


def _partials(positions: int, nchunk: int, device) -> _Partials:
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
        race=tuple(empty(positions, nchunk, dtype=dt) for dt in (f32, i32, f32, i32)),
    )


# launch arguments in the kernel signature's groups, one line each: no reformatting
# fmt: off
def _launch_split_stats(a: _Args, parts: _Partials, positions: int):
    launch(
        _split_stats_kernel, (positions, a.cfg["NCHUNK"]),
        *a.rows.logits,
        a.num_draft_tokens, a.controls.temperature,
        *parts.stats,
        a.rows.lstart,
        *a.sizes,
        GREEDY_ONLY=a.greedy_only, **a.tiles("CHUNK", "BLOCK"), **a.layout, **COMPILE,
    )


def _launch_split_thresholds(a: _Args, parts: _Partials, positions: int):
    c = a.controls
    launch(
        _split_threshold_kernel, (positions,),
        *a.rows.logits,
        a.num_draft_tokens, c.temperature, c.top_k, c.top_p,
        *parts.stats,
        *parts.filter,
        a.rows.lstart,
        *a.sizes,
        HAS_TOPK=c.has_top_k, HAS_TOPP=c.has_top_p, **a.tiles("NPIV", "CHUNK", "TBLOCK"),
        **a.layout, **COMPILE,
    )


def _launch_split_race(a: _Args, parts: _Partials, positions: int):
    launch(
        _split_race_kernel, (positions, a.cfg["NCHUNK"]),
        *a.rows.logits,
        *a.drafts,
        *a.rows.q,
        a.num_draft_tokens, a.controls.temperature, a.controls.seeds,
        *parts.stats,
        *parts.filter,
        *parts.race,
        a.rows.lstart, a.rows.qstart,
        *a.sizes, a.rows.qrows,
        HAS_Q=a.rows.has_q, HAS_FILTER=a.has_filter, **a.tiles("CHUNK", "BLOCK"), **a.layout,
        **COMPILE,
    )


def _launch_split_decide(a: _Args, parts: _Partials, tokens, num_accepted):
    launch(
        _split_decide_kernel, (tokens.shape[0],),
        *a.rows.logits,
        *a.drafts,
        *a.rows.q,
        a.num_draft_tokens, a.controls.temperature, a.controls.seeds,
        *parts.stats,
        *parts.filter,
        *parts.race,
        tokens,
        num_accepted,
        a.rows.lstart, a.rows.qstart,
        *a.sizes, a.rows.qrows,
        GREEDY_ONLY=a.greedy_only, HAS_Q=a.rows.has_q, HAS_FILTER=a.has_filter, BLOCK_K=a.block_k,
        **a.layout, **COMPILE,
    )
# fmt: on


def _launch_split(a: _Args, tokens, num_accepted):
    """The split strategy: statistics, then (sampling) thresholds and race, then the decisions."""
    positions = tokens.numel()  # B * (K+1)
    parts = _partials(positions, a.cfg["NCHUNK"], tokens.device)
    _launch_split_stats(a, parts, positions)
    if not a.greedy_only:
        if a.has_filter:
            _launch_split_thresholds(a, parts, positions)
        _launch_split_race(a, parts, positions)
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
):
    """Launch the verification kernels; see :func:`specdec_kernels.verify_sampling`.

    Inputs are already checked: ``target_logits [B, K+1, V]`` (last stride 1), ``draft_tokens
    [B, K]``, ``draft_probs [B, K, V]`` (last stride 1) or None, ``num_draft_tokens [B]``,
    ``temperature [B]`` float32, ``top_k [B]`` int64 or None, ``top_p [B]`` float32 or None,
    ``seeds [B]`` int64. ``greedy_only`` ignores the sampling arguments (they may be None).
    Flattened layout: with ``logits_row_start [B]`` int64, ``target_logits`` is ``[R, V]`` and
    position ``j`` of row ``b`` reads row ``logits_row_start[b] + j`` (clamped into ``[0, R)``);
    ``probs_row_start [B]`` does the same for a ``[R', V]`` ``draft_probs``. ``log_input``: the
    inputs are probabilities (``x = log p``; temperature must be 1 or 0).
    Returns ``(tokens [B, K+1] int64, num_accepted [B] int64)``.
    """
    batch, k = draft_tokens.shape
    device = target_logits.device
    tokens = torch.empty((batch, k + 1), dtype=torch.int64, device=device)
    num_accepted = torch.empty((batch,), dtype=torch.int64, device=device)
    if batch == 0:
        return tokens, num_accepted
    strategy = strategy or pick_strategy(batch, device)
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy must be 'row', 'split' or None, got {strategy!r}")
    args = _Args(
        rows=_rows(target_logits, draft_probs, logits_row_start, probs_row_start, num_draft_tokens),
        drafts=(draft_tokens, draft_tokens.stride(0)),
        num_draft_tokens=num_draft_tokens,
        controls=row_controls(
            num_draft_tokens, temperature, top_k, top_p, seeds, greedy_only=greedy_only
        ),
        cfg=launch_config(target_logits.shape[-1]),
        greedy_only=greedy_only,
        log_input=log_input,
    )
    _STRATEGIES[strategy](args, tokens, num_accepted)
    return tokens, num_accepted
