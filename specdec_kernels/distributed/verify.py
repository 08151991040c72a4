"""Vocabulary-parallel verification: each rank holds the logits of its own vocabulary columns.

Vocabulary of this file: a *shard* is one rank's columns ``vocab_start .. vocab_start + V_r - 1``
of the global ``[B, K+1, V]`` logits; a *round* is one collective call; a *key* is the
order-preserving integer image of a float32 (:func:`float_key`), and a *packed key*
``float_key(value) << 32 | (2**32 - 1 - global_id)`` makes one ``MAX`` all-reduce return the
largest value and, among equal values, the smallest global id: ``torch.argmax``'s first index.

The rounds of one call (``N = B * (K+1)``, ``P = NUM_PIVOTS = 16``, ``R = SEARCH_ROUNDS = 8``):

=====================  =============================================  ==================
round                  what                                           bytes per rank
=====================  =============================================  ==================
maxima                 MAX of packed keys of the raw logits: the      ``8 N``
                       greedy argmax and ``m = max(logits) / T``
top-k, scalar          all-gather of each rank's ``k`` largest        ``4 N k``
``k <= 256``           values (then, with top-p, a SUM of the kept    (``+ 4 N``)
                       top-k mass; top-p runs on the gathered values)
top-k search (R)       otherwise: SUM of counts of keys above ``P``   ``8 N P`` each
                       pivots
top-p search (R)       without a scalar top-k: SUM of masses above    ``4 N P`` each
                       ``P`` pivots (the first round also the kept    (+ ``4 N`` once)
                       top-k mass)
sums                   SUM of the kept mass ``Z``, and of             ``4 (N + B K)``
                       ``exp(x_j - m)`` / ``q(x_j)`` of each draft    (``+ 4 B K`` with q)
                       token from the rank that owns it
race                   MAX of packed keys of the residual and plain   ``16 B``
                       race winners at each row's recovered/bonus position
=====================  =============================================  ==================

Greedy verification is the first round alone. Nothing depends on ``V``. Every number is
computed with the reference's formulas (:mod:`specdec_kernels.reference.verify_sampling`) and the
same counter-based random numbers keyed by the *global* token id, so the result equals the
single-device op on the gathered tensors, except where the order of a floating-point sum
decides a near-tie (the threshold searches are the kernels' pivot search,
:mod:`specdec_kernels.ops._common`, with one collective per pass).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from specdec_kernels.reference import rng
from specdec_kernels.reference.verify_greedy import emitted_tokens, prefix_match_count

KEY_FLOOR = -(2**31) - 1  # below every float key: "keep everything"
NUM_PIVOTS = 16  # pivots tested per search round
MAX_CANDIDATES = 256  # a scalar top_k up to this gathers each rank's top-k values instead
LOW32 = 0xFFFFFFFF


def search_rounds(num_pivots: int = NUM_PIVOTS, key_range: int = 2**32) -> int:
    """Rounds that always finish a pivot search over ``key_range`` keys: each round shrinks
    the range to at most ``ceil(range / (num_pivots + 1))``.

    >>> search_rounds(16)
    8
    """
    rounds = 0
    while key_range > 1:
        key_range = -(-key_range // (num_pivots + 1))
        rounds += 1
    return rounds


SEARCH_ROUNDS = search_rounds()


# --- keys ------------------------------------------------------------------------------------


def float_key(x: torch.Tensor) -> torch.Tensor:
    """Order-preserving int64 key of float32 ``x`` (``-0.0`` counts as ``+0.0``), in int32 range."""
    x = torch.where(x == 0, torch.zeros_like(x), x).contiguous()
    bits = x.view(torch.int32)
    return torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(torch.int64)


def key_value(key: torch.Tensor) -> torch.Tensor:
    """The float32 whose :func:`float_key` is ``key`` (int64 in int32 range)."""
    bits = key.to(torch.int32)
    return torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).contiguous().view(torch.float32)


def pack(value: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Packed keys: ``MAX`` over them picks the largest value, then the smallest index."""
    return (float_key(value) << 32) + (LOW32 - index.to(torch.int64))


