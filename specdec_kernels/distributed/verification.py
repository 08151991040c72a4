"""``sk.distributed.verify_greedy`` / ``verify_sampling``: verification of vocabulary-sharded
logits over a ``torch.distributed`` group, with ``O(B * (K+1))`` numbers per collective round.

The rounds and their sizes are listed in :mod:`specdec_kernels.distributed.verify`.
"""

from __future__ import annotations

import numbers

import torch
import torch.distributed as dist

from specdec_kernels import _validate as check
from specdec_kernels.distributed import _checks
from specdec_kernels.distributed.verify import verify_greedy_shard, verify_sampling_shard
from specdec_kernels.reference import rng
from specdec_kernels.verification import Verification


def _structure(logits_shard, draft_tokens, num_draft_tokens, vocab_start, vocab_size):
    b, k, vr = _checks.renamed(check.check_logits, logits_shard)
    device = logits_shard.device
    check.check_draft_tokens(draft_tokens, b, k, device)
    nd = check.num_draft_tensor(num_draft_tokens, b, k, device)
    _checks.check_shard_bounds(vocab_start, vocab_size, vr)
    return b, k, vr, nd


def verify_greedy(
    logits_shard: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    vocab_start: int,
    vocab_size: int,
    num_draft_tokens: torch.Tensor | None = None,
    group=None,
    validate: bool = True,
) -> Verification:
    """Greedy verification of logits sharded over the vocabulary across a process group.

    Every rank passes its own columns of the target logits and the same drafts; every rank
    returns the same :class:`sk.Verification`, exactly :func:`sk.verify_greedy`'s on the gathered
    logits (first global index on ties, across shards too). One ``MAX`` all-reduce of
    ``B * (K+1)`` int64 (a packed max logit and global argmax per position).

    Parameters
    ----------
    logits_shard : Tensor
        `[B, K+1, V_r]` float32/bfloat16/float16, last dim stride 1: global columns
        ``vocab_start .. vocab_start + V_r - 1``. Shards tile ``[0, vocab_size)`` in rank order;
        widths may differ.
    draft_tokens : Tensor
        `[B, K]` int32/int64 global ids, the same on every rank; positions ``>= k_b`` ignored.
    vocab_start, vocab_size : int
        This shard's first global column, and the global vocabulary size.
    num_draft_tokens : Tensor, optional
        `[B]` integer in ``[0, K]``, the same on every rank; default ``K``.
    group : ProcessGroup, optional
        Default: the default group.
    validate : bool
        Check values and the agreement of the ranks (shards tiling ``[0, vocab_size)``, the same
        drafts everywhere) with one ``all_gather_object`` round; an error found on any rank, of
        any type, is raised on every rank. That agreement round is the validation itself:
        the global checks (tiling, the same arguments on every rank, a position with no finite
        logit on any shard, draft rows summing to 1 over all shards) need every rank's
        partial results, so checking them across a group *is* a collective, and it is the one
        collective ``validate`` adds. The verification collectives (the op's own rounds) are
        the same for both settings. With ``False`` nothing is exchanged beyond those and a
        structural error raises only where it is found (the other ranks then wait in the
        collective until the group's timeout). Every rank must pass the same ``validate``: it
        decides whether the agreement round takes place, so this one thing cannot be checked
        (ranks that differ wait or fail in mismatched collectives).

    Returns
    -------
    Verification
        ``tokens [B, K+1]`` int64 (global ids, -1 padded), ``num_accepted [B]``,
        ``num_emitted [B]``; identical on every rank.

    Raises
    ------
    TypeError, ValueError
        As :func:`sk.verify_greedy`, and for shards that do not tile the vocabulary or
        arguments that differ across ranks; with ``validate=True`` on every rank, each message
        prefixed by the rank that found the problem.

    Examples
    --------
    On a one-process group (each rank of a bigger group passes its own columns):

    >>> import os, torch, torch.distributed as dist, specdec_kernels as sk
    >>> os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(sk.distributed.free_port()))
    >>> dist.init_process_group("gloo", rank=0, world_size=1)
    >>> logits = torch.tensor([[[0., 5., 0.], [0., 0., 5.], [5., 0., 0.]]])  # argmax 1, 2, 0
    >>> out = sk.distributed.verify_greedy(logits, torch.tensor([[1, 0]]), vocab_start=0,
    ...                                    vocab_size=3)
    >>> out.tokens.tolist(), out.num_accepted.tolist()
    ([[1, 2, -1]], [1])
    >>> dist.destroy_process_group()
    """
    error = summary = None
    try:
        b, k, vr, nd = _structure(
            logits_shard, draft_tokens, num_draft_tokens, vocab_start, vocab_size
        )
        if validate:
            _checks.local_value_checks(logits_shard, draft_tokens, nd, vocab_start, vocab_size)
            digest = _checks.fingerprint("greedy", draft_tokens.long(), nd.long())
            summary = _checks.summarise(logits_shard, vocab_start, vocab_size, digest)
    except Exception as exc:  # any local failure is raised on every rank by the agreement
        if not validate:
            raise
        error = exc
    if validate:
        _checks.agree(group, error, summary, None if error else nd, None)
    tokens, accepted, emitted = verify_greedy_shard(
        logits_shard, draft_tokens.contiguous(), nd, vocab_start, group
    )
    return Verification(tokens, accepted, emitted)


