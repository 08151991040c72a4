"""``@triton.jit`` helpers shared by the verification kernels.

The random numbers here are the uint32 twins of :mod:`specdec_kernels.reference.rng` (same keys,
same mixer, bit-identical draws). The chunk helpers compute the per-chunk statistics that both
launch strategies of :mod:`specdec_kernels.ops.verify_sampling` combine in the same order, which is
what makes the two strategies give identical results. :func:`launch` is how every op launches
its kernels (one interpreted launch at a time, see below); :func:`launch_config`,
:func:`row_controls` and the ``COMPILE`` options are the host side every verification launcher
shares, and :func:`row_sampling` / :func:`row_filters` / :func:`position_stats` the per-row and
per-position setup of every verification kernel.
"""

import contextlib
import dataclasses
import os
import threading

import torch
import triton
import triton.language as tl

try:  # Triton's interpreter (TRITON_INTERPRET=1: every @triton.jit function is one of these)
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # older triton: no separate class; the environment variable decides
    InterpretedFunction = ()

# Keep in sync with specdec_kernels.reference.rng (a test checks the draws are identical).
GOLDEN = tl.constexpr(0x9E3779B9)
POS_MULT = tl.constexpr(0x85EBCA77)
PURPOSE_MULT = tl.constexpr(0xC2B2AE3D)
INDEX_MULT = tl.constexpr(0x27D4EB2F)
PURPOSE_ACCEPT = tl.constexpr(0)
PURPOSE_SAMPLE = tl.constexpr(1)
KEY_FLOOR = tl.constexpr(-2147483649)  # below every float key: "keep everything"
KEY_CEIL = tl.constexpr(2147483648)  # above every float key: "gather nothing"
NEG_INF_KEY = tl.constexpr(-2139095041)  # float_key(-inf)
INT32_MIN = tl.constexpr(-2147483648)
# The filters' candidate buffer (per position): a position's top-k / top-p thresholds are selected
# from the tokens its statistics pass gathered (those at or above a cutoff estimated from a
# sample of SAMPLE_BLOCKS blocks of SAMPLE_WIDTH tokens, aimed at CANDIDATES / 4 of them); a
# position whose kept set is not inside the buffer falls back to the pivot search.
CANDIDATES = 1024
SAMPLE_BLOCKS = 16
SAMPLE_WIDTH = 128
# Rounds that always finish a threshold search over 32-bit keys with 16 pivots a round
# (the range shrinks to at most ceil(range / 17) per round: 2**32 + 1 -> 1 in 8; one spare).
SEARCH_ROUNDS = tl.constexpr(9)
# Uniforms (reference.rng.unit_interval): v = (r + 0.5) * 2**-32 below r = 2**23, else
# ((r >> 9) + 0.5) * 2**-23; exact, in [2**-33, 1 - 2**-24]: fine near 0 for the race's tail.
UNIFORM_SHIFT = tl.constexpr(9)
UNIFORM_SCALE = tl.constexpr(2.0**-23)
FINE_LIMIT = tl.constexpr(0x800000)
FINE_SCALE = tl.constexpr(2.0**-32)
SERIES_LIMIT = tl.constexpr(2.0**-9)  # E = -log(1 - v) by its series below it
# The fused race (chunk_stats_race) takes its winner where it beats every other token by more than
# this margin of log scores (nats); closer, the race over the row decides. The margins' rounding
# (the x differences, two logs) and that of p / E in the race over the row are each below ~1e-5
# where a token can win (GPU's approximate exp and log included): 2**-13 = 1.2e-4 leaves them
# 3x. At most about that fraction of the races reads its row again (the log gap of the top two
# is ~Exp(1) among many equally likely tokens, wider where one token dominates).
RACE_TOL = tl.constexpr(2.0**-13)
TILES_PER_CHUNK = 4
NUM_PIVOTS = 16
# No FMA contraction: every kernel then rounds the shared chunk arithmetic the same way, which the
# identical-results promise between the two chain strategies relies on (and it tracks the
# reference).
COMPILE = {"enable_fp_fusion": False}
# The walking kernels (the chain's row strategy, the tree) keep a position's statistics, filter
# state and race state live at once; under ptxas's default budget (128 registers at 4 warps) some
# variants spill. 240 registers remove every spill at sm_80 and sm_90, the masked block and tree
# variants included (tests/aot_compile.py --fail-on-spills); 2 programs of 4 warps still fit an
# SM's 64K registers.
WALK_COMPILE = {**COMPILE, "maxnreg": 240}

# Sparse logit edits (API.md section 10): a row's edited token ids are sorted, and the launcher
# indexes them by granules of EDIT_GRANULE tokens (edit_table: csr[b, g] = the number of row b's
# ids below g * EDIT_GRANULE, a [B, ceil(V / 32) + 1] int32 table made with torch.searchsorted).
# A tile finds its edits from the table's entries at its first and last token (edit_logits);
# up to EDIT_SCAN of them are applied one by one, more by a binary search per lane.
EDIT_GRANULE = tl.constexpr(32)
EDIT_SCAN = tl.constexpr(8)

# Triton's interpreter keeps the launch it is running in module globals (the grid, the patched
# `triton.language`), so two interpreted launches from different threads corrupt each other
# ("InterpreterError ... x >= grid_dim[0]"). Interpreted launches take this lock; compiled GPU
# launches never do.
_INTERPRETER_LOCK = threading.Lock()


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``, one interpreted launch at a time in this process."""
    with _interpreter_lock(kernel):
        return kernel[grid](*args, **kwargs)


def _interpreter_lock(kernel):
    if isinstance(kernel, InterpretedFunction) or os.environ.get("TRITON_INTERPRET") == "1":
        return _INTERPRETER_LOCK
    return contextlib.nullcontext()


def launch_config(vocab_size: int) -> dict:
    """Tile sizes, fixed by ``V`` alone so that every kernel chunks a row identically."""
    block = min(1024, triton.next_power_of_2(vocab_size))
    chunk = block * TILES_PER_CHUNK
    return {
        "BLOCK": block,
        "CHUNK": chunk,
        "TBLOCK": min(128, block),
        "NPIV": NUM_PIVOTS,
        "NCHUNK": triton.cdiv(vocab_size, chunk),
        "CAP": CANDIDATES,
        "SB": SAMPLE_BLOCKS,
        "SW": SAMPLE_WIDTH,
    }


@dataclasses.dataclass(frozen=True)
class RowControls:
    """The ``[B]`` control tensors a verification kernel is passed, and its filter flags."""

    temperature: object  # [B] float32
    top_k: object  # [B] int64
    top_p: object  # [B] float32
    seeds: object  # [B] int64
    has_top_k: bool
    has_top_p: bool
    min_p: object = None  # [B] float32
    has_min_p: bool = False

    @property
    def has_filter(self) -> bool:
        return self.has_top_k or self.has_top_p or self.has_min_p


def row_controls(placeholder, temperature, top_k, top_p, seeds, *, greedy_only: bool, min_p=None):
    """:class:`RowControls` of one call. A pointer the kernel never reads still needs a tensor:
    ``placeholder`` (any ``[B]`` tensor of the call) stands for the controls that are None or,
    with ``greedy_only``, ignored; the filter flags are off for greedy-only calls."""
    return RowControls(
        temperature=placeholder if greedy_only else temperature,
        top_k=top_k if top_k is not None else placeholder,
        top_p=top_p if top_p is not None else placeholder,
        seeds=placeholder if greedy_only else seeds,
        has_top_k=top_k is not None and not greedy_only,
        has_top_p=top_p is not None and not greedy_only,
        min_p=min_p if min_p is not None else placeholder,
        has_min_p=min_p is not None and not greedy_only,
    )


@dataclasses.dataclass(frozen=True)
class EditArgs:
    """A call's sparse logit edits as kernel arguments (API.md section 10)."""

    ids: object  # [B, E] int32 edited token ids, sorted, padded with V
    vals: object  # [B, P, E] float32 their logits at each position (P = K+1, or the rows)
    table: object  # [B, NG+1] int32 edit_table
    num_edits: int  # E
    num_granules: int  # NG = ceil(V / EDIT_GRANULE)
    has_edits: bool