def unpack(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(value float32, index int64)`` of packed keys."""
    return key_value(packed >> 32), LOW32 - (packed & LOW32)


def _local_best(score: torch.Tensor, vocab_start: int) -> torch.Tensor:
    """Packed key of the max of ``score [..., V_r]`` and its first global index."""
    index = score.argmax(dim=-1, keepdim=True)  # first index on ties
    return pack(score.gather(-1, index)[..., 0], index[..., 0] + vocab_start)


def _max(t: torch.Tensor, group) -> torch.Tensor:
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t


def _sum(t: torch.Tensor, group) -> torch.Tensor:
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


# --- greedy ----------------------------------------------------------------------------------


def global_argmax(logits_shard: torch.Tensor, vocab_start: int, group) -> torch.Tensor:
    """One ``MAX`` round: packed keys ``[B, K+1]`` of the global max logit and first argmax."""
    return _max(_local_best(logits_shard.float(), vocab_start), group)


def greedy_from_target(target: torch.Tensor, draft_tokens: torch.Tensor, num_draft: torch.Tensor):
    """``(tokens, num_accepted)`` of greedy verification from the argmax ``target [B, K+1]``."""
    k = draft_tokens.shape[1]
    positions = torch.arange(k, device=target.device)
    valid = positions[None, :] < num_draft[:, None].to(torch.int64)
    accepted = prefix_match_count(draft_tokens.to(torch.int64), target[:, :k], valid)
    return emitted_tokens(target, accepted), accepted


def verify_greedy_shard(logits_shard, draft_tokens, num_draft, vocab_start, group):
    """Greedy verification of one shard (arguments already checked): one ``MAX`` round."""
    _, target = unpack(global_argmax(logits_shard, vocab_start, group))
    tokens, accepted = greedy_from_target(target, draft_tokens, num_draft)
    return tokens, accepted, accepted + 1


# --- threshold searches (top-k, top-p) --------------------------------------------------------


class _SortedShard:
    """The shard's largest scaled logits in descending order (all of them, or the ``n``
    largest), with the prefix masses ``sum exp(x - m)`` in that order: counts and masses above
    any key by binary search. With ``n`` values only, counts are capped at ``n`` and masses are
    exact above the ``n``-th value: what a top-``k`` search with ``k <= n`` needs."""

    def __init__(self, x: torch.Tensor, m: torch.Tensor, n: int | None = None):
        if n is None or n >= x.shape[-1]:
            xs = x.sort(dim=-1, descending=True).values  # [B, K+1, V_r]
        else:
            xs = x.topk(n, dim=-1, sorted=True).values  # [B, K+1, n]
        self.neg_keys = (-float_key(xs)).contiguous()  # ascending
        self.cum_mass = torch.exp(xs - m[..., None]).cumsum(dim=-1)

    def count_above(self, pivots: torch.Tensor) -> torch.Tensor:
        """``[B, K+1, P]`` int64: tokens with ``key > pivot`` (at most the values held)."""
        return torch.searchsorted(self.neg_keys, (-pivots).contiguous(), right=False)

    def mass_above(self, pivots: torch.Tensor) -> torch.Tensor:
        """``[B, K+1, P]`` float32: ``sum exp(x - m)`` over tokens with ``key > pivot``."""
        count = self.count_above(pivots)
        mass = self.cum_mass.gather(-1, (count - 1).clamp(min=0))
        return torch.where(count > 0, mass, 0.0)


def threshold_value(kappa: torch.Tensor) -> torch.Tensor:
    """The float32 ``t`` with ``x >= t`` exactly when ``float_key(x) >= kappa`` (``-inf``
    for ``KEY_FLOOR``); ``kappa`` is a key of a value or ``KEY_FLOOR``."""
    floor = kappa <= KEY_FLOOR
    value = key_value(torch.where(floor, 0, kappa))
    return torch.where(floor, float("-inf"), value)


def _pivots(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    steps = torch.arange(1, NUM_PIVOTS + 1, device=lo.device)
    return lo[..., None] + ((hi - lo)[..., None] * steps) // (NUM_PIVOTS + 1)


def _narrow(lo, hi, pivots, values, target):
    """Keep ``f(lo) >= target > f(hi)`` from the pivots' values ``f``."""
    good = values < target[..., None]
    new_lo = torch.where(good, lo[..., None], pivots).amax(dim=-1)
    new_hi = torch.where(good, pivots, hi[..., None]).amin(dim=-1)
    return new_lo, new_hi


def top_k_threshold(shard: _SortedShard, top_k, max_key, group) -> torch.Tensor:
    """Smallest key with fewer than ``k`` tokens above it (``SEARCH_ROUNDS`` SUM rounds of
    counts): the key of the k-th largest value, so ties at it are kept."""
    lo = torch.full_like(max_key, KEY_FLOOR)
    hi = max_key
    target = top_k.to(torch.int64)[:, None].expand_as(max_key)
    for _ in range(SEARCH_ROUNDS):
        pivots = _pivots(lo, hi)
        counts = _sum(shard.count_above(pivots), group)
        lo, hi = _narrow(lo, hi, pivots, counts, target)
    return hi


