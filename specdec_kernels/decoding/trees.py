"""Token trees drafted by a draft model: static shapes (Medusa) and dynamic ones (EAGLE-2).

Vocabulary of this file: the *root* is the last committed token (node 0); every other node is a
draft token, a child of the node whose draft distribution ranked it; a node is *expanded* when
its own draft distribution is computed (the draft model is fed the node), which is what gives it
children. A tree is drafted one *level* (depth) at a time: the level's candidates are
``(expanded parent of the previous level, rank)`` pairs, the child being the parent's
``rank``-th most likely token; some of them are expanded (fed to the draft model together, one
pass per level, with the tree attention mask over the draft's KV cache); at the end some
candidates are kept as the tree's nodes.

- :class:`StaticTree`: the same shape for every row and step (Medusa's trees). Every candidate is
  a node; the nodes with children are expanded.
- :class:`DynamicTree` (EAGLE-2, Li et al. 2024, https://arxiv.org/abs/2406.16858): level 1 is
  the root's ``top_k`` most likely tokens; each further level expands the ``top_k`` candidates of
  the previous level with the highest cumulative draft log-probability (the sum along the path)
  and proposes their ``top_k`` children each; the tree keeps the ``num_nodes - 1`` candidates with
  the highest cumulative log-probability. A child's score never exceeds its parent's, and ties go
  to the earlier candidate (parents come first), so the kept set is a tree.

Children are fixed by the draft's distribution (its top-ranked tokens), so sampling verifies them
with ``draft_mode="deterministic"`` (one-hot proposals), which keeps it lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec_kernels.decoding.drafters import ModelDrafter
from specdec_kernels.decoding.proposals import TreeProposal
from specdec_kernels.models.causal_lm import TreeAttention
from specdec_kernels.reference import rng
from specdec_kernels.reference.bitmask import masked_logits


def _int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True, init=False)
class StaticTree:
    """The same tree shape for every row: Medusa-style branching per depth, or any ``parents``.

    Parameters
    ----------
    branching : sequence of int, optional
        ``branching[d]``: children of every node at depth ``d`` (``[3, 2, 1]``: the root's top 3
        tokens, each with its top 2, each of those with its top 1: ``1 + 3 + 6 + 6`` nodes).
    parents : sequence of int, keyword only
        ``parents[0] = -1`` (the root), ``0 <= parents[i] < i``; the ``c``-th child of a node (in
        index order) is its ``c``-th most likely token. Exactly one of the two.
    sampled : bool, keyword only
        When generation samples (``temperature > 0``), draw each node's children from the
        draft's distribution (filtered like the target's), without replacement, instead of
        taking its most likely tokens, and verify them with
        ``draft_mode="without_replacement"`` and the draft's probabilities (SpecInfer-style).
        Greedy generation takes the most likely tokens either way.

    Attributes
    ----------
    parents : tuple of int
        The tree in breadth-first order (depths ascending; the order of siblings kept).
    depths : tuple of int
    num_nodes, depth, num_fed : int
        Nodes (root included), the deepest depth, expanded nodes (root excluded).

    Raises
    ------
    ValueError
        Neither or both arguments, a branching entry ``< 1``, a bad ``parents`` entry.

    Examples
    --------
    >>> StaticTree([2, 1]).parents
    (-1, 0, 0, 1, 2)
    >>> t = StaticTree(parents=[-1, 0, 1, 0])   # a chain of two, and a second root child
    >>> t.parents, t.depths, t.num_fed
    ((-1, 0, 0, 1), (0, 1, 1, 2), 1)
    """

    parents: tuple[int, ...]
    depths: tuple[int, ...]
    sampled: bool

    def __init__(self, branching: Sequence[int] | None = None, *, parents=None, sampled=False):
        if (branching is None) == (parents is None):
            raise ValueError("StaticTree: give exactly one of branching and parents")
        if branching is not None:
            parents = _from_branching(branching)
        parents = [int(p) for p in parents] if isinstance(parents, Sequence) else parents
        if not isinstance(parents, list) or len(parents) < 2 or parents[0] != -1:
            raise ValueError(
                f"StaticTree: parents must be a list of at least 2 ints starting with -1, "
                f"got {parents!r}"
            )
        bad = [i for i, p in enumerate(parents) if i > 0 and not 0 <= p < i]
        if bad:
            raise ValueError(
                f"StaticTree: parents[i] must be in [0, i) for i >= 1; bad at {bad[:5]}: "
                f"{[parents[i] for i in bad[:5]]}"
            )
        depth = [0] * len(parents)
        for i in range(1, len(parents)):
            depth[i] = depth[parents[i]] + 1
        order = sorted(range(len(parents)), key=lambda i: (depth[i], i))  # breadth first
        new = {old: i for i, old in enumerate(order)}
        object.__setattr__(self, "parents", tuple(-1 if i == 0 else new[parents[i]] for i in order))
        object.__setattr__(self, "depths", tuple(depth[i] for i in order))
        if not isinstance(sampled, bool):
            raise ValueError(f"StaticTree: sampled must be a bool, got {sampled!r}")
        object.__setattr__(self, "sampled", sampled)

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        return self.depths[-1]

    @property
    def num_fed(self) -> int:
        return len(set(self.parents[1:]) - {0})

    def plan(self, device) -> _Plan:
        """The levels of this shape as candidate ``(slot, rank)`` pairs and expansions."""
        n = self.num_nodes
        expanded = [[0]]  # per depth: expanded node ids, in order
        levels, expand = [], []
        rank, seen = [0] * n, {}
        for i in range(1, n):
            rank[i] = seen.get(self.parents[i], 0)
            seen[self.parents[i]] = rank[i] + 1
        for d in range(1, self.depth + 1):
            nodes = [i for i in range(n) if self.depths[i] == d]
            slot = [expanded[d - 1].index(self.parents[i]) for i in nodes]
            levels.append(_tensors(device, slot, [rank[i] for i in nodes]))
            if d < self.depth:
                has_children = [j for j, i in enumerate(nodes) if i in seen]
                expanded.append([nodes[j] for j in has_children])
                expand.append(torch.tensor(has_children, dtype=torch.int64, device=device))
        return _Plan(levels, expand, max(seen.values()), None)


def _from_branching(branching) -> list[int]:
    if (
        isinstance(branching, (str, bytes))
        or not isinstance(branching, Sequence)
        or not branching
        or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in branching)
    ):
        raise ValueError(
            f"StaticTree: branching must be a non-empty sequence of ints >= 1, got {branching!r}"
        )
    parents, level = [-1], [0]
    for c in branching:
        nxt = []
        for p in level:
            for _ in range(c):
                parents.append(p)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


@dataclass(frozen=True)
class DynamicTree:
    """An EAGLE-2 tree per row and step, chosen by cumulative draft log-probability.

    Parameters
    ----------
    num_nodes : int
        ``N >= 2``: nodes of the verified tree, root included (``N - 1`` draft tokens).
    top_k : int
        Children proposed per expanded node, and nodes expanded per level (``>= 1``).
    depth : int
        Levels drafted (``>= 1``), so the draft runs ``depth`` passes per step; paths are at most
        this deep. Needs ``N - 1 <= top_k + (depth - 1) * top_k**2`` (the candidates drafted).

    Examples
    --------
    >>> t = DynamicTree(num_nodes=16, top_k=4, depth=5)
    >>> t.num_fed   # draft tokens fed to the draft model per step (4 per level but the last)
    16
    """

    num_nodes: int = 16
    top_k: int = 4
    depth: int = 5

    def __post_init__(self):
        _int("num_nodes", self.num_nodes, 2)
        _int("top_k", self.top_k, 1)
        _int("depth", self.depth, 1)
        cands = self.top_k + (self.depth - 1) * self.top_k**2
        if self.num_nodes - 1 > cands:
            raise ValueError(
                f"DynamicTree: num_nodes - 1 = {self.num_nodes - 1} draft tokens, but top_k = "
                f"{self.top_k} and depth = {self.depth} draft only {cands} candidates"
            )

    @property
    def num_fed(self) -> int:
        return self.top_k * (self.depth - 1)

    def plan(self, device) -> _Plan:
        k = self.top_k
        first = _tensors(device, [0] * k, list(range(k)))
        grid = _tensors(device, [e for e in range(k) for _ in range(k)], list(range(k)) * k)
        return _Plan([first] + [grid] * (self.depth - 1), None, k, self.num_nodes - 1)


def _tensors(device, *lists):
    return tuple(torch.tensor(x, dtype=torch.int64, device=device) for x in lists)


@dataclass
class _Plan:
    """``levels[d-1] = (slot [W], rank [W])``: level ``d``'s candidates; ``expand[d-1]``: the
    candidates of level ``d`` to expand (static), ``None``: the ``top_k`` best (dynamic);
    ``width``: children per expanded node at most; ``keep``: ``None`` keeps every candidate,
    else the best ``keep``."""

    levels: list
    expand: list | None
    width: int
    keep: int | None


class TreeDrafter(ModelDrafter):
    """A draft model (any :class:`~specdec_kernels.decoding.adapters.CachedModel` with tree
    support) drafting a :class:`StaticTree` or :class:`DynamicTree` per row.

    The draft cache lags the committed tokens by one or two, as for chains: ``propose`` feeds
    those (one ragged pass, giving the root's distribution), then each level's expanded nodes
    (one pass per level, at cache slots after the committed tokens, in expansion order, attending
    to the prefix, their expanded ancestors and themselves). Once the target has chosen a path,
    the cache keeps the expanded nodes on it (:meth:`sk.KVCache.compact`) and drops the rest.

    Under a grammar (``propose(..., grammar=)``) each expanded node's children come from the
    draft's distribution masked by the row's matcher after the path to that node (the root's:
    after the committed tokens), so the children are grammar-valid where the grammar allows
    enough tokens; the loop then fills every node's mask for verification
    (:meth:`TreeProposal.fill_bitmask`), which rejects any child the grammar forbids.
    """

    def __init__(self, model, tree: StaticTree | DynamicTree):
        if not isinstance(tree, (StaticTree, DynamicTree)):
            raise ValueError(f"tree must be a StaticTree or a DynamicTree, got {tree!r}")
        super().__init__(model)
        self.tree = tree
        self._plan = tree.plan(model.device)
        if self._plan.width > model.vocab_size:
            raise ValueError(
                f"the tree asks for {self._plan.width} children of a node but the vocabulary "
                f"has {model.vocab_size} tokens"
            )

    def forwards_per_step(self, k_loop):
        return len(self._plan.levels)  # the catch-up, then every level but the last

    def propose(self, tokens, seq_len, num_draft, k_loop, sampling, seeds, grammar=None):
        """Draft a tree per row whose paths are at most ``num_draft[b]`` deep (deeper nodes are
        drafted but cut: ``num_nodes`` counts the rest, which come first); under ``grammar``
        (a :class:`~specdec_kernels.grammar.GrammarState`) from masked distributions."""
        plan, model = self._plan, self.model
        b, dev = tokens.shape[0], tokens.device
        rows = torch.arange(b, device=dev)[:, None]
        sampled = getattr(self.tree, "sampled", False) and not sampling.greedy
        # the expanded nodes of the level above: children candidates and bookkeeping
        root = self.catch_up(tokens, seq_len)[:, None]  # [B, 1, V]
        if grammar is not None:
            root = masked_logits(root, grammar.mask_for_next()[:, None])
        exp_lp, exp_tok, q = self._children(
            root, sampled, sampling, seeds, 0
        )  # [B, E, width] x2, [B, E, V] or None
        qs = [q]  # the expanded nodes' draft distributions: the root's, then in feeding order
        exp_score = torch.zeros(b, 1, dtype=exp_lp.dtype, device=dev)  # [B, E] cumulative
        exp_cand = torch.full((b, 1), -1, dtype=torch.int64, device=dev)  # [B, E] (root -1)
        exp_fed = torch.full((b, 1), -1, dtype=torch.int64, device=dev)  # [B, E] cache slot
        anc = torch.zeros(b, 0, 0, dtype=torch.bool, device=dev)  # [B, F, F] among fed nodes
        cand = {k: [] for k in ("tok", "score", "parent", "fed", "depth")}
        n_cand = 0
        for d, (slot, rank) in enumerate(plan.levels, start=1):
            w = slot.numel()
            score = exp_score[:, slot] + exp_lp[:, slot, rank]  # [B, W]
            cand["tok"].append(exp_tok[:, slot, rank])
            cand["score"].append(score)
            cand["parent"].append(exp_cand[:, slot])
            cand["depth"].append(torch.full((w,), d, dtype=torch.int64, device=dev))
            fed = torch.full((b, w), -1, dtype=torch.int64, device=dev)
            cand["fed"].append(fed)
            if d == len(plan.levels):
                break
            sel = (  # [B, E']: the level's candidates to expand
                plan.expand[d - 1].expand(b, -1)
                if plan.expand is not None
                else score.topk(self.tree.top_k, -1).indices
            )
            e, f = sel.shape[1], anc.shape[1]
            fed.scatter_(1, sel, f + torch.arange(e, device=dev).expand(b, -1))
            parent_fed = exp_fed.gather(1, slot[sel])  # [B, E']
            anc = _grow_ancestors(anc, parent_fed)  # [B, F+E', F+E']
            logits = model.extend(
                exp_tok[rows, slot[sel], rank[sel]],
                torch.full((b,), e, dtype=torch.int64, device=dev),
                tree=TreeAttention(
                    (seq_len - 1 + d)[:, None].expand(b, e), anc[:, f:], seq_len.clone()
                ),
            )  # [B, E', V]
            if grammar is not None:
                logits = masked_logits(logits, _candidate_masks(grammar, cand, n_cand + sel))
            exp_lp, exp_tok, q = self._children(logits, sampled, sampling, seeds, d)
            qs.append(q)
            exp_score = score.gather(1, sel)
            exp_cand = n_cand + sel
            exp_fed = f + torch.arange(e, device=dev).expand(b, -1)
            n_cand += w
        c = {k: torch.cat(v, -1) for k, v in cand.items()}  # [B, C] each (depth: [C])
        prop, fed = self._tree(c, anc, num_draft, tokens.shape[0])
        if sampled:  # node i's row: the distribution its children were drawn from
            q_all = torch.cat(qs, 1)  # [B, 1 + F, V]: root, then fed nodes
            prop.draft_probs = q_all.gather(
                1, (fed + 1)[..., None].expand(-1, -1, q_all.shape[2])
            )  # [B, N, V] (leaves: the root's row, unused)
            prop.draft_mode = "without_replacement"
        return prop

    def _children(self, logits, sampled, sampling, seeds, depth):
        """Each row's candidate children from draft logits ``[B, E, V]`` of ``E`` nodes at
        ``depth``: ``(log q [B, E, w], tokens [B, E, w], q [B, E, V] or None)``; the ``w`` most
        likely tokens, or (``sampled``) ``w`` tokens drawn without replacement from the filtered
        ``q``, in drawing order (the largest ``q / Exp(1)`` first: the exponential race, run
        ``w`` deep), the exponentials keyed by the step ``seeds`` ``[B]``, ``depth`` and the
        draft purpose (:func:`~specdec_kernels.reference.rng.draft_exponentials`)."""
        w = self._plan.width
        if not sampled:
            lp, tok = logits.log_softmax(-1).topk(w, -1)
            return lp, tok, None
        b, e, v = logits.shape
        q = sampling.probs(logits.reshape(b * e, v)).view(b, e, v)
        race = rng.draft_exponentials(seeds, depth, (e, v))  # [B, E, V]
        tok = torch.where(q > 0, q / race, -1.0).topk(w, -1).indices
        return q.gather(-1, tok).log(), tok, q

    def _tree(self, c, anc, num_draft, b) -> tuple[TreeProposal, torch.Tensor]:
        """The candidates kept as nodes, in breadth-first order, as a :class:`TreeProposal`, and
        each node's draft cache slot ``[B, N]`` (``-1``: not fed to the draft)."""
        dev = num_draft.device
        num_c = c["score"].shape[1]
        if self._plan.keep is None:
            sel = torch.arange(num_c, device=dev).expand(b, -1)
        else:  # the best `keep`; ties to the earlier candidate (parents precede children)
            order = c["score"].sort(dim=-1, descending=True, stable=True).indices
            sel = order[:, : self._plan.keep].sort(-1).values  # [B, N-1], depths ascending
        node_of = torch.zeros(b, num_c + 1, dtype=torch.int64, device=dev)  # candidate -> node
        node_of.scatter_(1, sel + 1, torch.arange(1, sel.shape[1] + 1, device=dev).expand(b, -1))
        zero = torch.zeros(b, 1, dtype=torch.int64, device=dev)
        parents = torch.cat([zero - 1, node_of.gather(1, c["parent"].gather(1, sel) + 1)], 1)
        depths = torch.cat([zero, c["depth"][sel]], 1)  # [B, N]
        fed = torch.cat([zero - 1, c["fed"].gather(1, sel)], 1)  # [B, N]: draft cache slot
        parent_fed = fed.gather(1, parents.clamp_min(0))
        parent_fed[:, 0] = -1
        # ancestors of node i: i, the root, and the (expanded) ancestors of its parent
        n = depths.shape[1]
        if anc.shape[1]:
            a = anc.gather(1, parent_fed.clamp_min(0)[..., None].expand(-1, -1, anc.shape[2]))
            a = a.gather(2, fed.clamp_min(0)[:, None].expand(-1, n, -1))  # [B, N, N]
            a &= (parent_fed >= 0)[..., None] & (fed >= 0)[:, None]
        else:  # nothing expanded below the root: a star
            a = torch.zeros(b, n, n, dtype=torch.bool, device=dev)
        eye = torch.eye(n, dtype=torch.bool, device=dev)
        mask = a | eye | (torch.arange(n, device=dev) == 0)
        num_nodes = 1 + (depths[:, 1:] <= num_draft[:, None]).sum(1)
        tokens = torch.cat([zero, c["tok"].gather(1, sel)], 1)
        start = self.model.lengths - anc.shape[1]  # [B]: the first fed node's slot

        def keep(ver):  # the expanded nodes on the accepted path; they come first on it
            path = fed.gather(1, ver.accepted_nodes[:, 1:].clamp_min(0))  # [B, D]
            on = (path >= 0) & (ver.accepted_nodes[:, 1:] >= 0)
            self.model.compact(start[:, None] + path.clamp_min(0), on.sum(1), start)

        return TreeProposal(tokens, parents, depths, mask, num_nodes, self.tree.depth, keep), fed


def _candidate_masks(grammar, cand: dict, which: torch.Tensor) -> torch.Tensor:
    """``[B, E, W]``: the grammar's mask after the path to each candidate ``which`` ``[B, E]``
    (the mask of its children), from the candidates drafted so far as a tree (candidate ``c`` is
    node ``c + 1``, the root node 0)."""
    tok = torch.cat(cand["tok"], -1)  # [B, C]
    par = torch.cat(cand["parent"], -1)  # [B, C]: the parent candidate, -1 the root
    root = torch.zeros_like(tok[:, :1])
    masks = grammar.fill_tree_bitmasks(torch.cat([root, tok], 1), torch.cat([root - 1, par + 1], 1))
    return masks.gather(1, (which + 1)[..., None].expand(-1, -1, masks.shape[2]))


def _grow_ancestors(anc: torch.Tensor, parent_fed: torch.Tensor) -> torch.Tensor:
    """``anc`` ``[B, F, F]`` (``anc[b, i, j]``: fed node ``j`` is ``i`` or its ancestor) with
    ``E`` new fed nodes whose parents are the fed nodes ``parent_fed`` ``[B, E]`` (``-1``: the
    root, which is not a fed node)."""
    b, f, _ = anc.shape
    e = parent_fed.shape[1]
    out = torch.zeros(b, f + e, f + e, dtype=torch.bool, device=anc.device)
    out[:, :f, :f] = anc
    if f:
        inherited = anc.gather(1, parent_fed.clamp_min(0)[..., None].expand(-1, -1, f))
        out[:, f:, :f] = inherited & (parent_fed >= 0)[..., None]
    out[:, f:, f:] = torch.eye(e, dtype=torch.bool, device=anc.device)
    return out
