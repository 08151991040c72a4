"""Fused tree verification kernel (sampling and greedy) and its launcher.

One program per row walks the row's tree (:mod:`specdec_kernels.reference.verify_tree` is the
specification; same numbers, same formulas). Nodes are in topological order, so the walk is one
pass over the node indices: node ``i`` is tried when its parent is the current node. At every
node the walk reaches it computes the filtered target statistics of that node's logits row (max,
sum of exponentials and first argmax chunk by chunk; with top-k / top-p the candidate buffer
and its thresholds, ``_common.position_filter_stats``, as the chain's row kernel, or the
search with a token bitmask, ``_common.position_stats``; the row setup and the launch config are
the chain's too, in :mod:`specdec_kernels.ops._common`); nodes off the accepted path are never
read beyond their token's entry. A rejected child costs nothing more in ``"deterministic"``
mode (its token is removed from the residual: kept in a small list) and one pass over the
vocabulary otherwise (the residual ``max(0, r - Z q_c)`` is kept in a ``[B, V]`` float32
workspace). The recovered or bonus token is one exponential race over the stop node's row.

That is the ``"row"`` strategy (one launch). At small batch sizes (``"split"``, the chain's
choice: :func:`specdec_kernels.ops.verify_sampling.pick_strategy`) every live node's statistics
come first from the chain's split statistics kernels (``NCHUNK`` programs a node), the walk
reads them instead of the rows, and the stop node's race runs ``NCHUNK`` programs a row
(:func:`_tree_race_kernel`), merged in chunk order (:func:`_tree_finish_kernel`): the same
numbers, the same tokens. Every index that comes from the inputs (``num_nodes``, ``parents``,
``tree_tokens``) is clamped or masked before it addresses memory, so ``validate=False`` garbage
never reads or writes out of bounds.
"""

import torch
import triton
import triton.language as tl

from specdec_kernels.ops import verify_sampling as chain
from specdec_kernels.ops._common import (
    PURPOSE_ACCEPT,
    PURPOSE_SAMPLE,
    WALK_COMPILE,
    edit_args,
    exponential,
    launch,
    launch_config,
    load_x,
    merge_best,
    position_filter_stats,
    position_stats,
    row_controls,
    row_count,
    row_filters,
    row_sampling,
    row_temperature,
    stream_key,
    target_prob,
    uniform,
)
from specdec_kernels.ops.verify_sampling import _filter_state, _merged_stats

MODE_DETERMINISTIC = tl.constexpr(0)
MODE_WITHOUT_REPLACEMENT = tl.constexpr(2)


def compile_options(kernel) -> dict:
    """The compile options a tree kernel is launched with (for the AOT checks): the walk as the
    chain's walking kernel (``_common.WALK_COMPILE``), the split race as the chain's race, the
    finish as its decide kernel."""
    if kernel is _tree_race_kernel:
        return chain.THRESHOLD_COMPILE
    if kernel is _tree_finish_kernel:
        return chain.SPLIT_COMPILE
    return WALK_COMPILE


