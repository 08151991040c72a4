"""``CausalLM``: a GPT-2-layout causal language model that reads and writes ``sk.KVCache``.

The parameter layout is GPT-2's (``transformer.wte``, ``transformer.wpe``, ``transformer.h.{i}``,
``transformer.ln_f``, ``lm_head``), so real GPT-2 / distilgpt2 checkpoints run in it through
:meth:`CausalLM.from_hf` and go back with :meth:`CausalLM.to_hf`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from specdec_kernels import _dispatch, _extension
from specdec_kernels.models.transformer import TANH_GELU, Block, activation, init_weights, linear

# GPT-2's Conv1D stores [in, out]; nn.Linear stores [out, in]
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


#: tokens of a pass (rows times new tokens) from which it runs on the process's threads even
#: where :attr:`CausalLM.num_threads` says fewer: a drafter's one-token passes gain nothing from
#: a second thread, its prefill does (the bundled draft in bfloat16, AMD EPYC VM, 2 threads,
#: medians of 30: prefilling one 63-token prompt 0.50 -> 0.32 ms, four 1.70 -> 0.97 ms; a pass
#: of 8 tokens 0.106 -> 0.088 ms, 16 tokens 0.17 -> 0.12-0.14 ms)
ALL_THREADS_FROM_TOKENS = 8

# modules assigned as attributes anywhere in the process (torch's global registration hook):
# CausalLM._pass_weights finds its weight slots again after any
_modules_assigned = [0]


def _count_module_assignment(module, name, submodule) -> None:
    _modules_assigned[0] += 1


torch.nn.modules.module.register_module_module_registration_hook(_count_module_assignment)


class TreeAttention(NamedTuple):
    """Where ``T`` new tokens of a cached forward sit and what they see, for token trees.

    Query ``t`` of row ``b`` is written, as always, at cache slot ``cache.lengths[b] + t``; it
    takes the position id ``positions[b, t]`` (the committed length plus its depth) and attends
    to every cache slot ``< start[b]`` (the committed prefix) and to slot ``start[b] + j`` where
    ``mask[b, t, j]`` (its ancestors in the tree and itself), nothing else. Slots
    ``start[b] .. cache.lengths[b] - 1`` may already hold earlier tree levels (the draft feeds a
    tree one level per pass), so ``M >= cache.lengths - start + T``.

    Attributes
    ----------
    positions : Tensor
        ``[B, T]`` int64 position ids.
    mask : Tensor
        ``[B, T, M]`` bool.
    start : Tensor
        ``[B]`` int64: the cache slot of mask column 0.
    """

    positions: torch.Tensor
    mask: torch.Tensor
    start: torch.Tensor


def tree_key_mask(tree: TreeAttention, lengths: torch.Tensor, kv_len: int) -> torch.Tensor:
    """The ``[B, 1, T, kv_len]`` bool attention mask of ``tree`` over cache slots ``< kv_len``:
    the prefix ``< start``, the tree columns ``mask`` selects, and each query's own slot
    ``lengths + t`` (so that no query row is all masked, even a padding one: a fully masked row
    would write NaN into the cache)."""
    B, T, M = tree.mask.shape
    keys = torch.arange(kv_len, device=lengths.device)
    rel = keys[None] - tree.start[:, None]  # [B, L]: column of each slot in the tree mask
    in_tree = tree.mask.gather(2, rel.clamp(0, M - 1)[:, None].expand(B, T, kv_len))
    in_tree &= ((rel >= 0) & (rel < M))[:, None]  # [B, T, L]
    own = keys[None, None] == (lengths[:, None] + torch.arange(T, device=lengths.device))[..., None]
    return ((rel < 0)[:, None] | in_tree | own)[:, None]


@dataclass(frozen=True)
class CausalLMConfig:
    """Shape of a :class:`CausalLM`; the field names are ``transformers.GPT2Config``'s."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    tie_word_embeddings: bool = True
    eos_token_id: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        activation(self.activation_function)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def kv_cache_for(config, num_kv_heads: int, batch_size: int, max_seq_len: int | None, like):
    """An empty ``sk.KVCache`` for a model of ``config`` with ``num_kv_heads`` heads (all of
    them, or a tensor-parallel rank's share), ``max_seq_len`` positions (default: the context),
    in the dtype and on the device of the tensor ``like``; zero-filled, as ``sk.KVCache`` is."""
    from specdec_kernels.kv_cache import KVCache

    return KVCache(
        config.n_layer,
        batch_size,
        num_kv_heads,
        config.head_dim,
        max_seq_len or config.n_positions,
        dtype=like.dtype,
        device=like.device,
    )


