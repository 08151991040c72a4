"""Fused verification kernels (sampling and greedy) and their launcher.

One kernel family serves both :func:`specdec_kernels.verify_sampling` and, with ``GREEDY_ONLY``,
:func:`specdec_kernels.verify_greedy`. Logits are read in chunks of ``CHUNK`` tokens; per chunk the
max of ``x = logit / T``, the sum of ``exp(x - max)`` and the first argmax are computed by one helper
and merged in chunk order. Two launch strategies use that helper:

``row``   grid ``(B,)``: a program walks its row's positions in order and stops at the first
          rejection, so logits rows after it are never read. Best when B fills the GPU.
``split`` grid ``(B * (K+1), NCHUNK)``: every position's vocabulary is split across programs
          (statistics, then the rounds of the top-k/top-p threshold search, then the resampling
          race), and a small ``(B,)`` kernel makes the decisions from the partials. Best for
          small batches.

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
    SEARCH_ROUNDS,
    accept_draft,
    chunk_pivot_pass,
    chunk_race,
    chunk_stats,
    float_key,
    merge_best,
    merge_stats,
    row_key,
    search_pivots,
    search_step,
    stream_key,
    thresholds,
)

TILES_PER_CHUNK = 4
NUM_PIVOTS = 16
# No FMA contraction: every kernel then rounds the shared chunk arithmetic the same way, which the
# identical-results promise between the two strategies relies on (and it tracks the reference).
_COMPILE = {"enable_fp_fusion": False}


@triton.jit
def _row_temperature(temp_ptr, b, GREEDY_ONLY: tl.constexpr):
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
def _row_setup(nd_ptr, temp_ptr, seed_ptr, b, K, GREEDY_ONLY: tl.constexpr):
    """(k_b clamped to [0, K], temperature, is-greedy flag, RNG row key) of row ``b``."""
    kb = tl.minimum(tl.maximum(tl.load(nd_ptr + b).to(tl.int32), 0), K)
    temp, greedy = _row_temperature(temp_ptr, b, GREEDY_ONLY)
    if GREEDY_ONLY:
        key = tl.zeros([], tl.uint32)
    else:
        key = row_key(tl.load(seed_ptr + b))
    return kb, temp, greedy, key


@triton.jit
def _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, base, NCHUNK):
    big_m = tl.full([], float("-inf"), tl.float32)
    big_s = tl.zeros([], tl.float32)
    big_a = tl.zeros([], tl.int32)
    for c in range(0, NCHUNK):
        big_m, big_s, big_a = merge_stats(big_m, big_s, big_a, tl.load(part_m_ptr + base + c),
                                          tl.load(part_s_ptr + base + c),
                                          tl.load(part_a_ptr + base + c))
    return big_m, big_s, big_a


@triton.jit
def _write_row(draft_ptr, stride_db, tokens_ptr, nacc_ptr, b, n_acc, extra, V, K,
               BLOCK_K: tl.constexpr):
    """tokens[b] = accepted drafts, then the extra token, then -1."""
    offs = tl.arange(0, BLOCK_K)
    drafts = tl.load(draft_ptr + b * stride_db + offs, mask=offs < n_acc, other=-1).to(tl.int64)
    extra = tl.minimum(tl.maximum(extra, 0), V - 1).to(tl.int64)
    out = tl.where(offs < n_acc, drafts, tl.where(offs == n_acc, extra, -1))
    tl.store(tokens_ptr + b * (K + 1) + offs, out, mask=offs < K + 1)
    tl.store(nacc_ptr + b, n_acc.to(tl.int64))


@triton.jit
def _verify_row_kernel(
    logits_ptr, stride_lb, stride_lk, draft_ptr, stride_db, q_ptr, stride_qb, stride_qk,
    nd_ptr, temp_ptr, topk_ptr, topp_ptr, seed_ptr, tokens_ptr, nacc_ptr,
    V, K, NCHUNK,
    GREEDY_ONLY: tl.constexpr, HAS_Q: tl.constexpr, HAS_TOPK: tl.constexpr,
    HAS_TOPP: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, TBLOCK: tl.constexpr,
    NPIV: tl.constexpr, BLOCK_K: tl.constexpr,
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
    extra = 0
    go_on = kb >= 0
    while go_on:
        row = logits_ptr + b * stride_lb + j.to(tl.int64) * stride_lk
        q_row = q_ptr + b * stride_qb + j.to(tl.int64) * stride_qk
        big_m = tl.full([], float("-inf"), tl.float32)
        big_s = tl.zeros([], tl.float32)
        big_a = tl.zeros([], tl.int32)
        for c in range(0, NCHUNK):
            m, s, a = chunk_stats(row, c * CHUNK, V, temp, not GREEDY_ONLY, CHUNK, BLOCK)
            big_m, big_s, big_a = merge_stats(big_m, big_s, big_a, m, s, a)
        draft = tl.load(draft_ptr + b * stride_db + j, mask=j < kb, other=-1).to(tl.int32)
        kappa = tl.full([], KEY_FLOOR, tl.int64)
        z = big_s
        if not GREEDY_ONLY:
            if greedy == 0:
                kappa, z = thresholds(row, V, temp, big_m, big_s, top_k, top_p, HAS_TOPK,
                                      HAS_TOPP, NPIV, CHUNK, TBLOCK, NCHUNK)
        accepted = draft == big_a
        if not GREEDY_ONLY:
            if (greedy == 0) & (j < kb):
                accepted = accept_draft(row, q_row, draft, V, temp, big_m, z, kappa, key, j,
                                        HAS_Q)
        accepted = accepted & (j < kb)
        if accepted:
            j += 1
        else:
            extra = big_a
            if not GREEDY_ONLY:
                if greedy == 0:
                    stream = stream_key(key, j, PURPOSE_SAMPLE)
                    r_best = tl.zeros([], tl.float32)
                    r_idx = tl.zeros([], tl.int32)
                    p_best = tl.full([], -1.0, tl.float32)
                    p_idx = tl.zeros([], tl.int32)
                    for c in range(0, NCHUNK):
                        rb, ri, pb, pi = chunk_race(row, q_row, draft, c * CHUNK, V, temp, big_m,
                                                    z, kappa, stream, tl.where(j < kb, V, 0), HAS_Q,
                                                    CHUNK, BLOCK)
                        r_best, r_idx = merge_best(r_best, r_idx, rb, ri)
                        p_best, p_idx = merge_best(p_best, p_idx, pb, pi)
                    extra = tl.where((j < kb) & (r_best > 0.0), r_idx, p_idx)
            go_on = False
    _write_row(draft_ptr, stride_db, tokens_ptr, nacc_ptr, b, j, extra, V, K, BLOCK_K)


@triton.jit
def _split_stats_kernel(
    logits_ptr, stride_lb, stride_lk, nd_ptr, temp_ptr, part_m_ptr, part_s_ptr, part_a_ptr,
    V, K, NCHUNK,
    GREEDY_ONLY: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    b = pid // (K + 1)
    j = pid % (K + 1)
    kb = tl.minimum(tl.maximum(tl.load(nd_ptr + b).to(tl.int32), 0), K)
    if j <= kb:
        temp, greedy = _row_temperature(temp_ptr, b, GREEDY_ONLY)
        row = logits_ptr + b * stride_lb + j * stride_lk
        m, s, a = chunk_stats(row, c * CHUNK, V, temp, not GREEDY_ONLY, CHUNK, BLOCK)
        out = pid * NCHUNK + c
        tl.store(part_m_ptr + out, m)
        tl.store(part_s_ptr + out, s)
        tl.store(part_a_ptr + out, a)


@triton.jit
def _split_search_phase_kernel(
    nd_ptr, temp_ptr, topk_ptr, topp_ptr, part_m_ptr, part_s_ptr, part_a_ptr,
    kappa_ptr, z_ptr, m_ptr, lo_ptr, hi_ptr, mass_ptr, floor_ptr, target_ptr, active_ptr,
    V, K, NCHUNK,
    PHASE: tl.constexpr, HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr,
):
    """Between the rounds of the chunk-parallel threshold search, one program per position.

    PHASE 0: merge the statistics, set ``kappa`` / ``Z`` to "no filter", start the top-k search.
    PHASE 1: finish the top-k search, start the top-p search. PHASE 2: finish the top-p search.
    The state (``lo``, ``hi``, mass above ``lo``, floor, target) follows ``_common.thresholds``
    step for step, so the split strategy ends where the row strategy's search ends.
    """
    pid = tl.program_id(0).to(tl.int64)
    b = pid // (K + 1)
    j = pid % (K + 1)
    kb = tl.minimum(tl.maximum(tl.load(nd_ptr + b).to(tl.int32), 0), K)
    temp, greedy = _row_temperature(temp_ptr, b, False)
    if (j <= kb) & (greedy == 0):
        if PHASE == 0:
            big_m, big_s, big_a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr,
                                                pid * NCHUNK, NCHUNK)
            tl.store(m_ptr + pid, big_m)
            tl.store(kappa_ptr + pid, tl.full([], KEY_FLOOR, tl.int64))
            tl.store(z_ptr + pid, big_s)
            active = tl.full([], 0, tl.int32)
            if HAS_TOPK:
                top_k = tl.load(topk_ptr + b)
                active = ((top_k > 0) & (top_k < V)).to(tl.int32)
            hi = float_key(big_m)
            # an inactive search starts finished (lo == hi)
            tl.store(lo_ptr + pid, tl.where(active != 0, KEY_FLOOR, hi))
            tl.store(hi_ptr + pid, hi)
            tl.store(mass_ptr + pid, big_s)
            tl.store(floor_ptr + pid, tl.full([], KEY_FLOOR, tl.int64))
            tl.store(active_ptr + pid, active)
        else:
            if tl.load(active_ptr + pid) != 0:  # the search just run was live: take its result
                tl.store(kappa_ptr + pid, tl.load(hi_ptr + pid))
                tl.store(z_ptr + pid, tl.load(mass_ptr + pid))
            if PHASE == 1:
                active = tl.full([], 0, tl.int32)
                if HAS_TOPP:
                    active = (tl.load(topp_ptr + b).to(tl.float32) < 1.0).to(tl.int32)
                kappa = tl.load(kappa_ptr + pid)
                z = tl.load(z_ptr + pid)
                hi = float_key(tl.load(m_ptr + pid))
                tl.store(lo_ptr + pid, tl.where(active != 0, kappa - 1, hi))
                tl.store(hi_ptr + pid, hi)
                tl.store(mass_ptr + pid, z)
                tl.store(floor_ptr + pid, kappa)
                if HAS_TOPP:
                    tl.store(target_ptr + pid, tl.load(topp_ptr + b).to(tl.float32) * z)
                tl.store(active_ptr + pid, active)
    else:
        tl.store(active_ptr + pid, 0)
        tl.store(lo_ptr + pid, 0)
        tl.store(hi_ptr + pid, 0)


@triton.jit
def _split_search_partial_kernel(
    logits_ptr, stride_lb, stride_lk, temp_ptr, m_ptr, lo_ptr, hi_ptr, floor_ptr,
    pcount_ptr, pmass_ptr,
    V, K, NCHUNK,
    NPIV: tl.constexpr, CHUNK: tl.constexpr, TBLOCK: tl.constexpr,
):
    """One round of the threshold search: pivot counts and masses of one chunk of a position."""
    pid = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    lo = tl.load(lo_ptr + pid)
    hi = tl.load(hi_ptr + pid)
    if hi - lo > 1:
        b = pid // (K + 1)
        j = pid % (K + 1)
        temp, greedy = _row_temperature(temp_ptr, b, False)
        row = logits_ptr + b * stride_lb + j * stride_lk
        pivots = search_pivots(lo, hi, NPIV)
        counts, masses = chunk_pivot_pass(row, c * CHUNK, V, temp, tl.load(m_ptr + pid),
                                          tl.load(floor_ptr + pid), pivots, NPIV, CHUNK, TBLOCK)
        out = (pid * NCHUNK + c) * NPIV + tl.arange(0, NPIV)
        tl.store(pcount_ptr + out, counts)
        tl.store(pmass_ptr + out, masses)


@triton.jit
def _split_search_update_kernel(
    topk_ptr, lo_ptr, hi_ptr, mass_ptr, target_ptr, pcount_ptr, pmass_ptr,
    K, NCHUNK,
    USE_MASS: tl.constexpr, NPIV: tl.constexpr,
):
    """One round of the threshold search: add the chunk partials in chunk order, narrow."""
    pid = tl.program_id(0).to(tl.int64)
    lo = tl.load(lo_ptr + pid)
    hi = tl.load(hi_ptr + pid)
    if hi - lo > 1:
        pivots = search_pivots(lo, hi, NPIV)
        counts = tl.zeros([NPIV], tl.int64)
        masses = tl.zeros([NPIV], tl.float32)
        for c in range(0, NCHUNK):
            at = (pid * NCHUNK + c) * NPIV + tl.arange(0, NPIV)
            counts += tl.load(pcount_ptr + at)
            masses += tl.load(pmass_ptr + at)
        target_count = 0
        target_mass = 0.0
        if USE_MASS:
            target_mass = tl.load(target_ptr + pid)
        else:
            target_count = tl.load(topk_ptr + pid // (K + 1))
        lo, hi, mass_lo = search_step(lo, hi, tl.load(mass_ptr + pid), pivots, counts, masses,
                                      target_count, target_mass, USE_MASS)
        tl.store(lo_ptr + pid, lo)
        tl.store(hi_ptr + pid, hi)
        tl.store(mass_ptr + pid, mass_lo)


@triton.jit
def _split_race_kernel(
    logits_ptr, stride_lb, stride_lk, draft_ptr, stride_db, q_ptr, stride_qb, stride_qk,
    nd_ptr, temp_ptr, seed_ptr, part_m_ptr, part_s_ptr, part_a_ptr, kappa_ptr, z_ptr,
    race_rb_ptr, race_ri_ptr, race_pb_ptr, race_pi_ptr,
    V, K, NCHUNK,
    HAS_Q: tl.constexpr, HAS_FILTER: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    b = pid // (K + 1)
    j = pid % (K + 1)
    kb = tl.minimum(tl.maximum(tl.load(nd_ptr + b).to(tl.int32), 0), K)
    temp, greedy = _row_temperature(temp_ptr, b, False)
    if (j <= kb) & (greedy == 0):
        big_m, big_s, big_a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pid * NCHUNK,
                                            NCHUNK)
        kappa = tl.full([], KEY_FLOOR, tl.int64)
        z = big_s
        if HAS_FILTER:
            kappa = tl.load(kappa_ptr + pid)
            z = tl.load(z_ptr + pid)
        draft = tl.load(draft_ptr + b * stride_db + j, mask=j < kb, other=-1).to(tl.int32)
        stream = stream_key(row_key(tl.load(seed_ptr + b)), j, PURPOSE_SAMPLE)
        row = logits_ptr + b * stride_lb + j * stride_lk
        q_row = q_ptr + b * stride_qb + j * stride_qk
        rb, ri, pb, pi = chunk_race(row, q_row, draft, c * CHUNK, V, temp, big_m, z, kappa,
                                    stream, tl.where(j < kb, V, 0), HAS_Q, CHUNK, BLOCK)
        out = pid * NCHUNK + c
        tl.store(race_rb_ptr + out, rb)
        tl.store(race_ri_ptr + out, ri)
        tl.store(race_pb_ptr + out, pb)
        tl.store(race_pi_ptr + out, pi)


@triton.jit
def _split_decide_kernel(
    logits_ptr, stride_lb, stride_lk, draft_ptr, stride_db, q_ptr, stride_qb, stride_qk,
    nd_ptr, temp_ptr, seed_ptr, part_m_ptr, part_s_ptr, part_a_ptr, kappa_ptr, z_ptr,
    race_rb_ptr, race_ri_ptr, race_pb_ptr, race_pi_ptr, tokens_ptr, nacc_ptr,
    V, K, NCHUNK,
    GREEDY_ONLY: tl.constexpr, HAS_Q: tl.constexpr, HAS_FILTER: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kb, temp, greedy, key = _row_setup(nd_ptr, temp_ptr, seed_ptr, b, K, GREEDY_ONLY)
    j = 0
    extra = 0
    go_on = kb >= 0
    while go_on:
        pos = b * (K + 1) + j
        big_m, big_s, big_a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pos * NCHUNK,
                                            NCHUNK)
        draft = tl.load(draft_ptr + b * stride_db + j, mask=j < kb, other=-1).to(tl.int32)
        accepted = draft == big_a
        if not GREEDY_ONLY:
            if (greedy == 0) & (j < kb):
                kappa = tl.full([], KEY_FLOOR, tl.int64)
                z = big_s
                if HAS_FILTER:
                    kappa = tl.load(kappa_ptr + pos)
                    z = tl.load(z_ptr + pos)
                row = logits_ptr + b * stride_lb + j.to(tl.int64) * stride_lk
                q_row = q_ptr + b * stride_qb + j.to(tl.int64) * stride_qk
                accepted = accept_draft(row, q_row, draft, V, temp, big_m, z, kappa, key, j,
                                        HAS_Q)
        accepted = accepted & (j < kb)
        if accepted:
            j += 1
        else:
            extra = big_a
            if not GREEDY_ONLY:
                if greedy == 0:
                    r_best = tl.zeros([], tl.float32)
                    r_idx = tl.zeros([], tl.int32)
                    p_best = tl.full([], -1.0, tl.float32)
                    p_idx = tl.zeros([], tl.int32)
                    for c in range(0, NCHUNK):
                        at = pos * NCHUNK + c
                        r_best, r_idx = merge_best(r_best, r_idx, tl.load(race_rb_ptr + at),
                                                   tl.load(race_ri_ptr + at))
                        p_best, p_idx = merge_best(p_best, p_idx, tl.load(race_pb_ptr + at),
                                                   tl.load(race_pi_ptr + at))
                    extra = tl.where((j < kb) & (r_best > 0.0), r_idx, p_idx)
            go_on = False
    _write_row(draft_ptr, stride_db, tokens_ptr, nacc_ptr, b, j, extra, V, K, BLOCK_K)


def _threshold_search(target_logits, num_draft_tokens, temp, topk_t, topp_t, part_m, part_s,
                      part_a, kappa, z, has_topk, has_topp, cfg):
    """Split strategy's top-k/top-p thresholds: ``SEARCH_ROUNDS`` rounds per filter, each a
    ``(positions, NCHUNK)`` pivot-count launch and a ``(positions,)`` narrowing launch. A fixed
    number of launches (no host sync); positions whose search is done skip their work."""
    batch, k1, vocab = target_logits.shape
    positions, nchunk, npiv = batch * k1, cfg["NCHUNK"], cfg["NPIV"]
    device = target_logits.device
    m = torch.empty((positions,), dtype=torch.float32, device=device)
    lo, hi, floor = (torch.empty((positions,), dtype=torch.int64, device=device) for _ in range(3))
    mass, target = (torch.empty((positions,), dtype=torch.float32, device=device) for _ in range(2))
    active = torch.empty((positions,), dtype=torch.int32, device=device)
    pcount = torch.empty((positions, nchunk, npiv), dtype=torch.int64, device=device)
    pmass = torch.empty((positions, nchunk, npiv), dtype=torch.float32, device=device)
    lb, lk = target_logits.stride(0), target_logits.stride(1)
    k = k1 - 1

    def phase(number):
        _split_search_phase_kernel[(positions,)](
            num_draft_tokens, temp, topk_t, topp_t, part_m, part_s, part_a, kappa, z, m, lo, hi,
            mass, floor, target, active, vocab, k, nchunk,
            PHASE=number, HAS_TOPK=has_topk, HAS_TOPP=has_topp, **_COMPILE)

    def rounds(use_mass):
        for _ in range(SEARCH_ROUNDS):
            _split_search_partial_kernel[(positions, nchunk)](
                target_logits, lb, lk, temp, m, lo, hi, floor, pcount, pmass, vocab, k, nchunk,
                NPIV=npiv, CHUNK=cfg["CHUNK"], TBLOCK=cfg["TBLOCK"], **_COMPILE)
            _split_search_update_kernel[(positions,)](
                topk_t, lo, hi, mass, target, pcount, pmass, k, nchunk,
                USE_MASS=use_mass, NPIV=npiv, **_COMPILE)

    phase(0)
    if has_topk:
        rounds(False)
    phase(1)
    if has_topp:
        rounds(True)
        phase(2)


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
    return {"BLOCK": block, "CHUNK": chunk, "TBLOCK": min(128, block), "NPIV": NUM_PIVOTS,
            "NCHUNK": triton.cdiv(vocab_size, chunk)}


def pick_strategy(batch_size: int, device: torch.device) -> str:
    """``"row"`` when the batch alone fills the device, else ``"split"``."""
    return "row" if batch_size >= _row_strategy_min_batch(device) else "split"


def verify(target_logits, draft_tokens, draft_probs, num_draft_tokens, temperature, top_k,
           top_p, seeds, *, greedy_only: bool, strategy: str | None = None):
    """Launch the verification kernels; see :func:`specdec_kernels.verify_sampling`.

    Inputs are already checked: ``target_logits [B, K+1, V]`` (last stride 1), ``draft_tokens
    [B, K]``, ``draft_probs [B, K, V]`` (last stride 1) or None, ``num_draft_tokens [B]``,
    ``temperature [B]`` float32, ``top_k [B]`` int64 or None, ``top_p [B]`` float32 or None,
    ``seeds [B]`` int64. ``greedy_only`` ignores the sampling arguments (they may be None).
    Returns ``(tokens [B, K+1] int64, num_accepted [B] int64)``.
    """
    batch, k1, vocab = target_logits.shape
    k = k1 - 1
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
    stride_qb, stride_qk = (q.stride(0), q.stride(1)) if has_q else (0, 0)
    # Pointers that a mode never reads still need a tensor; num_draft_tokens is always there.
    temp = num_draft_tokens if greedy_only else temperature
    seed_t = num_draft_tokens if greedy_only else seeds
    topk_t = top_k if top_k is not None else num_draft_tokens
    topp_t = top_p if top_p is not None else num_draft_tokens
    has_topk, has_topp = top_k is not None, top_p is not None
    lb, lk = target_logits.stride(0), target_logits.stride(1)
    db = draft_tokens.stride(0)
    block_k = triton.next_power_of_2(k1)

    if strategy == "row":
        _verify_row_kernel[(batch,)](
            target_logits, lb, lk, draft_tokens, db, q, stride_qb, stride_qk,
            num_draft_tokens, temp, topk_t, topp_t, seed_t, tokens, num_accepted,
            vocab, k, nchunk,
            GREEDY_ONLY=greedy_only, HAS_Q=has_q, HAS_TOPK=has_topk, HAS_TOPP=has_topp,
            CHUNK=cfg["CHUNK"], BLOCK=cfg["BLOCK"], TBLOCK=cfg["TBLOCK"], NPIV=cfg["NPIV"],
            BLOCK_K=block_k, **_COMPILE,
        )
        return tokens, num_accepted
    if strategy != "split":
        raise ValueError(f"strategy must be 'row', 'split' or None, got {strategy!r}")

    positions = batch * k1
    part_m = torch.empty((positions, nchunk), dtype=torch.float32, device=device)
    part_s = torch.empty_like(part_m)
    part_a = torch.empty((positions, nchunk), dtype=torch.int32, device=device)
    _split_stats_kernel[(positions, nchunk)](
        target_logits, lb, lk, num_draft_tokens, temp, part_m, part_s, part_a,
        vocab, k, nchunk, GREEDY_ONLY=greedy_only, CHUNK=cfg["CHUNK"], BLOCK=cfg["BLOCK"],
        **_COMPILE,
    )
    has_filter = (has_topk or has_topp) and not greedy_only
    kappa = torch.empty((positions,), dtype=torch.int64, device=device)
    z = torch.empty((positions,), dtype=torch.float32, device=device)
    race = [torch.empty((positions, nchunk), dtype=dt, device=device)
            for dt in (torch.float32, torch.int32, torch.float32, torch.int32)]
    if not greedy_only:
        if has_filter:
            _threshold_search(target_logits, num_draft_tokens, temp, topk_t, topp_t, part_m,
                              part_s, part_a, kappa, z, has_topk, has_topp, cfg)
        _split_race_kernel[(positions, nchunk)](
            target_logits, lb, lk, draft_tokens, db, q, stride_qb, stride_qk,
            num_draft_tokens, temp, seed_t, part_m, part_s, part_a, kappa, z, *race,
            vocab, k, nchunk,
            HAS_Q=has_q, HAS_FILTER=has_filter, CHUNK=cfg["CHUNK"], BLOCK=cfg["BLOCK"],
            **_COMPILE,
        )
    _split_decide_kernel[(batch,)](
        target_logits, lb, lk, draft_tokens, db, q, stride_qb, stride_qk,
        num_draft_tokens, temp, seed_t, part_m, part_s, part_a, kappa, z, *race,
        tokens, num_accepted, vocab, k, nchunk,
        GREEDY_ONLY=greedy_only, HAS_Q=has_q, HAS_FILTER=has_filter, BLOCK_K=block_k,
        **_COMPILE,
    )
    return tokens, num_accepted