@triton.jit
def _removed(idx, rej, count, BLOCK_N: tl.constexpr):
    """``[BLOCK]`` bool: ``idx`` is one of the first ``count`` rejected siblings' tokens
    ``rej [BLOCK_N]`` (one ``[BLOCK]`` comparison per token: no ``[BLOCK, BLOCK_N]`` tile)."""
    offs_n = tl.arange(0, BLOCK_N)
    hit = idx < 0
    for j in range(0, count):
        token = tl.sum(tl.where(offs_n == j, rej, 0), axis=0)
        hit = hit | (idx == token)
    return hit


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _shrink_residual(row_ptr,  # [V] logits row of the current node
                     q_row,  # [V] its draft probabilities
                     ws_row,  # [V] float32 residual workspace of the row
                     bits_row,  # [W] int32 token bitmask row of the current node (if HAS_MASK)
                     V, temp, m, zp, kappa, z, sib, rej, denom,
                     MODE: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, NCHUNK,
                     BLOCK_N: tl.constexpr, HAS_MASK: tl.constexpr):
    """``r = max(0, r - Z * q_c)`` over the vocabulary (``r = p`` before the first rejection);
    returns the new mass ``sum(r)``."""
    offs = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], tl.float32)
    for c in range(0, NCHUNK):
        for t in tl.static_range(0, CHUNK, BLOCK):
            idx = c * CHUNK + t + offs
            mask = idx < V
            if sib == 0:
                x = load_x(row_ptr + idx, mask, temp, False, bits_row, idx, HAS_MASK)
                r = tl.where(mask, target_prob(x, m, zp, kappa), 0.0)
            else:
                r = tl.load(ws_row + idx, mask=mask, other=0.0)
            q = tl.load(q_row + idx, mask=mask, other=0.0).to(tl.float32)
            if MODE == MODE_WITHOUT_REPLACEMENT:
                q = tl.where(_removed(idx, rej, sib, BLOCK_N), 0.0, q) / denom
                q = tl.where(denom > 0.0, q, 0.0)
            r = tl.maximum(r - z * q, 0.0)
            r = tl.where(mask, r, 0.0)
            tl.store(ws_row + idx, r, mask=mask)
            total += r
    return tl.sum(total, axis=0)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _race_chunk(row_ptr,  # [V] logits row of the stop node
                ws_row,  # [V] float32 residual workspace (used when MODE is not deterministic)
                bits_row,  # [W] int32 token bitmask row of the stop node (if HAS_MASK)
                c, V, temp, m, zp, kappa, stream, sib, rej,
                MODE: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                BLOCK_N: tl.constexpr, HAS_MASK: tl.constexpr):
    """Chunk ``c`` of the stop node's race: ``(residual best, its token, plain best, its
    token)``, each the chunk's largest score with the lowest index on ties."""
    offs = tl.arange(0, BLOCK)
    rb_vec = tl.zeros([BLOCK], tl.float32)
    ri_vec = tl.zeros([BLOCK], tl.int32)
    pb_vec = tl.full([BLOCK], -1.0, tl.float32)
    pi_vec = tl.zeros([BLOCK], tl.int32)
    for t in tl.static_range(0, CHUNK, BLOCK):
        idx = c * CHUNK + t + offs
        mask = idx < V
        x = load_x(row_ptr + idx, mask, temp, False, bits_row, idx, HAS_MASK)
        p = tl.where(mask, target_prob(x, m, zp, kappa), 0.0)
        if MODE == MODE_DETERMINISTIC:
            r = tl.where(_removed(idx, rej, sib, BLOCK_N), 0.0, p)
        else:
            r = tl.load(ws_row + idx, mask=mask, other=0.0)
        r = tl.where(sib > 0, r, 0.0)
        e = exponential(uniform(stream, idx))
        rb_vec, ri_vec = merge_best(rb_vec, ri_vec, tl.where(r > 0.0, r / e, 0.0), idx)
        pb_vec, pi_vec = merge_best(
            pb_vec, pi_vec, tl.where(mask & (p > 0.0), p / e, -1.0), idx
        )
    rb = tl.max(rb_vec, axis=0)
    ri = tl.min(tl.where(rb_vec == rb, ri_vec, 2147483647), axis=0)
    pb = tl.max(pb_vec, axis=0)
    pi = tl.min(tl.where(pb_vec == pb, pi_vec, 2147483647), axis=0)
    return rb, ri, pb, pi


