"""Proposals: what a drafter hands the decoding step, and how the step scores, verifies and
keeps it.

A step of :class:`~specdec_kernels.decoding.Decoder` is the same for every proposal::

    proposal = drafter.propose(...)                  # draft
    logits = proposal.score(target, cur)             # one target pass
    ver = proposal.verify(logits, sampling, seeds)   # sk.verify_* decides
    proposal.keep(target, drafter, ver)              # caches keep what was accepted

A :class:`ChainProposal` holds ``k[b]`` drafts in sequence (verified by ``sk.verify_greedy`` /
``sk.verify_sampling``, caches rolled back); a :class:`TreeProposal` holds a token tree per row
(one target pass with the tree attention mask, verified by ``sk.verify_tree_greedy`` /
``sk.verify_tree_sampling``, caches compacted to the accepted path). Both give a verification
with ``tokens`` / ``num_accepted`` / ``num_emitted``, which the step commits alike.

Under a grammar (docs: serving.md) a proposal carries ``token_bitmask``, each row's masks along its
draft (``[B, k_loop+1, W]``, trees ``[B, N, W]``): the drafter's own (a :class:`ModelDrafter`
masks as it drafts) or :meth:`fill_bitmask`'s, and verification passes them to the op.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_kernels.models.causal_lm import TreeAttention
from specdec_kernels.tree_verification import verify_tree_greedy, verify_tree_sampling
from specdec_kernels.verification import parse_chain


@dataclass
class ChainProposal:
    """``num_draft[b]`` draft tokens of row ``b`` in sequence.

    Attributes
    ----------
    drafts : Tensor
        ``[B, k_loop]`` int64; entries ``>= num_draft[b]`` are padding.
    num_draft : Tensor
        ``[B]`` int64.
    draft_probs : Tensor or None
        ``[B, k_loop, V]``: the distributions the drafts were sampled from; ``None`` when
        deterministic.
    token_bitmask : Tensor or None
        ``[B, k_loop + 1, W]`` int32: each row's grammar masks at positions ``0 .. k_loop``
        (``None``: no grammar).
    """

    drafts: torch.Tensor
    num_draft: torch.Tensor
    draft_probs: torch.Tensor | None = None
    token_bitmask: torch.Tensor | None = None

    @property
    def num_drafted(self) -> torch.Tensor:
        return self.num_draft

    def score(self, target, cur: torch.Tensor) -> torch.Tensor:
        """Target logits ``[B, k_loop + 1, V]`` of the last committed token ``cur`` ``[B, 1]``
        followed by the drafts."""
        return target.extend(torch.cat([cur, self.drafts.clamp_min(0)], 1), self.num_draft + 1)

    def fill_bitmask(self, grammar) -> None:
        """``token_bitmask`` from each row's matcher walked along its drafts
        (:meth:`specdec_kernels.grammar.GrammarState.fill_draft_bitmasks`)."""
        self.token_bitmask = grammar.fill_draft_bitmasks(self.drafts, self.num_draft)

    def verify(self, logits, sampling, seeds, ops=None, backend=None, context=None):
        """``sk.verify_greedy`` / ``sk.verify_sampling`` on ``backend`` (``None``: the automatic
        choice): their parse (:func:`~specdec_kernels.verification.parse_chain`, without the
        value checks) and the op's body run directly, not through the dispatcher (the loop's
        inputs are its own; docs: kernels.md). Or ``ops``, the target adapter's ``verify_ops``
        pair: a sharded target's vocabulary-parallel ops, which run on the shard's device and
        take no ``backend`` (nor processors: the loop refuses them there). ``context``
        ``[B, L]``: each row's tokens so far, which the penalties count."""
        mask = _mask_kwargs(self.token_bitmask, ops)
        if ops is None:
            return parse_chain(
                logits,
                self.drafts,
                self.draft_probs,
                num_draft_tokens=self.num_draft,
                seed=seeds,
                method=sampling.verify_method,
                backend=backend,
                validate=False,
                **sampling.filter_kwargs,
                **sampling.logprob_kwargs,
                **sampling.processor_kwargs(context),
                **mask,
            ).run(direct=True)
        greedy_op, sampling_op = ops
        if sampling.greedy:  # verify_method changes nothing here
            return greedy_op(
                logits,
                self.drafts,
                num_draft_tokens=self.num_draft,
                validate=False,
                **sampling.logprob_kwargs,
                **mask,
            )
        return sampling_op(
            logits,
            self.drafts,
            self.draft_probs,
            num_draft_tokens=self.num_draft,
            seed=seeds,
            validate=False,
            **sampling.filter_kwargs,
            **sampling.method_kwargs,
            **sampling.logprob_kwargs,
            **mask,
        )

    def keep(self, target, drafter, ver) -> None:
        """Roll the target back past the rejected drafts; tell the drafter what was kept."""
        target.rollback(self.num_draft - ver.num_accepted)
        if drafter is not None and self.drafts.shape[1] > 0:
            drafter.accept(ver.num_accepted, self.drafts.shape[1])


