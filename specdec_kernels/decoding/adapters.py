"""Model adapters: what the decoding loop needs of a model with a KV cache.

A :class:`CachedModel` holds, per row, the tokens it has been fed (its ``lengths``). The loop
only ever asks four things of it:

``prefill(prompts)``         feed each row's tokens (ragged lists), no logits;
``extend(tokens, num_valid, logits_index=None, tree=None)``
                             append the first ``num_valid[b]`` of ``tokens[b]`` (``[B, T]``) to row
                             ``b`` at positions ``lengths[b] ..``; return logits ``[B, T, V]``, or
                             ``[B, V]`` at ``logits_index`` (slots past ``num_valid`` are garbage);
                             ``tree`` (:class:`sk.models.TreeAttention`, adapters that support
                             token trees): the tokens are tree nodes;
``rollback(n)``              forget the last ``n[b]`` tokens of each row;
``compact(src, keep, start)``  token trees only: keep the entries at ``src[b, :keep[b]]`` at
                             ``start[b] ..`` and drop the rest (:meth:`sk.KVCache.compact`);
``select(order)``            keep rows ``order`` (new row ``i`` = old row ``order[i]``).

``sync_value()`` / ``on_sync(values)`` let an adapter piggyback on the loop's one host
synchronisation per step (the contiguous cache learns its longest row, the ``transformers``
cache how many trailing hole columns it may crop). Nothing else synchronises.

Two optional attributes serve targets sharded over a process group: ``verify_ops``, a pair
``(verify_greedy, verify_sampling)`` with :func:`sk.verify_greedy`'s and
:func:`sk.verify_sampling`'s signatures that the loop verifies with instead, and
``shared_seed()``, the seed every rank uses when the caller gives none.
:func:`adapter_for` picks a model's adapter.
"""

from __future__ import annotations

import inspect
from typing import Protocol

import torch