def _host_plan(temperature, top_k, topk, topp):
    """Which verification collectives run, from the arguments' host forms alone (no
    synchronisation, so the same for both ``validate`` settings): ``(all_greedy, top_k off,
    top_p off, top_k_bound)``. A scalar ``temperature=0`` is all greedy (the greedy round
    only), a scalar ``top_k`` bounds every row's (the candidate all-gather); a filter passed as
    ``None`` (or a scalar that keeps everything) is off."""
    all_greedy = check.all_greedy(temperature)
    bound = top_k if isinstance(top_k, numbers.Integral) and topk is not None else None
    return all_greedy, topk is None, topp is None, bound


def _plan_of(plan, topk, topp, b, device):
    """``(all_greedy, top_k, top_p, top_k_bound)`` for this rank under ``plan`` (rank 0's host
    plan, see :func:`_host_plan`): a filter ``plan`` turns off is ``None`` (the agreement
    showed that every rank's values keep everything then); one it keeps gets this rank's
    values, or the ``[B]`` tensor of "off" (``top_k = 0``, ``top_p = 1``) where this rank
    passed ``None`` for them."""
    all_greedy, k_off, p_off, bound = plan
    if k_off:
        topk = None
    elif topk is None:
        topk = torch.zeros(b, dtype=torch.int64, device=device)
    if p_off:
        topp = None
    elif topp is None:
        topp = torch.ones(b, dtype=torch.float32, device=device)
    return all_greedy, topk, topp, bound


def _agreed_digest(b, device, draft_tokens, nd, temp, topk, topp, seed, vocab_size, has_q):
    """The fingerprint of what every rank must agree on, by value: equivalent forms (a scalar or
    its ``[B]`` tensor, an off filter as ``None``, ``0``/``1`` or a tensor of them, an int seed
    or its per-row seeds) give the same digest."""
    zeros = torch.zeros(b, dtype=torch.int64, device=device)
    k_values = zeros if topk is None else torch.where(topk >= vocab_size, 0, topk)
    p_values = torch.ones(b, device=device) if topp is None else topp
    seeds = None if seed is None else rng.seeds_for_batch(b, device, seed)
    return _checks.fingerprint(
        "sampling", draft_tokens.long(), nd.long(), temp, k_values, p_values, seeds, has_q
    )


def _shared_seeds(b, device, seed, group) -> torch.Tensor:
    """The per-row seeds, the same on every rank: drawn on the group's first rank when
    ``seed`` is None (one broadcast of ``B`` int64)."""
    seeds = rng.seeds_for_batch(b, device, seed)
    if seed is None:
        src = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast(seeds, src=src, group=group)
    return seeds