class CausalLM(nn.Module):
    """GPT-2-layout causal LM with KV-cache aware, ragged-row forward passes.

    Parameters
    ----------
    config : CausalLMConfig
        Model shape. ``CausalLM(CausalLMConfig(...))`` initialises GPT-2 style random weights.

    Notes
    -----
    With a cache, row ``b`` of ``input_ids`` ``[B, T]`` is placed at positions
    ``cache.lengths[b] .. cache.lengths[b] + T - 1``; its keys and values are written there but
    **not committed**: the caller commits with ``cache.advance(n)`` (``n`` may differ per row, so
    right-padded ragged inputs work: padding is written past the committed length and overwritten
    later, and no real token attends to it, as it lies in its future).

    Examples
    --------
    >>> import torch, specdec_kernels as sk
    >>> lm = sk.models.CausalLM(sk.models.CausalLMConfig(vocab_size=11, n_positions=16, n_embd=8,
    ...                                                  n_layer=1, n_head=2))
    >>> lm(torch.tensor([[1, 2, 3]])).shape
    torch.Size([1, 3, 11])
    """

    def __init__(self, config: CausalLMConfig):
        super().__init__()
        self.config = c = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(c.vocab_size, c.n_embd),
                wpe=nn.Embedding(c.n_positions, c.n_embd),
                h=nn.ModuleList(
                    Block(
                        c.n_embd,
                        c.n_head,
                        c.n_inner,
                        c.activation_function,
                        c.layer_norm_epsilon,
                        layer=i,
                    )
                    for i in range(c.n_layer)
                ),
                ln_f=nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon),
            )
        )
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        init_weights(self, c.n_layer)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self._row_invariant = False
        self._num_threads: int | None = None
        #: as a draft, its expected acceptance by its target, the prior of
        #: ``SpeculativeGenerator(..., "auto")`` (``None``: the generator's default, 0.7);
        #: ``load_bundled`` sets the bundled drafts' from their held-out evaluation
        self.acceptance_prior: float | None = None

    # ------------------------------------------------------------------ kernels
    @property
    def num_threads(self) -> int | None:
        """The torch thread count this model's passes run on; ``None`` (the default): the
        process's (``torch.get_num_threads()``).

        A draft this small runs a one-token pass fastest on one thread (waking a second one
        costs more than it saves), while the target beside it gains from every core: with
        ``draft.num_threads = 1`` each of the draft's passes switches to one thread and back.
        :func:`specdec_kernels.models.load_bundled` sets it from a measurement with
        ``draft_threads="auto"``. A pass of :data:`ALL_THREADS_FROM_TOKENS` tokens or more (a
        prefill) runs on the process's threads whatever this says: there the arithmetic
        outweighs waking the others.
        """
        return self._num_threads

    @num_threads.setter
    def num_threads(self, n: int | None) -> None:
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"num_threads must be None or a positive int, got {n!r}")
        self._num_threads = n

    @contextlib.contextmanager
    def _on_own_threads(self, tokens: int = 1):
        """Run the body on :attr:`num_threads` threads, then the process's count again; a pass
        of ``tokens >= ALL_THREADS_FROM_TOKENS`` on the process's."""
        n, before = getattr(self, "_num_threads", None), torch.get_num_threads()
        if n is None or n == before or tokens >= ALL_THREADS_FROM_TOKENS:
            yield
            return
        torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    @property
    def row_invariant(self) -> bool:
        """Whether the projections and attention run on the row-invariant native kernels.

        A verify pass scores ``K+1`` tokens per row where plain decoding scores one, and BLAS
        libraries reduce in an order that depends on how many rows share a matrix product, so
        the same token's logits can differ by an ulp between the two passes and greedy output
        can diverge from the target's own. With ``row_invariant = True`` every token's logits
        are bitwise the same whatever else shares the pass (other tokens, other rows, the
        cache length, the thread count): the speculative loop's greedy output is then exactly
        the target's own greedy decoding in the same dtype. CPU, float32 or bfloat16, and the
        C++ extension only (``ValueError`` otherwise); ``specdec_kernels.models.load_bundled``
        turns it on for the bundled pairs there.

        A model converted after it was turned on (``.double()``, ``.half()``, ``.to("cuda")``)
        runs its passes on the PyTorch path, as a model that never had the kernels does, with
        one ``RuntimeWarning``, and reads ``False`` here; converted back (``.float()``,
        ``.bfloat16()`` on the CPU) it runs on the kernels again.
        """
        return self._kernels_on(warn=False)

    @row_invariant.setter
    def row_invariant(self, on: bool) -> None:
        on = bool(on)
        problem = self.row_invariant_problem() if on else None
        if problem is not None:
            raise ValueError(f"row_invariant: {problem}")
        self._row_invariant = on
        self._kernels_state = None  # checked again at the next pass
        self._flag_submodules(on)

    def _flag_submodules(self, on: bool) -> None:
        for m in self.modules():
            if hasattr(m, "row_invariant") and m is not self:
                m.row_invariant = on

    def _kernels_on(self, warn: bool = True) -> bool:
        """Whether a pass runs on the row-invariant kernels now: :attr:`row_invariant` was
        turned on and the weights' dtype and device still fit them. Checked again whenever the
        weights' dtype or device differs from the last check's (a ``.to(dtype)`` after the flag
        was set), the submodules' flags following; where they no longer fit, the passes run on
        the PyTorch path, with one ``RuntimeWarning`` (``warn``) for each such conversion."""
        if not getattr(self, "_row_invariant", False):
            return False
        p = self.lm_head.weight
        where = (p.dtype, p.device)
        state = getattr(self, "_kernels_state", None)  # [(dtype, device), problem, warned]
        if state is None or state[0] != where:
            state = self._kernels_state = [where, self.row_invariant_problem(), False]
            self._flag_submodules(state[1] is None)
        if state[1] is not None and warn and not state[2]:
            state[2] = True
            warnings.warn(
                f"CausalLM: row_invariant was turned on, but its native kernels {state[1]}: this "
                "model's passes run on the PyTorch path (as a model without the kernels) until "
                "it is converted back (.float() or .bfloat16(), on the CPU)",
                RuntimeWarning,
                stacklevel=3,
            )
        return state[1] is None

    def row_invariant_problem(self) -> str | None:
        """Why :attr:`row_invariant` cannot be turned on here, or ``None`` if it can."""
        p = self.lm_head.weight
        if p.device.type != "cpu" or p.dtype not in (torch.float32, torch.bfloat16):
            return f"needs a float32 or bfloat16 model on the CPU, got {p.dtype} on {p.device}"
        if not _extension.has_op("rowinv_linear"):
            return "needs the C++ extension, which is not built"
        if self.config.head_dim % 16:
            return f"needs a head size divisible by 16, got {self.config.head_dim}"
        return None

    # ------------------------------------------------------------------ forward
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.config.n_positions

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        cache=None,
        kv_len: int | None = None,
        validate: bool = True,
        tree: TreeAttention | None = None,
    ) -> torch.Tensor:
        """Final-layer-normed hidden states ``[B, T, C]`` of ``input_ids`` ``[B, T]``.

        ``kv_len`` (host int, optional) bounds the cache positions attention reads: it must be
        ``>= max(cache.lengths) + T``; the default reads the whole cache buffer.
        ``validate=False`` skips the cache's bounds checks (and their host synchronisation):
        for callers that guarantee ``lengths + T <= max_seq_len``, like the generators.
        ``tree`` (with a cache only): the new tokens are tree nodes, placed and masked as
        :class:`TreeAttention` says, instead of a causal run.
        """
        with self._on_own_threads(input_ids.numel()):
            return self._hidden_states(input_ids, cache, kv_len, tree, validate)

    def _hidden_states(self, input_ids, cache, kv_len, tree, validate) -> torch.Tensor:
        B, T = input_ids.shape
        wte, wpe = self.transformer.wte, self.transformer.wpe
        if cache is None:
            if tree is not None:
                raise ValueError("hidden_states: tree attention needs a cache")
            pos = torch.arange(T, device=input_ids.device)[None]  # [1, T]
            mask = None
        else:
            if kv_len is None:
                kv_len = cache.key(0).shape[2]
            if tree is None:
                pos = cache.lengths[:, None] + torch.arange(T, device=input_ids.device)  # [B, T]
                keys = torch.arange(kv_len, device=input_ids.device)
                mask = (keys[None, None, :] <= pos[:, :, None])[:, None]  # [B, 1, T, L]
            else:
                pos = tree.positions.clamp_min(0)  # [B, T]; padding nodes may say -1
                mask = tree_key_mask(tree, cache.lengths, kv_len)  # [B, 1, T, L]
        # padding past the context is garbage by construction; clamp it into the table
        x = wte(input_ids) + wpe(pos.clamp(max=self.config.n_positions - 1))  # [B, T, C]
        self._kernels_on()  # the blocks read their own flags, which this keeps in step
        for block in self.transformer.h:
            x = block(x, cache, mask, kv_len, validate)
        return self.transformer.ln_f(x)

    def forward(
        self,
        input_ids: torch.Tensor,
        cache=None,
        *,
        logits_index=None,
        kv_len: int | None = None,
        validate: bool = True,
        tree: TreeAttention | None = None,
    ) -> torch.Tensor:
        """Logits of ``input_ids`` ``[B, T]`` (int64), optionally through a KV cache.

        Parameters
        ----------
        input_ids : Tensor
            ``[B, T]`` token ids.
        cache : sk.KVCache, optional
            Written at ``cache.lengths`` (not advanced). ``None``: a plain causal pass from 0.
        logits_index : Tensor, optional
            ``None``: logits for all positions, ``[B, T, V]``. A ``[B]`` index: the logits of one
            position per row, ``[B, V]`` (the LM head runs only there). ``[B, n]``: ``[B, n, V]``.
        kv_len : int, optional
            See :meth:`hidden_states`.
        validate : bool
            See :meth:`hidden_states`.
        tree : TreeAttention, optional
            The new tokens are the nodes of a token tree (see :class:`TreeAttention`).
        """
        with self._on_own_threads(input_ids.numel()):
            if tree is None and self._one_op_pass(cache):
                span = cache.max_seq_len if kv_len is None else kv_len
                return self._native("causal_lm_pass", input_ids, cache, span, logits_index)
            h = self.hidden_states(input_ids, cache, kv_len, validate, tree)  # [B, T, C]
            if logits_index is not None:
                rows = torch.arange(h.shape[0], device=h.device)
                h = (
                    h[rows, logits_index]
                    if logits_index.dim() == 1
                    else h[rows[:, None], logits_index]
                )
            return linear(h, self.lm_head, self._kernels_on())

    def greedy_chain(
        self,
        input_ids: torch.Tensor,
        cache,
        num_valid: torch.Tensor,
        num_tokens: int,
        kv_len: int,
        *,
        exact: bool = True,
    ) -> torch.Tensor | None:
        """A speculative step's greedy draft chain in one native call
        (``specdec::causal_lm_greedy_chain``), or ``None`` where the one-op pass does not run
        (then the caller loops over :meth:`forward` itself).

        A pass over ``input_ids`` ``[B, W]`` (row ``b``'s first ``num_valid[b]`` tokens count),
        the argmax of its logits at token ``num_valid[b] - 1``, then ``num_tokens - 1``
        one-token passes, each fed the argmax before it; the last argmax is not fed. Returns
        the argmaxes ``[B, num_tokens]`` int64, bitwise those of the loop of :meth:`forward`
        calls and ``argmax`` (ties: the first index). Writes the cache at ``cache.lengths``
        onwards and does not commit: the caller advances by ``num_valid + num_tokens - 1``.
        ``kv_len`` (host int) bounds the first pass's attention as in :meth:`forward`; each
        later pass reads one slot more.

        ``exact=False`` (a drafter's choice: a draft's tokens need no bitwise contract) runs
        ``specdec::causal_lm_draft_chain`` instead: the same network with float32 activations
        and no ATen call inside (its own layer norm and GELU), 2.9x faster for the bundled
        one-layer draft (K = 2: 212 -> 73 us, Zen 3); its logits differ from the bitwise pass's
        in the last bits (another layer norm and GELU) or by the bfloat16 roundings it skips,
        so a draft token may differ near a tie. The cache is written in its dtype as every pass
        writes it.
        """
        name = "causal_lm_greedy_chain" if exact else "causal_lm_draft_chain"
        return self._one_op(name, input_ids, cache, num_valid, kv_len, num_tokens)

    def sample_chain(
        self,
        input_ids: torch.Tensor,
        cache,
        num_valid: torch.Tensor,
        num_tokens: int,
        kv_len: int,
        seeds: torch.Tensor,
        temperature: float,
        top_k: int | None = None,
        top_p: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`greedy_chain` (``exact=False``) for sampled drafts, in one native call
        (``specdec::causal_lm_draft_sample_chain``), or ``None`` where the one-op pass does not
        run. Draft ``i`` of row ``b`` is drawn from ``q = filtered_probs(logits / temperature,
        top_k, top_p)`` (the reference's filter) by the race ``argmax(q / E)`` with the
        drafter's exponentials of ``(seeds[b], i)`` (:func:`~specdec_kernels.reference.rng.
        draft_exponentials`), as :meth:`Sampling.draw <specdec_kernels.decoding.sampling.Sampling.
        draw>` draws it, up to float rounding; returns the drafts ``[B, num_tokens]`` and the
        ``q`` they came from ``[B, num_tokens, V]`` (float32). Writes and commits as
        :meth:`greedy_chain` does."""
        filters = (float(temperature), int(top_k or 0), 1.0 if top_p is None else float(top_p))
        return self._one_op(
            "causal_lm_draft_sample_chain", input_ids, cache, num_valid, kv_len, num_tokens,
            tail=(seeds, *filters),
        )  # fmt: skip

    def draft_logits(
        self, input_ids: torch.Tensor, cache, logits_index: torch.Tensor, kv_len: int
    ) -> torch.Tensor:
        """:meth:`forward`'s cached pass with ``logits_index`` ``[B]``, for a drafter: the
        logits ``[B, V]`` in float32 from ``specdec::causal_lm_draft_pass`` (the float32
        kernels of :meth:`greedy_chain`'s ``exact=False``: a draft's logits need no bitwise
        contract) where the one-op pass runs, else :meth:`forward`'s, as float32. Writes the
        cache at ``cache.lengths`` onwards as :meth:`forward` does (not advanced)."""
        logits = self._one_op("causal_lm_draft_pass", input_ids, cache, kv_len, logits_index)
        if logits is None:
            kw = {"logits_index": logits_index, "kv_len": kv_len, "validate": False}
            return self(input_ids, cache, **kw).float()
        return logits

    def _one_op(self, name: str, input_ids: torch.Tensor, cache, *args, tail=()):
        """:meth:`_native` on this model's threads where the one-op pass runs and the extension
        has ``specdec::<name>``; ``None`` (nothing done) elsewhere."""
        if not (self._one_op_pass(cache) and _extension.has_op(name)):
            return None
        with self._on_own_threads():
            return self._native(name, input_ids, cache, *args, tail=tail)

    def _native(self, name: str, input_ids: torch.Tensor, cache, *args, tail=()):
        """``specdec::<name>`` on this model: ``(input_ids, cache.kv, cache.lengths, *args,
        weights, n_head, eps, *tail)``, the order every native pass and chain takes (``tail``: a
        sampled chain's seeds, temperature, top-k and top-p); the kernel is the routing table's
        (:func:`specdec_kernels._dispatch.kernel`)."""
        c = self.config
        op = _dispatch.kernel(name, "native")
        weights = self._pass_weights()
        return op(
            input_ids,
            cache.kv,
            cache.lengths,
            *args,
            weights,
            c.n_head,
            c.layer_norm_epsilon,
            *tail,
        )

    def _one_op_pass(self, cache) -> bool:
        """Whether this cached pass runs as one native op (``specdec::causal_lm_pass``,
        ``csrc/causal_lm_cpu.cpp``): the row-invariant kernels, a contiguous ``sk.KVCache``,
        tanh GELU, and no gradient to record. Bitwise the Python pass's logits and cache, without
        its ~15 dispatched ops per layer (half the bundled draft's pass)."""
        from specdec_kernels.kv_cache import KVCache

        if type(cache) is not KVCache or not self._kernels_on():
            return False
        if torch.is_grad_enabled() and any(w.requires_grad for w in self._pass_weights()):
            return False  # the op has no backward: autograd records the Python ops
        return self.config.activation_function in TANH_GELU and _extension.has_op("causal_lm_pass")

    def _pass_weights(self) -> list[torch.Tensor]:
        """The weights ``specdec::causal_lm_pass`` takes, in its order.

        Read live from the owning modules' parameter tables through slots found once (walking
        the module tree by attribute costs 146 us a pass for the bundled 6-layer target, 36 us
        of the draft's ~100 us); the slots are found again whenever a module was assigned
        anywhere since (a replaced layer), while a reassigned or converted parameter is picked
        up by the live read itself.
        """
        slots = getattr(self, "_weight_slots", None)
        if slots is None or slots[0] != _modules_assigned[0]:
            slots = self._weight_slots = (_modules_assigned[0], self._find_weight_slots())
        return [table[name] for table, name in slots[1]]

    def _find_weight_slots(self) -> list[tuple[dict, str]]:
        """``(module._parameters, name)`` of each :meth:`_pass_weights` entry, in its order."""
        t = self.transformer
        mods = [(t.wte, "weight"), (t.wpe, "weight")]
        for block in t.h:
            a, m = block.attn, block.mlp
            for layer in (block.ln_1, a.c_attn, a.c_proj, block.ln_2, m.c_fc, m.c_proj):
                mods += [(layer, "weight"), (layer, "bias")]
        mods += [(t.ln_f, "weight"), (t.ln_f, "bias"), (self.lm_head, "weight")]
        return [(module._parameters, name) for module, name in mods]

    def new_cache(self, batch_size: int, max_seq_len: int | None = None):
        """An empty ``sk.KVCache`` shaped for this model (its dtype and device), zero-filled.

        Zero-filling matters: attention reads positions past a row's length (masked out, weight
        exactly 0), and ``0 * nan`` would still be ``nan`` if the buffer held garbage.
        """
        return kv_cache_for(
            self.config, self.config.n_head, batch_size, max_seq_len, self.lm_head.weight
        )

    # ------------------------------------------------------------------ conversion
    @classmethod
    def from_hf(cls, model) -> CausalLM:
        """Convert a ``transformers.GPT2LMHeadModel`` (same logits, same dtype and device).

        Raises ``ValueError`` for configurations GPT-2's layout here does not cover
        (cross-attention, layer-index attention scaling, unscaled attention).
        """
        hf = model.config
        for flag, ok in (
            ("add_cross_attention", False),
            ("scale_attn_by_inverse_layer_idx", False),
            ("scale_attn_weights", True),
        ):
            if getattr(hf, flag, ok) != ok:
                raise ValueError(f"CausalLM.from_hf: {flag}={getattr(hf, flag)} is not supported")
        tie = bool(getattr(hf, "tie_word_embeddings", True))
        config = CausalLMConfig(
            vocab_size=hf.vocab_size,
            n_positions=hf.n_positions,
            n_embd=hf.n_embd,
            n_layer=hf.n_layer,
            n_head=hf.n_head,
            n_inner=hf.n_inner,
            activation_function=hf.activation_function,
            layer_norm_epsilon=hf.layer_norm_epsilon,
            tie_word_embeddings=tie,
            eos_token_id=hf.eos_token_id if isinstance(hf.eos_token_id, int) else None,
        )
        p = next(model.parameters())
        lm = cls(config).to(device=p.device, dtype=p.dtype)
        state = {
            k: (v.t() if k.endswith(_CONV1D) else v)
            for k, v in model.state_dict().items()
            if not k.endswith((".attn.bias", ".attn.masked_bias"))
        }
        if "lm_head.weight" not in state or tie:
            state["lm_head.weight"] = state["transformer.wte.weight"]
        lm.load_state_dict(state, strict=True)
        return lm.train(model.training)

    def to_hf(self):
        """The same model as a ``transformers.GPT2LMHeadModel`` (same logits, dtype, device)."""
        from transformers import GPT2Config, GPT2LMHeadModel

        c = self.config
        hf_config = GPT2Config(
            vocab_size=c.vocab_size,
            n_positions=c.n_positions,
            n_embd=c.n_embd,
            n_layer=c.n_layer,
            n_head=c.n_head,
            n_inner=c.n_inner,
            activation_function=c.activation_function,
            layer_norm_epsilon=c.layer_norm_epsilon,
            tie_word_embeddings=c.tie_word_embeddings,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            eos_token_id=c.eos_token_id,
            bos_token_id=c.eos_token_id,
        )
        p = self.lm_head.weight
        model = GPT2LMHeadModel(hf_config).to(device=p.device, dtype=p.dtype)
        state = {k: (v.t() if k.endswith(_CONV1D) else v) for k, v in self.state_dict().items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]
        if missing or unexpected:
            raise RuntimeError(f"to_hf: missing {missing}, unexpected {unexpected}")
        if c.tie_word_embeddings:
            model.tie_weights()
        return model.train(self.training)

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike, dtype: torch.dtype | None = None) -> None:
        """Write the weights (optionally cast to ``dtype``) and config to one safetensors file."""
        from safetensors.torch import save_file

        state = {
            k: v.detach().to(dtype or v.dtype).contiguous().cpu()
            for k, v in self.state_dict().items()
        }
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight")
        meta = {"config": json.dumps(dataclasses.asdict(self.config))}
        save_file(state, os.fspath(path), metadata=meta)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> CausalLM:
        """Read a file written by :meth:`save`."""
        from safetensors import safe_open

        with safe_open(os.fspath(path), framework="pt") as f:
            config = CausalLMConfig(**json.loads(f.metadata()["config"]))
            state = {k: f.get_tensor(k) for k in f.keys()}
        lm = cls(config)
        if config.tie_word_embeddings:
            state["lm_head.weight"] = state["transformer.wte.weight"]
        lm.load_state_dict(state)
        return lm.to(device=device, dtype=dtype).eval()
