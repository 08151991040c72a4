"""Reference tree verification: the specification of :func:`specdec_kernels.verify_tree_greedy`,
:func:`specdec_kernels.verify_tree_sampling`, :func:`specdec_kernels.tree_depths` and
:func:`specdec_kernels.tree_attention_mask`.

Vocabulary of this file. A row's tree has ``n_b`` nodes in topological order (``parents[i] < i``);
node 0 is the root (the last committed token). The *walk* starts at the root; at the *current*
node the children are tried in index order: a child is *accepted* (the walk descends to it) or
*rejected* (the residual ``r`` shrinks and the next sibling is tried). When every child of the
current node is rejected the walk stops and emits the *recovered* token drawn from ``r``; at a
leaf it emits the *bonus* token drawn from the leaf's target distribution ``p``.

Recursive rejection sampling (SpecInfer, Miao et al. 2024; multi-draft speculative sampling,
Chen et al. 2023 / Jeon et al. 2024): at the current node, with filtered target distribution ``p``,
``r = p``; child ``c`` with token ``x_c`` and proposal ``q_c`` is accepted when ``r(x_c) > 0``,
``q_c(x_c) > 0`` and ``u * q_c(x_c) < r(x_c)``; otherwise ``r = norm(max(0, r - q_c))``.

How the numbers are kept (the kernels do exactly the same):

* ``r`` is kept unnormalised with its mass ``Z``: ``r = p`` and ``Z = 1`` (exactly) at a fresh
  node, the accept test is ``(u * q_c(x)) * Z < r(x)`` and the update is
  ``r = max(0, r - Z * q_c)``, ``Z = sum(r)``. That is the normalised recursion in exact
  arithmetic, and for the first child (``Z = 1``) it is bit for bit the chain's
  ``u * q < p`` and ``max(0, p - q)``: a chain is a tree.
* ``"deterministic"`` (``q_c`` one-hot at ``x_c``): the update removes ``x_c`` from ``r`` and
  ``Z = max(0, Z - r(x_c))`` -- what ``max(0, r - Z * onehot)`` is in exact arithmetic
  (``r(x) <= Z``), and exactly the chain's residual for the first child.
* ``"independent"``: ``q_c = q_i``, node ``i``'s draft row, for every child.
* ``"without_replacement"``: ``q_c = q_i`` with the earlier siblings' tokens removed, divided by
  ``1 - (q_i mass of those tokens)``; no proposal (all zero) once that is ``<= 0``.

Random numbers (:mod:`.rng`): the accept uniform of the ``s``-th child (0-based, among the
current node's children) of a node at depth ``d`` is ``uniform(stream_key(key, d, ACCEPT), s)``
and the race of the node where the walk stops is keyed by its depth ``d``. The chain's draft
position ``j`` is the depth of its parent node and sibling 0 draws index 0, so a path-shaped tree
draws exactly the chain's numbers.

Written for clarity, in float32 over whole ``[B, N, V]`` tensors, vectorised over the batch: the
loop visits nodes in index order; a node whose parent is the row's current node is the current
node's next child (children follow their parent, and an accepted node's children follow it).
"""

from __future__ import annotations

import torch

from specdec_kernels.reference import rng
from specdec_kernels.reference.verify_sampling import race_uniforms, split_greedy_rows

DRAFT_MODES = ("deterministic", "independent", "without_replacement")
MODE_DETERMINISTIC, MODE_INDEPENDENT, MODE_WITHOUT_REPLACEMENT = 0, 1, 2