def top_p_threshold(shard: _SortedShard, top_p, floor, kept_mass, max_key, group):
    """Smallest key whose strictly-larger mass, among the tokens kept by ``floor`` (the top-k
    threshold; ``kept_mass`` is this shard's mass at or above it), is below ``top_p`` times
    their mass (``SEARCH_ROUNDS`` SUM rounds of masses; the first also sums the kept mass)."""
    lo = floor - 1
    hi = max_key
    target = None
    for _ in range(SEARCH_ROUNDS):
        pivots = _pivots(lo, hi)
        # a pivot below the floor is lo = floor - 1 itself: the kept mass (ties included)
        masses = torch.where(pivots < floor[..., None], kept_mass[..., None],
                             shard.mass_above(pivots))  # fmt: skip
        if target is None:
            masses = _sum(torch.cat([kept_mass[..., None], masses], -1), group)
            target = top_p.float()[:, None] * masses[..., 0]
            masses = masses[..., 1:]
        else:
            masses = _sum(masses, group)
        lo, hi = _narrow(lo, hi, pivots, masses, target)
    return hi


def gathered_top_k(x: torch.Tensor, k: int, group) -> torch.Tensor:
    """``[B, K+1, W k]``: every rank's ``k`` largest values (``-inf`` padded), sorted in
    descending order; one all-gather of ``k`` float32 per position. They hold the global top-k
    values, so entry ``k - 1`` is the k-th largest value, and every value above it."""
    local = x.topk(min(k, x.shape[-1]), dim=-1, sorted=False).values
    local = F.pad(local, (0, k - local.shape[-1]), value=float("-inf")).contiguous()
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local, group=group)
    return torch.cat(parts, dim=-1).sort(dim=-1, descending=True).values


def top_p_on_candidates(values, kth, ex, x, m, top_p, group) -> torch.Tensor:
    """Top-p over the top-k survivors, from the gathered candidates ``values`` (sorted, every
    survivor above ``kth`` among them) and one SUM round of the kept mass (ties at ``kth``
    included): the reference's sorted exclusive cumulative mass, computed on every rank."""
    kept_mass = _sum((ex * (x >= kth[..., None])).sum(dim=-1), group)  # [B, K+1]
    kept = values >= kth[..., None]
    es = torch.exp(values - m[..., None]) * kept
    mass_above = es.cumsum(dim=-1) - es  # exclusive: mass of strictly earlier tokens
    inside = (mass_above < top_p.float()[:, None, None] * kept_mass[..., None]) & kept
    last = inside.sum(dim=-1, keepdim=True) - 1  # kept tokens form a prefix
    threshold = values.gather(-1, last.clamp(min=0))[..., 0]
    return torch.where((top_p < 1)[:, None], threshold, kth)


def filter_threshold(x, ex, m, top_k, top_p, top_k_bound, vocab_size, group):
    """Per position, the float32 threshold of the top-k/top-p filter (``x >= t`` is kept).

    A scalar ``top_k`` (``top_k_bound``) up to ``MAX_CANDIDATES`` gathers candidates (one
    all-gather, and one SUM round for top-p); otherwise pivot searches (``SEARCH_ROUNDS`` each).
    """
    if top_k_bound is not None and top_k_bound >= vocab_size:  # keeps everything
        top_k = top_k_bound = None
    if top_k_bound is not None and top_k_bound <= MAX_CANDIDATES:
        values = gathered_top_k(x, top_k_bound, group)
        kth = values[..., top_k_bound - 1]  # [B, K+1]
        if top_p is None:
            return kth
        return top_p_on_candidates(values, kth, ex, x, m, top_p, group)
    b, k1, _ = x.shape
    if top_k is None and top_p is None:
        return torch.full((b, k1), float("-inf"), device=x.device)
    kappa = torch.full((b, k1), KEY_FLOOR, dtype=torch.int64, device=x.device)
    shard = _SortedShard(x, m, top_k_bound if top_k is not None else None)
    max_key = float_key(m)
    if top_k is not None:
        active = ((top_k > 0) & (top_k < vocab_size))[:, None]
        kappa = torch.where(active, top_k_threshold(shard, top_k, max_key, group), kappa)
    if top_p is not None:
        kept_mass = (ex * (x >= threshold_value(kappa)[..., None])).sum(dim=-1)
        active = (top_p < 1)[:, None]
        found = top_p_threshold(shard, top_p, kappa, kept_mass, max_key, group)
        kappa = torch.where(active, found, kappa)
    return threshold_value(kappa)


# --- sampling --------------------------------------------------------------------------------


