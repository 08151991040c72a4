"""Batched, lossless speculative generation with ``sk.models.CausalLM`` models.

Thin wrappers around the decoding loop of :mod:`specdec_kernels.decoding`: convert the inputs,
run :class:`~specdec_kernels.decoding.Decoder` with a :class:`CausalLMAdapter` over ``sk.KVCache``
(per-row lengths, no padding, nothing recomputed), format the outputs.

References: Leviathan et al. 2023 (https://arxiv.org/abs/2211.17192), Chen et al. 2023
(https://arxiv.org/abs/2302.01318); gpt-fast's ``speculative_decode``.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass

import torch

from specdec_kernels._dispatch import check_backend
from specdec_kernels.decoding import (
    Decoder,
    DecodeResult,
    GenerationStats,
    ModelDrafter,
    NgramDrafter,
    Sampling,
    TopLogprobs,
)
from specdec_kernels.decoding.adapters import CausalLMAdapter, adapter_for
from specdec_kernels.decoding.trees import DynamicTree, StaticTree, TreeDrafter
from specdec_kernels.tuning import AcceptanceTracker, PassCosts, measure_pass_costs
from specdec_kernels.verification import METHODS

__all__ = [
    "GenerationOutput",
    "GenerationStats",
    "SpeculativeGenerator",
    "autoregressive_generate",
    "cost_per_token",
]


@dataclass
class GenerationOutput:
    """``sequences[b]``: prompt + generated tokens of row ``b``; ``draft_accepted[b][i]``: whether
    generated token ``i`` of row ``b`` was a draft token the target accepted. With
    ``logprobs=``: ``logprobs[b]`` (``[T_b]`` float32, one per generated token) and, with
    ``num_logprobs = n > 0``, ``top_logprobs[b]`` (a
    :class:`~specdec_kernels.decoding.TopLogprobs` of ``values`` / ``ids`` ``[T_b, n]``), as
    :class:`~specdec_kernels.decoding.DecodeResult` has them; else ``None``."""

    sequences: list[list[int]]
    stats: GenerationStats
    draft_accepted: list[list[bool]]
    prompt_lengths: list[int]
    logprobs: list[torch.Tensor] | None = None
    top_logprobs: list[TopLogprobs] | None = None

    @classmethod
    def from_result(cls, result: DecodeResult) -> GenerationOutput:
        lens = [len(s) - len(f) for s, f in zip(result.sequences, result.from_draft)]
        return cls(
            result.sequences,
            result.stats,
            result.from_draft,
            lens,
            result.logprobs,
            result.top_logprobs,
        )


def cost_per_token(model) -> float:
    """Multiply-adds per token of a GPT-2-layout model (layers and LM head)."""
    c = model.config
    inner = c.n_inner or 4 * c.n_embd
    return c.n_layer * (4 * c.n_embd**2 + 2 * c.n_embd * inner) + c.n_embd * c.vocab_size


class SpeculativeGenerator:
    """Lossless batched speculative decoding with a draft model (or n-gram lookup).

    Parameters
    ----------
    target : sk.models.CausalLM or sk.distributed.TensorParallelCausalLM
        The model whose distribution is produced. A tensor-parallel target runs on every rank
        of its group with the same arguments (and a draft replicated on every rank); its
        logit shards are verified by the vocabulary-parallel ops.
    draft : sk.models.CausalLM or "ngram"
        A cheaper model with the same vocabulary and device (its dtype may differ: a small
        draft is often fastest in float32 beside a bfloat16 target), or ``"ngram"`` for
        prompt-lookup drafting (no model).
    num_speculative_tokens : int, "auto" or None
        Draft tokens per pass ``K >= 1``, or ``"auto"`` (the default, ``None``, for chains):
        before each step, the ``K`` in ``0 .. max_speculative_tokens`` that finishes the live
        batch soonest (:meth:`specdec_kernels.tuning.PassCosts.finish_ms`,
        :class:`specdec_kernels.decoding.policy.AutoK`) from the rows' measured acceptance and
        the pair's pass costs; ``K = 0`` lets the target
        decode alone while drafting would not pay. The costs are measured once per pair, dtype,
        device and thread count, before any generation, and cached
        (:func:`specdec_kernels.tuning.measure_pass_costs`); the loop never times anything,
        so the same seed gives the same output on every call. With ``tree``, ``None`` is unused.
    max_speculative_tokens : int
        Upper bound of ``K`` for ``"auto"`` (default 8).
    cost_ratio : float, optional
        With ``verify_cost``, a batch-blind cost model for ``"auto"`` instead of measured pass
        costs: draft cost per token over target cost per pass.
    verify_cost : float, optional
        The target's extra cost per verified draft token, in one-token passes (with
        ``cost_ratio``; default 0).
    costs : PassCosts, optional
        The pass costs ``"auto"`` prices each step with. Default: measured by
        :func:`specdec_kernels.tuning.measure_pass_costs` for models with a KV cache
        (``sk.models.CausalLM``), else the batch-blind model of ``cost_ratio`` (default: the
        ratio of multiply-adds per token, :func:`cost_per_token`) and ``verify_cost``.
    ngram_size : int
        Longest n-gram matched by the ``"ngram"`` drafter.
    tree : StaticTree or DynamicTree, optional
        Draft a token tree per row instead of a chain (:mod:`specdec_kernels.decoding.trees`):
        a fixed shape (``StaticTree([3, 2, 1, 1])``, Medusa-style branching per depth, or
        ``StaticTree(parents=[...])``) or an EAGLE-2 tree (``DynamicTree(num_nodes=16, top_k=4,
        depth=5)``). The target scores the whole tree in one pass with the tree attention mask
        and ``sk.verify_tree_greedy`` / ``sk.verify_tree_sampling`` decide (the children are the
        draft's top-ranked tokens: ``draft_mode="deterministic"``), so greedy output still
        equals the target's greedy decoding and sampling stays lossless.
        ``num_speculative_tokens`` is not used then (``"auto"`` raises).
    backend : {None, "triton", "native", "reference"}
        The implementation of the verification ops the loop calls (chain and tree), as their
        ``backend`` (:func:`specdec_kernels.verify_greedy`); ``None`` (default): their automatic
        choice (``SPECDEC_BACKEND`` included). Greedy output is the same on every backend.
    acceptance_prior : float, optional
        ``"auto"``'s acceptance estimate of a row before any of its drafts is tested, in
        ``(0, 1)``: it decides whether the first steps draft at all (a batch whose first
        choice is ``K = 0`` measures nothing, and decodes with the target alone). Default: the
        draft's ``acceptance_prior`` attribute where it has one (the bundled pairs state theirs,
        measured on held-out text when they were trained: ``load_bundled``), else 0.7.
    method : {"token", "block", "match"}
        The default ``verify_method`` of :meth:`generate`: with ``"match"`` every sampled
        token is the target's own sample at its output position, keyed by (seed, row,
        position), so the output equals :func:`autoregressive_generate`'s with the same seed
        and arguments, token for token, wherever the target's logits do not depend on how
        many tokens share a pass (the bundled CPU models: row-invariant kernels).
    coupled : bool
        Under ``"match"``, the draft model draws its drafts with the verifier's noise at the
        same position (:class:`~specdec_kernels.decoding.ModelDrafter`'s ``coupled``): more
        drafts match; the output is the same either way.

    Raises
    ------
    ValueError
        Draft and target with different vocabulary sizes or devices; a bad ``K``; a
        ``backend`` that is not one of the above; an ``acceptance_prior`` outside ``(0, 1)``
        (named in the message, before any work).

    Examples
    --------
    >>> import specdec_kernels as sk
    >>> target, draft = sk.models.load_bundled()
    >>> gen = sk.SpeculativeGenerator(target, draft, num_speculative_tokens=4)
    >>> out = gen.generate([sk.models.encode("def main():\\n")], max_new_tokens=16)
    >>> len(out.sequences[0])
    28
    >>> tree = sk.decoding.DynamicTree(num_nodes=8, top_k=2, depth=4)
    >>> out_tree = sk.SpeculativeGenerator(target, draft, tree=tree).generate(
    ...     [sk.models.encode("def main():\\n")], max_new_tokens=16)
    >>> out_tree.sequences == out.sequences     # greedy: both are the target's own decoding
    True
    """

    def __init__(
        self,
        target,
        draft,
        num_speculative_tokens: int | str | None = None,
        *,
        max_speculative_tokens: int = 8,
        cost_ratio: float | None = None,
        verify_cost: float | None = None,
        costs: PassCosts | None = None,
        ngram_size: int = 3,
        tree: StaticTree | DynamicTree | None = None,
        backend: str | None = None,
        acceptance_prior: float | None = None,
        method: str = "token",
        coupled: bool = True,
    ):
        check_backend(backend)
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self.method = method
        if num_speculative_tokens is None:
            num_speculative_tokens = 4 if tree is not None else "auto"
        self.target, self.draft = target, draft
        ngram = isinstance(draft, str)
        if ngram and draft != "ngram":
            raise ValueError(f"draft must be a model or 'ngram', got {draft!r}")
        if tree is not None and ngram:
            raise ValueError("tree needs a draft model, not 'ngram'")
        if tree is not None and not isinstance(tree, (StaticTree, DynamicTree)):
            raise ValueError(
                f"tree must be None, a StaticTree or a DynamicTree, got {type(tree).__name__}"
            )
        if not ngram:
            tp, dp = next(target.parameters()), next(draft.parameters())
            if draft.vocab_size != target.vocab_size:
                raise ValueError(
                    f"draft vocabulary size {draft.vocab_size} differs from the "
                    f"target's {target.vocab_size}"
                )
            if dp.device != tp.device:
                raise ValueError(
                    f"draft is on device {dp.device}, the target on {tp.device}; move one of them"
                )
        auto = num_speculative_tokens == "auto" and tree is None
        blind = cost_ratio is not None or verify_cost is not None
        if cost_ratio is None:
            cost_ratio = 0.0 if ngram else cost_per_token(draft) / cost_per_token(target)
        verify_cost = 0.0 if verify_cost is None else verify_cost
        if auto and costs is None and not blind and not ngram and _measurable(target, draft):
            costs = measure_pass_costs(target, draft, max_k=max_speculative_tokens)
            costs = with_loop_costs(costs, target, draft)
        self.cost_ratio, self.costs = cost_ratio, costs

        def drafter():
            if ngram:
                return NgramDrafter(ngram_size)
            if tree is not None:
                return TreeDrafter(CausalLMAdapter(draft), tree)
            return ModelDrafter(CausalLMAdapter(draft), coupled=coupled)

        if acceptance_prior is None:
            stated = None if ngram else getattr(draft, "acceptance_prior", None)
            acceptance_prior = AcceptanceTracker.prior if stated is None else stated
        self.tree = tree
        # one decoder for every call (it holds no run state; its adapters hold the caches of
        # the call in progress), built now: the arguments are checked before any work
        self._new_decoder = lambda: Decoder(
            adapter_for(target),
            drafter(),
            num_speculative_tokens,
            max_speculative_tokens=max_speculative_tokens,
            cost_ratio=cost_ratio,
            verify_cost=verify_cost,
            costs=costs,
            backend=backend,
            acceptance_prior=acceptance_prior,
        )
        self.decoder = self._new_decoder()
        self._running = threading.Lock()

    def generate(
        self,
        prompts,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | None = None,
        seed: int | None = None,
        progress=None,
        *,
        verify_method: str | None = None,
        logprobs: str | None = None,
        num_logprobs: int = 0,
        grammar=None,
        min_p: float | None = None,
        repetition_penalty: float | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        logit_bias: dict | None = None,
    ) -> GenerationOutput:
        """Generate up to ``max_new_tokens`` tokens for every prompt.

        Parameters
        ----------
        prompts : list of list of int, or Tensor
            Token ids, rows of different lengths allowed, or a ``[B, T]`` int tensor.
        max_new_tokens : int
            ``>= 1``.
        temperature : float
            ``0``: greedy (each row equals the target's greedy decoding). ``> 0``: sampling, the
            output distributed as the target's (with ``top_k`` / ``top_p`` filtering).
        eos_token_id : int, optional
            A row stops after emitting it.
        seed : int, optional
            Seeds the draft's sampling and the verification draws (sampling only). Every draw
            is keyed by (seed, row index, position, purpose), so a row's tokens depend on its
            prompt, its index in ``prompts`` and the seed, never on the other rows.
        progress : callable, optional
            Called as ``progress(generated_tokens_so_far, live_rows)`` after each target pass.
        verify_method : {"token", "block", "match"}, optional
            The acceptance rule when sampling (:class:`~specdec_kernels.decoding.Sampling`):
            ``"block"`` is block verification, ``"match"`` the target's own samples (chains
            only: ``ValueError`` with ``tree``); greedy decoding is the same either way.
            Default: the generator's ``method``.
        logprobs : {None, "raw", "processed"}
            Also return each generated token's log-probability (``GenerationOutput.logprobs``):
            of the target's raw logits, or of the distribution it was drawn from.
        num_logprobs : int
            ``0 .. 20``: also the most likely tokens at each position (``top_logprobs``).
        grammar : xgrammar.CompiledGrammar or list of them, optional
            Constrain each row's generated tokens to a grammar (one for all rows, or one per
            row), compiled with :func:`specdec_kernels.grammar.tokenizer_info` of the target
            (:mod:`specdec_kernels.grammar`: JSON, a JSON schema, EBNF, a regex). Drafts are
            proposed under it and verified with its masks; a row stops when its grammar ends
            (at the stop token, ``<eos>`` for the bundled models). Greedy output equals the
            target's own constrained greedy decoding; sampling follows its masked distribution.
        min_p : float, optional
            In ``[0, 1]``: after top-p, keep the tokens at least ``min_p`` times as likely as
            the most likely one.
        repetition_penalty, presence_penalty, frequency_penalty : float, optional
            transformers' repetition penalty (``> 0``, ``1`` = off) and OpenAI's presence /
            frequency penalties (``0`` = off) over each row's prompt and generated tokens.
        logit_bias : dict, optional
            ``{token id: bias}`` added to those logits (finite or ``-inf``), every row alike.
            The processors apply before temperature and the filters (API.md section 10);
            speculative output follows plain decoding with the same processors exactly
            (:class:`~specdec_kernels.decoding.Sampling`).

        Returns
        -------
        GenerationOutput

        Raises
        ------
        ValueError
            A bad argument (named in the message), before any work.
        """
        sampling = Sampling(
            temperature, top_k, top_p, verify_method or self.method, logprobs, num_logprobs,
            min_p, repetition_penalty, presence_penalty, frequency_penalty, logit_bias,
        )  # fmt: skip
        kw = dict(eos_token_id=eos_token_id, seed=seed, progress=progress, grammar=grammar)
        if not self._running.acquire(blocking=False):  # a call is running (another thread's,
            # or this one's progress callback): this one gets adapters and caches of its own
            return GenerationOutput.from_result(
                self._new_decoder().run(prompts, max_new_tokens, sampling, **kw)
            )
        try:
            result = self.decoder.run(prompts, max_new_tokens, sampling, **kw)
        finally:
            self._running.release()
        return GenerationOutput.from_result(result)


#: tries of the loop's calibration (:func:`with_loop_costs`), each every run once (~0.6 s for
#: the default pair on a 2-core EPYC VM); a figure is the median over the tries, so a spell of
#: the machine must last through half of them to move it. With 5, one fresh clone's
#: calibration priced the loop's work per draft token at batch 4 at 0.136 ms (three
#: calibrations in a row after it: 0, 0.013, 0 ms) and "auto" drafted ~2 tokens at batch 4
#: greedy, 0.93x of ``K = 4``.
LOOP_TRIES = 9


def with_loop_costs(costs: PassCosts, target, draft, *, cache: bool = True) -> PassCosts:
    """``costs`` with the decoding loop's own work measured in: per step (verification,
    commit, the one host sync: ``step_ms``), per drafting step (``draft_fixed_ms``) and per
    draft token (drawing and feeding it: ``draft_step_ms``; the two apart from runs at K = 1
    and K = 4), at batch sizes 1, 4 and the grid's largest (``loop_batch``), from short greedy
    runs of the loop (the difference of two lengths, so the prefill cancels; every run of a
    try back to back, the drafting steps priced at the median of :data:`LOOP_TRIES` tries'
    ratios to their K = 0 step), minus the model passes ``costs`` prices: the loop's steps at
    each batch size are then priced as the loop ran them, whatever the passes' figures (taken
    apart, in a spell that may have been slower or faster) say. Measured once per pair like the pass
    costs, before any generation."""
    import json

    from specdec_kernels.tuning._timing import remembered

    key = "loop6:" + json.dumps(costs.to_dict(), sort_keys=True)
    return remembered(
        key,
        lambda: _measure_loop_costs(costs, target, draft),
        dump=PassCosts.to_dict,
        load=PassCosts.from_dict,
        cache=cache,
    )


def _measure_loop_costs(costs: PassCosts, target, draft) -> PassCosts:
    import dataclasses

    ctx = min(target.max_seq_len or 256, draft.max_seq_len or 256)
    if ctx < 24:  # too short a context to time anything: the pass costs alone
        return costs
    short, long_ = ctx // 24, ctx // 4  # new tokens of the two runs
    prompt = [(7 * i) % target.vocab_size for i in range(ctx // 8)]
    hi = max(2, min(4, costs.tokens[-1] - 1))
    # batch 1, 4 and the grid's largest: the loop's work per step grows with the rows, and the
    # passes' grid, timed pass after pass, can misprice a batch's steps by more than drafting
    # gains there (at batch 4 on an AMD EPYC VM with AVX512_BF16 the grid put a K = 2 step at
    # 1.39x the target alone's, the loop ran it at 1.87x to 2.12x: "auto" drafted and ran
    # at 0.89x of the target alone)
    sizes = sorted({b for b in (1, 4, costs.batch[-1]) if b <= costs.batch[-1]})

    def run(b: int, k: int, n: int) -> tuple[float, int]:  # (wall ms, steps) of one run
        drafter = ModelDrafter(CausalLMAdapter(draft)) if k else None
        res = Decoder(adapter_for(target), drafter, max(k, 1) if k else 4).run([prompt] * b, n)
        return res.stats.wall_seconds * 1e3, res.stats.target_forwards  # equal rows: one end

    # every run of a try back to back, LOOP_TRIES tries. A batch size's step at K = 1 and hi is
    # priced at the median over the tries of its ratio to the same try's K = 0 step (a batch
    # size's six runs follow one another, in one spell of the machine), the K = 0 step at
    # the median of the tries': on a shared VM whose passes take 0.6 ms in one minute and
    # 1.9 ms in another, the fastest of each run's tries had mixed spells (a K = 1 step at
    # batch 1 priced at 0.89x and at 2.02x of a K = 0 one, three calibrations of one pair, AMD
    # EPYC VM)
    keys = [(b, k, n) for b in sizes for k in (0, 1, hi) for n in (short, long_)]
    # a warm-up run of each shape first: a first run is slower (its allocations), and one had
    # taken longer than the same loop run for 6x as many tokens
    for b, k, n in keys[::2]:
        run(b, k, n)
    tries = []
    for _ in range(LOOP_TRIES):
        walls = {key: run(*key) for key in keys}  # (wall ms, steps): the steps never vary
        tries.append(
            {
                (b, k): (walls[b, k, long_][0] - walls[b, k, short][0])
                / max(walls[b, k, long_][1] - walls[b, k, short][1], 1)
                for b in sizes
                for k in (0, 1, hi)
            }
        )
    per = {}
    for b in sizes:
        per[b, 0] = statistics.median(t[b, 0] for t in tries)
        for k in (1, hi):
            # a try whose K = 0 figure a hiccup drove to 0 or below gives no ratio
            ratios = [t[b, k] / t[b, 0] for t in tries if t[b, 0] > 0]
            per[b, k] = (
                per[b, 0] * statistics.median(ratios)
                if ratios
                else statistics.median(t[b, k] for t in tries)
            )
    step, per_token, fixed = zip(*(_loop_corrections(costs, per, b, hi) for b in sizes))
    return dataclasses.replace(
        costs,
        step_ms=tuple(step),
        draft_step_ms=tuple(per_token),
        draft_fixed_ms=tuple(fixed),
        loop_batch=tuple(sizes),
    )


def _loop_corrections(costs: PassCosts, per: dict, b: int, hi: int) -> tuple[float, ...]:
    """``(step_ms, draft_step_ms, draft_fixed_ms)`` at batch ``b`` from the loop's ms per step
    ``per[b, k]`` at ``K = 0, 1, hi``, beyond the passes ``costs`` prices."""
    s = per[b, 0] - costs.target(b, 1)
    # what drafting adds beyond the priced passes, at K = 1 and at K = hi: a part per step (the
    # catch-up pass, the draft's weights back into cache) and a part per draft token
    extra = {k: per[b, k] - costs.target(b, k + 1) - k * costs.draft(b) - s for k in (1, hi)}
    per_token = max(0.0, (extra[hi] - extra[1]) / (hi - 1))
    return s, per_token, extra[1] - per_token


def _measurable(target, draft) -> bool:
    """Both models have the cached forward :func:`measure_pass_costs` times (a single-process
    ``CausalLM``; a tensor-parallel target would need its whole group to time it)."""
    return all(
        hasattr(m, "new_cache") and hasattr(m, "hidden_states") and not hasattr(m, "group")
        for m in (target, draft)
    )


def autoregressive_generate(
    model,
    prompts,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | None = None,
    seed: int | None = None,
    progress=None,
    *,
    backend: str | None = None,
    logprobs: str | None = None,
    num_logprobs: int = 0,
    grammar=None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    logit_bias: dict | None = None,
) -> GenerationOutput:
    """The target alone: one token per forward pass, batched over ragged prompts with a KV
    cache. The baseline that speculative generation must equal (greedy) and beat (speed).
    Same arguments and output as :meth:`SpeculativeGenerator.generate` (``logprobs`` and
    ``num_logprobs`` included: greedy speculative logprobs equal these; ``grammar`` too: each
    token is drawn under its row's grammar mask; and the processors ``min_p``, ``logit_bias`` and
    the penalties); the tokens are drawn by the same verification ops with no draft (``K = 0``),
    on ``backend`` (as in :class:`SpeculativeGenerator`; a bad name raises ``ValueError``
    before any work), the token at each output position by the race keyed by (seed, row,
    position): what ``SpeculativeGenerator(..., method="match")`` reproduces."""
    result = Decoder(adapter_for(model), backend=backend).run(
        prompts,
        max_new_tokens,
        Sampling(
            temperature,
            top_k,
            top_p,
            logprobs=logprobs,
            num_logprobs=num_logprobs,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            logit_bias=logit_bias,
        ),  # fmt: skip
        eos_token_id=eos_token_id,
        seed=seed,
        progress=progress,
        grammar=grammar,
    )
    return GenerationOutput.from_result(result)
