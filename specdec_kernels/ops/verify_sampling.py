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
"""

import functools

import torch
import triton
import triton.language as tl

from specdec_kernels.ops._common import (
    KEY_FLOOR,
    PURPOSE_SAMPLE,
    accept_draft,
    chunk_race,
    chunk_stats,
    launch,
    merge_best,
    merge_stats,
    row_key,
    stream_key,
    thresholds,
)

TILES_PER_CHUNK = 4
NUM_PIVOTS = 16
# No FMA contraction: every kernel then rounds the shared chunk arithmetic the same way, which the
# identical-results promise between the two strategies relies on (and it tracks the reference).
_COMPILE = {"enable_fp_fusion": False}
# The row kernel keeps a position's statistics, filter state and race state live at once; under
# ptxas's default budget (128 registers at 4 warps) some variants spill. 192 registers remove
# every spill at sm_80 and sm_90 (tests/aot_compile.py --fail-on-spills); 2 programs fit an SM.
_ROW_COMPILE = {**_COMPILE, "maxnreg": 192}


def compile_options(kernel) -> dict:
    """The compile options a kernel of this module is launched with (for the AOT checks)."""
    return _ROW_COMPILE if kernel is _verify_row_kernel else _COMPILE


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
def _row_temperature(temp_ptr, b, GREEDY_ONLY: tl.constexpr):  # temp_ptr: [B]
    """(temperature used for x = logit / T, is this a greedy row)."""
    if GREEDY_ONLY:
        t = tl.full([], 1.0, tl.float32)
        greedy = t == t
    else:
        t = tl.load(temp_ptr + b).to(tl.float32)
        greedy = t == 0.0
        t = tl.where(greedy, 1.0, t)
    return t, greedy


@triton.jit
def _row_setup(nd_ptr, temp_ptr, seed_ptr, b, K, GREEDY_ONLY: tl.constexpr):  # [B] each
    """(k_b clamped to [0, K], temperature, is-greedy flag, RNG row key) of row ``b``."""
    kb = tl.minimum(tl.maximum(tl.load(nd_ptr + b).to(tl.int32), 0), K)
    temp, greedy = _row_temperature(temp_ptr, b, GREEDY_ONLY)
    if GREEDY_ONLY:
        key = tl.zeros([], tl.uint32)
    else:
        key = row_key(tl.load(seed_ptr + b))
    return kb, temp, greedy, key


@triton.jit
def _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, base, NCHUNK):  # [B*(K+1), NCHUNK]
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
    kb, temp, greedy, key = _row_setup(nd_ptr, temp_ptr, seed_ptr, b, K, GREEDY_ONLY)
    top_k = 0
    top_p = 1.0
    if HAS_TOPK:
        top_k = tl.load(topk_ptr + b)
    if HAS_TOPP:
        top_p = tl.load(topp_ptr + b).to(tl.float32)

    j = 0
    recovered_or_bonus = 0
    go_on = kb >= 0
    for _ in range(0, K + 1):  # each position accepts (and moves on) or stops the row
        if go_on:
            row = _row(logits_ptr, lstart_ptr, b, j.to(tl.int64), stride_lb, stride_lk, NROWS, FLAT)
            q_row = _row(q_ptr, qstart_ptr, b, j.to(tl.int64), stride_qb, stride_qk, QROWS, FLAT)
            big_m = tl.full([], float("-inf"), tl.float32)
            big_s = tl.zeros([], tl.float32)
            big_a = tl.zeros([], tl.int32)
            for c in range(0, NCHUNK):
                m, s, a = chunk_stats(
                    row, c * CHUNK, V, temp, not GREEDY_ONLY, CHUNK, BLOCK, LOG_X
                )
                big_m, big_s, big_a = merge_stats(big_m, big_s, big_a, m, s, a)
            draft = tl.load(draft_ptr + b * stride_db + j, mask=j < kb, other=-1).to(tl.int32)
            kappa = tl.full([], KEY_FLOOR, tl.int64)
            z = big_s
            if not GREEDY_ONLY:
                if greedy == 0:
                    kappa, z = thresholds(
                        row,
                        V,
                        temp,
                        big_m,
                        big_s,
                        top_k,
                        top_p,
                        HAS_TOPK,
                        HAS_TOPP,
                        NPIV,
                        CHUNK,
                        TBLOCK,
                        NCHUNK,
                        LOG_X,
                    )
            accepted = draft == big_a
            if not GREEDY_ONLY:
                if (greedy == 0) & (j < kb):
                    accepted = accept_draft(
                        row, q_row, draft, V, temp, big_m, z, kappa, key, j, HAS_Q, LOG_X
                    )
            accepted = accepted & (j < kb)
            if accepted:
                j += 1
            else:
                recovered_or_bonus = big_a
                if not GREEDY_ONLY:
                    if greedy == 0:
                        stream = stream_key(key, j, PURPOSE_SAMPLE)
                        r_best = tl.zeros([], tl.float32)
                        r_idx = tl.zeros([], tl.int32)
                        p_best = tl.full([], -1.0, tl.float32)
                        p_idx = tl.zeros([], tl.int32)
                        for c in range(0, NCHUNK):
                            rb, ri, pb, pi = chunk_race(
                                row,
                                q_row,
                                draft,
                                c * CHUNK,
                                V,
                                temp,
                                big_m,
                                z,
                                kappa,
                                stream,
                                tl.where(j < kb, V, 0),
                                HAS_Q,
                                CHUNK,
                                BLOCK,
                                LOG_X,
                            )
                            r_best, r_idx = merge_best(r_best, r_idx, rb, ri)
                            p_best, p_idx = merge_best(p_best, p_idx, pb, pi)
                        recovered_or_bonus = tl.where((j < kb) & (r_best > 0.0), r_idx, p_idx)
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
    kb = tl.minimum(tl.maximum(tl.load(nd_ptr + b).to(tl.int32), 0), K)
    if j <= kb:
        temp, greedy = _row_temperature(temp_ptr, b, GREEDY_ONLY)
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
    kb = tl.minimum(tl.maximum(tl.load(nd_ptr + b).to(tl.int32), 0), K)
    temp, greedy = _row_temperature(temp_ptr, b, False)
    big_m, big_s, big_a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pid * NCHUNK, NCHUNK)
    kappa = tl.full([], KEY_FLOOR, tl.int64)
    z = big_s
    if (j <= kb) & (greedy == 0):
        top_k = 0
        top_p = 1.0
        if HAS_TOPK:
            top_k = tl.load(topk_ptr + b)
        if HAS_TOPP:
            top_p = tl.load(topp_ptr + b).to(tl.float32)
        row = _row(logits_ptr, lstart_ptr, b, j, stride_lb, stride_lk, NROWS, FLAT)
        kappa, z = thresholds(
            row,
            V,
            temp,
            big_m,
            big_s,
            top_k,
            top_p,
            HAS_TOPK,
            HAS_TOPP,
            NPIV,
            CHUNK,
            TBLOCK,
            NCHUNK,
            LOG_X,
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
    pid = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    b = pid // (K + 1)
    j = pid % (K + 1)
    kb = tl.minimum(tl.maximum(tl.load(nd_ptr + b).to(tl.int32), 0), K)
    temp, greedy = _row_temperature(temp_ptr, b, False)
    if (j <= kb) & (greedy == 0):
        big_m, big_s, big_a = _merged_stats(
            part_m_ptr, part_s_ptr, part_a_ptr, pid * NCHUNK, NCHUNK
        )
        kappa = tl.full([], KEY_FLOOR, tl.int64)
        z = big_s
        if HAS_FILTER:
            kappa = tl.load(kappa_ptr + pid)
            z = tl.load(z_ptr + pid)
        draft = tl.load(draft_ptr + b * stride_db + j, mask=j < kb, other=-1).to(tl.int32)
        stream = stream_key(row_key(tl.load(seed_ptr + b)), j, PURPOSE_SAMPLE)
        row = _row(logits_ptr, lstart_ptr, b, j, stride_lb, stride_lk, NROWS, FLAT)
        q_row = _row(q_ptr, qstart_ptr, b, j, stride_qb, stride_qk, QROWS, FLAT)
        rb, ri, pb, pi = chunk_race(
            row,
            q_row,
            draft,
            c * CHUNK,
            V,
            temp,
            big_m,
            z,
            kappa,
            stream,
            tl.where(j < kb, V, 0),
            HAS_Q,
            CHUNK,
            BLOCK,
            LOG_X,
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
    kb, temp, greedy, key = _row_setup(nd_ptr, temp_ptr, seed_ptr, b, K, GREEDY_ONLY)
    j = 0
    recovered_or_bonus = 0
    go_on = kb >= 0
    while go_on:
        pos = b * (K + 1) + j
        big_m, big_s, big_a = _merged_stats(
            part_m_ptr, part_s_ptr, part_a_ptr, pos * NCHUNK, NCHUNK
        )
        draft = tl.load(draft_ptr + b * stride_db + j, mask=j < kb, other=-1).to(tl.int32)
        accepted = draft == big_a
        if not GREEDY_ONLY:
            if (greedy == 0) & (j < kb):
                kappa = tl.full([], KEY_FLOOR, tl.int64)
                z = big_s
                if HAS_FILTER:
                    kappa = tl.load(kappa_ptr + pos)
                    z = tl.load(z_ptr + pos)
                jj = j.to(tl.int64)
                row = _row(logits_ptr, lstart_ptr, b, jj, stride_lb, stride_lk, NROWS, FLAT)
                q_row = _row(q_ptr, qstart_ptr, b, jj, stride_qb, stride_qk, QROWS, FLAT)
                accepted = accept_draft(
                    row, q_row, draft, V, temp, big_m, z, kappa, key, j, HAS_Q, LOG_X
                )
        accepted = accepted & (j < kb)
        if accepted:
            j += 1
        else:
            recovered_or_bonus = big_a
            if not GREEDY_ONLY:
                if greedy == 0:
                    r_best = tl.zeros([], tl.float32)
                    r_idx = tl.zeros([], tl.int32)
                    p_best = tl.full([], -1.0, tl.float32)
                    p_idx = tl.zeros([], tl.int32)
                    for c in range(0, NCHUNK):
                        at = pos * NCHUNK + c
                        r_best, r_idx = merge_best(
                            r_best, r_idx, tl.load(race_rb_ptr + at), tl.load(race_ri_ptr + at)
                        )
                        p_best, p_idx = merge_best(
                            p_best, p_idx, tl.load(race_pb_ptr + at), tl.load(race_pi_ptr + at)
                        )
                    recovered_or_bonus = tl.where((j < kb) & (r_best > 0.0), r_idx, p_idx)
            go_on = False
    _write_row(draft_ptr, stride_db, tokens_ptr, nacc_ptr, b, j, recovered_or_bonus, V, K, BLOCK_K)
# fmt: on


@functools.cache
def _row_strategy_min_batch(device: torch.device) -> int:
    """Batch size from which one program per row keeps the device busy."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 64