def edit_args(edit_ids, edit_vals, vocab_size: int, placeholder) -> EditArgs:
    """:class:`EditArgs` of one call: the ``[B, NG+1]`` granule table of the sorted edit ids
    (``table[b, g]`` = how many of row ``b``'s ids are below ``min(g * EDIT_GRANULE, V)``; the
    padding ids ``V`` never count), or ``placeholder`` tensors without edits."""
    if edit_ids is None:
        return EditArgs(placeholder, placeholder, placeholder, 1, 0, False)
    ids = edit_ids.to(torch.int32).contiguous()
    granules = triton.cdiv(vocab_size, EDIT_GRANULE.value)
    bounds = torch.arange(granules + 1, device=ids.device, dtype=torch.int32) * EDIT_GRANULE.value
    bounds = bounds.clamp_max(vocab_size).expand(ids.shape[0], granules + 1).contiguous()
    table = torch.searchsorted(ids, bounds, out_int32=True)
    vals = edit_vals.to(torch.float32).contiguous()
    return EditArgs(ids, vals, table, ids.shape[1], granules, True)


@triton.jit
def fmix32(h):
    """MurmurHash3's 32-bit finaliser on uint32 values."""
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def row_key(seed):
    """32-bit key of a row from its int64 seed."""
    lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    return fmix32(lo ^ fmix32(hi + GOLDEN))


@triton.jit
def stream_key(key, position, PURPOSE: tl.constexpr):
    """Key of the (row, position, purpose) stream."""
    mixed = key + position.to(tl.uint32) * POS_MULT
    if PURPOSE != 0:
        mixed = mixed + PURPOSE_MULT
    return fmix32(mixed)


@triton.jit
def unit_interval(r):
    """uint32 draws to float32 uniforms in ``[2**-33, 1 - 2**-24]``, fine near 0 (exact)."""
    fine = (r.to(tl.float32) + 0.5) * FINE_SCALE  # exact where kept (r < 2**23)
    coarse = ((r >> UNIFORM_SHIFT).to(tl.float32) + 0.5) * UNIFORM_SCALE
    return tl.where(r < FINE_LIMIT, fine, coarse)


@triton.jit
def exponential(v):
    """The race's Exp(1) draw ``-log(1 - v)``: its series below ``v = 2**-9`` (``1 - v`` would
    round), else the logarithm of the exact ``1 - v``. Finite and ``>= v > 0``."""
    series = v * (1.0 + v * (0.5 + v * (1.0 / 3.0)))
    return tl.where(v < SERIES_LIMIT, series, -tl.log(1.0 - v))


@triton.jit
def _unit(r, stream):
    return unit_interval(fmix32(r + stream))


@triton.jit
def uniform(stream, index):
    """Float32 uniforms in ``[2**-33, 1 - 2**-24]`` of ``stream`` at integer tensor ``index``."""
    return _unit(fmix32(stream ^ (index.to(tl.uint32) * INDEX_MULT)), stream)


@triton.jit
def uniform_first(stream):
    """The uniform of ``stream`` at index 0 (the accept test's number)."""
    return _unit(fmix32(stream), stream)


@triton.jit
def row_count(ptr, b, lo, hi):  # ptr: [B] integer counts (num_draft_tokens, num_nodes)
    """Row ``b``'s count clamped to ``[lo, hi]``, int32 (bad counts stay in bounds)."""
    return tl.minimum(tl.maximum(tl.load(ptr + b).to(tl.int32), lo), hi)


@triton.jit
def row_temperature(temp_ptr, b, GREEDY_ONLY: tl.constexpr):  # temp_ptr: [B]
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
def row_sampling(temp_ptr, seed_ptr, b, GREEDY_ONLY: tl.constexpr):  # [B] each
    """(temperature, is-greedy flag, RNG row key) of row ``b``."""
    temp, greedy = row_temperature(temp_ptr, b, GREEDY_ONLY)
    if GREEDY_ONLY:
        key = tl.zeros([], tl.uint32)
    else:
        key = row_key(tl.load(seed_ptr + b))
    return temp, greedy, key


@triton.jit
def row_filters(topk_ptr, topp_ptr, b, HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr):
    """(top_k, top_p) of row ``b`` from ``[B]`` tensors; 0 and 1.0 (off) where a flag is off."""
    top_k = 0
    top_p = 1.0
    if HAS_TOPK:
        top_k = tl.load(topk_ptr + b)
    if HAS_TOPP:
        top_p = tl.load(topp_ptr + b).to(tl.float32)
    return top_k, top_p


@triton.jit
def row_min_p(minp_ptr, b, HAS_MINP: tl.constexpr):  # minp_ptr: [B] float32
    """min-p of row ``b``; 0 (off) without ``HAS_MINP``."""
    min_p = 0.0
    if HAS_MINP:
        min_p = tl.load(minp_ptr + b).to(tl.float32)
    return min_p


@triton.jit
def edit_row(ids_ptr, vals_ptr, table_ptr, b, row, E, NG):
    """The ``edits`` tuple of row ``b`` at values row ``row`` (``b * P + position``):
    ``(ids [E], vals [E], table [NG+1], NG)`` (:class:`EditArgs`)."""
    return ids_ptr + b * E, vals_ptr + row * E, table_ptr + b * (NG + 1), NG