@triton.jit
def _race(row_ptr,  # [V] logits row of the stop node
          ws_row,  # [V] float32 residual workspace (used when MODE is not deterministic)
          bits_row,  # [W] int32 token bitmask row of the stop node (if HAS_MASK)
          V, temp, m, zp, kappa, stream, sib, rej,
          MODE: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, NCHUNK,
          BLOCK_N: tl.constexpr, HAS_MASK: tl.constexpr):
    """The exponential race of the stop node: the recovered token over the residual (when a
    child was rejected) and the bonus token over ``p``; the chain's scores
    (``_common.chunk_race``). Chunk by chunk (:func:`_race_chunk`), merged in chunk order."""
    r_best = tl.zeros([], tl.float32)
    r_idx = tl.zeros([], tl.int32)
    p_best = tl.full([], -1.0, tl.float32)
    p_idx = tl.zeros([], tl.int32)
    for c in range(0, NCHUNK):
        rb, ri, pb, pi = _race_chunk(
            row_ptr, ws_row, bits_row, c, V, temp, m, zp, kappa, stream, sib, rej, MODE, CHUNK,
            BLOCK, BLOCK_N, HAS_MASK,
        )
        r_best, r_idx = merge_best(r_best, r_idx, rb, ri)
        p_best, p_idx = merge_best(p_best, p_idx, pb, pi)
    return tl.where((sib > 0) & (r_best > 0.0), r_idx, p_idx)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _node_stats(row,  # [V] logits row of the node
                bits_row,  # [W] int32 token bitmask row of the node (if HAS_MASK)
                pos,  # the node's index in [B*N]
                V, temp, greedy, top_k, top_p,
                part_m_ptr, part_s_ptr, part_a_ptr,  # [B*N, NCHUNK] chunk partials (PRE)
                kappa_ptr, z_ptr,  # [B*N] key threshold, kept mass (PRE with HAS_FILTER)
                cnt_ptr,  # [B*N] int32 zeros: candidates gathered per node (GATHER)
                cidx_row, cx_row,  # [CAP] int32, float32: the row's candidate buffer (GATHER)
                NEED_SUM: tl.constexpr, HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr,
                NPIV: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                TBLOCK: tl.constexpr, NCHUNK, HAS_MASK: tl.constexpr, PRE: tl.constexpr,
                GATHER: tl.constexpr, HAS_FILTER: tl.constexpr, CAP: tl.constexpr,
                SB: tl.constexpr, SW: tl.constexpr):
    """(max of x, first argmax, key threshold, kept mass) of a node: ``PRE``, the split
    statistics' (every node's, computed before the walk by ``NCHUNK`` programs each); else read
    here, in one pass with the filter's candidate buffer (``GATHER``) or chunk by chunk then the
    threshold search, as the chain's walking kernel does."""
    if PRE:
        m, s, a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pos * NCHUNK, NCHUNK)
        kappa, z = _filter_state(kappa_ptr, z_ptr, pos, s, HAS_FILTER)
    elif GATHER:
        m, a, kappa, z, from_buf = position_filter_stats(
            row, V, temp, greedy, top_k, top_p, HAS_TOPK, HAS_TOPP, NPIV, CHUNK, BLOCK, TBLOCK,
            NCHUNK, False, bits_row, HAS_MASK, (cnt_ptr + pos, cidx_row, cx_row), CAP, SB, SW,
        )
    else:
        m, a, kappa, z = position_stats(
            row, V, temp, greedy, top_k, top_p, NEED_SUM, HAS_TOPK, HAS_TOPP, NPIV, CHUNK, BLOCK,
            TBLOCK, NCHUNK, False, bits_row, HAS_MASK,
        )
    return m, a, kappa, z
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _verify_tree_kernel(
    logits_ptr, stride_lb, stride_ln,  # [B, N, V] target logits, vocab stride 1
    tok_ptr, stride_tb,  # [B, N] tree tokens
    par_ptr, stride_pb,  # [B, N] parents
    q_ptr, stride_qb, stride_qn,  # [B, N, V] draft probabilities (unused in MODE 0)
    bits_ptr, stride_mb, stride_mn,  # [B, N, W] int32 token bitmask (unused without HAS_MASK)
    nn_ptr,  # [B] num_nodes
    temp_ptr, topk_ptr, topp_ptr,  # [B] temperature, top_k, top_p (used as flagged)
    seed_ptr,  # [B] int64 seeds
    ws_ptr,  # [B, V] float32 residual workspace (unused in MODE 0)
    tokens_ptr, nodes_ptr,  # [B, N] int64 out: emitted tokens, accepted path; -1 padded
    nacc_ptr,  # [B] int64 out: num_accepted
    part_m_ptr, part_s_ptr, part_a_ptr,  # [B*N, NCHUNK] split chunk statistics (PRE)
    kappa_ptr, z_ptr,  # [B*N] split thresholds and kept masses (PRE with HAS_FILTER)
    cnt_ptr,  # [B*N] int32 zeros: candidates gathered per node (GATHER)
    cidx_ptr, cx_ptr,  # [B, CAP] int32, float32: the row's candidate buffer (GATHER)
    state_ptr, rejws_ptr,  # [B, 3], [B, BLOCK_N] int32 out: stop node, depth, siblings (SPLIT_RACE)
    V, N, NCHUNK,
    GREEDY_ONLY: tl.constexpr, MODE: tl.constexpr, HAS_TOPK: tl.constexpr,
    HAS_TOPP: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, TBLOCK: tl.constexpr,
    NPIV: tl.constexpr, BLOCK_N: tl.constexpr, HAS_MASK: tl.constexpr, PRE: tl.constexpr,
    GATHER: tl.constexpr, HAS_FILTER: tl.constexpr, CAP: tl.constexpr, SB: tl.constexpr,
    SW: tl.constexpr, SPLIT_RACE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    nb = row_count(nn_ptr, b, 1, N)
    temp, greedy, key = row_sampling(temp_ptr, seed_ptr, b, GREEDY_ONLY)
    top_k, top_p = row_filters(topk_ptr, topp_ptr, b, HAS_TOPK, HAS_TOPP)
    need_sum = not GREEDY_ONLY
    ws_row = ws_ptr + b * V

    offs_n = tl.arange(0, BLOCK_N)
    out_tok = tl.full([BLOCK_N], -1, tl.int64)
    out_node = tl.where(offs_n == 0, 0, -1).to(tl.int64)
    rej = tl.full([BLOCK_N], -1, tl.int32)  # tokens of the current node's rejected children
    cur = 0
    depth = 0
    sib = 0
    z = tl.full([], 1.0, tl.float32)  # mass of the unnormalised residual
    removed_mass = tl.zeros([], tl.float32)
    row = logits_ptr + b * stride_lb
    bits_row = bits_ptr + b * stride_mb
    cidx_row = cidx_ptr + b * CAP
    cx_row = cx_ptr + b * CAP
    m, a, kappa, zp = _node_stats(
        row, bits_row, b * N, V, temp, greedy, top_k, top_p, part_m_ptr, part_s_ptr, part_a_ptr,
        kappa_ptr, z_ptr, cnt_ptr, cidx_row, cx_row, need_sum, HAS_TOPK, HAS_TOPP, NPIV, CHUNK,
        BLOCK, TBLOCK, NCHUNK, HAS_MASK, PRE, GATHER, HAS_FILTER, CAP, SB, SW,
    )
    for i in range(1, N):
        parent = tl.load(par_ptr + b * stride_pb + i, mask=i < nb, other=-1).to(tl.int32)
        if parent == cur:
            x = tl.load(tok_ptr + b * stride_tb + i).to(tl.int32)
            in_vocab = (x >= 0) & (x < V)
            xs = tl.minimum(tl.maximum(x, 0), V - 1)
            row = logits_ptr + b * stride_lb + cur.to(tl.int64) * stride_ln
            q_row = q_ptr + b * stride_qb + cur.to(tl.int64) * stride_qn
            bits_row = bits_ptr + b * stride_mb + cur.to(tl.int64) * stride_mn
            accept = in_vocab & (x == a)
            r_x = tl.zeros([], tl.float32)
            x_removed = tl.sum((rej == x).to(tl.int32), axis=0) > 0
            denom = 1.0 - removed_mass
            if not GREEDY_ONLY:
                if greedy == 0:
                    x_s = load_x(row + xs, xs == xs, temp, False, bits_row, xs, HAS_MASK)
                    p_x = target_prob(x_s, m, zp, kappa)
                    if MODE == MODE_DETERMINISTIC:
                        r_x = tl.where(x_removed, 0.0, p_x)
                        q_x = tl.full([], 1.0, tl.float32)
                    else:
                        r_x = p_x
                        if sib > 0:
                            r_x = tl.load(ws_row + xs)
                        q_x = tl.load(q_row + xs).to(tl.float32)
                        if MODE == MODE_WITHOUT_REPLACEMENT:
                            q_x = tl.where(x_removed, 0.0, q_x) / denom
                            q_x = tl.where(denom > 0.0, q_x, 0.0)
                    r_x = tl.where(in_vocab, r_x, 0.0)
                    u = uniform(stream_key(key, depth, PURPOSE_ACCEPT), sib)
                    accept = in_vocab & (r_x > 0.0) & (q_x > 0.0) & (u * q_x * z < r_x)
            if accept:
                out_tok = tl.where(offs_n == depth, x.to(tl.int64), out_tok)
                depth += 1
                out_node = tl.where(offs_n == depth, i, out_node)
                cur = i
                sib = 0
                z = 1.0
                removed_mass = 0.0
                rej = tl.full([BLOCK_N], -1, tl.int32)
                row = logits_ptr + b * stride_lb + cur.to(tl.int64) * stride_ln
                bits_row = bits_ptr + b * stride_mb + cur.to(tl.int64) * stride_mn
                m, a, kappa, zp = _node_stats(
                    row, bits_row, b * N + cur, V, temp, greedy, top_k, top_p, part_m_ptr,
                    part_s_ptr, part_a_ptr, kappa_ptr, z_ptr, cnt_ptr, cidx_row, cx_row,
                    need_sum, HAS_TOPK, HAS_TOPP, NPIV, CHUNK, BLOCK, TBLOCK, NCHUNK, HAS_MASK,
                    PRE, GATHER, HAS_FILTER, CAP, SB, SW,
                )
            else:
                if not GREEDY_ONLY:
                    if greedy == 0:
                        if MODE == MODE_DETERMINISTIC:
                            z = tl.maximum(z - r_x, 0.0)
                        else:
                            z = _shrink_residual(
                                row, q_row, ws_row, bits_row, V, temp, m, zp, kappa, z, sib, rej,
                                denom, MODE, CHUNK, BLOCK, NCHUNK, BLOCK_N, HAS_MASK,
                            )
                            if MODE == MODE_WITHOUT_REPLACEMENT:
                                fresh = in_vocab & (x_removed == 0)
                                q_first = tl.load(q_row + xs).to(tl.float32)
                                removed_mass += tl.where(fresh, q_first, 0.0)
                rej = tl.where(offs_n == sib, tl.where(in_vocab, x, -1), rej)
                sib += 1

    recovered_or_bonus = a
    if SPLIT_RACE:  # the race is _tree_race_kernel's, NCHUNK programs; _tree_finish's token
        tl.store(state_ptr + b * 3, cur)
        tl.store(state_ptr + b * 3 + 1, depth)
        tl.store(state_ptr + b * 3 + 2, sib)
        tl.store(rejws_ptr + b * BLOCK_N + offs_n, rej)
    elif not GREEDY_ONLY:
        if greedy == 0:
            row = logits_ptr + b * stride_lb + cur.to(tl.int64) * stride_ln
            bits_row = bits_ptr + b * stride_mb + cur.to(tl.int64) * stride_mn
            stream = stream_key(key, depth, PURPOSE_SAMPLE)
            recovered_or_bonus = _race(
                row, ws_row, bits_row, V, temp, m, zp, kappa, stream, sib, rej, MODE, CHUNK,
                BLOCK, NCHUNK, BLOCK_N, HAS_MASK,
            )
    recovered_or_bonus = tl.minimum(tl.maximum(recovered_or_bonus, 0), V - 1).to(tl.int64)
    out_tok = tl.where(offs_n == depth, recovered_or_bonus, out_tok)
    tl.store(tokens_ptr + b * N + offs_n, out_tok, mask=offs_n < N)
    tl.store(nodes_ptr + b * N + offs_n, out_node, mask=offs_n < N)
    tl.store(nacc_ptr + b, depth.to(tl.int64))
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _tree_race_kernel(
    logits_ptr, stride_lb, stride_ln,  # [B, N, V] target logits, vocab stride 1
    bits_ptr, stride_mb, stride_mn,  # [B, N, W] int32 token bitmask (unused without HAS_MASK)
    temp_ptr, seed_ptr,  # [B] temperature, int64 seeds
    ws_ptr,  # [B, V] float32 residual workspace (unused in MODE 0)
    state_ptr, rejws_ptr,  # [B, 3], [B, BLOCK_N] int32: stop node, depth, siblings; their tokens
    part_m_ptr, part_s_ptr, part_a_ptr,  # [B*N, NCHUNK] split chunk statistics
    kappa_ptr, z_ptr,  # [B*N] split thresholds and kept masses (HAS_FILTER)
    race_rb_ptr, race_ri_ptr, race_pb_ptr, race_pi_ptr,  # [B, NCHUNK] out: the chunk's race
    V, N, NCHUNK,
    MODE: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_FILTER: tl.constexpr,
):
    """One chunk of the stop node's race (:func:`_race_chunk`) after the split strategy's walk:
    grid ``(B, NCHUNK)``; greedy rows race nothing."""
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    temp, greedy, key = row_sampling(temp_ptr, seed_ptr, b, False)
    if greedy == 0:
        cur = tl.load(state_ptr + b * 3)
        depth = tl.load(state_ptr + b * 3 + 1)
        sib = tl.load(state_ptr + b * 3 + 2)
        rej = tl.load(rejws_ptr + b * BLOCK_N + tl.arange(0, BLOCK_N))
        pos = b * N + cur
        m, s, a = _merged_stats(part_m_ptr, part_s_ptr, part_a_ptr, pos * NCHUNK, NCHUNK)
        kappa, zp = _filter_state(kappa_ptr, z_ptr, pos, s, HAS_FILTER)
        row = logits_ptr + b * stride_lb + cur.to(tl.int64) * stride_ln
        bits_row = bits_ptr + b * stride_mb + cur.to(tl.int64) * stride_mn
        stream = stream_key(key, depth, PURPOSE_SAMPLE)
        rb, ri, pb, pi = _race_chunk(
            row, ws_ptr + b * V, bits_row, c, V, temp, m, zp, kappa, stream, sib, rej, MODE,
            CHUNK, BLOCK, BLOCK_N, HAS_MASK,
        )
        at = b * NCHUNK + c
        tl.store(race_rb_ptr + at, rb)
        tl.store(race_ri_ptr + at, ri)
        tl.store(race_pb_ptr + at, pb)
        tl.store(race_pi_ptr + at, pi)


@triton.jit
def _tree_finish_kernel(
    temp_ptr,  # [B] temperature
    state_ptr,  # [B, 3] int32: stop node, depth, siblings tried
    race_rb_ptr, race_ri_ptr, race_pb_ptr, race_pi_ptr,  # [B, NCHUNK] the chunks' races
    tokens_ptr,  # [B, N] int64 out: the recovered or bonus token at the stop depth
    V, N, NCHUNK,
):
    """The stop node's race merged in chunk order, as :func:`_race` merges it: the token at the
    row's stop depth (sampled rows; a greedy row keeps the walk's argmax). Grid ``(B,)``."""
    b = tl.program_id(0).to(tl.int64)
    temp, greedy = row_temperature(temp_ptr, b, False)
    if greedy == 0:
        depth = tl.load(state_ptr + b * 3 + 1)
        sib = tl.load(state_ptr + b * 3 + 2)
        r_best = tl.zeros([], tl.float32)
        r_idx = tl.zeros([], tl.int32)
        p_best = tl.full([], -1.0, tl.float32)
        p_idx = tl.zeros([], tl.int32)
        for c in range(0, NCHUNK):
            at = b * NCHUNK + c
            r_best, r_idx = merge_best(r_best, r_idx, tl.load(race_rb_ptr + at),
                                       tl.load(race_ri_ptr + at))
            p_best, p_idx = merge_best(p_best, p_idx, tl.load(race_pb_ptr + at),
                                       tl.load(race_pi_ptr + at))
        token = tl.where((sib > 0) & (r_best > 0.0), r_idx, p_idx)
        token = tl.minimum(tl.maximum(token, 0), V - 1).to(tl.int64)
        tl.store(tokens_ptr + b * N + depth, token)
# fmt: on


def verify_tree(
    target_logits,
    tree_tokens,
    parents,
    draft_probs,
    num_nodes,
    mode,
    temperature,
    top_k,
    top_p,
    seeds,
    *,
    greedy_only: bool,
    token_bitmask=None,
    strategy: str | None = None,
):
    """Launch the tree kernel; see :func:`specdec_kernels.verify_tree_sampling`.

    Inputs are already checked: ``target_logits [B, N, V]`` (last stride 1), ``tree_tokens`` and
    ``parents [B, N]`` (unit last stride), ``draft_probs [B, N, V]`` (last stride 1; None in mode
    0), ``num_nodes [B]``, ``temperature [B]`` float32, ``top_k [B]`` int64 or None, ``top_p
    [B]`` float32 or None, ``seeds [B]`` int64. ``greedy_only`` ignores the sampling arguments.
    ``token_bitmask``: None or int32 ``[B, N, W]`` (last stride 1); a disallowed token is a
    ``-inf`` logit. ``strategy``: ``"split"`` computes every node's statistics first, each row
    spread over ``NCHUNK`` programs (the chain's split statistics kernels, the nodes as its
    positions), and the walk reads them; ``"row"`` reads each node on the path as the walk
    reaches it; None: the chain's choice for the batch size
    (:func:`specdec_kernels.ops.verify_sampling.pick_strategy`).
    Returns ``(tokens [B, N], num_accepted [B], accepted_nodes [B, N])`` int64.
    """
    batch, n, vocab = target_logits.shape
    device = target_logits.device
    cfg = launch_config(vocab)
    tokens = torch.empty((batch, n), dtype=torch.int64, device=device)
    nodes = torch.empty((batch, n), dtype=torch.int64, device=device)
    num_accepted = torch.empty((batch,), dtype=torch.int64, device=device)
    if batch == 0:
        return tokens, num_accepted, nodes
    mode = 0 if greedy_only else int(mode)
    has_q = mode != 0
    q = draft_probs if has_q else target_logits  # never read in mode 0
    stride_qb, stride_qn = (q.stride(0), q.stride(1)) if has_q else (0, 0)
    ws = (
        torch.empty((batch, vocab), dtype=torch.float32, device=device)
        if has_q
        else num_accepted  # never read in mode 0
    )
    has_mask = token_bitmask is not None
    bits = token_bitmask if has_mask else target_logits  # never read without a bitmask
    stride_mb, stride_mn = (bits.stride(0), bits.stride(1)) if has_mask else (0, 0)
    c = row_controls(num_nodes, temperature, top_k, top_p, seeds, greedy_only=greedy_only)
    strategy = strategy or chain.pick_strategy(batch, device)
    if strategy not in ("row", "split"):
        raise ValueError(f"strategy must be 'row', 'split' or None, got {strategy!r}")
    has_filter = c.has_top_k or c.has_top_p
    # the row strategy's walk gathers its nodes' candidates; with a token bitmask too it would
    # spill registers (12 bytes at sm_90), so it searches the thresholds there as before
    gather = has_filter and strategy == "row" and not has_mask
    if strategy == "split":  # every node's statistics first, NCHUNK programs a node
        args = chain._Args(
            rows=chain._rows(target_logits, None, None, None, token_bitmask, num_nodes),
            drafts=(tree_tokens[:, 1:], tree_tokens.stride(0)),  # never read: no race here
            num_draft_tokens=num_nodes - 1,  # positions 0 .. num_nodes - 1: the live nodes
            controls=c,
            edits=edit_args(None, None, vocab, num_nodes),
            cfg=cfg,
            greedy_only=greedy_only,
            log_input=False,
            method=chain.METHODS["token"],
            race_in_stats=False,
        )
        parts = chain.split_statistics(args, batch * n, device)
        stats, filt = parts.stats, parts.filter
    else:
        stats, filt = (num_accepted,) * 3, (num_accepted,) * 2  # never read in the row strategy
    cand = chain._candidates(batch, n, cfg["CAP"] if gather else 0, device)
    split_race = strategy == "split" and not greedy_only
    block_n = triton.next_power_of_2(n)
    if split_race:
        state = torch.empty((batch, 3), dtype=torch.int32, device=device)
        rej = torch.empty((batch, block_n), dtype=torch.int32, device=device)
    else:
        state = rej = cand.count  # never written without SPLIT_RACE
    launch(
        _verify_tree_kernel,
        (batch,),
        target_logits,
        target_logits.stride(0),
        target_logits.stride(1),
        tree_tokens,
        tree_tokens.stride(0),
        parents,
        parents.stride(0),
        q,
        stride_qb,
        stride_qn,
        bits,
        stride_mb,
        stride_mn,
        num_nodes,
        c.temperature,
        c.top_k,
        c.top_p,
        c.seeds,
        ws,
        tokens,
        nodes,
        num_accepted,
        *stats,
        *filt,
        cand.count,
        cand.ids,
        cand.x,
        state,
        rej,
        vocab,
        n,
        cfg["NCHUNK"],
        GREEDY_ONLY=greedy_only,
        MODE=mode,
        HAS_TOPK=c.has_top_k,
        HAS_TOPP=c.has_top_p,
        CHUNK=cfg["CHUNK"],
        BLOCK=cfg["BLOCK"],
        TBLOCK=cfg["TBLOCK"],
        NPIV=cfg["NPIV"],
        BLOCK_N=block_n,
        HAS_MASK=has_mask,
        PRE=strategy == "split",
        GATHER=gather,
        HAS_FILTER=has_filter,
        CAP=cfg["CAP"],
        SB=cfg["SB"],
        SW=cfg["SW"],
        SPLIT_RACE=split_race,
        **WALK_COMPILE,
    )
    if split_race:  # the stop node's race, NCHUNK programs a row, then its token
        races = tuple(parts.race[:4])  # [B*N, NCHUNK] workspaces: the first B rows serve
        launch(
            _tree_race_kernel, (batch, cfg["NCHUNK"]),
            target_logits, target_logits.stride(0), target_logits.stride(1),
            bits, stride_mb, stride_mn,
            c.temperature, c.seeds,
            ws,
            state, rej,
            *stats,
            *filt,
            *races,
            vocab, n, cfg["NCHUNK"],
            MODE=mode, CHUNK=cfg["CHUNK"], BLOCK=cfg["BLOCK"], BLOCK_N=block_n,
            HAS_MASK=has_mask, HAS_FILTER=has_filter, **chain.THRESHOLD_COMPILE,
        )  # fmt: skip
        launch(
            _tree_finish_kernel, (batch,),
            c.temperature, state, *races, tokens, vocab, n, cfg["NCHUNK"],
            **chain.SPLIT_COMPILE,
        )  # fmt: skip
    return tokens, num_accepted, nodes