def launch_config(vocab_size: int) -> dict:
    """Tile sizes, fixed by ``V`` alone so that both strategies chunk a row identically."""
    block = min(1024, triton.next_power_of_2(vocab_size))
    chunk = block * TILES_PER_CHUNK
    return {
        "BLOCK": block,
        "CHUNK": chunk,
        "TBLOCK": min(128, block),
        "NPIV": NUM_PIVOTS,
        "NCHUNK": triton.cdiv(vocab_size, chunk),
    }


def pick_strategy(batch_size: int, device: torch.device) -> str:
    """``"row"`` when the batch alone fills the device, else ``"split"``."""
    return "row" if batch_size >= _row_strategy_min_batch(device) else "split"


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
    flat = logits_row_start is not None
    batch, k = draft_tokens.shape
    k1 = k + 1
    vocab = target_logits.shape[-1]
    nrows = target_logits.shape[0] if flat else 0
    qrows = draft_probs.shape[0] if flat and draft_probs is not None else 0
    device = target_logits.device
    cfg = launch_config(vocab)
    nchunk = cfg["NCHUNK"]
    tokens = torch.empty((batch, k1), dtype=torch.int64, device=device)
    num_accepted = torch.empty((batch,), dtype=torch.int64, device=device)
    if batch == 0:
        return tokens, num_accepted
    strategy = strategy or pick_strategy(batch, device)
    has_q = draft_probs is not None
    q = draft_probs if has_q else target_logits  # never read when HAS_Q is false
    if flat:
        stride_qb, stride_qk = (0, q.stride(0)) if has_q else (0, 0)
        lstart = logits_row_start
        qstart = probs_row_start if has_q else logits_row_start
    else:
        stride_qb, stride_qk = (q.stride(0), q.stride(1)) if has_q else (0, 0)
        lstart = qstart = num_draft_tokens  # never read when FLAT is false
    # Pointers that a mode never reads still need a tensor; num_draft_tokens is always there.
    temp = num_draft_tokens if greedy_only else temperature
    seed_t = num_draft_tokens if greedy_only else seeds
    topk_t = top_k if top_k is not None else num_draft_tokens
    topp_t = top_p if top_p is not None else num_draft_tokens
    has_topk, has_topp = top_k is not None, top_p is not None
    if flat:
        lb, lk = 0, target_logits.stride(0)
    else:
        lb, lk = target_logits.stride(0), target_logits.stride(1)
    db = draft_tokens.stride(0)
    block_k = triton.next_power_of_2(k1)

    if strategy == "row":
        launch(
            _verify_row_kernel,
            (batch,),
            target_logits,
            lb,
            lk,
            draft_tokens,
            db,
            q,
            stride_qb,
            stride_qk,
            num_draft_tokens,
            temp,
            topk_t,
            topp_t,
            seed_t,
            tokens,
            num_accepted,
            lstart,
            qstart,
            vocab,
            k,
            nchunk,
            nrows,
            qrows,
            GREEDY_ONLY=greedy_only,
            HAS_Q=has_q,
            HAS_TOPK=has_topk,
            HAS_TOPP=has_topp,
            CHUNK=cfg["CHUNK"],
            BLOCK=cfg["BLOCK"],
            TBLOCK=cfg["TBLOCK"],
            NPIV=cfg["NPIV"],
            BLOCK_K=block_k,
            FLAT=flat,
            LOG_X=log_input,
            **_ROW_COMPILE,
        )
        return tokens, num_accepted
    if strategy != "split":
        raise ValueError(f"strategy must be 'row', 'split' or None, got {strategy!r}")

    positions = batch * k1
    part_m = torch.empty((positions, nchunk), dtype=torch.float32, device=device)
    part_s = torch.empty_like(part_m)
    part_a = torch.empty((positions, nchunk), dtype=torch.int32, device=device)
    launch(
        _split_stats_kernel,
        (positions, nchunk),
        target_logits,
        lb,
        lk,
        num_draft_tokens,
        temp,
        part_m,
        part_s,
        part_a,
        lstart,
        vocab,
        k,
        nchunk,
        nrows,
        GREEDY_ONLY=greedy_only,
        CHUNK=cfg["CHUNK"],
        BLOCK=cfg["BLOCK"],
        FLAT=flat,
        LOG_X=log_input,
        **_COMPILE,
    )
    has_filter = (has_topk or has_topp) and not greedy_only
    kappa = torch.empty((positions,), dtype=torch.int64, device=device)
    z = torch.empty((positions,), dtype=torch.float32, device=device)
    race = [
        torch.empty((positions, nchunk), dtype=dt, device=device)
        for dt in (torch.float32, torch.int32, torch.float32, torch.int32)
    ]
    if not greedy_only:
        if has_filter:
            launch(
                _split_threshold_kernel,
                (positions,),
                target_logits,
                lb,
                lk,
                num_draft_tokens,
                temp,
                topk_t,
                topp_t,
                part_m,
                part_s,
                part_a,
                kappa,
                z,
                lstart,
                vocab,
                k,
                nchunk,
                nrows,
                HAS_TOPK=has_topk,
                HAS_TOPP=has_topp,
                NPIV=cfg["NPIV"],
                CHUNK=cfg["CHUNK"],
                TBLOCK=cfg["TBLOCK"],
                FLAT=flat,
                LOG_X=log_input,
                **_COMPILE,
            )
        launch(
            _split_race_kernel,
            (positions, nchunk),
            target_logits,
            lb,
            lk,
            draft_tokens,
            db,
            q,
            stride_qb,
            stride_qk,
            num_draft_tokens,
            temp,
            seed_t,
            part_m,
            part_s,
            part_a,
            kappa,
            z,
            *race,
            lstart,
            qstart,
            vocab,
            k,
            nchunk,
            nrows,
            qrows,
            HAS_Q=has_q,
            HAS_FILTER=has_filter,
            CHUNK=cfg["CHUNK"],
            BLOCK=cfg["BLOCK"],
            FLAT=flat,
            LOG_X=log_input,
            **_COMPILE,
        )
    launch(
        _split_decide_kernel,
        (batch,),
        target_logits,
        lb,
        lk,
        draft_tokens,
        db,
        q,
        stride_qb,
        stride_qk,
        num_draft_tokens,
        temp,
        seed_t,
        part_m,
        part_s,
        part_a,
        kappa,
        z,
        *race,
        tokens,
        num_accepted,
        lstart,
        qstart,
        vocab,
        k,
        nchunk,
        nrows,
        qrows,
        GREEDY_ONLY=greedy_only,
        HAS_Q=has_q,
        HAS_FILTER=has_filter,
        BLOCK_K=block_k,
        FLAT=flat,
        LOG_X=log_input,
        **_COMPILE,
    )
    return tokens, num_accepted
