"""Drafters: where the draft tokens of a step come from.

A :class:`Drafter` proposes up to ``k_loop`` tokens for every live row and is told how many the
target accepted; the decoding loop treats every drafter alike.
"""

from __future__ import annotations

from typing import Protocol

import torch

from specdec_kernels.decoding.proposals import ChainProposal
from specdec_kernels.ngram import ngram_draft
from specdec_kernels.reference import rng
from specdec_kernels.reference.bitmask import masked_logits
from specdec_kernels.reference.verify_sampling import match_exponentials

#: the most ``k_loop * V`` whose draft exponentials are drawn in one go: beyond it the integer
#: mixing of every position at once costs more than position by position (V = 151,936: 53 ms
#: for 8 positions in one go, 4.3 ms a position alone, one AMD EPYC core), and a drafter that
#: stops early (``stop_below``) would draw positions it never uses
UPTO_LIMIT = 1 << 18


class Drafter(Protocol):
    """What :class:`specdec_kernels.decoding.Decoder` asks of a drafter.

    ``prefill(prompts, capacity)``: start on the rows' committed prompts.
    ``propose(tokens, seq_len, num_draft, k_loop, sampling, seeds)`` -> a proposal
    (:mod:`specdec_kernels.decoding.proposals`): a :class:`ChainProposal` of
    ``drafts [B, k_loop]``, ``num_draft [B]`` (which may shrink: a lookup that found fewer
    tokens) and ``draft_probs [B, k_loop, V]`` (the distributions the drafts were sampled from,
    ``None`` for deterministic drafts), or a tree (:class:`TreeDrafter`) whose paths are at most
    ``num_draft[b]`` deep. ``seeds`` (``[B]`` int64, ``None`` when greedy) are the step's
    seeds: a drafter that samples draws from them with
    :func:`~specdec_kernels.reference.rng.draft_exponentials` (keyed by row seed, position and
    the draft purpose: batch invariant, independent of the verifier's draws).
    ``accept(num_accepted, k_loop)``: the target kept ``num_accepted[b]`` drafts of row ``b``
    (chains; a tree proposal carries its own bookkeeping).
    ``select(order)``, ``sync_value()``, ``on_sync(values)``: as for model adapters.
    ``forwards_per_step(k_loop)``: model passes of one ``propose`` (statistics).

    Under a grammar, a drafter whose ``drafts_under_grammar`` is true is called as
    ``propose(..., grammar=state)`` (a :class:`specdec_kernels.grammar.GrammarState`): it drafts
    from its masked distribution and returns the proposal with its ``token_bitmask``; any other
    drafter proposes as usual and the loop fills the masks from its proposal.
    """

    def prefill(self, prompts: list[list[int]], capacity: int) -> None: ...

    def propose(self, tokens, seq_len, num_draft, k_loop, sampling, seeds): ...

    def accept(self, num_accepted: torch.Tensor, k_loop: int) -> None: ...

    def select(self, order: torch.Tensor) -> None: ...

    def sync_value(self) -> torch.Tensor | None: ...

    def on_sync(self, values: list[int]) -> None: ...

    def forwards_per_step(self, k_loop: int) -> int: ...

    # optional, read once into the loop's Capabilities (absent means None / False):
    # tree: the token-tree shape a TreeDrafter proposes (depth, num_nodes, num_fed)
    # drafts_under_grammar: bool, propose(..., grammar=) masks the drafts itself
    tree: object
    drafts_under_grammar: bool


def _own_method(model, name: str):
    """``model``'s method ``name`` where its class defines one, else ``None``: a wrapper that
    forwards other attributes to an adapter (``__getattr__``) and overrides ``extend`` (a
    logits processor, say) must not have its ``extend`` skipped by the adapter's faster paths."""
    return getattr(model, name) if hasattr(type(model), name) else None