@dataclass
class TreeProposal:
    """A token tree per row (docs: trees.md), in breadth-first order (depths ascending).

    Attributes
    ----------
    tokens : Tensor
        ``[B, N]`` int64; entry 0 (the root: the last committed token) is filled in by
        :meth:`score`.
    parents : Tensor
        ``[B, N]`` int64, ``parents[b, 0] = -1``, ``parents[b, i] < i``.
    depths : Tensor
        ``[B, N]`` int64, root 0.
    mask : Tensor
        ``[B, N, N]`` bool: ``mask[b, i, j]``: ``j`` is ``i`` or an ancestor of ``i``.
    num_nodes : Tensor
        ``[B]`` int64, ``>= 1``; nodes ``>= num_nodes[b]`` are padding.
    depth : int
        The deepest depth any row's tree may have (host int).
    on_keep : callable or None
        ``on_keep(ver)``: the drafter's cache bookkeeping once the accepted path is known.
    draft_probs : Tensor or None
        ``None`` when the children are the draft's top-ranked tokens (``draft_mode =
        "deterministic"``); else ``[B, N, V]``, row ``i`` the distribution node ``i``'s
        children were drawn from.
    draft_mode : str
        How the children were proposed (``sk.verify_tree_sampling``'s ``draft_mode``).
    token_bitmask : Tensor or None
        ``[B, N, W]`` int32: node ``i``'s row is the grammar's mask after the path to ``i``
        (``None``: no grammar).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    mask: torch.Tensor
    num_nodes: torch.Tensor
    depth: int
    on_keep: object = None
    draft_probs: torch.Tensor | None = None
    draft_mode: str = "deterministic"
    token_bitmask: torch.Tensor | None = None

    @property
    def num_drafted(self) -> torch.Tensor:
        return self.num_nodes - 1

    def fill_bitmask(self, grammar) -> None:
        """``token_bitmask`` from each row's matcher walked over its tree
        (:meth:`specdec_kernels.grammar.GrammarState.fill_tree_bitmasks`)."""
        self.token_bitmask = grammar.fill_tree_bitmasks(self.tokens, self.parents, self.num_nodes)

    def score(self, target, cur: torch.Tensor) -> torch.Tensor:
        """Target logits ``[B, N, V]`` of every node, in one pass: node ``i`` is written at cache
        slot ``base + i`` (``base`` = the target's length, where the root goes), at position
        ``base + depth``, attending to the committed prefix, its ancestors and itself."""
        base = target.lengths  # [B]
        tokens = torch.cat([cur, self.tokens[:, 1:].clamp_min(0)], 1)  # [B, N]
        tree = TreeAttention(base[:, None] + self.depths, self.mask, base)
        return target.extend(tokens, self.num_nodes, tree=tree)

    def verify(self, logits, sampling, seeds, ops=None, backend=None, context=None):
        """``sk.verify_tree_*``'s result on ``backend`` (``None``: the automatic choice),
        ``[B, depth + 1]`` (the ops are told the static ``depth``: no synchronisation). ``ops``
        must be ``None``: no vocabulary-parallel tree ops yet."""
        if ops is not None:
            raise ValueError("token trees with a vocabulary-sharded target are not supported")
        return self._verify(logits, sampling, seeds, backend)

    def _verify(self, logits, sampling, seeds, backend):
        mask = _mask_kwargs(self.token_bitmask, None)
        if sampling.greedy:
            return verify_tree_greedy(
                logits,
                self.tokens,
                self.parents,
                num_nodes=self.num_nodes,
                max_depth=self.depth,
                backend=backend,
                validate=False,
                **sampling.logprob_kwargs,
                **mask,
            )
        # top-ranked children are fixed given the context ("deterministic": one-hot q);
        # sampled ones come with the distributions they were drawn from
        return verify_tree_sampling(
            logits,
            self.tokens,
            self.parents,
            self.draft_probs,
            draft_mode=self.draft_mode,
            num_nodes=self.num_nodes,
            max_depth=self.depth,
            seed=seeds,
            backend=backend,
            validate=False,
            **sampling.filter_kwargs,
            **sampling.logprob_kwargs,
            **mask,
        )

    def keep(self, target, drafter, ver) -> None:
        """Keep the root and the accepted path in the target's cache (in node order after the
        root, the rest dropped), then let the drafter do the same with its own cache."""
        root = target.lengths - self.num_nodes  # [B]: the root's slot (extend advanced N)
        target.compact(root[:, None] + ver.accepted_nodes[:, 1:], ver.num_accepted, root + 1)
        if self.on_keep is not None:
            self.on_keep(ver)


def _mask_kwargs(token_bitmask, ops) -> dict:
    """The ops' ``token_bitmask=`` keyword (none without a grammar, so that ops which predate it
    still serve unconstrained decoding); a vocabulary-sharded target has no masked ops yet."""
    if token_bitmask is None:
        return {}
    if ops is not None:
        raise ValueError(
            "grammar-constrained decoding with a vocabulary-sharded target is not supported"
        )
    return {"token_bitmask": token_bitmask}