def verify_sampling_shard(
    logits_shard: torch.Tensor,  # [B, K+1, V_r]
    draft_tokens: torch.Tensor,  # [B, K] global ids
    draft_probs_shard: torch.Tensor | None,  # [B, K, V_r]
    num_draft: torch.Tensor,  # [B]
    temperature: torch.Tensor,  # [B] float32
    top_k: torch.Tensor | None,  # [B] int64
    top_p: torch.Tensor | None,  # [B] float32
    seeds: torch.Tensor,  # [B] int64, the same on every rank
    vocab_start: int,
    vocab_size: int,
    group,
    top_k_bound: int | None = None,
):
    """Rejection-sampling verification of one shard (arguments already checked); see the module
    docstring for the rounds. Mirrors :func:`specdec_kernels.reference.verify_sampling
    .verify_sampling` step by step. ``top_k_bound``: a host int ``>= top_k`` of every row whose
    top-k is active (a scalar ``top_k``), so the search reads this shard's ``top_k_bound``
    largest values (``torch.topk``) instead of sorting it."""
    b, k1, vr = logits_shard.shape
    k = k1 - 1
    device = logits_shard.device
    top, g_target = unpack(global_argmax(logits_shard, vocab_start, group))  # [B, K+1]
    greedy_row = temperature == 0
    temp = torch.where(greedy_row, torch.ones_like(temperature), temperature)[:, None]
    x = logits_shard.float() / temp[..., None]  # [B, K+1, V_r]
    m = top / temp  # [B, K+1]: division rounds monotonically, so this is max(x)

    e = torch.exp(x - m[..., None])  # unnormalised probabilities
    if top_k is not None or top_p is not None:
        t = filter_threshold(x, e, m, top_k, top_p, top_k_bound, vocab_size, group)
        e = e * (x >= t[..., None])  # kept, unnormalised

    # one SUM round: the kept mass, and p / q of each draft token from the rank owning it
    drafts = draft_tokens.to(torch.int64)
    in_vocab = (drafts >= 0) & (drafts < vocab_size)
    local = drafts.clamp(0, vocab_size - 1) - vocab_start  # [B, K]
    owned = (local >= 0) & (local < vr)
    local = local.clamp(0, vr - 1)
    parts = [e.sum(dim=-1), e[:, :k].gather(-1, local[..., None])[..., 0] * owned]
    if draft_probs_shard is not None:
        parts.append(draft_probs_shard.float().gather(-1, local[..., None])[..., 0] * owned)
    sums = _sum(torch.cat(parts, dim=-1), group)
    z = sums[:, :k1]  # [B, K+1]
    p_draft = sums[:, k1 : k1 + k] / z[:, :k] * in_vocab  # [B, K]
    q_draft = sums[:, k1 + k :] if draft_probs_shard is not None else torch.ones_like(p_draft)

    positions = torch.arange(k, device=device)
    key = rng.row_key(seeds)  # [B]
    u = rng.accept_uniforms(seeds, k)  # [B, K]
    valid = positions[None, :] < num_draft[:, None].to(torch.int64)
    accept = (u * q_draft < p_draft) & (q_draft > 0) & in_vocab
    num_accepted = prefix_match_count(accept, torch.ones_like(accept), valid)  # [B]

    # the recovered or bonus token: one MAX round of the residual and plain race winners
    rows = torch.arange(b, device=device)
    p_extra = e[rows, num_accepted] / z[rows, num_accepted][:, None]  # [B, V_r]
    rejected = num_accepted < num_draft.to(torch.int64)
    if k > 0:
        j = num_accepted.clamp(max=k - 1)
        if draft_probs_shard is not None:
            q_extra = draft_probs_shard[rows, j].float()
        else:
            q_extra = torch.zeros_like(p_extra)
            q_extra[rows, local[rows, j]] = (in_vocab & owned)[rows, j].float()
        residual = (p_extra - q_extra).clamp(min=0)
    else:
        residual = torch.zeros_like(p_extra)
    ids = torch.arange(vocab_start, vocab_start + vr, device=device)
    stream = rng.stream_key(key, num_accepted, rng.PURPOSE_SAMPLE)  # [B]
    exponential = rng.exponential(rng.uniform(stream[:, None], ids[None, :]))  # [B, V_r]
    residual_score = torch.where(residual > 0, residual / exponential, 0.0)
    plain_score = torch.where(p_extra > 0, p_extra / exponential, -1.0)
    best = torch.stack(
        [_local_best(residual_score, vocab_start), _local_best(plain_score, vocab_start)], -1
    )
    (residual_best, plain_best), (residual_token, plain_token) = (
        t.unbind(-1) for t in unpack(_max(best, group))
    )
    recovered_or_bonus = torch.where(
        rejected & (residual_best > 0), residual_token, plain_token
    )  # [B]

    padded = torch.cat(
        [drafts.clamp(0, vocab_size - 1), recovered_or_bonus[:, None]], dim=1
    )  # [B, K+1]
    padded[rows, num_accepted] = recovered_or_bonus
    tokens = emitted_tokens(padded, num_accepted)

    g_tokens, g_accepted = greedy_from_target(g_target, draft_tokens, num_draft)
    tokens = torch.where(greedy_row[:, None], g_tokens, tokens)
    num_accepted = torch.where(greedy_row, g_accepted, num_accepted)
    return tokens, num_accepted, num_accepted + 1