class ModelDrafter:
    """A smaller causal LM behind any model adapter, sampling its drafts autoregressively.

    The drafter's cache lags the committed sequence by one or two tokens (the last committed
    token, and the last accepted draft when all were accepted); ``propose`` first feeds those
    (one ragged pass), then one token per further draft.

    Under a grammar each draft is drawn from the draft's logits masked by the row's matcher
    after the drafts before it (``q`` is that masked distribution, so sampling stays lossless
    against the masked target), and the masks of positions ``0 .. k_loop`` go with the proposal.

    ``stop_below`` (``None``: off): a row stops drafting after a draft whose probability under
    the draft (its distribution at temperature 1, or the sampled one) is below it, and the step
    stops drafting once every row has stopped; ``transformers``' assisted generation does the same
    with its ``assistant_confidence_threshold`` (0.4 by default there). What a row drafts depends
    on the draft's values only, so verification stays lossless. It costs a host sync per draft
    token (a test of every row), and skips the native chains, which draft ``k_loop`` tokens in one
    call.

    ``coupled=True``: sampled drafts are drawn with the noise of the verifier's
    ``method="match"`` race at the same output position
    (:func:`~specdec_kernels.reference.verify_sampling.match_exponentials`), so that a draft
    close to the target proposes the very token the target's own sample will be (a higher match
    rate; ``"match"``'s output is the target's samples whatever the drafts). It applies under
    ``verify_method="match"`` only: token and block verification must not see drafts drawn
    with their own noise, so there the drafts draw their own. It skips the native chains.
    """

    drafts_under_grammar = True

    def __init__(self, model, stop_below: float | None = None, coupled: bool = False):
        if stop_below is not None and not 0.0 <= stop_below <= 1.0:
            raise ValueError(f"stop_below must be in [0, 1] or None, got {stop_below}")
        self.model = model  # a CachedModel
        self.stop_below = stop_below
        self.coupled = bool(coupled)
        self._passes = 0  # draft passes of the last step (with stop_below)

    def prefill(self, prompts, capacity):
        self.model.prefill([r[:-1] for r in prompts], capacity)

    def behind(self, tokens, seq_len) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed tokens the cache lacks, ``[B, 2]`` (row ``b``'s first ``n[b]``), and
        ``n`` ``[B]`` (1 or 2)."""
        width = 2  # at most this many committed tokens not yet fed
        n = seq_len - self.model.lengths  # [B]: 1 .. width
        at = (self.model.lengths[:, None] + torch.arange(width, device=tokens.device)).clamp(
            max=tokens.shape[1] - 1
        )
        return tokens.gather(1, at), n

    def catch_up(self, tokens, seq_len) -> torch.Tensor:
        """Feed the committed tokens the cache lacks (one ragged pass); the draft's logits
        ``[B, V]`` after the last committed token."""
        fed, n = self.behind(tokens, seq_len)
        return self._extend(fed, n, n - 1)

    def propose(self, tokens, seq_len, num_draft, k_loop, sampling, seeds, grammar=None):
        chain = _own_method(self.model, "greedy_chain")
        stops = self.stop_below is not None
        coupled = (
            self.coupled
            and not sampling.greedy
            and sampling.verify_method == "match"
            and isinstance(seeds, torch.Tensor)
        )
        if sampling.greedy and grammar is None and chain is not None and not stops:
            # the whole chain in one native call where the model has one; drafts need no
            # bitwise contract (float32 activations, CausalLM.greedy_chain's exact=False)
            drafts = chain(*self.behind(tokens, seq_len), k_loop, exact=False)
            if drafts is not None:
                return ChainProposal(drafts, num_draft)
        sample_chain = _own_method(self.model, "sample_chain")
        if (
            not sampling.greedy
            and grammar is None
            and isinstance(seeds, torch.Tensor)
            and sample_chain is not None
            and not stops
            and not coupled
        ):
            # sampled drafts and their q in one native call (no bitwise contract either)
            out = sample_chain(*self.behind(tokens, seq_len), k_loop, seeds, sampling)
            if out is not None:
                return ChainProposal(out[0], num_draft, out[1])
        logits = self.catch_up(tokens, seq_len)
        drafts, probs, masks = [], [], []
        races = [None] * k_loop  # every position's exponentials in one go (sampling)
        if coupled:  # the verifier's match noise at each position (drawn as each is needed)
            races = _CoupledRaces(seeds, logits.shape[1])
        elif (
            not sampling.greedy
            and isinstance(seeds, torch.Tensor)
            and 1 < k_loop
            and k_loop * logits.shape[1] <= UPTO_LIMIT
            and not stops
        ):
            races = rng.draft_exponentials_upto(seeds, k_loop, logits.shape[1:])
        for i in range(k_loop):
            if grammar is not None:  # the row's mask after its drafts 0 .. i-1
                masks.append(grammar.mask_for_next())  # [B, W]
                logits = masked_logits(logits, masks[-1])
            x, p = sampling.draw(logits, seeds, position=i, race=races[i])  # [B], [B, V] / None
            drafts.append(x)
            probs.append(p)
            if grammar is not None:  # rows past their num_draft keep their bonus mask
                grammar.push_drafts(x, i < num_draft)
            if stops:
                num_draft = self._stop(num_draft, logits, x, p, i)
                if not bool((num_draft > i + 1).any()):
                    break  # every row has stopped: no more draft passes this step
            if i + 1 < k_loop:
                ones = torch.ones_like(x)
                logits = self._extend(x[:, None], ones, ones - 1)
        self._passes = len(drafts)  # the catch-up, then one pass a further draft
        q = None if sampling.greedy else torch.stack(probs, 1)  # [B, k_loop, V]
        prop = ChainProposal(torch.stack(drafts, 1), num_draft, q)
        if grammar is not None:
            masks.append(grammar.mask_for_next())  # the bonus position's
            grammar.discard_drafts()
            prop.token_bitmask = torch.stack(masks, 1)  # [B, k_loop + 1, W]
        return prop

    def _stop(self, num_draft, logits, x, p, i: int) -> torch.Tensor:
        """``num_draft`` ``[B]`` cut to ``i + 1`` for the rows whose draft ``x`` ``[B]`` at
        position ``i`` has probability below ``stop_below`` (under ``p`` ``[B, V]`` when sampled,
        else the softmax of ``logits`` ``[B, V]``)."""
        q = p if p is not None else torch.softmax(logits.float(), -1)
        conf = q.gather(1, x[:, None])[:, 0]  # [B]
        return torch.where(conf < self.stop_below, num_draft.clamp(max=i + 1), num_draft)

    def _extend(self, tokens, num_valid, logits_index):
        """The model's pass with one logits row a row: the adapter's drafter pass
        (``draft_extend``: float32 kernels, no bitwise contract) where it has one."""
        extend = _own_method(self.model, "draft_extend")
        if extend is None:
            return self.model.extend(tokens, num_valid, logits_index=logits_index)
        return extend(tokens, num_valid, logits_index)

    def accept(self, num_accepted, k_loop):
        # fed: the catch-up, then drafts 1 .. k_loop-1; keep the accepted ones
        self.model.rollback((k_loop - 1 - num_accepted).clamp_min(0))

    def select(self, order):
        self.model.select(order)

    def sync_value(self):
        return self.model.sync_value()

    def on_sync(self, values):
        self.model.on_sync(values)

    def forwards_per_step(self, k_loop):
        return k_loop if self.stop_below is None else self._passes


class _CoupledRaces:
    """``races[i]``: the match race's exponentials of draft position ``i`` (``[B, V]``)."""

    def __init__(self, seeds: torch.Tensor, vocab_size: int):
        self.seeds, self.vocab_size = seeds, vocab_size

    def __getitem__(self, i: int) -> torch.Tensor:
        return match_exponentials(self.seeds, i, self.vocab_size)


class NgramDrafter:
    """Prompt lookup (n-gram) drafting: no model; deterministic drafts (``q`` one-hot)."""

    def __init__(self, ngram_size: int = 3):
        self.ngram_size = ngram_size

    def prefill(self, prompts, capacity):
        pass

    def propose(self, tokens, seq_len, num_draft, k_loop, sampling, seeds):
        drafts, found = ngram_draft(tokens, seq_len, k_loop, self.ngram_size)
        return ChainProposal(drafts, torch.minimum(num_draft, found))

    def accept(self, num_accepted, k_loop):
        pass

    def select(self, order):
        pass

    def sync_value(self):
        return None

    def on_sync(self, values):
        pass

    def forwards_per_step(self, k_loop):
        return 0