class CachedModel(Protocol):
    """The model-adapter protocol of :class:`specdec_kernels.decoding.Decoder`."""

    vocab_size: int
    max_seq_len: int | None
    device: torch.device
    dtype: torch.dtype
    lengths: torch.Tensor  # [B] int64: tokens fed per row

    def prefill(self, prompts: list[list[int]], capacity: int) -> None: ...

    def extend(
        self,
        tokens: torch.Tensor,
        num_valid: torch.Tensor,
        logits_index: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def rollback(self, n: torch.Tensor) -> None: ...

    def select(self, order: torch.Tensor) -> None: ...

    def sync_value(self) -> torch.Tensor: ...

    def on_sync(self, values: list[int]) -> None: ...

    # optional, read once into the loop's Capabilities (an adapter without them lacks the
    # capability): token trees (also extend(..., tree=TreeAttention))
    def compact(self, src_positions, num_keep: torch.Tensor, start: torch.Tensor) -> None: ...

    # a target sharded over a process group: its (verify_greedy, verify_sampling) pair, and the
    # seed every rank uses when the caller gives none
    verify_ops: tuple

    def shared_seed(self) -> int: ...


def left_padded(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` ids and 0/1 mask of ragged ``rows``, left-padded with 0 (``T >= 1``)."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    for b, r in enumerate(rows):
        if r:
            ids[b, width - len(r) :] = torch.tensor(r, dtype=torch.int64)
            mask[b, width - len(r) :] = 1
    return ids.to(device), mask.to(device)


def adapter_for(model):
    """The adapter of ``model``: its own ``decoding_adapter()`` if it has one (a tensor-parallel
    target), else :class:`CausalLMAdapter`."""
    make = getattr(model, "decoding_adapter", None)
    return make() if make is not None else CausalLMAdapter(model)


class CausalLMAdapter:
    """``sk.models.CausalLM`` over an ``sk.KVCache`` with a length per row.

    Rows of different lengths share the cache without padding: each row is written at its own
    offset and attends to its own prefix. Retiring rows moves only the rows that fill the freed
    slots (:meth:`sk.KVCache.select_rows`), never a copy of the whole cache.
    """

    def __init__(self, model):
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.vocab_size, self.max_seq_len = model.vocab_size, model.max_seq_len
        self.cache = None
        self._max_len = 0  # host upper bound of max(cache.lengths)

    @property
    def lengths(self) -> torch.Tensor:
        return self.cache.lengths

    def prefill(self, prompts: list[list[int]], capacity: int) -> None:
        self.cache = self.model.new_cache(len(prompts), capacity)
        width = max(len(r) for r in prompts)
        if width > 0:
            ids = torch.zeros(len(prompts), width, dtype=torch.int64)
            for b, r in enumerate(prompts):
                ids[b, : len(r)] = torch.tensor(r, dtype=torch.int64)
            # a forward with one logits row (the LM head on one token a row), not
            # hidden_states: CausalLM runs a cached forward as one native op where it can
            # (bitwise its Python pass), 11% less time for a 63-token prompt (Zen 3, bfloat16)
            last = torch.full((len(prompts),), width - 1, dtype=torch.int64, device=self.device)
            self.model(ids.to(self.device), self.cache, logits_index=last, kv_len=width)
        self.cache.advance(torch.tensor([len(r) for r in prompts], device=self.device))
        self._max_len = width

    def extend(self, tokens, num_valid, logits_index=None, tree=None):
        span = self._max_len + tokens.shape[1]  # attention reads positions < span
        logits = self.model(
            tokens, self.cache, logits_index=logits_index, kv_len=span, validate=False, tree=tree
        )
        self.cache.advance(num_valid, validate=False)
        self._max_len = span
        return logits

    def draft_extend(self, tokens, num_valid, logits_index):
        """:meth:`extend` for a drafter: the logits ``[B, V]`` (float32) of
        :meth:`CausalLM.draft_logits <specdec_kernels.models.CausalLM.draft_logits>` where the
        model has it (no bitwise contract: a draft's), else :meth:`extend`'s."""
        if not hasattr(self.model, "draft_logits"):
            return self.extend(tokens, num_valid, logits_index)
        span = self._max_len + tokens.shape[1]
        logits = self.model.draft_logits(tokens, self.cache, logits_index, span)
        self.cache.advance(num_valid, validate=False)
        self._max_len = span
        return logits

    def greedy_chain(self, tokens, num_valid, num_tokens, exact=True):
        """The greedy drafts ``[B, num_tokens]`` of :meth:`CausalLM.greedy_chain
        <specdec_kernels.models.CausalLM.greedy_chain>` after ``tokens`` ``[B, W]`` (``exact``
        as there), committing what it fed (``num_valid + num_tokens - 1`` per row); ``None``
        (nothing done) where the model has no native chain, and the caller loops over
        :meth:`extend`."""
        return self._chain("greedy_chain", tokens, num_valid, num_tokens, exact=exact)

    def sample_chain(self, tokens, num_valid, num_tokens, seeds, sampling):
        """The sampled drafts ``[B, num_tokens]`` and their distributions
        ``[B, num_tokens, V]`` of :meth:`CausalLM.sample_chain
        <specdec_kernels.models.CausalLM.sample_chain>` under ``sampling`` (a
        :class:`~specdec_kernels.decoding.sampling.Sampling`), committing as :meth:`greedy_chain`;
        ``None`` (nothing done) where the model has no native chain."""
        args = (seeds, sampling.temperature, sampling.top_k, sampling.top_p)
        return self._chain("sample_chain", tokens, num_valid, num_tokens, *args)

    def _chain(self, name, tokens, num_valid, num_tokens, *args, **kwargs):
        """The model's chain ``name`` after ``tokens`` at this cache, and the commit of what it
        fed; ``None`` where the model has no such chain or it does not run."""
        chain = getattr(self.model, name, None)
        span = self._max_len + tokens.shape[1]  # the first pass's, as extend's
        out = None
        if chain is not None:
            out = chain(tokens, self.cache, num_valid, num_tokens, span, *args, **kwargs)
        if out is not None:
            self.cache.advance(num_valid + (num_tokens - 1), validate=False)
            self._max_len += tokens.shape[1] + num_tokens - 1
        return out

    def rollback(self, n):
        self.cache.rollback(n, validate=False)

    def compact(self, src_positions, num_keep, start):
        self.cache.compact(src_positions, num_keep, start, validate=False)

    def select(self, order):
        self.cache.select_rows(order, self._max_len)

    def sync_value(self):
        return self.cache.lengths

    def on_sync(self, values):
        self._max_len = max(values)


class HFAdapter:
    """A ``transformers`` causal LM over its ``DynamicCache``, fed with explicit positions.

    A ``DynamicCache`` has one length for the whole batch, so a row that accepts fewer tokens
    than another leaves *holes*: slots its attention mask hides. Every slot appended after a
    row's last valid token is a trailing hole of that row (``tail[b]``); columns that are
    trailing holes of every row are cropped at the loop's host sync. Rows never see each
    other's tokens and nothing is recomputed.
    """

    def __init__(self, model):
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        c = model.config
        self.max_seq_len = next(
            (
                v
                for v in (
                    getattr(c, "max_position_embeddings", None),
                    getattr(c, "n_positions", None),
                )
                if isinstance(v, int)
            ),
            None,
        )
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_arg = "logits_to_keep" in params
        self.cache = None
        self.mask = None  # [B, C] 0/1: which cache columns each row attends to
        self.lengths = None  # [B] int64: valid tokens per row (= next position)
        self.tail = None  # [B] int64: trailing hole columns per row

    def _forward(self, ids, mask, positions, last_only):
        if self.max_seq_len is not None:
            positions = positions.clamp(max=self.max_seq_len - 1)  # hole slots may pass it
        kwargs = {
            self._cache_kw: self.cache,
            "attention_mask": mask,
            "position_ids": positions,
            "use_cache": True,
        }
        if last_only and self._keep_arg:
            kwargs["logits_to_keep"] = 1
        logits = self.model(input_ids=ids, **kwargs).logits
        return logits[:, -1] if last_only else logits

    def prefill(self, prompts: list[list[int]], capacity: int) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        b = len(prompts)
        self.lengths = torch.tensor([len(r) for r in prompts], device=self.device)
        self.tail = torch.zeros(b, dtype=torch.int64, device=self.device)
        if max(len(r) for r in prompts) == 0:
            self.mask = torch.zeros(b, 0, dtype=torch.int64, device=self.device)
            return
        ids, self.mask = left_padded(prompts, self.device)
        positions = (self.mask.cumsum(1) - 1).clamp_min(0)
        self._forward(ids, self.mask, positions, last_only=True)

    def extend(self, tokens, num_valid, logits_index=None):
        t = tokens.shape[1]
        j = torch.arange(t, device=self.device)
        valid = j[None] < num_valid[:, None]  # [B, T]
        self.mask = torch.cat([self.mask, valid.long()], 1)
        logits = self._forward(tokens, self.mask, self.lengths[:, None] + j, last_only=False)
        self.lengths = self.lengths + num_valid
        self.tail = torch.where(num_valid > 0, t - num_valid, self.tail + t)
        if logits_index is not None:
            logits = logits[torch.arange(tokens.shape[0], device=self.device), logits_index]
        return logits

    def rollback(self, n):
        cols = torch.arange(self.mask.shape[1], device=self.device)[None]  # [1, C]
        end = self.mask.shape[1] - self.tail[:, None]  # [B, 1]: one past the last valid slot
        self.mask = self.mask * ~((cols >= end - n[:, None]) & (cols < end))
        self.lengths = self.lengths - n
        self.tail = self.tail + n

    def select(self, order):
        self.cache.batch_select_indices(order)
        self.mask, self.lengths, self.tail = self.mask[order], self.lengths[order], self.tail[order]

    def sync_value(self):
        return self.tail

    def on_sync(self, values):
        crop = min(values)
        if crop > 0:
            self.cache.crop(-crop)  # negative: remove the last `crop` columns
            self.mask = self.mask[:, :-crop]
            self.tail = self.tail - crop