@triton.jit
def edit_logits(logit, idx, mask, edits):
    """``logit`` (float32, the tile's token ids ``idx``, any shape) with the edited tokens'
    values: ``vals[e]`` where ``ids[e] == idx`` (``edits``: :func:`edit_row`).

    Cost: the tile's smallest and largest id (two reductions) and two scalar loads of the
    granule table (``[V / 32 + 1]`` int32 a row, cached); a tile with no edited token in its
    granules stops there, which is the common case. A tile with up to ``EDIT_SCAN`` edits applies
    them one by one (two scalar loads and one select over the tile each): ``O(E)`` extra bytes
    per pass over a row, never ``O(V)``. A tile with more (dense edits) finds each lane's by a
    branch-free binary search over the tile's slice of the sorted ids (``log2`` of its size
    gathers from cached words) and one masked load of the value.
    """
    ids_row = edits[0]
    vals_row = edits[1]
    table = edits[2]
    ng = edits[3]
    lanes = idx + tl.zeros([1], idx.dtype)  # a scalar id as a 1-lane tile
    lo = tl.min(lanes, axis=None)
    hi = tl.max(lanes, axis=None)
    e_lo = tl.load(table + tl.minimum(lo // EDIT_GRANULE, ng))
    e_hi = tl.load(table + tl.minimum(hi // EDIT_GRANULE + 1, ng))
    n = e_hi - e_lo
    if n > 0:
        if n <= EDIT_SCAN:
            for e in range(e_lo, e_hi):
                hit = mask & (idx == tl.load(ids_row + e))
                logit = tl.where(hit, tl.load(vals_row + e), logit)
        else:
            # the last e in [e_lo, e_hi) with ids[e] <= idx (e_lo if none): the hit if equal
            base = tl.zeros_like(idx).to(tl.int32) + e_lo
            while n > 1:
                half = n // 2
                probe = tl.load(ids_row + base + half)
                base = tl.where(probe <= idx, base + half, base)
                n -= half
            hit = mask & (tl.load(ids_row + base) == idx)
            logit = tl.where(hit, tl.load(vals_row + base, mask=hit, other=0.0), logit)
    return logit


@triton.jit
def load_x(ptr, mask, temp, LOG_X: tl.constexpr, bits_row=None, idx=None,
           HAS_MASK: tl.constexpr = False, edits=None,
           HAS_EDITS: tl.constexpr = False):  # fmt: skip
    """``x = logit / temp`` of the logits at ``ptr`` (``-inf`` where masked); with ``LOG_X`` the
    inputs are probabilities and ``x = log(prob)`` (``log 0 = -inf``: masked; ``temp`` unused).
    With ``HAS_MASK`` the token ids ``idx`` (``ptr`` = row + ``idx``) are looked up in the token
    bitmask row ``bits_row`` (``[W]`` int32, bit ``idx % 32`` of word ``idx // 32``): a
    disallowed token is ``-inf``, whatever its logit (API.md section 9). With ``HAS_EDITS`` the
    logits of the position's edited tokens are replaced first (:func:`edit_logits`, API.md
    section 10; never with ``LOG_X``): the bitmask and the temperature then apply to them."""
    if LOG_X:
        x = tl.log(tl.load(ptr, mask=mask, other=0.0).to(tl.float32))
    else:
        logit = tl.load(ptr, mask=mask, other=float("-inf")).to(tl.float32)
        if HAS_EDITS:
            logit = edit_logits(logit, idx, mask, edits)
        x = logit / temp
    if HAS_MASK:
        word = tl.load(bits_row + (idx >> 5), mask=mask, other=0)
        x = tl.where(((word >> (idx & 31)) & 1) != 0, x, float("-inf"))
    return x


@triton.jit
def float_key(x):
    """Order-preserving int64 key of float32 ``x`` (``-0.0`` counts as ``+0.0``)."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def merge_stats(big_m, big_s, big_a, m, s, a):
    """Merge chunk statistics (max, sum of exp(x - max), first argmax) into running ones.

    The running side comes first in index order, so on equal maxima its argmax is kept.
    """
    new_m = tl.maximum(big_m, m)
    safe = tl.where(new_m == float("-inf"), 0.0, new_m)  # exp(-inf - safe) = 0, never NaN
    scaled_big = big_s * tl.exp(big_m - safe)
    scaled = s * tl.exp(m - safe)
    new_a = tl.where(m > big_m, a, big_a)
    return new_m, scaled_big + scaled, new_a


@triton.jit
def merge_best(best, index, cand, cand_index):
    """Keep the larger score; on equal scores the earlier (running) index."""
    take = cand > best
    return tl.where(take, cand, best), tl.where(take, cand_index, index)


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def chunk_stats(row_ptr,  # [V] one logits row
                chunk_start, V, temp, NEED_SUM: tl.constexpr,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr, LOG_X: tl.constexpr = False,
                bits_row=None,  # [W] int32 token bitmask row (if HAS_MASK)
                HAS_MASK: tl.constexpr = False, GATHER: tl.constexpr = False, pivot=0,
                cand=None,  # (count [1] int32, token ids [CAP] int32, x [CAP] float32) if GATHER
                CAP: tl.constexpr = 1,
                edits=None,  # (ids [E], vals [E], csr [NG+1], NG): edit_row (if HAS_EDITS)
                HAS_EDITS: tl.constexpr = False):
    """Max of ``x = logit / temp``, sum of ``exp(x - max)`` and first argmax over one chunk.

    With ``GATHER``, the finite tokens with ``float_key(x) >= pivot`` are also appended to the
    position's candidate buffer (:func:`gather`) while the tiles are in registers."""
    offs = tl.arange(0, BLOCK)
    m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
    s_vec = tl.zeros([BLOCK], tl.float32)
    i_vec = tl.zeros([BLOCK], tl.int32)
    for t in tl.static_range(0, CHUNK, BLOCK):
        idx = chunk_start + t + offs
        mask = idx < V
        x = load_x(row_ptr + idx, mask, temp, LOG_X, bits_row, idx, HAS_MASK, edits, HAS_EDITS)
        if GATHER:
            gather(x, idx, mask, pivot, cand[0], cand[1], cand[2], CAP)
        i_vec = tl.where(x > m_vec, idx, i_vec)
        new_m = tl.maximum(m_vec, x)
        if NEED_SUM:
            safe = tl.where(new_m == float("-inf"), 0.0, new_m)  # no (-inf) - (-inf)
            s_vec = s_vec * tl.exp(m_vec - safe) + tl.exp(x - safe)
        m_vec = new_m
    m = tl.max(m_vec, axis=0)
    a = tl.min(tl.where(m_vec == m, i_vec, 2147483647), axis=0)
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(s_vec * tl.exp(m_vec - safe_m), axis=0)
    return m, s, a
# fmt: on


@triton.jit
def log_exponential(stream, idx):
    """``log E`` of the race's exponentials at the token ids ``idx`` (the fused race's noise)."""
    return tl.log(exponential(uniform(stream, idx)))


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _race_tile(row_ptr,  # [V] one logits row
               idx, V, temp, stream, draft, m_vec, s_vec, i_vec, b_x, b_le, b_i, gap,
               LOG_X: tl.constexpr,
               bits_row,  # [W] int32 token bitmask row (if HAS_MASK)
               HAS_MASK: tl.constexpr,
               edits,  # (ids [E], vals [E], csr [NG+1], NG): edit_row (if HAS_EDITS)
               HAS_EDITS: tl.constexpr):
    """One tile of :func:`chunk_stats_race`: the lanes' statistics and race state updated."""
    x = load_x(row_ptr + idx, idx < V, temp, LOG_X, bits_row, idx, HAS_MASK, edits, HAS_EDITS)
    i_vec = tl.where(x > m_vec, idx, i_vec)
    new_m = tl.maximum(m_vec, x)
    safe = tl.where(new_m == float("-inf"), 0.0, new_m)  # no (-inf) - (-inf)
    s_vec = s_vec * tl.exp(m_vec - safe) + tl.exp(x - safe)
    le = log_exponential(stream, idx)
    live = (x > float("-inf")) & (idx != draft)
    # the new token's margin over the lane's best (+inf where the lane has none)
    margin = (tl.where(live, x, 0.0) - b_x) - (le - b_le)
    take = live & (margin > 0.0)
    gap = tl.where(take, margin, tl.where(live, tl.minimum(gap, -margin), gap))
    b_x = tl.where(take, x, b_x)
    b_le = tl.where(take, le, b_le)
    b_i = tl.where(take, idx, b_i)
    return new_m, s_vec, i_vec, b_x, b_le, b_i, gap
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def chunk_stats_race(row_ptr,  # [V] one logits row
                     chunk_start, V, temp, stream, draft, CHUNK: tl.constexpr,
                     BLOCK: tl.constexpr, LOG_X: tl.constexpr,
                     bits_row,  # [W] int32 token bitmask row (if HAS_MASK)
                     HAS_MASK: tl.constexpr, UNROLL: tl.constexpr,
                     edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
                     HAS_EDITS: tl.constexpr = False):
    """:func:`chunk_stats` and, in the same pass, the race of an unfiltered position with a
    one-hot draft over the chunk's tokens but the draft, without the row's max or normaliser.

    The race's winner is the argmax of ``p / E = exp(x - m) / (Z E)``: of the log score
    ``x - log E``, which needs neither ``m`` nor ``Z``. Its absolute value is not kept (at
    ``T = 1e-6``, ``x ~ 1e7`` and a float32 ulp of 1 would swallow ``log E``); two tokens are
    compared by their margin ``(x_a - x_b) - (log E_a - log E_b)``, which is exact to a few ulps
    of the margin's terms wherever the two could win (within ~26 nats of each other, where
    ``x_a - x_b`` is exact or nearly). Each lane keeps its best token and its *gap*: the margin
    by which it beats every other token the lane has seen (``+inf`` alone, 0 on a tie); the
    lanes are merged by their scores relative to the chunk's max ``x``. The winner is the race
    over the row's only where its gap exceeds ``RACE_TOL`` (:func:`race_choice`); elsewhere the
    caller races the row again (the margin cannot tell the rounding of ``p / E``, which decides
    true ties). ``UNROLL``: the tiles unrolled (not in the walking kernel, whose registers it
    would spill). Returns ``(max, sum, argmax, best_x, best_index, gap)``: ``-inf`` and index
    0 where the chunk has no finite token but the draft."""
    offs = tl.arange(0, BLOCK)
    m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
    s_vec = tl.zeros([BLOCK], tl.float32)
    i_vec = tl.zeros([BLOCK], tl.int32)
    b_x = tl.full([BLOCK], float("-inf"), tl.float32)  # each lane's best token: x, log E, id
    b_le = tl.zeros([BLOCK], tl.float32)
    b_i = tl.zeros([BLOCK], tl.int32)
    gap = tl.full([BLOCK], float("inf"), tl.float32)
    if UNROLL:
        for t in tl.static_range(0, CHUNK, BLOCK):
            m_vec, s_vec, i_vec, b_x, b_le, b_i, gap = _race_tile(
                row_ptr, chunk_start + t + offs, V, temp, stream, draft, m_vec, s_vec, i_vec,
                b_x, b_le, b_i, gap, LOG_X, bits_row, HAS_MASK, edits, HAS_EDITS,
            )
    else:  # the walking kernel: a tile's loads at a time keep its registers
        for t in range(0, CHUNK, BLOCK):
            m_vec, s_vec, i_vec, b_x, b_le, b_i, gap = _race_tile(
                row_ptr, chunk_start + t + offs, V, temp, stream, draft, m_vec, s_vec, i_vec,
                b_x, b_le, b_i, gap, LOG_X, bits_row, HAS_MASK, edits, HAS_EDITS,
            )
    m = tl.max(m_vec, axis=0)
    a = tl.min(tl.where(m_vec == m, i_vec, 2147483647), axis=0)
    safe_m = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(s_vec * tl.exp(m_vec - safe_m), axis=0)
    score = (b_x - safe_m) - b_le  # relative to the chunk's max (-inf: an empty lane)
    best = tl.max(score, axis=0)
    bi = tl.min(tl.where(score == best, b_i, 2147483647), axis=0)
    chosen = (score == best) & (b_i == bi)  # every lane where the chunk has none
    bx = tl.max(tl.where(chosen, b_x, float("-inf")), axis=0)
    g = tl.min(tl.where(chosen, gap, best - tl.where(chosen, 0.0, score)), axis=0)
    return m, s, a, bx, bi, g
# fmt: on


@triton.jit
def merge_race(best_x, best_index, best_gap, x, index, gap, stream):
    """Merge a chunk's race winner (``x`` of token ``index``, its ``gap``) into the running one
    (:func:`chunk_stats_race`); ``x = -inf``: no token."""
    live = x > float("-inf")
    margin = (tl.where(live, x, 0.0) - best_x) - (
        log_exponential(stream, index) - log_exponential(stream, best_index)
    )
    take = live & (margin > 0.0)  # best_x = -inf: margin = +inf
    new_gap = tl.where(
        take, tl.minimum(gap, margin), tl.where(live, tl.minimum(best_gap, -margin), best_gap)
    )
    return tl.where(take, x, best_x), tl.where(take, index, best_index), new_gap


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def race_choice(row_ptr,  # [V] the logits row of the stop position
                best_x, best_index, gap, m, z, draft, residual, V, temp, stream,
                LOG_X: tl.constexpr,
                bits_row,  # [W] int32 token bitmask row (if HAS_MASK)
                HAS_MASK: tl.constexpr,
                edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
                HAS_EDITS: tl.constexpr = False):
    """The token of the fused race (:func:`chunk_stats_race`'s winner ``best_index`` over the
    row but the draft, merged with :func:`merge_race`) and whether it is sure: ``(token,
    sure)``. With ``residual`` (a rejected draft) the race is over ``max(0, p - onehot(draft))``
    (the draft has none), else over ``p``, the draft included; a token with ``p = 0`` never wins
    and no winner is token 0, as in :func:`chunk_race`. ``p`` is computed as ``target_prob``
    computes it, from the same ``m`` and ``z``. Sure when the winner's margin over every other
    token exceeds ``RACE_TOL``; where it is not, the race over the row decides."""
    in_vocab = (draft >= 0) & (draft < V)
    d = tl.minimum(tl.maximum(draft, 0), V - 1)
    dx = load_x(row_ptr + d, d == d, temp, LOG_X, bits_row, d, HAS_MASK, edits, HAS_EDITS)
    dx = tl.where(in_vocab, dx, float("-inf"))
    safe_m = tl.where(m == float("-inf"), 0.0, m)  # m, z themselves wherever m is finite
    safe_z = tl.where(z > 0.0, z, 1.0)
    best_ok = tl.exp(best_x - safe_m) / safe_z > 0.0  # p > 0
    draft_ok = tl.exp(dx - safe_m) / safe_z > 0.0
    # the best's margin over the draft (where both can win)
    margin = (tl.where(best_ok, best_x, 0.0) - tl.where(draft_ok, dx, 0.0)) - (
        log_exponential(stream, best_index) - log_exponential(stream, d)
    )
    alone = residual | (draft_ok == 0)  # the draft is no rival
    use_best = best_ok & (alone | (margin > 0.0))
    token = tl.where(use_best, best_index, tl.where(draft_ok, d, 0))
    sure_by = tl.where(
        use_best,
        tl.where(alone, gap, tl.minimum(gap, margin)),
        tl.where(draft_ok & best_ok, -margin, float("inf")),
    )
    return token, sure_by > RACE_TOL
# fmt: on


@triton.jit
def gather(x, idx, mask, pivot, count_ptr, cidx_ptr, cx_ptr, CAP: tl.constexpr):
    """Append the tile's finite tokens with ``float_key(x) >= pivot`` to a candidate buffer:
    slots from an atomic count (programs of one position share it), so the buffer's order is
    arbitrary and every reader sorts it; a count above ``CAP`` marks an overflow (nothing past
    ``CAP`` is written)."""
    take = mask & (float_key(x) >= pivot) & (x > float("-inf"))
    n = tl.sum(take.to(tl.int32), axis=0)
    if n > 0:
        base = tl.atomic_add(count_ptr, n)
        slot = base + tl.cumsum(take.to(tl.int32), axis=0) - 1
        ok = take & (slot < CAP)
        tl.store(cidx_ptr + slot, idx, mask=ok)
        tl.store(cx_ptr + slot, x, mask=ok)


@triton.jit
def key_search(keys, weights, lo, hi, target, NPIV: tl.constexpr):
    """Smallest key ``k`` in ``(lo, hi]`` with ``sum(weights[keys > k]) < target``, given
    ``f(lo) >= target > f(hi)``, over keys held in registers (a sample or a candidate buffer):
    the row search's pivots and narrowing (:func:`search_pivots`, :func:`search_step`), one
    pivot at a time (a ``[len(keys), NPIV]`` tile would not fit in registers), with int64
    weights, so the sums are exact and do not depend on the order of the keys."""
    lo = tl.zeros([], tl.int64) + lo  # a tensor from the first round on (KEY_FLOOR is constexpr)
    hi = tl.zeros([], tl.int64) + hi
    for _ in range(SEARCH_ROUNDS):
        if hi - lo > 1:
            new_lo = lo
            new_hi = hi
            for i in tl.static_range(NPIV):
                pivot = lo + ((hi - lo) * (i + 1)) // (NPIV + 1)
                good = tl.sum(tl.where(keys > pivot, weights, 0), axis=0) < target
                new_lo = tl.where(good, new_lo, tl.maximum(new_lo, pivot))
                new_hi = tl.where(good, tl.minimum(new_hi, pivot), new_hi)
            lo = new_lo
            hi = new_hi
    return hi


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def sample_pivot(row_ptr,  # [V] one logits row
                 V, temp, top_k, HAS_TOPK: tl.constexpr, LOG_X: tl.constexpr,
                 bits_row,  # [W] int32 token bitmask row (if HAS_MASK)
                 HAS_MASK: tl.constexpr, CAP: tl.constexpr, SB: tl.constexpr,
                 SW: tl.constexpr, NPIV: tl.constexpr,
                 edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
                 HAS_EDITS: tl.constexpr = False):
    """The gather's cutoff key for one row, from up to ``SB`` evenly spread blocks of ``SW``
    tokens (one block per ``16 * SW`` tokens of the row: at most 1/16 of it, 3% of a 128k row):
    the sample's key of the rank that puts about ``CAP / 4`` tokens of the row at or above it
    (``2 * top_k`` for a larger top-k, at most ``CAP / 2``). Only a cost estimate:
    :func:`select_filter` checks that the buffer holds the kept set, and a position where it
    does not falls back to the search."""
    blk = tl.arange(0, SB).to(tl.int64)
    nb = tl.minimum(tl.maximum(V // (16 * SW), 1), SB).to(tl.int64)
    start = (blk * tl.maximum(V - SW, 0)) // tl.maximum(nb - 1, 1)
    idx = start[:, None] + tl.arange(0, SW)[None, :]
    mask = tl.reshape((blk[:, None] < nb) & (idx < V), [SB * SW])
    idx = tl.reshape(idx, [SB * SW])
    x = load_x(row_ptr + idx, mask, temp, LOG_X, bits_row, idx, HAS_MASK, edits, HAS_EDITS)
    # int32 keys (a float key fits; INT32_MIN, below every pivot, marks the unsampled lanes):
    # half the registers of int64 ones in the walking kernel
    keys = tl.where(mask, float_key(x), INT32_MIN).to(tl.int32)
    n_s = tl.sum(mask.to(tl.int64), axis=0)
    target = tl.full([], CAP // 4, tl.int64)
    if HAS_TOPK:
        if (top_k > 0) & (top_k < V):
            target = tl.minimum(tl.maximum(2 * top_k.to(tl.int64), CAP // 4), CAP // 2)
    rank = tl.minimum(tl.maximum((target * n_s + V - 1) // V, 1), n_s)  # 1-based
    return key_search(keys, mask.to(tl.int32), KEY_FLOOR, tl.max(keys, axis=0), rank, NPIV)
# fmt: on


@triton.jit
def filter_active(V, greedy, top_k, top_p, HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr,
                  min_p=0.0, HAS_MINP: tl.constexpr = False):  # fmt: skip
    """Does a filter change this row's distribution (a sampling row with top-k in ``(0, V)``,
    top-p below 1 or min-p above 0)?"""
    on = greedy == 2  # False, as a tensor
    if HAS_TOPK:
        on = on | ((top_k > 0) & (top_k < V))
    if HAS_TOPP:
        on = on | (top_p < 1.0)
    if HAS_MINP:
        on = on | (min_p > 0.0)
    return on & (greedy == 0)


#: The candidates' masses ``exp(x - max)`` in [0, 1] as int64 multiples of 2**-40: their sums are
#: exact, whatever order the atomic gather left them in (and at most 2**50 for CAP entries).
FIXED_SCALE = tl.constexpr(2.0**40)


@triton.jit
def select_filter(
    cand_count,
    cidx_ptr,
    cx_ptr,  # the candidate buffer (count, [CAP], [CAP])
    V,
    m,
    s,
    top_k,
    top_p,
    pivot,
    HAS_TOPK: tl.constexpr,
    HAS_TOPP: tl.constexpr,
    CAP: tl.constexpr,
    NPIV: tl.constexpr,
    min_p=0.0,
    HAS_MINP: tl.constexpr = False,
):
    """``(exact, kappa, Z)`` of the top-k / top-p / min-p filter from a position's candidate
    buffer: the reference's rules (:func:`thresholds`) searched over the candidates in registers
    (:func:`key_search`; masses in fixed point, so every reader gets the same sums).

    The buffer holds every finite token with key ``>= pivot`` (unless it overflowed). The answer
    is exact when the kept set lies inside it: top-k needs ``k`` candidates, top-p survivors
    whose mass reaches ``top_p * Z_k``; both hold trivially when the pivot is ``-inf`` (every
    finite token gathered); min-p (:func:`min_p_key`) only raises ``kappa``, and needs the
    buffer to reach down to its key where no other filter is on. ``exact`` is False otherwise
    (the caller falls back to the search)."""
    n = cand_count
    offs = tl.arange(0, CAP)
    live = offs < n
    x = tl.load(cx_ptr + offs, mask=live, other=float("-inf"))
    key = tl.where(live, float_key(x), KEY_FLOOR)
    mass = tl.where(live, tl.exp(x - m) * FIXED_SCALE, 0.0).to(tl.int64)
    max_key = float_key(m)
    complete = pivot <= NEG_INF_KEY
    exact = (n > 0) & (n <= CAP)
    kappa = tl.full([], KEY_FLOOR, tl.int64)
    z_k = s * FIXED_SCALE  # top-p's normaliser, fixed point (the whole row without top-k)
    topk_on = n < 0  # False, as a tensor
    if HAS_TOPK:
        topk_on = (top_k > 0) & (top_k < V)
        if topk_on:
            have = n >= top_k
            kth = key_search(key, live.to(tl.int64), KEY_FLOOR, max_key, top_k, NPIV)
            # complete with fewer finite tokens than k: every finite token is kept
            kappa = tl.where(have, kth, NEG_INF_KEY)
            exact = exact & (have | complete)
            z_k = tl.sum(tl.where(key >= kappa, mass, 0), axis=0).to(tl.float32)
    if HAS_TOPP:
        if top_p < 1.0:
            survivors = tl.where(key >= kappa, mass, 0)
            target = tl.maximum((top_p * z_k).to(tl.int64), 1)
            found = tl.sum(survivors, axis=0) >= target
            kp = key_search(key, survivors, kappa - 1, max_key, target, NPIV)
            kappa = tl.where(found, kp, kappa)
            exact = exact & (found | topk_on | complete)
            topk_on = topk_on | (top_p < 1.0)  # from here: "a filter before min-p is on"
    if HAS_MINP:
        k_min = min_p_key(m, min_p)
        exact = exact & (topk_on | complete | (k_min >= pivot))
        kappa = tl.maximum(kappa, k_min)
    z = tl.sum(tl.where(key >= kappa, mass, 0), axis=0).to(tl.float32) / FIXED_SCALE
    return exact, kappa, z


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def buffer_race(cand_count, cidx_ptr, cx_ptr,  # the candidate buffer (count, [CAP], [CAP])
                q_ptr,  # [V] the draft probabilities of the same position (if HAS_Q)
                draft, m, z, kappa, stream, q_len, HAS_Q: tl.constexpr, weight,
                CAP: tl.constexpr,
                inv_ptr=None,  # [V] int32 draft_probs column of each target id (HAS_DRAFT_MAP)
                HAS_DRAFT_MAP: tl.constexpr = False):
    """:func:`chunk_race` over a position's candidate buffer instead of its row: exact when the
    buffer holds the filter's kept set (every other token has ``p = 0`` and cannot win). The
    winners do not depend on the buffer's order (max score, first token id on ties)."""
    offs = tl.arange(0, CAP)
    live = offs < cand_count
    idx = tl.load(cidx_ptr + offs, mask=live, other=0)
    x = tl.load(cx_ptr + offs, mask=live, other=float("-inf"))
    p = tl.where(live, target_prob(x, m, z, kappa), 0.0)
    if HAS_Q:
        if HAS_DRAFT_MAP:
            q = mapped_q(q_ptr, inv_ptr, idx, live & (idx < q_len))
        else:
            q = tl.load(q_ptr + idx, mask=live & (idx < q_len), other=0.0).to(tl.float32)
    else:
        q = tl.where(idx == draft, 1.0, 0.0)
    e = exponential(uniform(stream, idx))
    residual = weight * p - q
    r_score = tl.where(live & (residual > 0.0), residual / e, 0.0)
    p_score = tl.where(live & (p > 0.0), p / e, -1.0)
    rb = tl.max(r_score, axis=0)
    ri = tl.min(tl.where(r_score == rb, idx, 2147483647), axis=0)
    pb = tl.max(p_score, axis=0)
    pi = tl.min(tl.where(p_score == pb, idx, 2147483647), axis=0)
    return rb, tl.where(rb > 0.0, ri, 0), pb, tl.where(pb > -1.0, pi, 0)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def chunk_pivot_pass(row_ptr,  # [V] one logits row
                     chunk_start, V, temp, m, floor_key, pivots, NPIV: tl.constexpr,
                     CHUNK: tl.constexpr, TBLOCK: tl.constexpr, LOG_X: tl.constexpr = False,
                     bits_row=None,  # [W] int32 token bitmask row (if HAS_MASK)
                     HAS_MASK: tl.constexpr = False,
                     edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
                     HAS_EDITS: tl.constexpr = False):
    """Over one chunk, for each pivot: the count and unnormalised mass ``exp(x - m)`` of the
    tokens with ``key >= floor_key`` and ``key > pivot``."""
    offs = tl.arange(0, TBLOCK)
    # Per-lane sums, reduced across lanes once a chunk: a cross-lane sum of 2 x NPIV columns
    # every tile cost several times the tile's own work on a GPU (150x the unfiltered call).
    counts = tl.zeros([TBLOCK, NPIV], tl.int32)
    masses = tl.zeros([TBLOCK, NPIV], tl.float32)
    for t in range(0, CHUNK, TBLOCK):
        idx = chunk_start + t + offs
        mask = idx < V
        x = load_x(row_ptr + idx, mask, temp, LOG_X, bits_row, idx, HAS_MASK, edits, HAS_EDITS)
        key = float_key(x)
        live = mask & (key >= floor_key)
        e = tl.where(live, tl.exp(x - m), 0.0)
        above = (key[:, None] > pivots[None, :]) & live[:, None]
        counts += above.to(tl.int32)
        masses += tl.where(above, e[:, None], 0.0)
    return tl.sum(counts, axis=0).to(tl.int64), tl.sum(masses, axis=0)
# fmt: on


@triton.jit
def search_pivots(lo, hi, NPIV: tl.constexpr):
    """``NPIV`` pivots spread over ``(lo, hi)``; with ``hi - lo >= 2`` one lies strictly inside."""
    steps = tl.arange(0, NPIV).to(tl.int64) + 1
    return lo + ((hi - lo) * steps) // (NPIV + 1)


@triton.jit
def search_step(
    lo, hi, mass_lo, pivots, counts, masses, target_count, target_mass, USE_MASS: tl.constexpr
):
    """One narrowing step of the threshold search from the pivots' counts / masses.

    Keeps the invariant ``f(lo) >= target > f(hi)`` (``f`` = count or mass above a key) and the
    mass above ``lo``; the range shrinks at least ``NPIV + 1``-fold (rounded up).
    """
    if USE_MASS:
        good = masses < target_mass
    else:
        good = counts < target_count
    new_lo = tl.max(tl.where(good, lo, pivots), axis=0)
    new_hi = tl.min(tl.where(good, pivots, hi), axis=0)
    moved = tl.max(tl.where(pivots == new_lo, masses, -1.0), axis=0)
    mass_lo = tl.where(new_lo == lo, mass_lo, moved)
    return new_lo, new_hi, mass_lo


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _search(row_ptr,  # [V] one logits row
            V, temp, m, floor_key, lo, hi, mass_lo, target_count, target_mass,
            USE_MASS: tl.constexpr, NPIV: tl.constexpr, CHUNK: tl.constexpr,
            TBLOCK: tl.constexpr, NCHUNK, LOG_X: tl.constexpr = False,
            bits_row=None,  # [W] int32 token bitmask row (if HAS_MASK)
            HAS_MASK: tl.constexpr = False,
            edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
            HAS_EDITS: tl.constexpr = False):
    """Smallest key ``k`` in ``(lo, hi]`` with ``f(k) < target``, ``f`` = count or mass above.

    Invariant: ``f(lo) >= target > f(hi)``. Each pass over the row tests ``NPIV`` pivots, so the
    search takes at most ``SEARCH_ROUNDS`` passes. The per-pivot sums are taken chunk by chunk
    and added in chunk order, exactly as the split strategy adds its per-chunk partials. Returns
    the key and the mass of the tokens kept (those with ``key >= k``).
    """
    for _ in range(SEARCH_ROUNDS):
        if hi - lo > 1:
            pivots = search_pivots(lo, hi, NPIV)
            counts = tl.zeros([NPIV], tl.int64)
            masses = tl.zeros([NPIV], tl.float32)
            for c in range(0, NCHUNK):
                cc, cm = chunk_pivot_pass(
                    row_ptr, c * CHUNK, V, temp, m, floor_key, pivots, NPIV, CHUNK, TBLOCK, LOG_X,
                    bits_row, HAS_MASK, edits, HAS_EDITS,
                )
                counts += cc
                masses += cm
            lo, hi, mass_lo = search_step(
                lo, hi, mass_lo, pivots, counts, masses, target_count, target_mass, USE_MASS
            )
    return hi, mass_lo
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def thresholds(row_ptr,  # [V] one logits row
               V, temp, m, s, top_k, top_p, HAS_TOPK: tl.constexpr,
               HAS_TOPP: tl.constexpr, NPIV: tl.constexpr, CHUNK: tl.constexpr,
               TBLOCK: tl.constexpr, NCHUNK, LOG_X: tl.constexpr = False,
               bits_row=None,  # [W] int32 token bitmask row (if HAS_MASK)
               HAS_MASK: tl.constexpr = False, min_p=0.0, HAS_MINP: tl.constexpr = False,
               edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
               HAS_EDITS: tl.constexpr = False):
    """Key threshold ``kappa`` of the top-k/top-p/min-p filter and the kept mass ``Z``.

    Tokens with ``float_key(x) >= kappa`` are kept; ``p(x) = exp(x - m) / Z`` on them. Without
    an active filter ``kappa`` keeps everything and ``Z = s``. Top-k: the smallest key with fewer
    than ``k`` tokens above it (ties at the k-th value kept). Top-p, on the top-k survivors: the
    smallest key whose strictly-larger mass is below ``top_p * Z_k``. Min-p, on the top-p
    survivors: :func:`min_p_key` where it cuts more, and ``Z`` is then one more pass over the
    row (:func:`kept_mass`).
    """
    kappa = tl.full([], KEY_FLOOR, tl.int64)
    z = s
    max_key = float_key(m)
    if HAS_TOPK:
        if (top_k > 0) & (top_k < V):
            kappa, z = _search(
                row_ptr, V, temp, m, KEY_FLOOR, kappa, max_key, z, top_k, 0.0, False, NPIV, CHUNK,
                TBLOCK, NCHUNK, LOG_X, bits_row, HAS_MASK, edits, HAS_EDITS,
            )
    if HAS_TOPP:
        if top_p < 1.0:
            kappa, z = _search(
                row_ptr, V, temp, m, kappa, kappa - 1, max_key, z, 0, top_p * z, True, NPIV,
                CHUNK, TBLOCK, NCHUNK, LOG_X, bits_row, HAS_MASK, edits, HAS_EDITS,
            )
    if HAS_MINP:
        k_min = min_p_key(m, min_p)
        if k_min > kappa:
            kappa = k_min
            z = kept_mass(row_ptr, V, temp, m, kappa, NPIV, CHUNK, TBLOCK, NCHUNK, LOG_X,
                          bits_row, HAS_MASK, edits, HAS_EDITS)
    return kappa, z
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def kept_mass(row_ptr,  # [V] one logits row
              V, temp, m, kappa, NPIV: tl.constexpr, CHUNK: tl.constexpr,
              TBLOCK: tl.constexpr, NCHUNK, LOG_X: tl.constexpr,
              bits_row,  # [W] int32 token bitmask row (if HAS_MASK)
              HAS_MASK: tl.constexpr,
              edits,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
              HAS_EDITS: tl.constexpr):
    """``sum exp(x - m)`` over the tokens with ``float_key(x) >= kappa``: the search's pass
    (:func:`chunk_pivot_pass`, chunk partials added in chunk order) with every pivot below."""
    pivots = tl.full([NPIV], KEY_FLOOR, tl.int64)
    z = tl.zeros([], tl.float32)
    for c in range(0, NCHUNK):
        _, cm = chunk_pivot_pass(
            row_ptr, c * CHUNK, V, temp, m, kappa, pivots, NPIV, CHUNK, TBLOCK, LOG_X, bits_row,
            HAS_MASK, edits, HAS_EDITS,
        )
        z += tl.max(cm, axis=0)  # every column is the same sum
    return z
# fmt: on


@triton.jit
def key_float(key):
    """The float32 of an order-preserving key (:func:`float_key`'s inverse)."""
    bits = tl.where(key >= 0, key, key ^ 0x7FFFFFFF).to(tl.int32)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def min_p_key(m, min_p):
    """Min-p's key threshold: the smallest key whose ``x`` has ``exp(x - m) >= min_p`` (the
    reference's rule, evaluated with the kernel's own ``exp``: an upper set of ``x``, the max
    always in it), bisected over ``(key(-inf), key(m)]`` in 32 scalar steps; ``KEY_FLOOR``
    (keep everything) where ``min_p <= 0`` or no token is finite."""
    lo = tl.full([], NEG_INF_KEY, tl.int64)  # exp(-inf) = 0 < min_p
    hi = float_key(m)  # exp(0) = 1 >= min_p
    for _ in range(32):  # the range is below 2**32 keys
        mid = lo + (hi - lo) // 2
        ok = tl.exp(key_float(mid) - m) >= min_p
        lo = tl.where(ok, lo, mid)
        hi = tl.where(ok, mid, hi)
    return tl.where((min_p > 0.0) & (m > float("-inf")), hi, KEY_FLOOR)


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def position_stats(row_ptr,  # [V] one position's (or node's) logits row
                   V, temp, greedy, top_k, top_p, NEED_SUM: tl.constexpr,
                   HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr, NPIV: tl.constexpr,
                   CHUNK: tl.constexpr, BLOCK: tl.constexpr, TBLOCK: tl.constexpr, NCHUNK,
                   LOG_X: tl.constexpr = False,
                   bits_row=None,  # [W] int32 token bitmask row (if HAS_MASK)
                   HAS_MASK: tl.constexpr = False, min_p=0.0, HAS_MINP: tl.constexpr = False,
                   edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
                   HAS_EDITS: tl.constexpr = False):
    """(max of x, first argmax, key threshold, kept mass) of one row, read by a walking kernel:
    chunk statistics merged in chunk order, then (sampling rows) the top-k / top-p search."""
    big_m = tl.full([], float("-inf"), tl.float32)
    big_s = tl.zeros([], tl.float32)
    big_a = tl.zeros([], tl.int32)
    for c in range(0, NCHUNK):
        m, s, a = chunk_stats(
            row_ptr, c * CHUNK, V, temp, NEED_SUM, CHUNK, BLOCK, LOG_X, bits_row, HAS_MASK,
            edits=edits, HAS_EDITS=HAS_EDITS,
        )
        big_m, big_s, big_a = merge_stats(big_m, big_s, big_a, m, s, a)
    kappa = tl.full([], KEY_FLOOR, tl.int64)
    z = big_s
    if NEED_SUM:
        if greedy == 0:
            kappa, z = thresholds(
                row_ptr, V, temp, big_m, big_s, top_k, top_p, HAS_TOPK, HAS_TOPP, NPIV, CHUNK,
                TBLOCK, NCHUNK, LOG_X, bits_row, HAS_MASK, min_p, HAS_MINP, edits, HAS_EDITS,
            )
    return big_m, big_a, kappa, z
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def position_stats_race(row_ptr,  # [V] one position's logits row
                        V, temp, stream, draft, NCHUNK, CHUNK: tl.constexpr,
                        BLOCK: tl.constexpr, LOG_X: tl.constexpr,
                        bits_row,  # [W] int32 token bitmask row (if HAS_MASK)
                        HAS_MASK: tl.constexpr,
                        edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
                        HAS_EDITS: tl.constexpr = False):
    """:func:`chunk_stats_race` over a row, merged in chunk order: ``(max, argmax, sum,
    best_x, best_index, gap)`` (the race's winner but the draft, for :func:`race_choice`)."""
    big_m = tl.full([], float("-inf"), tl.float32)
    big_s = tl.zeros([], tl.float32)
    big_a = tl.zeros([], tl.int32)
    best_x = tl.full([], float("-inf"), tl.float32)
    best_i = tl.zeros([], tl.int32)
    gap = tl.full([], float("inf"), tl.float32)
    for c in range(0, NCHUNK):
        m, s, a, bx, bi, g = chunk_stats_race(
            row_ptr, c * CHUNK, V, temp, stream, draft, CHUNK, BLOCK, LOG_X, bits_row, HAS_MASK,
            False, edits, HAS_EDITS,
        )
        big_m, big_s, big_a = merge_stats(big_m, big_s, big_a, m, s, a)
        best_x, best_i, gap = merge_race(best_x, best_i, gap, bx, bi, g, stream)
    return big_m, big_a, big_s, best_x, best_i, gap
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def position_filter_stats(row_ptr,  # [V] one position's logits row
                          V, temp, greedy, top_k, top_p,
                          HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr, NPIV: tl.constexpr,
                          CHUNK: tl.constexpr, BLOCK: tl.constexpr, TBLOCK: tl.constexpr,
                          NCHUNK, LOG_X: tl.constexpr,
                          bits_row,  # [W] int32 token bitmask row (if HAS_MASK)
                          HAS_MASK: tl.constexpr,
                          cand,  # (count [1] int32 (zeroed), ids [CAP] int32, x [CAP] float32)
                          CAP: tl.constexpr, SB: tl.constexpr, SW: tl.constexpr,
                          min_p=0.0, HAS_MINP: tl.constexpr = False,
                          edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
                          HAS_EDITS: tl.constexpr = False):
    """:func:`position_stats` of a sampling row under top-k / top-p in one pass over the row:
    the statistics pass gathers the candidates (:func:`sample_pivot`, :func:`gather`) and the
    thresholds are selected from them (:func:`select_filter`); the search runs only where the
    buffer misses the kept set. Returns ``(max, argmax, kappa, Z, from_buffer)``."""
    pivot = tl.full([], KEY_CEIL, tl.int64)
    if filter_active(V, greedy, top_k, top_p, HAS_TOPK, HAS_TOPP, min_p, HAS_MINP):
        pivot = sample_pivot(row_ptr, V, temp, top_k, HAS_TOPK, LOG_X, bits_row, HAS_MASK, CAP,
                             SB, SW, NPIV, edits, HAS_EDITS)
    tl.debug_barrier()  # the previous position's readers are done with the buffer
    big_m = tl.full([], float("-inf"), tl.float32)
    big_s = tl.zeros([], tl.float32)
    big_a = tl.zeros([], tl.int32)
    for c in range(0, NCHUNK):
        m, s, a = chunk_stats(
            row_ptr, c * CHUNK, V, temp, True, CHUNK, BLOCK, LOG_X, bits_row, HAS_MASK, True,
            pivot, cand, CAP, edits, HAS_EDITS,
        )
        big_m, big_s, big_a = merge_stats(big_m, big_s, big_a, m, s, a)
    tl.debug_barrier()  # every gathered candidate is visible
    kappa = tl.full([], KEY_FLOOR, tl.int64)
    z = big_s
    exact = greedy != 0  # False for the sampling rows: searched unless the buffer answers
    if greedy == 0:
        exact, kappa, z = select_filter(
            tl.load(cand[0]), cand[1], cand[2], V, big_m, big_s, top_k, top_p, pivot, HAS_TOPK,
            HAS_TOPP, CAP, NPIV, min_p, HAS_MINP,
        )
        if not exact:
            kappa, z = thresholds(
                row_ptr, V, temp, big_m, big_s, top_k, top_p, HAS_TOPK, HAS_TOPP, NPIV, CHUNK,
                TBLOCK, NCHUNK, LOG_X, bits_row, HAS_MASK, min_p, HAS_MINP, edits, HAS_EDITS,
            )
    return big_m, big_a, kappa, z, exact & (greedy == 0)
# fmt: on


@triton.jit
def target_prob(x, m, z, kappa):
    """Filtered target probability of scaled logits ``x``."""
    return tl.where(float_key(x) >= kappa, tl.exp(x - m) / z, 0.0)


# A reduced draft vocabulary (EAGLE-3's draft-to-target map, ``HAS_DRAFT_MAP``): a position's
# draft probabilities are a ``[V_draft]`` row and ``inv [V]`` int32 gives the column of each
# target id, or -1 outside the map (q = 0 there). Each q read costs one int32 gather of ``inv``
# per token (4 bytes a token, like a bitmask word per token) and then a gather of q from the
# ``[V_draft]`` row instead of a contiguous load; nothing ``[B, K, V]`` is written. Without the
# flag the q loads are the plain ones, compiled as before.
@triton.jit
def mapped_q(q_ptr,  # [V_draft] the draft probabilities of one position
             inv_ptr,  # [V] int32: the column of each target id, -1 outside the map
             idx, mask):  # fmt: skip
    """float32 ``q`` at the target ids ``idx``: ``q_ptr[inv[idx]]``, 0 where ``inv[idx] < 0``
    or ``mask`` is false."""
    col = tl.load(inv_ptr + idx, mask=mask, other=-1)
    return tl.load(q_ptr + col, mask=col >= 0, other=0.0).to(tl.float32)


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def _chunk_pq(row_ptr,  # [V] one logits row
              q_ptr,  # [V] the draft probabilities of the same position (if HAS_Q)
              draft, idx, V, temp, m, z, kappa, q_len, HAS_Q: tl.constexpr,
              LOG_X: tl.constexpr, bits_row, HAS_MASK: tl.constexpr,
              edits,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
              HAS_EDITS: tl.constexpr,
              inv_ptr,  # [V] int32 draft_probs column of each target id (if HAS_DRAFT_MAP)
              HAS_DRAFT_MAP: tl.constexpr):
    """``(p, q)`` at the token ids ``idx`` of one tile: the filtered target probability (0 past
    ``V``) and the draft's (one-hot at ``draft`` without ``HAS_Q``; 0 at ``idx >= q_len``)."""
    mask = idx < V
    x = load_x(row_ptr + idx, mask, temp, LOG_X, bits_row, idx, HAS_MASK, edits, HAS_EDITS)
    p = tl.where(mask, target_prob(x, m, z, kappa), 0.0)
    if HAS_Q:
        if HAS_DRAFT_MAP:
            q = mapped_q(q_ptr, inv_ptr, idx, idx < q_len)
        else:
            q = tl.load(q_ptr + idx, mask=idx < q_len, other=0.0).to(tl.float32)
    else:
        q = tl.where(idx == draft, 1.0, 0.0)
    return p, q
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def chunk_residual_mass(row_ptr,  # [V] one logits row
                        q_ptr,  # [V] the draft probabilities of the same position
                        chunk_start, V, temp, m, z, kappa, weight, q_len,
                        CHUNK: tl.constexpr, BLOCK: tl.constexpr, LOG_X: tl.constexpr,
                        bits_row,  # [W] int32 token bitmask row (if HAS_MASK)
                        HAS_MASK: tl.constexpr,
                        edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
                        HAS_EDITS: tl.constexpr = False,
                        inv_ptr=None,  # [V] int32 draft_probs columns (if HAS_DRAFT_MAP)
                        HAS_DRAFT_MAP: tl.constexpr = False):
    """Block verification's residual mass over one chunk: ``sum max(0, weight * p - q)`` (the
    chunk values are added in chunk order by both chain strategies)."""
    offs = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], tl.float32)
    for t in range(0, CHUNK, BLOCK):  # not unrolled: the walking kernels keep registers
        idx = chunk_start + t + offs
        p, q = _chunk_pq(row_ptr, q_ptr, 0, idx, V, temp, m, z, kappa, q_len, True, LOG_X,
                         bits_row, HAS_MASK, edits, HAS_EDITS, inv_ptr, HAS_DRAFT_MAP)
        total += tl.maximum(weight * p - q, 0.0)
    return tl.sum(total, axis=0)
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def chunk_race(row_ptr,  # [V] one logits row
               q_ptr,  # [V] the draft probabilities of the same position (if HAS_Q)
               draft, chunk_start, V, temp, m, z, kappa, stream, q_len,
               HAS_Q: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
               LOG_X: tl.constexpr = False, weight=1.0,
               bits_row=None,  # [W] int32 token bitmask row (if HAS_MASK)
               HAS_MASK: tl.constexpr = False,
               edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
               HAS_EDITS: tl.constexpr = False,
               inv_ptr=None,  # [V] int32 draft_probs column of each target id (HAS_DRAFT_MAP)
               HAS_DRAFT_MAP: tl.constexpr = False):
    """Exponential race over one chunk, for the residual ``max(0, weight * p - q)`` and for
    ``p`` (``weight`` is 1 but for block verification's weighted residual).

    Returns ``(residual_best, residual_index, plain_best, plain_index)``; the sample is the
    argmax of ``w(x) / E_x`` with ``E_x = exponential(u_x)``, first index on ties. ``q`` is read at
    indices below ``q_len`` only: ``V`` at a draft position, 0 at the bonus one.
    """
    offs = tl.arange(0, BLOCK)
    r_best = tl.zeros([BLOCK], tl.float32)
    r_idx = tl.zeros([BLOCK], tl.int32)
    p_best = tl.full([BLOCK], -1.0, tl.float32)
    p_idx = tl.zeros([BLOCK], tl.int32)
    for t in tl.static_range(0, CHUNK, BLOCK):
        idx = chunk_start + t + offs
        mask = idx < V
        p, q = _chunk_pq(row_ptr, q_ptr, draft, idx, V, temp, m, z, kappa, q_len, HAS_Q, LOG_X,
                         bits_row, HAS_MASK, edits, HAS_EDITS, inv_ptr,
                         HAS_DRAFT_MAP)  # fmt: skip
        e = exponential(uniform(stream, idx))
        residual = weight * p - q
        # Zero (or NaN) weights score 0 / -1 and never beat the initial values: a token with no
        # mass cannot win, whatever the inputs.
        r_best, r_idx = merge_best(
            r_best, r_idx, tl.where(residual > 0.0, residual / e, 0.0), idx
        )
        p_best, p_idx = merge_best(
            p_best, p_idx, tl.where(mask & (p > 0.0), p / e, -1.0), idx
        )
    rb = tl.max(r_best, axis=0)
    ri = tl.min(tl.where(r_best == rb, r_idx, 2147483647), axis=0)
    pb = tl.max(p_best, axis=0)
    pi = tl.min(tl.where(p_best == pb, p_idx, 2147483647), axis=0)
    return rb, ri, pb, pi
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def accept_draft(row_ptr,  # [V] one logits row
                 q_ptr,  # [V] the draft probabilities of the same position (if HAS_Q)
                 draft, V, temp, m, z, kappa, key, j, HAS_Q: tl.constexpr,
                 LOG_X: tl.constexpr = False,
                 bits_row=None,  # [W] int32 token bitmask row (if HAS_MASK)
                 HAS_MASK: tl.constexpr = False,
                 edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
                 HAS_EDITS: tl.constexpr = False,
                 inv_ptr=None,  # [V] int32 draft_probs column of each target id (HAS_DRAFT_MAP)
                 HAS_DRAFT_MAP: tl.constexpr = False):
    """The accept test of draft token ``draft`` at position ``j``: ``u * q(x) < p(x)``."""
    p, q, in_vocab = draft_prob(
        row_ptr, q_ptr, draft, V, temp, m, z, kappa, HAS_Q, LOG_X, bits_row, HAS_MASK, edits,
        HAS_EDITS, inv_ptr, HAS_DRAFT_MAP,
    )
    u = uniform_first(stream_key(key, j, PURPOSE_ACCEPT))
    return (u * q < p) & (q > 0.0) & in_vocab
# fmt: on


# argument groups keep their shape comments: no reformatting
# fmt: off
@triton.jit
def draft_prob(row_ptr,  # [V] one logits row
               q_ptr,  # [V] the draft probabilities of the same position (if HAS_Q)
               draft, V, temp, m, z, kappa, HAS_Q: tl.constexpr, LOG_X: tl.constexpr = False,
               bits_row=None,  # [W] int32 token bitmask row (if HAS_MASK)
               HAS_MASK: tl.constexpr = False,
               edits=None,  # (ids [E], vals [E], csr [NG+1], NG) (if HAS_EDITS)
               HAS_EDITS: tl.constexpr = False,
               inv_ptr=None,  # [V] int32 draft_probs column of each target id (HAS_DRAFT_MAP)
               HAS_DRAFT_MAP: tl.constexpr = False):
    """``(p(x), q(x), x in [0, V))`` of draft token ``x = draft`` (``q = 1`` without ``HAS_Q``;
    an id outside the vocabulary is read clamped, the flag says so; ``q = 0`` for an id outside
    a reduced draft vocabulary, so that draft is never accepted)."""
    in_vocab = (draft >= 0) & (draft < V)
    d = tl.minimum(tl.maximum(draft, 0), V - 1)
    x = load_x(row_ptr + d, d == d, temp, LOG_X, bits_row, d, HAS_MASK, edits, HAS_EDITS)
    p = target_prob(x, m, z, kappa)
    if HAS_Q:
        if HAS_DRAFT_MAP:
            q = mapped_q(q_ptr, inv_ptr, d, d == d)
        else:
            q = tl.load(q_ptr + d).to(tl.float32)
    else:
        q = tl.full([], 1.0, tl.float32)
    return p, q, in_vocab
# fmt: on
