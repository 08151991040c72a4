"""Drop-in SGLang tree verification (``sgl_kernel.verify_tree_greedy`` and
``sgl_kernel.tree_speculative_sampling_target_only``) on this package's tree ops.

Follows SGLang's sgl-kernel at commit ``0e6ed14d`` (``csrc/speculative/eagle_utils.cu``:
``VerifyTreeGreedy``) and ``120affb9`` (``csrc/speculative/speculative_sampling.cuh``:
``TreeSpeculativeSamplingTargetOnly``), the kernels SGLang's EAGLE worker calls
(``python/sglang/srt/speculative/eagle_info.py``). Switch over with one line::

    from specdec_kernels.compat.sglang import verify_tree_greedy  # or
    from specdec_kernels.compat.sglang import tree_speculative_sampling_target_only

SGLang's trees are linked lists per request ``b`` over its ``N`` draft nodes (node 0 the root):
``retrive_next_token[b, i]`` is node ``i``'s first child (``-1``: none),
``retrive_next_sibling[b, i]`` its next sibling, ``retrive_index[b, i]`` the node's position in
the flat ``[B * N]`` buffers (``predicts``, and ``target_predict`` viewed flat).
``candidates[b, i]`` is node ``i``'s token. The adapters turn the lists into ``parents`` (no host
synchronisation) and run :func:`specdec_kernels.verify_tree_greedy` /
:func:`specdec_kernels.verify_tree_sampling`, which try siblings in index order: the sibling
lists must be in increasing node order and children must follow their parents, as SGLang's
``build_tree_kernel_efficient`` builds them (nodes unreachable from the root are never visited).

Outputs, written in place as upstream: ``accept_index[b, 0]`` = the root's ``retrive_index``,
``accept_index[b, d]`` = that of the ``d``-th accepted node (entries after the path are left as
they were: SGLang fills them with ``-1`` first); ``accept_token_num[b]`` = accepted draft tokens
(at most ``S - 1``, ``S = accept_index.shape[1]``); ``predicts[retrive_index of a path node]`` =
the token that follows it (the next accepted token, or the target's token at the last one);
``predicts`` entries of other nodes are left as they were.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec_kernels import _validate as check
from specdec_kernels._dispatch import check_backend, resolve_backend
from specdec_kernels.compat._common import require
from specdec_kernels.reference import rng
from specdec_kernels.tree_verification import DRAFT_MODES, TreeVerification
from specdec_kernels.tree_verification import verify_tree_greedy as _tree_greedy

__all__ = ["tree_speculative_sampling_target_only", "verify_tree_greedy"]

_LONG = (torch.int64,)
_INT = (torch.int32,)


def verify_tree_greedy(
    predicts: Tensor,
    accept_index: Tensor,
    accept_token_num: Tensor,
    candidates: Tensor,
    retrive_index: Tensor,
    retrive_next_token: Tensor,
    retrive_next_sibling: Tensor,
    target_predict: Tensor,
    *,
    backend: str | None = None,
) -> None:
    """Greedy tree verification in place, with SGLang's arguments and outputs.

    From the root, with ``t`` = the target's prediction after the current node
    (``target_predict.view(-1)[retrive_index[b, node]]``), the first child in the sibling list
    whose candidate equals ``t`` is accepted and the walk continues from it, for at most
    ``S - 1`` accepted tokens; ``predicts`` gets ``t`` at every path node. Runs on
    :func:`specdec_kernels.verify_tree_greedy`: the predictions are passed as scores over node
    labels (a `[B, N, N+1]` one-hot: node ``i`` predicts label ``i``, a child carries its
    parent's label when its candidate equals the parent's prediction), so the tree op decides
    the walk without a `[.., V]` tensor; the tokens are then read back from ``candidates`` /
    ``target_predict``.

    Differences (deliberate): out-of-range links and indices are clamped, never followed out of
    bounds (upstream trusts them); siblings must be listed in increasing node order (see the
    module docstring); shapes and dtypes raise ``ValueError`` / ``TypeError`` instead of
    upstream's ``RuntimeError``.

    Parameters
    ----------
    predicts : Tensor
        `[B * N]` int32, written in place.
    accept_index : Tensor
        `[B, S]` int32, written in place.
    accept_token_num : Tensor
        `[B]` int32, written in place.
    candidates, retrive_index, retrive_next_token, retrive_next_sibling : Tensor
        `[B, N]` int64.
    target_predict : Tensor
        `[B, N]` int64: the target's argmax after each node (indexed flat by ``retrive_index``).
    backend : {None, "triton", "native", "reference"}
        Keyword-only, not in the upstream signature: the implementation of this package's
        verification kernels (as :func:`specdec_kernels.verify_tree_greedy`'s ``backend``); ``None``
        (default): the automatic choice. A bad name raises ``ValueError`` before any work.

    Examples
    --------
    The tree ``0 -> {1 -> 2, 3 -> 4 -> 5}``; the target predicts 30 after the root (node 3's
    token), 40 after node 3, 99 after node 4:

    >>> import torch
    >>> from specdec_kernels.compat.sglang import verify_tree_greedy
    >>> cand = torch.tensor([[7, 10, 20, 30, 40, 50]])
    >>> nxt = torch.tensor([[1, 2, -1, 4, 5, -1]])
    >>> sib = torch.tensor([[-1, 3, -1, -1, -1, -1]])
    >>> target = torch.tensor([[30, 0, 0, 40, 99, 0]])
    >>> predicts = torch.full((6,), -1, dtype=torch.int32)
    >>> accept_index = torch.full((1, 4), -1, dtype=torch.int32)
    >>> accept_token_num = torch.zeros(1, dtype=torch.int32)
    >>> verify_tree_greedy(predicts, accept_index, accept_token_num, cand,
    ...                    torch.arange(6)[None], nxt, sib, target)
    >>> accept_index.tolist(), accept_token_num.tolist(), predicts.tolist()
    ([[0, 3, 4, -1]], [2], [30, -1, -1, 40, 99, -1])
    """
    check_backend(backend)
    b, n, s, device = _check(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling,
    )  # fmt: skip
    require("target_predict", target_predict, 2, _LONG, device)
    check.require_shape("target_predict", target_predict, (b, n), "[B, N]")
    parents = parents_from_lists(retrive_next_token, retrive_next_sibling)
    flat_index = retrive_index.clamp(0, max(b * n - 1, 0))  # [B, N]
    predicted = target_predict.reshape(-1)[flat_index]  # [B, N]: t after each node
    rows = torch.arange(b, device=device)[:, None]
    parent_t = predicted[rows, parents.clamp(min=0)]  # [B, N]
    labels = torch.where(candidates == parent_t, parents.clamp(min=0), n)  # [B, N]
    scores = torch.zeros(b, n, n + 1, device=device)
    scores[:, torch.arange(n), torch.arange(n)] = 1.0  # node i predicts label i
    out = _tree_greedy(scores, labels, parents, max_depth=n - 1, backend=backend, validate=False)
    path_tokens = torch.where(
        out.accepted_nodes[:, 1:] >= 0, candidates[rows, out.accepted_nodes[:, 1:].clamp(min=0)], -1
    )
    _write(predicts, accept_index, accept_token_num, retrive_index, out.accepted_nodes,
           out.num_accepted, path_tokens, predicted, s)  # fmt: skip


def tree_speculative_sampling_target_only(
    predicts: Tensor,
    accept_index: Tensor,
    accept_token_num: Tensor,
    candidates: Tensor,
    retrive_index: Tensor,
    retrive_next_token: Tensor,
    retrive_next_sibling: Tensor,
    uniform_samples: Tensor,
    uniform_samples_for_final_sampling: Tensor,
    target_probs: Tensor,
    draft_probs: Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
    *,
    backend: str | None = None,
) -> None:
    """Lossless tree sampling of deterministic (top-k expanded) drafts, in place, with SGLang's
    arguments and outputs.

    Upstream, at the current node with target distribution ``p``, one coin ``u`` and the
    children in list order: child ``c`` is accepted when ``u <= sum of p(x) over the children
    tried so far`` (or ``p(x_c) >= threshold_single``, or with ``threshold_acc`` dividing the
    sum); when none is, a token is drawn from ``p`` without the rejected children's tokens (the
    residual ``relu(p - draft_probs)``, with the rejected tokens' ``p`` written into
    ``draft_probs`` as scratch), and at the depth limit ``S - 1`` from ``p``. With thresholds 1
    that is sampling from ``p`` with the children tried first: the emitted tokens follow the
    target. This adapter runs :func:`specdec_kernels.verify_tree_sampling` with
    ``draft_mode="deterministic"`` (the same recursion: child ``c`` accepted with probability
    ``r(x_c)``, ``r`` = ``p`` without the earlier siblings' tokens, renormalised), which has the
    same output distribution.

    Deliberate differences:

    * Thresholds below 1 (lossy relaxed acceptance) are rejected with ``ValueError``: this
      package only verifies losslessly. ``threshold_single = threshold_acc = 1`` (the defaults)
      is upstream's exact mode.
    * ``draft_probs`` is neither read nor written (upstream overwrites it as scratch and needs it
      zeroed); target-only verification needs no draft distribution.
    * Randomness: the uniforms are not used as upstream's coins; each row's seed is derived from
      the bits of ``uniform_samples[b, 0]`` and ``uniform_samples_for_final_sampling[b]``, and this
      package's counter-based numbers follow from it (same uniforms, same output; tokens differ
      from SGLang's for the same uniforms, the distribution is the same).
    * ``target_probs`` is read in place as ``x = log p`` by the C++ tree kernel (CPU); on CUDA
      the Triton tree kernel takes ``log(target_probs)``, a `[B, N, V]` float32 temporary.
    * Siblings in increasing node order, links clamped in bounds, as in :func:`verify_tree_greedy`.
    * ``deterministic`` is accepted and ignored (always deterministic).

    Parameters
    ----------
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling
        As in :func:`verify_tree_greedy`.
    uniform_samples : Tensor
        `[B, N]` float32: seeds the row (see above).
    uniform_samples_for_final_sampling : Tensor
        `[B]` float32: seeds the row too.
    target_probs : Tensor
        `[B, N, V]` float: row ``i`` is the target distribution after node ``i``'s path.
    draft_probs : Tensor
        `[B, N, V]`: shape-checked only.
    threshold_single, threshold_acc : float
        Must be 1.
    deterministic : bool
        Ignored.
    backend : {None, "triton", "native", "reference"}
        Keyword-only, not in the upstream signature: the implementation of this package's
        verification kernels (as :func:`specdec_kernels.verify_tree_sampling`'s
        ``backend``); ``None`` (default): the automatic choice. A bad name raises
        ``ValueError`` before any work.

    Examples
    --------
    One-hot targets make the walk certain: the tree ``0 -> {1 -> 2, 3 -> 4 -> 5}`` with the
    target certain of node 3's token after the root and of node 4's after node 3:

    >>> import torch
    >>> from specdec_kernels.compat.sglang import tree_speculative_sampling_target_only
    >>> cand = torch.tensor([[7, 1, 2, 3, 4, 5]])
    >>> probs = torch.eye(8)[[3, 0, 0, 4, 6, 0]][None]  # [1, 6, 8]
    >>> predicts = torch.full((6,), -1, dtype=torch.int32)
    >>> accept_index = torch.full((1, 4), -1, dtype=torch.int32)
    >>> accept_token_num = torch.zeros(1, dtype=torch.int32)
    >>> tree_speculative_sampling_target_only(
    ...     predicts, accept_index, accept_token_num, cand, torch.arange(6)[None],
    ...     torch.tensor([[1, 2, -1, 4, 5, -1]]), torch.tensor([[-1, 3, -1, -1, -1, -1]]),
    ...     torch.rand(1, 6), torch.rand(1), probs, torch.zeros_like(probs))
    >>> accept_index.tolist(), accept_token_num.tolist(), predicts.tolist()
    ([[0, 3, 4, -1]], [2], [3, -1, -1, 4, 6, -1])
    """
    check_backend(backend)
    b, n, s, device = _check(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling,
    )  # fmt: skip
    require("target_probs", target_probs, 3, check.FLOAT_DTYPES, device)
    v = target_probs.shape[2]
    check.require_shape("target_probs", target_probs, (b, n, v), "[B, N, V]")
    require("draft_probs", draft_probs, 3, check.FLOAT_DTYPES, device)
    check.require_shape("draft_probs", draft_probs, (b, n, v), "[B, N, V]")
    require("uniform_samples", uniform_samples, 2, check.FLOAT_DTYPES, device)
    check.require_shape("uniform_samples", uniform_samples, (b, n), "[B, N]")
    final = require(
        "uniform_samples_for_final_sampling",
        uniform_samples_for_final_sampling,
        1,
        check.FLOAT_DTYPES,
        device,
    )
    check.require_shape("uniform_samples_for_final_sampling", final, (b,), "[B]")
    for name, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if value != 1:
            raise ValueError(
                f"{name} must be 1 (lossless verification); relaxed acceptance with "
                f"thresholds below 1 is not supported, got {value}"
            )
    parents = parents_from_lists(retrive_next_token, retrive_next_sibling)
    seeds = seeds_from_uniforms(uniform_samples[:, 0], final)
    # verify_tree_sampling's op on the probabilities themselves (log_input: x = log p read in
    # place, where a [B, N, V] log had cost ~9x the op on the CPU); every node real, children
    # fixed choices, temperature 1, the [B, N] outputs (depth at most N - 1)
    if v > 1 and target_probs.stride(-1) != 1:  # the kernels read a row's tokens contiguously
        target_probs = target_probs.contiguous()
    out = TreeVerification(
        *torch.ops.specdec.verify_tree_sampling(
            target_probs,
            candidates.contiguous(),
            parents,
            None,
            torch.full((b,), n, dtype=torch.int64, device=device),
            DRAFT_MODES.index("deterministic"),
            torch.ones(b, dtype=torch.float32, device=device),
            None,
            None,
            seeds,
            None,
            resolve_backend(backend, device),
            True,
        )
    )
    # tokens[:, d] is the token after the path node at depth d (accepted child, or final draw)
    rows = torch.arange(b, device=device)[:, None]
    last = out.tokens[rows[:, 0], out.num_accepted.clamp(max=s - 1)]  # [B]
    after = torch.full((b, n), -1, dtype=torch.int64, device=device)
    after[rows[:, 0], out.accepted_nodes[rows[:, 0], out.num_accepted.clamp(max=s - 1)]] = last
    _write(predicts, accept_index, accept_token_num, retrive_index, out.accepted_nodes,
           out.num_accepted, out.tokens, after, s)  # fmt: skip


def parents_from_lists(next_token: Tensor, next_sibling: Tensor) -> Tensor:
    """``[B, N]`` int64 ``parents`` of SGLang's first-child / next-sibling lists (root ``-1``;
    nodes not reachable from the root ``-1``). Vectorised, no host synchronisation; links
    outside ``[0, N)`` end a list.

    A first child's parent is the node that points to it; any other node has its predecessor
    sibling's parent. That predecessor may itself wait for its own, so the parents travel down
    each sibling list by pointer jumping: every round a node still without a parent takes its
    predecessor's and then looks twice as far back, ``ceil(log2 N)`` rounds in all (a list of
    ``N - 1`` siblings took ``N - 1`` rounds one by one)."""
    b, n = next_token.shape
    device = next_token.device
    nodes = torch.arange(n, device=device).expand(b, n)
    none = torch.full((b, n + 1), -1, dtype=torch.int64, device=device)  # column n: no link

    def link(targets: Tensor) -> Tensor:  # where a link points, or the dummy column n
        return torch.where((targets >= 0) & (targets < n), targets, n)

    parents = none.scatter(1, link(next_token), nodes)[:, :n]  # i's first child: parent i
    before = none.scatter(1, link(next_sibling), nodes)[:, :n]  # the sibling before each node
    has_before = before >= 0
    before = before.clamp_min(0)
    for _ in range(max(n - 1, 0).bit_length()):  # ceil(log2 N) rounds reach N - 1 back
        waiting = (parents < 0) & has_before
        parents = torch.where(waiting, parents.gather(1, before), parents)
        has_before = has_before & has_before.gather(1, before)
        before = before.gather(1, before)
    parents[:, 0] = -1
    return parents


def _check(predicts, accept_index, accept_token_num, candidates, rindex, rnext, rsib):
    require("candidates", candidates, 2, _LONG)
    device = candidates.device
    b, n = candidates.shape
    for name, t in (
        ("retrive_index", rindex),
        ("retrive_next_token", rnext),
        ("retrive_next_sibling", rsib),
    ):
        require(name, t, 2, _LONG, device)
        check.require_shape(name, t, (b, n), "[B, N] (from candidates)")
    require("predicts", predicts, 1, _INT, device)
    check.require_shape("predicts", predicts, (b * n,), "[B * N]")
    require("accept_index", accept_index, 2, _INT, device)
    if accept_index.shape[0] != b or accept_index.shape[1] < 1:
        raise ValueError(
            f"accept_index must have shape [B, S] = [{b}, S >= 1], got {accept_index.shape}"
        )
    require("accept_token_num", accept_token_num, 1, _INT, device)
    check.require_shape("accept_token_num", accept_token_num, (b,), "[B]")
    return b, n, accept_index.shape[1], device


def _write(predicts, accept_index, accept_token_num, rindex, nodes, accepted, path_tokens,
           after, s: int) -> None:  # fmt: skip
    """Write upstream's outputs in place: the path cut to ``S - 1`` accepted tokens.

    ``nodes [B, *]`` the accepted path (root first, -1 after); ``path_tokens[b, d]`` the token
    that follows the path node at depth ``d``; ``after [B, N]`` the token following a node when
    the walk ends there (the target's token). No host synchronisation: masked writes go to a
    spare slot.
    """
    b, n = rindex.shape
    device = rindex.device
    accepted = accepted.clamp(max=s - 1)  # [B]
    width = min(s, nodes.shape[1])
    depth = torch.arange(width, device=device)
    on_path = depth[None, :] <= accepted[:, None]  # [B, width]
    node = nodes[:, :width].clamp(0, n - 1)
    rows = torch.arange(b, device=device)[:, None]
    global_index = rindex[rows, node].clamp(0, max(b * n - 1, 0))  # [B, width]
    # accept_index[b, d] for d <= accepted
    current = accept_index[:, :width]
    accept_index[:, :width] = torch.where(on_path, global_index.to(current.dtype), current)
    accept_token_num.copy_(accepted.to(accept_token_num.dtype))
    # predicts at each path node: the next path token, or at the last node the final token
    nxt = torch.full((b, width), -1, dtype=torch.int64, device=device)
    k = min(width - 1, path_tokens.shape[1])
    nxt[:, :k] = path_tokens[:, :k]
    is_last = depth[None, :] == accepted[:, None]
    value = torch.where(is_last, after[rows, node], nxt)
    spare = b * n  # masked writes land in a spare slot
    ext = torch.cat([predicts, predicts.new_zeros(1)])
    ext.scatter_(0, torch.where(on_path, global_index, spare).reshape(-1),
                 value.to(ext.dtype).reshape(-1))  # fmt: skip
    predicts.copy_(ext[:-1])


def seeds_from_uniforms(first: Tensor, final: Tensor) -> Tensor:
    """``[B]`` int64 seeds from the bits of two float32 uniforms per row."""
    a = first.float().contiguous().view(torch.int32).to(torch.int64) & rng.MASK32
    c = final.float().contiguous().view(torch.int32).to(torch.int64) & rng.MASK32
    return (rng.fmix32(a ^ rng.GOLDEN) << 31) ^ rng.fmix32(c)