def verify_sampling(
    logits_shard: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs_shard: torch.Tensor | None = None,
    *,
    vocab_start: int,
    vocab_size: int,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    num_draft_tokens: torch.Tensor | None = None,
    seed: int | torch.Tensor | None = None,
    group=None,
    validate: bool = True,
) -> Verification:
    """Lossless rejection-sampling verification of vocabulary-sharded logits.

    The same semantics as :func:`sk.verify_sampling` (Leviathan et al. 2023,
    https://arxiv.org/abs/2211.17192; Chen et al. 2023, https://arxiv.org/abs/2302.01318):
    temperature, top-k then top-p (ties kept), accept ``x_j`` with probability
    ``min(1, p_j(x_j) / q_j(x_j))``, resample the first rejection from ``norm(max(0, p - q))``
    or draw the bonus token from ``p``. Every rank returns the same result, which equals the
    single-device op's on the gathered tensors with the same seeds, token for token except where
    the order of a floating-point sum decides a near-tie: the random numbers are keyed by the
    global token id, so each rank draws exactly the numbers one device would for its columns.

    Communication, with ``N = B * (K+1)``: ``8 N`` bytes (max, greedy argmax) + ``4 (N + B K)``
    (kept mass, ``p`` of each draft token; ``+ 4 B K`` for ``q`` with ``draft_probs_shard``) +
    ``16 B`` (the race winners) in 3 all-reduce rounds. A scalar ``top_k <= 256`` adds one
    all-gather of ``4 N k`` bytes (each rank's ``k`` largest values) and, with ``top_p``, one
    ``4 N`` round; otherwise top-k adds 8 rounds of ``8 * 16 N`` bytes and top-p 8 rounds of
    ``4 * 16 N`` (+ ``4 N`` once): 16-pivot searches over float keys, as the kernels do.
    Independent of ``V``. ``seed=None`` adds a broadcast of ``B`` int64 seeds.

    Parameters
    ----------
    logits_shard : Tensor
        `[B, K+1, V_r]`, as in :func:`verify_greedy`.
    draft_tokens : Tensor
        `[B, K]` global ids, the same on every rank.
    draft_probs_shard : Tensor, optional
        `[B, K, V_r]`: this rank's columns of the draft distributions (used as given, not
        renormalised: see :func:`sk.verify_sampling`'s Notes for the bias a row summing to
        ``s != 1`` over all shards causes, at most ``|s - 1| / min(s, 1)``), or
        ``None`` on every rank for a deterministic drafter (``q`` one-hot at the draft token).
    vocab_start, vocab_size : int
        As in :func:`verify_greedy`.
    temperature, top_k, top_p, num_draft_tokens : optional
        As in :func:`sk.verify_sampling` (``top_k`` counts over the whole vocabulary), the same
        on every rank.
    seed : int or Tensor, optional
        As in :func:`sk.verify_sampling`, the same on every rank. ``None``: the first rank of
        the group draws the seeds and broadcasts them.
    group, validate
        As in :func:`verify_greedy`; ``validate`` also checks (globally) that the draft
        probabilities of every live position sum to 1 over all shards, and that every rank
        passes ``draft_probs_shard`` or every rank passes ``None``. Which verification
        collectives run is decided, for both settings, from the host forms of the arguments
        (no synchronisation): a scalar ``temperature=0`` runs the greedy round only, a scalar
        ``top_k`` the candidate all-gather, a filter passed as ``None`` (or a scalar that keeps
        everything) none of its rounds; ``[B]`` tensors run the general rounds, whatever their
        values. With ``validate=True`` the forms of rank 0 decide, shared in the agreement
        round, so equivalent forms (``0.0`` or ``torch.zeros(B)``, ``5`` or
        ``torch.full((B,), 5)``, ``None``, ``0`` or ``torch.zeros(B)`` for an off ``top_k``,
        ``None``, ``1.0`` or ``torch.ones(B)`` for an off ``top_p``, an int seed or its per-row
        seeds) may differ across ranks; with ``validate=False`` every rank must pass the same
        forms. Either way a call with rank 0's forms runs the same collectives.

    Returns
    -------
    Verification
        Identical on every rank.

    Raises
    ------
    TypeError, ValueError
        As :func:`verify_greedy` and :func:`sk.verify_sampling`.

    Examples
    --------
    >>> import os, torch, torch.distributed as dist, specdec_kernels as sk
    >>> os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(sk.distributed.free_port()))
    >>> dist.init_process_group("gloo", rank=0, world_size=1)
    >>> logits = torch.tensor([[[0., 9., 0.], [0., 0., 9.]]])  # p puts ~1 on token 1, then 2
    >>> out = sk.distributed.verify_sampling(logits, torch.tensor([[1]]), vocab_start=0,
    ...                                      vocab_size=3, seed=0)
    >>> out.tokens.tolist()
    [[1, 2]]
    >>> dist.destroy_process_group()
    """
    error = summary = plan = None
    temp = topk = topp = nd = None
    try:
        b, k, vr, nd = _structure(
            logits_shard, draft_tokens, num_draft_tokens, vocab_start, vocab_size
        )
        device = logits_shard.device
        if draft_probs_shard is not None:
            _checks.renamed(check.check_draft_probs, draft_probs_shard, b, k, vr, device)
        check.check_seed(seed, b, device)
        temp, topk, topp = check.sampling_controls(b, device, temperature, top_k, top_p)
        plan = _host_plan(temperature, top_k, topk, topp)
        if validate:
            _checks.local_value_checks(
                logits_shard,
                draft_tokens,
                nd,
                vocab_start,
                vocab_size,
                draft_probs=draft_probs_shard,
                temperature=temp,
                top_k=topk,
                top_p=topp,
            )
            digest = _agreed_digest(
                b, device, draft_tokens, nd, temp, topk, topp, seed, vocab_size,
                draft_probs_shard is None,
            )  # fmt: skip
            summary = _checks.summarise(
                logits_shard, vocab_start, vocab_size, digest, draft_probs_shard
            )
            summary.plan = plan
    except Exception as exc:  # any local failure is raised on every rank by the agreement
        if not validate:
            raise
        error = exc
    if validate:  # the agreement round: validation itself (see the docstring)
        plan = _checks.agree(group, error, summary, nd, temp)[0].plan  # rank 0's host plan
    all_greedy, topk, topp, bound = _plan_of(plan, topk, topp, b, device)
    draft_tokens = draft_tokens.contiguous()
    if all_greedy:
        tokens, accepted, emitted = verify_greedy_shard(
            logits_shard, draft_tokens, nd, vocab_start, group
        )
        return Verification(tokens, accepted, emitted)
    seeds = _shared_seeds(b, device, seed, group)
    tokens, accepted, emitted = verify_sampling_shard(
        logits_shard,
        draft_tokens,
        draft_probs_shard,
        nd,
        temp,
        topk,
        topp,
        seeds,
        vocab_start,
        vocab_size,
        group,
        bound,
    )
    return Verification(tokens, accepted, emitted)
