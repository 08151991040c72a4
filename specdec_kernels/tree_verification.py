"""Public tree verification ops: :func:`verify_tree_greedy`, :func:`verify_tree_sampling`,
:func:`tree_attention_mask`, :func:`tree_depths` and their result :class:`TreeVerification`.

A tree of candidates (Medusa, EAGLE-2/3, SpecInfer) is scored by the target in one pass; these ops
pick the accepted path. The two verify ops are ``torch.library`` custom ops
(``torch.ops.specdec.verify_tree_greedy`` / ``verify_tree_sampling``) with fakes of the same
signature; the functions here check arguments, turn scalars into per-row tensors, pick the backend
(:mod:`specdec_kernels._dispatch`) and call them; each op's body is one lookup in the routing table
(:func:`specdec_kernels._dispatch.kernel`). The specification is
:mod:`specdec_kernels.reference.verify_tree`.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch
from torch import Tensor

from specdec_kernels import _validate as check
from specdec_kernels._dispatch import kernel, resolve_backend
from specdec_kernels.logprobs import emitted_logprobs
from specdec_kernels.reference import rng
from specdec_kernels.reference import verify_tree as ref_tree

DRAFT_MODES = ref_tree.DRAFT_MODES


class TreeVerification(NamedTuple):
    """The result of a tree verification step.

    Attributes
    ----------
    tokens : Tensor
        `[B, D+1]` int64 (``D``: the ``max_depth`` the caller passed, else the deepest real
        node's depth in the batch; never decided by ``validate``): the accepted draft tokens,
        then the recovered or bonus token, left-aligned, then ``-1``.
    num_accepted : Tensor
        `[B]` int64: accepted draft tokens (the depth of the last accepted node).
    num_emitted : Tensor
        `[B]` int64, always ``num_accepted + 1``.
    accepted_nodes : Tensor
        `[B, D+1]` int64: the node indices of the accepted path, root (0) first, then ``-1``.
    logprobs, top_logprobs, top_ids : Tensor or None
        With ``logprobs=`` / ``num_logprobs=``: `[B, D+1]` and `[B, D+1, n]`, as
        :class:`specdec_kernels.Verification`'s (the token at depth ``d`` scored by node
        ``accepted_nodes[b, d]``'s row); else ``None``.
    """

    tokens: Tensor
    num_accepted: Tensor
    num_emitted: Tensor
    accepted_nodes: Tensor
    logprobs: Tensor | None = None
    top_logprobs: Tensor | None = None
    top_ids: Tensor | None = None


# --- custom ops ------------------------------------------------------------------------------


def _result(tokens: Tensor, accepted: Tensor, nodes: Tensor):
    return tokens, accepted, accepted + 1, nodes


@torch.library.custom_op("specdec::verify_tree_greedy", mutates_args=())
def _verify_tree_greedy_op(
    target_logits: Tensor,
    tree_tokens: Tensor,
    parents: Tensor,
    num_nodes: Tensor,
    token_bitmask: Tensor | None,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _result(
        *kernel("verify_tree", backend)(
            target_logits,
            tree_tokens,
            parents,
            None,
            num_nodes,
            0,
            None,
            None,
            None,
            None,
            token_bitmask,
            True,
            False,
        )
    )


def _fake_result(target_logits):
    b, n, _ = target_logits.shape
    tokens = target_logits.new_empty((b, n), dtype=torch.int64)
    accepted = tokens.new_empty((b,))
    return tokens, accepted, tokens.new_empty((b,)), tokens.new_empty((b, n))


@_verify_tree_greedy_op.register_fake
def _(target_logits, tree_tokens, parents, num_nodes, token_bitmask, backend):
    return _fake_result(target_logits)


@torch.library.custom_op("specdec::verify_tree_sampling", mutates_args=())
def _verify_tree_sampling_op(
    target_logits: Tensor,
    tree_tokens: Tensor,
    parents: Tensor,
    draft_probs: Tensor | None,
    num_nodes: Tensor,
    mode: int,
    temperature: Tensor,
    top_k: Tensor | None,
    top_p: Tensor | None,
    seeds: Tensor,
    token_bitmask: Tensor | None,
    backend: str,
    log_input: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``log_input``: ``target_logits`` holds probabilities, read as ``x = log p`` (temperature
    1) in place: the SGLang drop-in's inputs, without a ``[B, N, V]`` temporary of their log."""
    return _result(
        *kernel("verify_tree", backend)(
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
            token_bitmask,
            False,
            log_input,
        )
    )


@_verify_tree_sampling_op.register_fake
def _(target_logits, tree_tokens, parents, draft_probs, num_nodes, mode, *args):
    return _fake_result(target_logits)


# --- argument handling -----------------------------------------------------------------------


def _check_tree_args(target_logits, tree_tokens, parents, num_nodes):
    """Structural checks (always). Returns ``(B, N, V, tree_tokens, parents, num_nodes)`` with
    the small tensors contiguous and ``num_nodes`` a ``[B]`` tensor."""
    b, k, v = check.check_logits(target_logits, rows="N")  # N >= 1: the root is a node
    n = k + 1
    device = target_logits.device
    check.check_tree_tensor("tree_tokens", tree_tokens, b, n, device)
    check.check_tree_tensor("parents", parents, b, n, device)
    nn = check.num_nodes_tensor(num_nodes, b, n, device)
    return b, n, v, tree_tokens.contiguous(), parents.contiguous(), nn.contiguous()


def _width(parents, num_nodes, max_depth: int | None) -> int:
    """The output width ``D + 1``, the same whatever ``validate`` says: ``max_depth + 1`` when
    the caller passes the static tree depth (a host int: no synchronisation), else the deepest
    real node's depth of the batch read from ``parents`` (one host read of a ``[B]``-sized
    result: a device sync on CUDA, none on CPU tensors)."""
    n = parents.shape[1]
    if max_depth is not None:
        return min(max_depth, n - 1) + 1
    if parents.shape[0] == 0:
        return n
    return int(ref_tree.tree_depths(parents, num_nodes).amax()) + 1


def _max_depth_arg(max_depth) -> int | None:
    if max_depth is None:
        return None
    if isinstance(max_depth, bool) or not isinstance(max_depth, numbers.Integral):
        raise TypeError(f"max_depth must be None or an int, got {type(max_depth).__name__}")
    if max_depth < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    return int(max_depth)


def _check_depth(parents, num_nodes, max_depth: int | None) -> None:
    """``validate=True``: the tree must fit the ``max_depth`` the caller promised."""
    if max_depth is None:
        return
    depth = int(ref_tree.tree_depths(parents, num_nodes).amax()) if parents.shape[0] else 0
    if depth > max_depth:
        raise ValueError(
            f"max_depth = {max_depth} but the deepest real node has depth {depth}: the accepted "
            f"path would not fit the [B, max_depth + 1] outputs"
        )


def _shaped(result, width: int) -> TreeVerification:
    """``[B, N]`` outputs cut to ``[B, width]`` (``width = D + 1``, see :func:`_width`)."""
    tokens, accepted, emitted, nodes = result
    return TreeVerification(tokens[:, :width], accepted, emitted, nodes[:, :width])


def _serving_args(target_logits, nn, token_bitmask, logprobs, num_logprobs, validate) -> int:
    """Check the serving keywords (docs: serving.md): ``token_bitmask [B, N, W]``; with
    ``validate=True`` every real node's row allows a finite logit. Returns ``num_logprobs``."""
    n_logprobs = check.check_logprob_args(logprobs, num_logprobs)
    if token_bitmask is not None:
        b, n, v = target_logits.shape
        check.check_token_bitmask(token_bitmask, (b, n), v, target_logits.device, "[B, N, W]")
        if validate:
            real = torch.arange(n, device=nn.device)[None, :] < nn[:, None]
            check.check_bitmask_values(target_logits, token_bitmask, real, where="node")
    return n_logprobs


def _finish(
    out: TreeVerification,
    target_logits: Tensor,
    token_bitmask: Tensor | None,
    logprobs: str | None,
    num_logprobs: int,
    backend: str,
    temperature: Tensor | None = None,
    top_k: Tensor | None = None,
    top_p: Tensor | None = None,
) -> TreeVerification:
    """``out`` with the log-probabilities of its emitted tokens, when asked for."""
    if logprobs is None:
        return out
    lp, top, ids = emitted_logprobs(
        target_logits,
        out.accepted_nodes,
        out.tokens,
        mode=logprobs,
        num_logprobs=num_logprobs,
        backend=backend,
        token_bitmask=token_bitmask,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
    )
    return out._replace(logprobs=lp, top_logprobs=top, top_ids=ids)


# --- public functions ------------------------------------------------------------------------


def verify_tree_greedy(
    target_logits: Tensor,
    tree_tokens: Tensor,
    parents: Tensor,
    *,
    num_nodes: Tensor | None = None,
    max_depth: int | None = None,
    token_bitmask: Tensor | None = None,
    logprobs: str | None = None,
    num_logprobs: int = 0,
    backend: str | None = None,
    validate: bool = True,
) -> TreeVerification:
    """Greedy verification of a token tree scored in one target pass.

    From the root, ``t = argmax(target_logits[b, node])`` (first index on ties); the first child
    (in index order) whose token is ``t`` is accepted and the walk continues there; otherwise
    ``t`` is emitted and the walk stops; at a leaf the leaf's ``argmax`` is the bonus token.
    A path-shaped tree (``parents = [-1, 0, 1, ..., K-1]``) gives :func:`verify_greedy`'s
    tokens.

    Parameters
    ----------
    target_logits : Tensor
        `[B, N, V]` float32/bfloat16/float16, last dim stride 1: row ``i`` scores the token
        after node ``i``'s path.
    tree_tokens : Tensor
        `[B, N]` int32/int64: node ``i``'s draft token (entry 0, the root, is ignored).
    parents : Tensor
        `[B, N]` int32/int64: ``parents[b, 0] = -1``, ``0 <= parents[b, i] < i`` for the real
        nodes ``1 <= i < n_b`` (topological order). Siblings are tried in index order.
    num_nodes : Tensor, optional
        `[B]` integer ``n_b`` in ``[1, N]``; nodes ``>= n_b`` are padding (any values, never
        read). Default ``N``.
    max_depth : int, optional
        The static depth of the tree shape (a host int, e.g. a Medusa/EAGLE tree's depth, or
        ``N - 1`` to keep every column): the outputs are then ``[B, max_depth + 1]`` (``D =
        max_depth``, capped at ``N - 1``) and the call never synchronises. ``None`` (default):
        ``D`` is the deepest real node's depth in the batch, read from ``parents`` and
        ``num_nodes`` (one host read: a device sync on CUDA, whatever ``validate`` says). With
        ``validate=True`` a tree deeper than ``max_depth`` raises ``ValueError``; with
        ``False`` its accepted path is cut to the ``max_depth + 1`` columns.
    token_bitmask : Tensor, optional
        int32 `[B, N, W]`, ``W = ceil(V / 32)`` (xgrammar's layout): node ``i``'s row of allowed
        tokens, applied as ``-inf`` logits inside the kernel, as in
        :func:`specdec_kernels.verify_greedy` (``validate=True``: a real node whose allowed
        tokens are all ``-inf`` raises ``ValueError``).
    logprobs, num_logprobs
        As in :func:`specdec_kernels.verify_greedy`: ``TreeVerification.logprobs`` `[B, D+1]`
        (the token at depth ``d`` scored by node ``accepted_nodes[b, d]``'s row) and
        ``top_logprobs`` / ``top_ids`` `[B, D+1, n]`.
    backend : {None, "triton", "native", "reference"}
        As in :func:`specdec_kernels.verify_greedy`.
    validate : bool
        Check values first (synchronises): ``num_nodes`` range, ``parents`` (a bad entry raises
        ``ValueError`` naming the row and the node), token ids of real nodes in ``[0, V)``, no
        NaN / ``+inf`` logits in real nodes' rows. With ``False`` nothing is checked, bad
        values never cause out-of-bounds accesses or ids outside ``[0, V)``, and nothing
        synchronises when ``max_depth`` is given. ``validate`` never changes the outputs'
        shapes or types: both settings return the same ``[B, D+1]`` (see ``max_depth``).

    Returns
    -------
    TreeVerification
        ``tokens [B, D+1]``, ``num_accepted [B]``, ``num_emitted [B]``, ``accepted_nodes
        [B, D+1]`` (int64, ``-1`` padded; ``D`` = ``max_depth`` when given, else the deepest
        real node's depth in the batch; the same for both ``validate`` settings).
        ``cache.compact(start + accepted_nodes[:, 1:], num_accepted, start)`` keeps the
        accepted path of a tree written at ``start .. start + N - 1``.

    Raises
    ------
    TypeError, ValueError
        Bad types, shapes or devices; with ``validate=True`` bad values.

    Examples
    --------
    The tree ``0 -> {1, 2}, 1 -> 3``; the target's argmax after the root is 0 (node 2's token),
    after node 2 it is 2:

    >>> import torch, specdec_kernels as sk
    >>> parents = torch.tensor([[-1, 0, 0, 1]])
    >>> tree_tokens = torch.tensor([[-1, 1, 0, 2]])
    >>> logits = torch.tensor([[[5., 0, 0], [0, 0, 5], [0, 0, 5], [5, 0, 0]]])
    >>> out = sk.verify_tree_greedy(logits, tree_tokens, parents)
    >>> out.tokens.tolist(), out.accepted_nodes.tolist(), out.num_accepted.tolist()
    ([[0, 2, -1]], [[0, 2, -1]], [1])
    """
    b, n, v, tree_tokens, parents, nn = _check_tree_args(
        target_logits, tree_tokens, parents, num_nodes
    )
    max_depth = _max_depth_arg(max_depth)
    n_logprobs = _serving_args(target_logits, nn, token_bitmask, logprobs, num_logprobs, validate)
    resolved = resolve_backend(backend, target_logits.device)
    if validate:
        check.check_tree_values(target_logits, tree_tokens, parents, nn)
        _check_depth(parents, nn, max_depth)
    result = torch.ops.specdec.verify_tree_greedy(
        target_logits, tree_tokens, parents, nn, token_bitmask, resolved
    )
    out = _shaped(result, _width(parents, nn, max_depth))
    return _finish(out, target_logits, token_bitmask, logprobs, n_logprobs, resolved)


def verify_tree_sampling(
    target_logits: Tensor,
    tree_tokens: Tensor,
    parents: Tensor,
    draft_probs: Tensor | None = None,
    *,
    draft_mode: str = "deterministic",
    temperature: float | Tensor = 1.0,
    top_k: int | Tensor | None = None,
    top_p: float | Tensor | None = None,
    num_nodes: Tensor | None = None,
    max_depth: int | None = None,
    seed: int | Tensor | None = None,
    generator: torch.Generator | None = None,
    token_bitmask: Tensor | None = None,
    logprobs: str | None = None,
    num_logprobs: int = 0,
    backend: str | None = None,
    validate: bool = True,
) -> TreeVerification:
    """Lossless verification of a token tree by recursive rejection sampling.

    SpecInfer (Miao et al., ASPLOS 2024, https://arxiv.org/abs/2305.09781); multi-draft
    speculative sampling (Chen et al. 2023 https://arxiv.org/abs/2302.01318, Jeon et al. 2024
    https://arxiv.org/abs/2402.14160 for sampling without replacement). At an accepted node with
    filtered target distribution ``p`` (temperature, top-k, top-p as in
    :func:`specdec_kernels.verify_sampling`), ``r = p``; each child ``c`` in index order, with
    token ``x_c`` and proposal ``q_c``, is accepted when ``r(x_c) > 0``, ``q_c(x_c) > 0`` and
    ``u * q_c(x_c) < r(x_c)`` (the walk descends to it), else ``r = norm(max(0, r - q_c))``.
    When every child is rejected a token drawn from ``r`` is emitted; at a leaf, the bonus
    drawn from the leaf's ``p``. The emitted tokens are distributed exactly as tokens sampled
    from the target one at a time, whenever the ``draft_mode``'s assumption holds.

    Parameters
    ----------
    target_logits, tree_tokens, parents, num_nodes, max_depth
        As in :func:`verify_tree_greedy` (``max_depth`` fixes the outputs' width ``D + 1``).
    draft_probs : Tensor, optional
        `[B, N, V]` float, last stride 1: row ``i`` is ``q_i``, the draft distribution node
        ``i``'s children were proposed from. Needed unless ``draft_mode="deterministic"``
        (where it is ignored). Used as given, not renormalised: a row summing to ``s != 1``
        (``validate`` allows ``|s - 1| <= max(1e-3, eps(dtype))``) biases the output by up to
        about ``|s - 1|`` per node, as in :func:`specdec_kernels.verify_sampling` (Notes).
    draft_mode : {"deterministic", "independent", "without_replacement"}
        ``"deterministic"``: the children are fixed choices (top-k expansion, n-gram): ``q_c``
        is one-hot at ``x_c`` (then the residual drops ``x_c``). ``"independent"``: node ``i``'s
        children were sampled independently from ``q_i`` (SpecInfer). ``"without_replacement"``:
        sampled from ``q_i`` without replacement in index order: ``q_c`` is ``q_i`` with the
        earlier siblings' tokens removed, divided by ``1 -`` their ``q_i`` mass.
    temperature, top_k, top_p, seed, generator
        As in :func:`specdec_kernels.verify_sampling`; ``temperature = 0`` rows are exactly
        :func:`verify_tree_greedy`'s.
    token_bitmask, logprobs, num_logprobs
        As in :func:`verify_tree_greedy`; ``"processed"`` logprobs follow the filtered target
        distribution at each node (greedy rows: the masked ``log_softmax`` at temperature 1).
    backend, validate
        As in :func:`verify_tree_greedy`; ``validate`` also checks, as
        :func:`specdec_kernels.verify_sampling` does, the draft rows of real nodes with a real
        child (non-deterministic modes), ``temperature`` and ``top_p``.

    Returns
    -------
    TreeVerification
        As in :func:`verify_tree_greedy`.

    Raises
    ------
    TypeError, ValueError
        As in :func:`verify_tree_greedy`; also an unknown ``draft_mode``, a missing
        ``draft_probs`` where the mode needs it, both ``seed`` and ``generator``.

    Notes
    -----
    Random numbers are counter based (:mod:`specdec_kernels.reference.rng`): the accept uniform
    of the ``s``-th child tried at a node of depth ``d`` is keyed by ``(seed_b, d, s)``, the
    recovered / bonus race of the node where the walk stops by ``(seed_b, d)``. Sibling 0 at
    depth ``d`` draws the chain's numbers of draft position ``d``, so a path-shaped tree gives
    exactly :func:`specdec_kernels.verify_sampling`'s tokens (``"deterministic"`` = chain
    without ``draft_probs``, ``"independent"`` = chain with them, ``q_i`` at ``draft_probs[:,
    i]`` for the chain's ``draft_probs[:, i]``).

    Examples
    --------
    The tree of :func:`verify_tree_greedy`'s example with near one-hot targets: node 1's token
    has target probability ~1e-13 and is rejected, node 2's has ~1 and is accepted; the bonus
    after node 2 is token 2, whatever the seed:

    >>> import torch, specdec_kernels as sk
    >>> parents = torch.tensor([[-1, 0, 0, 1]])
    >>> tree_tokens = torch.tensor([[-1, 1, 0, 2]])
    >>> logits = torch.tensor([[[30., 0, 0], [0, 0, 30], [0, 0, 30], [30, 0, 0]]])
    >>> out = sk.verify_tree_sampling(logits, tree_tokens, parents, seed=0)
    >>> out.tokens.tolist(), out.accepted_nodes.tolist()
    ([[0, 2, -1]], [[0, 2, -1]])
    """
    b, n, v, tree_tokens, parents, nn = _check_tree_args(
        target_logits, tree_tokens, parents, num_nodes
    )
    device = target_logits.device
    if draft_mode not in DRAFT_MODES:
        raise ValueError(f"draft_mode must be one of {DRAFT_MODES}, got {draft_mode!r}")
    mode = DRAFT_MODES.index(draft_mode)
    if mode == ref_tree.MODE_DETERMINISTIC:
        draft_probs = None
    elif draft_probs is None:
        raise ValueError(f"draft_mode={draft_mode!r} needs draft_probs [B, N, V], got None")
    else:
        check.require_tensor("draft_probs", draft_probs)
        check.require_dtype("draft_probs", draft_probs, check.FLOAT_DTYPES)
        check.require_shape("draft_probs", draft_probs, (b, n, v), "[B, N, V]")
        check.require_device("draft_probs", draft_probs, device)
        if draft_probs.stride(-1) != 1 and v > 1:
            raise ValueError(
                "draft_probs must have stride 1 in its last dim, got strides "
                f"{tuple(draft_probs.stride())}"
            )
    if seed is not None and generator is not None:
        raise ValueError("pass at most one of seed and generator, got both")
    check.check_seed(seed, b, device)
    check.check_scalar_ranges(temperature, top_k, top_p)
    max_depth = _max_depth_arg(max_depth)
    n_logprobs = _serving_args(target_logits, nn, token_bitmask, logprobs, num_logprobs, validate)
    resolved = resolve_backend(backend, device)

    if check.all_greedy(temperature):  # all rows greedy
        if validate:
            check.check_tree_values(target_logits, tree_tokens, parents, nn)
            _check_depth(parents, nn, max_depth)
        result = torch.ops.specdec.verify_tree_greedy(
            target_logits, tree_tokens, parents, nn, token_bitmask, resolved
        )
        out = _shaped(result, _width(parents, nn, max_depth))
        return _finish(out, target_logits, token_bitmask, logprobs, n_logprobs, resolved)

    temp, topk, topp = check.sampling_controls(b, device, temperature, top_k, top_p)
    if validate:
        check.check_tree_values(
            target_logits, tree_tokens, parents, nn, draft_probs, temp, topk, topp
        )
        _check_depth(parents, nn, max_depth)
    seeds = rng.seeds_for_batch(b, device, seed, generator)
    result = torch.ops.specdec.verify_tree_sampling(
        target_logits,
        tree_tokens,
        parents,
        draft_probs,
        nn,
        mode,
        temp,
        topk,
        topp,
        seeds,
        token_bitmask,
        resolved,
    )
    out = _shaped(result, _width(parents, nn, max_depth))
    return _finish(
        out, target_logits, token_bitmask, logprobs, n_logprobs, resolved, temp, topk, topp
    )


def _parents_args(parents, num_nodes, validate: bool):
    check.require_tensor("parents", parents)
    check.require_dtype("parents", parents, check.INT_DTYPES)
    if parents.dim() != 2:
        raise ValueError(f"parents must have shape [B, N] (2 dims), got {check.shape_str(parents)}")
    b, n = parents.shape
    nn = check.num_nodes_tensor(num_nodes, b, n, parents.device)
    if num_nodes is not None and nn.device != parents.device:
        raise ValueError(f"num_nodes is on {nn.device} but parents is on {parents.device}")
    if validate:
        check.check_parents(parents, nn)
    return nn


def tree_depths(
    parents: Tensor, num_nodes: Tensor | None = None, *, validate: bool = True
) -> Tensor:
    """Depth of every node of a batch of trees.

    Parameters
    ----------
    parents : Tensor
        `[B, N]` int32/int64, as in :func:`verify_tree_greedy`.
    num_nodes : Tensor, optional
        `[B]` integer in ``[1, N]``; default ``N``.
    validate : bool
        Check ``parents`` and ``num_nodes`` (``ValueError`` naming the row and node;
        synchronises). With ``False`` a node whose parent is not a real earlier node gets
        depth ``-1``, like padding.

    Returns
    -------
    Tensor
        `[B, N]` int64: 0 at the root, ``depth(parent) + 1`` below, ``-1`` at padding nodes.

    Examples
    --------
    >>> import torch, specdec_kernels as sk
    >>> sk.tree_depths(torch.tensor([[-1, 0, 0, 1, 0]]), torch.tensor([4])).tolist()
    [[0, 1, 1, 2, -1]]
    """
    nn = _parents_args(parents, num_nodes, validate)
    return ref_tree.tree_depths(parents, nn)


def tree_attention_mask(
    parents: Tensor, num_nodes: Tensor | None = None, *, validate: bool = True
) -> Tensor:
    """Tree attention mask: which nodes each node's query may attend to.

    Parameters
    ----------
    parents, num_nodes, validate
        As in :func:`tree_depths`.

    Returns
    -------
    Tensor
        `[B, N, N]` bool: ``mask[b, i, j]`` is true when ``j`` is ``i`` or an ancestor of ``i``.
        Padding nodes see only themselves (so an attention row is never empty).

    Examples
    --------
    >>> import torch, specdec_kernels as sk
    >>> sk.tree_attention_mask(torch.tensor([[-1, 0, 0, 1]]))[0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    """
    nn = _parents_args(parents, num_nodes, validate)
    return ref_tree.tree_attention_mask(parents, nn)