def tree_depths(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` int64 depth of every node (root 0); ``-1`` for padding nodes (``>= n_b``)
    and for nodes whose parent is not a real node before them (``validate=False`` garbage)."""
    b, n = parents.shape
    par = parents.to(torch.int64)
    real = torch.arange(n, device=parents.device)[None, :] < num_nodes.to(torch.int64)[:, None]
    depth = torch.full((b, n), -1, dtype=torch.int64, device=parents.device)
    depth[:, 0] = torch.where(real[:, 0], 0, -1)
    for i in range(1, n):
        p = par[:, i]
        ok = real[:, i] & (p >= 0) & (p < i)
        parent_depth = depth.gather(1, p.clamp(0, i - 1)[:, None])[:, 0]
        depth[:, i] = torch.where(ok & (parent_depth >= 0), parent_depth + 1, -1)
    return depth


def tree_attention_mask(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """``[B, N, N]`` bool: ``mask[b, i, j]`` when ``j`` is ``i`` or an ancestor of ``i``.
    Nodes with depth ``-1`` (padding, detached) see only themselves."""
    b, n = parents.shape
    depth = tree_depths(parents, num_nodes)
    par = parents.to(torch.int64)
    rows = torch.arange(b, device=parents.device)
    mask = torch.zeros((b, n, n), dtype=torch.bool, device=parents.device)
    for i in range(n):
        if i > 0:
            inherited = mask[rows, par[:, i].clamp(0, i - 1)]  # [B, N]: the parent's row
            mask[:, i] = inherited & (depth[:, i] >= 0)[:, None]
        mask[:, i, i] = True
    return mask


class _Walk:
    """The per-row state of the walk: current node, its depth, children tried, emitted tokens."""

    def __init__(self, b: int, n: int, device: torch.device):
        self.rows = torch.arange(b, device=device)
        self.cur = torch.zeros(b, dtype=torch.int64, device=device)  # current node
        self.depth = torch.zeros(b, dtype=torch.int64, device=device)  # its depth = accepted
        self.sib = torch.zeros(b, dtype=torch.int64, device=device)  # its children tried
        self.tokens = torch.full((b, n), -1, dtype=torch.int64, device=device)
        self.path = torch.full((b, n), -1, dtype=torch.int64, device=device)
        self.path[:, 0] = 0

    def descend(self, accept: torch.Tensor, node: int, token: torch.Tensor) -> None:
        """Rows with ``accept`` accept child ``node`` (its token ``token``)."""
        d = self.depth
        self.tokens[self.rows, d] = torch.where(accept, token, self.tokens[self.rows, d])
        nxt = (d + 1).clamp(max=self.path.shape[1] - 1)
        self.path[self.rows, nxt] = torch.where(accept, node, self.path[self.rows, nxt])
        self.depth = d + accept.to(torch.int64)
        self.cur = torch.where(accept, node, self.cur)
        self.sib = torch.where(accept, 0, self.sib)

    def finish(self, recovered_or_bonus: torch.Tensor):
        """Write the recovered / bonus token; returns ``(tokens, num_accepted, accepted_nodes)``."""
        self.tokens[self.rows, self.depth] = recovered_or_bonus
        return self.tokens, self.depth.clone(), self.path


def _children(parents: torch.Tensor, num_nodes: torch.Tensor, walk: _Walk, i: int) -> torch.Tensor:
    """``[B]`` bool: node ``i`` is a real node and a child of the row's current node."""
    return (i < num_nodes.to(torch.int64)) & (parents[:, i].to(torch.int64) == walk.cur)


def verify_tree_greedy(
    target_logits: torch.Tensor,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
):
    """Greedy tree verification. Returns ``(tokens [B, N], num_accepted [B], accepted_nodes
    [B, N])``, int64, ``-1`` padded.

    ``t = argmax(target_logits[b, node])`` (first index on ties); from the root, the first child
    whose token is ``t`` is accepted; when none is, ``t`` is emitted (also the bonus at a leaf).
    """
    b, n, _ = target_logits.shape
    target = target_logits.argmax(dim=-1)  # [B, N]
    tokens = tree_tokens.to(torch.int64)
    walk = _Walk(b, n, target_logits.device)
    for i in range(1, n):
        child = _children(parents, num_nodes, walk, i)
        walk.descend(child & (tokens[:, i] == target[walk.rows, walk.cur]), i, tokens[:, i])
    return walk.finish(target[walk.rows, walk.cur])


def verify_tree_sampling(
    target_logits: torch.Tensor,
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_nodes: torch.Tensor,
    mode: int,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    seeds: torch.Tensor,
):
    """Recursive rejection sampling over token trees; see the module docstring.

    ``temperature [B]`` float32 (``0`` = greedy row), ``top_k [B]`` int64 or None, ``top_p [B]``
    float32 or None, ``seeds [B]`` int64, ``mode`` one of the ``MODE_*`` ints (``draft_probs``
    ``[B, N, V]`` needed unless deterministic). Returns ``(tokens [B, N], num_accepted [B],
    accepted_nodes [B, N])``, int64, ``-1`` padded.
    """
    b, n, v = target_logits.shape
    device = target_logits.device
    greedy_row, p = split_greedy_rows(target_logits, temperature, top_k, top_p)  # [B, N, V]
    key = rng.row_key(seeds)  # [B]
    tokens = tree_tokens.to(torch.int64)
    walk = _Walk(b, n, device)
    rows = walk.rows
    r = p[:, 0].clone()  # [B, V] unnormalised residual of the current node
    z = torch.ones(b, dtype=torch.float32, device=device)  # its mass
    removed = torch.zeros((b, v), dtype=torch.bool, device=device)  # rejected siblings' tokens
    removed_mass = torch.zeros(b, dtype=torch.float32, device=device)  # their q mass

    for i in range(1, n):
        child = _children(parents, num_nodes, walk, i)  # [B]
        x = tokens[:, i]
        in_vocab = (x >= 0) & (x < v)
        xs = x.clamp(0, v - 1)
        r_x = torch.where(in_vocab, r[rows, xs], 0.0)
        if mode == MODE_DETERMINISTIC:
            q_row = None
            q_x = torch.ones_like(r_x)
        else:
            q_row = draft_probs[rows, walk.cur].float()  # [B, V]: q of the current node
            if mode == MODE_WITHOUT_REPLACEMENT:
                q_first = q_row
                denom = 1.0 - removed_mass
                q_row = torch.where(removed, 0.0, q_row) / denom[:, None]
                q_row = torch.where((denom > 0)[:, None], q_row, 0.0)
            q_x = q_row[rows, xs]
        u = rng.uniform(rng.stream_key(key, walk.depth, rng.PURPOSE_ACCEPT), walk.sib)
        accept = child & in_vocab & (r_x > 0) & (q_x > 0) & (u * q_x * z < r_x)
        greedy_hit = child & (x == target_logits[rows, walk.cur].argmax(dim=-1))
        accept = torch.where(greedy_row, greedy_hit, accept)
        reject = child & ~accept

        # Rejected: shrink the residual of the current node.
        if mode == MODE_DETERMINISTIC:
            drop = reject & in_vocab
            r = r.scatter(1, xs[:, None], torch.where(drop, 0.0, r[rows, xs])[:, None])
            z = torch.where(reject, (z - r_x).clamp(min=0), z)
        else:
            shrunk = (r - z[:, None] * q_row).clamp(min=0)
            r = torch.where(reject[:, None], shrunk, r)
            z = torch.where(reject, shrunk.sum(dim=-1), z)
            if mode == MODE_WITHOUT_REPLACEMENT:
                fresh = reject & in_vocab & ~removed[rows, xs]
                removed_mass = removed_mass + torch.where(fresh, q_first[rows, xs], 0.0)
                removed = removed.scatter(1, xs[:, None], (fresh | removed[rows, xs])[:, None])
        walk.sib = walk.sib + reject.to(torch.int64)

        # Accepted: descend; the new current node starts with r = p, Z = 1, nothing removed.
        walk.descend(accept, i, x)
        r = torch.where(accept[:, None], p[:, i], r)
        z = torch.where(accept, 1.0, z)
        removed &= ~accept[:, None]
        removed_mass = torch.where(accept, 0.0, removed_mass)

    # The recovered token (race over r) where a child was rejected, else the bonus (race over p);
    # the same scores as the chain's (reference/verify_sampling.py).
    p_cur = p[rows, walk.cur]  # [B, V]
    exponential = rng.exponential(race_uniforms(key, walk.depth, v))  # [B, V], > 0
    residual_best, residual_token = torch.where(r > 0, r / exponential, 0.0).max(dim=-1)
    plain_token = torch.where(p_cur > 0, p_cur / exponential, -1.0).argmax(dim=-1)
    recovered_or_bonus = torch.where(
        (walk.sib > 0) & (residual_best > 0), residual_token, plain_token
    )
    greedy_recovered_or_bonus = target_logits[rows, walk.cur].argmax(dim=-1)
    return walk.finish(torch.where(greedy_row, greedy_recovered_or_bonus, recovered_or_bonus))
