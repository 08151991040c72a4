"""The decoding loop: draft -> one target pass -> verify -> commit -> retire.

Vocabulary of this file: a *row* is one sequence of the caller's batch; *live* rows are still
generating; a *step* is one target pass; ``k_loop`` (host int) is the number of draft slots of a
step, ``k`` (``[B]``) the real draft tokens of each row (``<= k_loop``); *committed* tokens are
the prompt and everything emitted so far (``tokens[b, :seq_len[b]]``).

Every row keeps its own length, budget (``limit``), draft count and seed; finished rows are
retired from the batch (caches included), so they cost no more work. The loop synchronises with
the device once per step, to learn which rows are done and the next ``k_loop``.

Under a grammar (``run(..., grammar=)``, API.md section 9) each row has an xgrammar matcher
(:class:`specdec_kernels.grammar.GrammarState`, on the host): the proposal carries the masks of
its positions, verification applies them in the op (``token_bitmask=``), the commit advances the
matchers by the kept tokens, and a row whose grammar has ended is done as at eos. The matchers
read the drafts and the emitted tokens on the host: a few more transfers per step.

References: Leviathan et al. 2023 (https://arxiv.org/abs/2211.17192), Chen et al. 2023
(https://arxiv.org/abs/2302.01318); gpt-fast's ``speculative_decode``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from specdec_kernels._dispatch import check_backend
from specdec_kernels._validate import check_logprob_args, require_int64
from specdec_kernels.decoding.proposals import ChainProposal
from specdec_kernels.reference import rng
from specdec_kernels.reference.verify_sampling import filtered_probs_alike
from specdec_kernels.tuning import (
    DRAFT_MARGIN,
    PRIOR_MARGIN,
    STOP_MARGIN,
    STOP_OPTIMISM,
    AcceptanceTracker,
    PassCosts,
    expected_accepts,
    pick_k,
    pick_k_host,
)
from specdec_kernels.verification import METHODS

#: steps between two choices of ``K`` by ``"auto"`` for a batch, once the first ``AUTO_EVERY``
#: steps have each renewed it (the choice is also renewed whenever rows retire; one row's after
#: every step)
AUTO_EVERY = 4


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen and what is reported about them (API.md sections 4 and 9).

    Parameters
    ----------
    temperature, top_k, top_p
        ``temperature == 0`` is greedy; otherwise temperature, then top-k, then top-p
        (``transformers``' warper order), the same filter for draft and target.
    verify_method : {"token", "block"}
        The acceptance rule of sampled chains (:func:`sk.verify_sampling`'s ``method``):
        token-by-token, or block verification (Sun et al. 2024, arXiv 2403.10444), lossless
        too and never fewer accepted drafts in expectation. Greedy rows are decided by argmax
        either way: ``"block"`` is accepted with ``temperature == 0`` and changes nothing. Token
        trees have no block rule (``Decoder.run`` raises ``ValueError`` for a tree drafter).
    logprobs : {None, "raw", "processed"}
        Report the log-probability of every generated token (``DecodeResult.logprobs``):
        ``"raw"``: ``log_softmax`` of the target's logits, before temperature and filters;
        ``"processed"``: the log of the distribution the token was drawn from (temperature,
        top-k, top-p; greedy: ``log_softmax`` at temperature 1). As the verification ops define
        them (``logprobs=``), from the pass that verifies.
    num_logprobs : int
        ``n`` in ``[0, 20]``: also the ``n`` most likely tokens of the same distribution at
        every generated position (``DecodeResult.top_logprobs``); needs ``logprobs``.

    Raises
    ------
    ValueError
        A bad value of any argument (named in the message).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    verify_method: str = "token"
    logprobs: str | None = None
    num_logprobs: int = 0

    def __post_init__(self):
        try:
            finite = math.isfinite(float(self.temperature))
        except (OverflowError, TypeError, ValueError):
            finite = False
        if not finite or not self.temperature >= 0:
            raise ValueError(f"temperature must be a finite float >= 0, got {self.temperature}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 0):
            raise ValueError(f"top_k must be None or an int >= 0, got {self.top_k!r}")
        if self.top_k is not None:
            require_int64("top_k", self.top_k)
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.verify_method not in METHODS:
            raise ValueError(f"verify_method must be one of {METHODS}, got {self.verify_method!r}")
        try:
            check_logprob_args(self.logprobs, self.num_logprobs)
        except TypeError as e:  # num_logprobs of another type: a bad value here too
            raise ValueError(str(e)) from None

    @property
    def logprob_kwargs(self) -> dict:
        """The verification ops' ``logprobs`` / ``num_logprobs`` keywords (empty when no
        logprobs are asked for, so ops without them, a sharded target's, still apply)."""
        if self.logprobs is None:
            return {}
        return {"logprobs": self.logprobs, "num_logprobs": self.num_logprobs}

    @property
    def method_kwargs(self) -> dict:
        """``verify_sampling``'s ``method`` keyword (empty for the default ``"token"``)."""
        return {} if self.verify_method == "token" else {"method": self.verify_method}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Filtered probabilities ``[B, V]`` (float32) of logits ``[B, V]``: the reference's
        filter (:func:`specdec_kernels.reference.verify_sampling.filtered_probs`)."""
        return filtered_probs_alike(
            logits[:, None], self.temperature, self.top_k or None, self.top_p
        )[:, 0]

    def draw(self, logits: torch.Tensor, seeds=None, position: int = 0, race=None):
        """One token per row of ``logits`` ``[B, V]`` and the distribution it was drawn from
        (``None`` when greedy), without a host sync: ``argmax(p / E)``, ``E ~ Exp(1)``.

        ``E`` is :func:`~specdec_kernels.reference.rng.draft_exponentials` of ``seeds`` (``[B]``
        int64, the step's seeds) at draft ``position``: keyed by (seed, row, position,
        purpose = draft), so a row's draft depends on nothing but its own seed. ``seeds=None``
        (or a ``torch.Generator``) draws fresh seeds from the generator (default: torch's).
        ``race``: those ``E``, already drawn
        (:func:`~specdec_kernels.reference.rng.draft_exponentials_upto`).
        """
        if self.greedy:
            return logits.argmax(-1), None
        p = self.probs(logits)
        if race is not None:
            e = race
        else:
            if seeds is None or isinstance(seeds, torch.Generator):
                seeds = rng.seeds_for_batch(p.shape[0], p.device, generator=seeds)
            e = rng.draft_exponentials(seeds, position, p.shape[1:])
        return torch.where(p > 0, p / e, -1.0).argmax(-1), p


@dataclass
class GenerationStats:
    """What a generation call did.

    ``target_forwards`` / ``draft_forwards`` count decoding passes (prefill excluded);
    ``acceptance_rate`` = accepted draft tokens / drafted tokens (with token trees every node but
    the root counts as drafted, so the rate is lower than a chain's); ``mean_accepted`` = mean
    accepted drafts per row and target pass; ``accepted_histogram[n]`` = how many (row, pass)
    pairs accepted ``n`` drafts; ``tokens_per_second`` counts generated tokens of all rows.
    """

    target_forwards: int = 0
    draft_forwards: int = 0
    mean_accepted: float = 0.0
    acceptance_rate: float = 0.0
    accepted_histogram: list[int] = field(default_factory=list)
    tokens_per_second: float = 0.0
    wall_seconds: float = 0.0
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def mean_emitted(self) -> float:
        """Mean tokens committed per row and target pass (``mean_accepted + 1``)."""
        return self.mean_accepted + 1.0


class TopLogprobs(NamedTuple):
    """The ``n`` most likely tokens at each of a row's ``T`` generated positions, most likely
    first, ties by the lower id (``-inf`` / ``-1`` past the tokens with nonzero probability)."""

    values: torch.Tensor  # [T, n] float32: their log-probabilities
    ids: torch.Tensor  # [T, n] int64: their token ids


@dataclass
class DecodeResult:
    """Per row of the caller's batch: ``sequences[b]`` (prompt + generated tokens),
    ``from_draft[b][i]`` (generated token ``i`` was an accepted draft), and the statistics.

    With ``Sampling(logprobs=...)``: ``logprobs[b]``, a ``[T_b]`` float32 CPU tensor, the
    log-probability of each of row ``b``'s ``T_b = len(sequences[b]) - len(prompt)`` generated
    tokens, in order (cut with the row at eos and at its budget); with ``num_logprobs = n > 0``
    also ``top_logprobs[b]``, a :class:`TopLogprobs` of ``[T_b, n]`` tensors. ``None`` when not
    asked for. The first generated token is scored like the others (the loop's first target pass
    decides it)."""

    sequences: list[list[int]]
    from_draft: list[list[bool]]
    stats: GenerationStats
    logprobs: list[torch.Tensor] | None = None
    top_logprobs: list[TopLogprobs] | None = None


@dataclass
class _Rows:
    """Device state of the live rows (all tensors share the batch dim)."""

    ids: torch.Tensor  # [B] int64: row index in the caller's batch
    tokens: torch.Tensor  # [B, cap] int64: committed tokens in [:seq_len]
    from_draft: torch.Tensor  # [B, cap] bool
    seq_len: torch.Tensor  # [B] int64
    prompt_len: torch.Tensor  # [B] int64
    limit: torch.Tensor  # [B] int64: seq_len at which the row is done
    num_draft: torch.Tensor  # [B] int64: draft tokens wanted next step
    logprobs: torch.Tensor | None = None  # [B, cap] float32, in step with tokens
    top_values: torch.Tensor | None = None  # [B, cap, n] float32
    top_ids: torch.Tensor | None = None  # [B, cap, n] int64

    def serving_tensors(self) -> tuple:
        return self.logprobs, self.top_values, self.top_ids

    def select(self, order: torch.Tensor) -> _Rows:
        return _Rows(
            *(
                None if t is None else t[order]
                for t in (
                    self.ids,
                    self.tokens,
                    self.from_draft,
                    self.seq_len,
                    self.prompt_len,
                    self.limit,
                    self.num_draft,
                    self.logprobs,
                    self.top_values,
                    self.top_ids,
                )
            )
        )


def _useful(num_draft: torch.Tensor, st) -> torch.Tensor:
    """``[B]``: the drafts a step of the rows ``st`` can keep, at most ``num_draft``: a step
    emits a row's accepted drafts and one token more, so drafts past a row's last token but
    one (its limit, ``max_new_tokens`` or the context) are never kept, and the last steps of a
    request draft only what they can use (batch 1, 32 new tokens a prompt, AMD EPYC VM: ``K = 8``
    sampling 3% faster, ``K = 4`` 1%)."""
    return num_draft.minimum((st.limit - st.seq_len - 1).clamp_min(0))


def swap_remove_order(done: list[bool]) -> list[int]:
    """Rows to keep, as an order in which each freed slot takes a kept row from the tail: only
    as many rows move as were removed.

    >>> swap_remove_order([False, True, False, False, True])
    [0, 3, 2]
    """
    keep = [i for i, d in enumerate(done) if not d]
    n = len(keep)
    order = list(range(n))
    tail = [i for i in keep if i >= n]
    for slot in range(n):
        if done[slot]:
            order[slot] = tail.pop()
    return order


class Decoder:
    """Batched, lossless speculative decoding over a model adapter and a drafter.

    Parameters
    ----------
    target : CachedModel
        The model whose distribution is produced (:mod:`specdec_kernels.decoding.adapters`).
    drafter : Drafter or None
        Where drafts come from; ``None`` decodes with the target alone (one token per pass,
        through the same verification ops with ``K = 0``). A
        :class:`~specdec_kernels.decoding.trees.TreeDrafter` drafts a token tree per row
        (its shape's ``depth`` plays the part of ``K``, ``num_speculative_tokens`` is unused).
    num_speculative_tokens : int or "auto"
        ``K >= 1``, or ``"auto"``: before each step, the ``K`` in ``0 .. max_speculative_tokens``
        that maximises the live batch's expected tokens per millisecond under ``costs``
        (:meth:`specdec_kernels.adaptive.PassCosts.best_k`), from the rows' accepted counts;
        ``K = 0`` decodes with the target alone while drafting would not pay. Never from timings
        taken while generating, so the same seed gives the same tokens on every call.
    cost_ratio : float
        Draft cost per token over target cost per pass (``"auto"`` without ``costs``).
    verify_cost : float
        The target's extra cost per verified draft token, in one-token passes (``"auto"``
        without ``costs``; 0 where a ``K+1``-token pass costs one token's, as on a GPU).
    costs : PassCosts, optional
        Measured pass costs of the pair (:func:`specdec_kernels.adaptive.measure_pass_costs`),
        which price each batch size; default: the batch-blind
        ``PassCosts.linear(cost_ratio, verify_cost, max_speculative_tokens)``.
    backend : {None, "triton", "native", "reference"}
        The implementation of the verification ops (chain and tree), as their ``backend``
        (:func:`specdec_kernels.verify_greedy`); ``None`` (default) is their automatic choice
        (``SPECDEC_BACKEND`` included). Every backend gives the same tokens (greedy: exactly).
        A vocabulary-sharded target verifies with its own ops, which take none.
    acceptance_prior : float
        ``"auto"``'s acceptance estimate of each row before any of its drafts is tested (worth
        4 tested drafts: :class:`~specdec_kernels.adaptive.AcceptanceTracker`), in ``(0, 1)``;
        default 0.7. It decides whether the first step drafts at all.

    Raises
    ------
    ValueError
        A bad ``num_speculative_tokens``, ``max_speculative_tokens``, cost, ``backend`` or
        ``acceptance_prior`` (named in the message), before any work.
    """

    def __init__(
        self,
        target,
        drafter=None,
        num_speculative_tokens: int | str = 4,
        *,
        max_speculative_tokens: int = 8,
        cost_ratio: float = 0.0,
        verify_cost: float = 0.0,
        costs: PassCosts | None = None,
        backend: str | None = None,
        acceptance_prior: float = AcceptanceTracker.prior,
    ):
        self.backend = check_backend(backend)
        auto = num_speculative_tokens == "auto"
        if isinstance(acceptance_prior, bool) or not (
            isinstance(acceptance_prior, (int, float)) and 0 < acceptance_prior < 1
        ):
            raise ValueError(f"acceptance_prior must be in (0, 1), got {acceptance_prior!r}")
        self.acceptance_prior = float(acceptance_prior)
        if not auto and (
            not isinstance(num_speculative_tokens, int)
            or isinstance(num_speculative_tokens, bool)
            or num_speculative_tokens < 1
        ):
            raise ValueError(
                "num_speculative_tokens must be an int >= 1 or 'auto', got "
                f"{num_speculative_tokens!r}"
            )
        if auto and (not isinstance(max_speculative_tokens, int) or max_speculative_tokens < 1):
            raise ValueError(
                f"max_speculative_tokens must be an int >= 1, got {max_speculative_tokens!r}"
            )
        if not cost_ratio >= 0:
            raise ValueError(f"cost_ratio must be >= 0, got {cost_ratio}")
        if not verify_cost >= 0:
            raise ValueError(f"verify_cost must be >= 0, got {verify_cost}")
        self.target, self.drafter, self.auto = target, drafter, auto
        self.max_k = (
            0 if drafter is None else (max_speculative_tokens if auto else num_speculative_tokens)
        )
        self.width = self.max_k  # most cache slots a step writes past the committed tokens
        tree = getattr(drafter, "tree", None)
        if tree is not None:  # a tree drafter: paths up to tree.depth, N - 1 nodes
            if auto:
                raise ValueError("num_speculative_tokens='auto' does not apply to token trees")
            if not hasattr(target, "compact"):
                raise ValueError(
                    f"token trees need a target adapter with tree support (extend(..., tree=), "
                    f"compact); {type(target).__name__} has none"
                )
            self.max_k, self.width = tree.depth, max(tree.num_nodes - 1, tree.num_fed)
        self.cost_ratio, self.verify_cost = cost_ratio, verify_cost
        if costs is not None and not isinstance(costs, PassCosts):
            raise ValueError(f"costs must be a PassCosts or None, got {type(costs).__name__}")
        self.costs = costs or PassCosts.linear(cost_ratio, verify_cost, max(self.max_k, 1))

    # ------------------------------------------------------------------------------ checks
    def check_prompts(self, prompts) -> list[list[int]]:
        """Token-id lists of ``prompts`` (lists or a ``[B, T]`` tensor); ``ValueError`` for an
        empty batch or row, ids outside the vocabulary, rows longer than the context."""
        if isinstance(prompts, torch.Tensor):
            if prompts.dim() != 2:
                raise ValueError(f"prompts tensor must be [B, T], got {list(prompts.shape)}")
            prompts = prompts.tolist()
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError(
                "prompts must be a non-empty list of token-id lists or a [B, T] tensor"
            )
        rows = [list(map(int, p)) for p in prompts]
        v, ctx = self.target.vocab_size, self.target.max_seq_len
        for b, row in enumerate(rows):
            if not row:
                raise ValueError(f"prompt {b} is empty")
            if ctx is not None and len(row) > ctx:
                raise ValueError(
                    f"prompt {b} has {len(row)} tokens, more than the model's context of {ctx}"
                )
            bad = [t for t in row if not 0 <= t < v]
            if bad:
                raise ValueError(f"prompt {b} has token ids outside [0, {v}): {bad[:5]}")
        return rows

    # ------------------------------------------------------------------------------ run
    @torch.inference_mode()
    def run(
        self,
        prompts,
        max_new_tokens: int,
        sampling: Sampling = Sampling(),
        *,
        eos_token_id: int | None = None,
        seed: int | None = None,
        progress=None,
        on_step=None,
        grammar=None,
    ) -> DecodeResult:
        """Generate up to ``max_new_tokens`` tokens for every prompt (see the module doc).

        ``progress(generated_tokens, live_rows)`` is called after each step's host sync.
        ``on_step(rows, start, count, logits, ver)`` is called after each step's commit, with
        device tensors and no sync: ``rows`` ``[B]`` (the live rows' indices in ``prompts``),
        ``start`` / ``count`` ``[B]`` (the step committed generated tokens ``start ..
        start + count - 1`` of each row, after the eos and budget cuts), the pass's target
        ``logits`` ``[B, W, V]`` and the verification ``ver`` (chains: emitted token ``j`` was
        decided at ``logits[:, j]``; trees: at node ``ver.accepted_nodes[:, j]``). The
        ``transformers`` integration collects ``scores`` with it.

        ``grammar``: ``None``, an ``xgrammar.CompiledGrammar`` for every row or a list of them,
        one per row (:mod:`specdec_kernels.grammar`), compiled for the target's vocabulary: the
        generated tokens of each row (not its prompt) are accepted by its grammar, or are a
        prefix of an accepted string when the budget ends; a row stops once its grammar has
        taken its stop token. ``ValueError`` for a bad grammar or a vocabulary mismatch, before
        any work.
        """
        if (
            not isinstance(max_new_tokens, int)
            or isinstance(max_new_tokens, bool)
            or max_new_tokens <= 0
        ):
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        v = self.target.vocab_size
        if eos_token_id is not None and not 0 <= eos_token_id < v:
            raise ValueError(f"eos_token_id {eos_token_id} is outside [0, {v})")
        rows_in = self.check_prompts(prompts)
        self._check_sampling(sampling)
        gs = None
        if grammar is not None:
            from specdec_kernels.grammar import GrammarState

            if getattr(self.target, "verify_ops", None) is not None:
                raise ValueError(
                    "grammar-constrained decoding with a vocabulary-sharded target is not supported"
                )
            gs = GrammarState(grammar, len(rows_in), v, self.target.device)
        start = time.perf_counter()
        if seed is None and hasattr(self.target, "shared_seed"):
            seed = self.target.shared_seed()  # the ranks of a sharded target must draw alike
        # every draw of the call (drafts and verification) is keyed by this seed, the row and
        # its position (rng.step_seeds): no generator state, batch invariant
        base_seed = (
            seed if seed is not None or sampling.greedy else int(torch.randint(0, 2**62, (1,)))
        )
        st, tracker = self._start(rows_in, max_new_tokens, sampling)
        stats = GenerationStats()
        steps: list[tuple[torch.Tensor, torch.Tensor]] = []  # (accepted, drafted) [B] a step
        results: dict[int, tuple] = {}  # row -> (tokens, from_draft, logprobs, top)
        done_tokens = 0  # generated tokens of retired rows
        kept = self._retire(st, tracker, (st.seq_len >= st.limit).tolist(), results, gs)
        # the first step drafts what the rows chose (with "auto" the prior's K, maybe 0), as
        # every later step does
        k_loop = int(_useful(st.num_draft, st).max()) if self.max_k else 0
        while kept is not None:
            st, tracker, _ = kept
            n, k = self._step(st, tracker, k_loop, sampling, eos_token_id, base_seed, on_step, gs)
            stats.target_forwards += 1
            if self.drafter is not None:
                stats.draft_forwards += self.drafter.forwards_per_step(k_loop)
            steps.append((n, k))  # counted once, at the end
            # ---- the one host sync of the step
            warm = self.drafter is not None and not self._draft_cold
            dvalue = self.drafter.sync_value() if warm else None
            parts = [
                st.seq_len >= st.limit,
                _useful(st.num_draft, st),
                st.seq_len - st.prompt_len,
                self.target.sync_value(),
            ] + ([] if dvalue is None else [dvalue])
            host = torch.stack([x.long() for x in parts]).tolist()
            done_tokens += sum(g for g, d in zip(host[2], host[0]) if d)
            kept = self._retire(st, tracker, host[0], results, gs)
            if kept is None:
                break
            order = kept[2]
            self.target.on_sync([host[3][i] for i in order])
            if dvalue is not None:
                self.drafter.on_sync([host[4][i] for i in order])
            k_loop = max(host[1][i] for i in order) if self.max_k else 0
            if progress is not None:
                progress(done_tokens + sum(host[2][i] for i in order), len(order))
        return self._finish(rows_in, results, steps, stats, start)

    def _check_sampling(self, sampling) -> None:
        """``ValueError`` for what ``sampling`` asks that this decoder cannot do."""
        if not isinstance(sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling, got {type(sampling).__name__}")
        if sampling.verify_method == "block" and getattr(self.drafter, "tree", None) is not None:
            raise ValueError(
                "verify_method='block' does not apply to token trees (a TreeDrafter): block "
                "verification is a chain rule; use verify_method='token'"
            )
        if getattr(self.target, "verify_ops", None) is not None and (
            sampling.logprob_kwargs or sampling.method_kwargs
        ):
            raise ValueError(
                "a vocabulary-sharded target verifies with its own ops, which take no "
                "logprobs and no verify_method='block'"
            )

    # ------------------------------------------------------------------------------ verbs
    def _start(self, rows_in: list[list[int]], max_new_tokens: int, sampling=Sampling()):
        """Per-row state and both caches prefilled with all but each prompt's last token."""
        dev, b, k = self.target.device, len(rows_in), self.max_k
        ctx = self.target.max_seq_len
        lens = [len(r) for r in rows_in]
        limits = [n + max_new_tokens if ctx is None else min(n + max_new_tokens, ctx) for n in lens]
        # sized by what rows can hold (a row stops at the context), not by the request: a step
        # writes up to k + 1 tokens past seq_len <= limit
        cap = max(limits) + k + 2
        tokens = torch.zeros(b, cap, dtype=torch.int64)
        for i, r in enumerate(rows_in):
            tokens[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
        st = _Rows(
            ids=torch.arange(b, device=dev),
            tokens=tokens.to(dev),
            from_draft=torch.zeros(b, cap, dtype=torch.bool, device=dev),
            seq_len=torch.tensor(lens, device=dev),
            prompt_len=torch.tensor(lens, device=dev),
            limit=torch.tensor(limits, device=dev),
            num_draft=torch.full((b,), k, dtype=torch.int64, device=dev),
        )
        if sampling.logprobs is not None:
            st.logprobs = torch.full((b, cap), -torch.inf, device=dev)
            if sampling.num_logprobs:
                n = sampling.num_logprobs
                st.top_values = torch.full((b, cap, n), -torch.inf, device=dev)
                st.top_ids = torch.full((b, cap, n), -1, dtype=torch.int64, device=dev)
        tracker = AcceptanceTracker.new(b, dev, prior=self.acceptance_prior)
        self._auto_rows = b  # the batch size "auto" last chose K for
        self._auto_age = 0  # steps since that choice
        self._auto_taught = 0  # steps that updated the acceptance estimate
        self._draft_cold = True  # not drafting yet
        if self.auto:  # the prior's choice until acceptance is measured: drafts wherever the
            # prior predicts any gain (PRIOR_MARGIN), so that the first steps measure it; the
            # rows priced at the prior's spread, as the batch waits for its slowest row
            left = st.limit - st.seq_len
            st.num_draft = self._auto_k(
                tracker, left, PRIOR_MARGIN, tracker.prior_spread(), cold_tokens=sum(lens)
            )
        self._probing = drafting = self.auto and bool(st.num_draft.any())  # see _step
        # the caches hold what the rows can reach (a row stops at its limit; a step writes up to
        # width tokens past it), not the model's whole context: a fresh cache is zero-filled, and
        # 16 rows of the bundled target's 256 positions took 7.4 ms to allocate where the 104 a
        # 64-token prompt and 32 new tokens reach took 0.36 (AMD EPYC, bfloat16)
        self._capacity = capacity = max(limits) + self.width + 2
        self.target.prefill([r[:-1] for r in rows_in], capacity)
        # a draft that "auto" will not use at this batch size (the prior predicts a loss) is
        # neither prefilled nor fed: the first step that drafts prefills it with the committed
        # rows then (after rows retire, say)
        self._draft_cold = self.drafter is not None and self.auto and not drafting
        if self.drafter is not None and not self._draft_cold:
            self.drafter.prefill(rows_in, capacity)
        return st, tracker

    def _step(
        self,
        st: _Rows,
        tracker,
        k_loop: int,
        sampling: Sampling,
        eos,
        base_seed,
        on_step=None,
        gs=None,
    ):
        """Draft, one target pass, verify, commit. Returns ``(num_accepted, k)``.

        The step's seeds ``[B]`` key the drafter's draws (``rng.PURPOSE_DRAFT``) and the
        verifier's (accept / sample): one stream per purpose, none shared. ``gs``: the rows'
        :class:`~specdec_kernels.grammar.GrammarState`, or ``None``."""
        dev = st.ids.device
        ctx = self.target.max_seq_len
        room = (
            st.num_draft
            if ctx is None
            else st.num_draft.clamp(max=(ctx - 1 - st.seq_len).clamp_min(0))
        )
        k = _useful(room, st).clamp(max=k_loop)  # [B]: tokens a path may add (chain, depth)
        seeds = None if sampling.greedy else rng.step_seeds(base_seed, st.ids, st.seq_len)
        if self.drafter is not None and k_loop == 0:
            self._draft_cold = True  # "auto" chose the target alone: the draft stops following
        if self.drafter is not None and k_loop > 0:
            if self._draft_cold:  # drafting again: the draft reads the committed rows afresh
                rows = [r[:n] for r, n in zip(st.tokens.tolist(), st.seq_len.tolist())]
                self.drafter.prefill(rows, self._capacity)
                self._draft_cold = False
            masked = gs is not None and getattr(self.drafter, "drafts_under_grammar", False)
            kw = {"grammar": gs} if masked else {}
            prop = self.drafter.propose(st.tokens, st.seq_len, k, k_loop, sampling, seeds, **kw)
        else:
            prop = ChainProposal(torch.zeros(st.ids.numel(), 0, dtype=torch.int64, device=dev), k)
        if gs is not None and prop.token_bitmask is None:
            prop.fill_bitmask(gs)
        if prop.draft_probs is not None:
            prop.draft_probs = verifiable(prop.draft_probs)
        cur = st.tokens.gather(1, (st.seq_len - 1)[:, None])  # [B, 1]
        logits = verifiable(prop.score(self.target, cur))  # [B, k_loop+1 or N, V(_r)]
        # a target sharded over the vocabulary verifies its V_r columns with its own ops
        ops = getattr(self.target, "verify_ops", None)
        ver = prop.verify(logits, sampling, seeds, ops, backend=self.backend)
        prop.keep(self.target, self.drafter, ver)
        before = None if on_step is None else st.seq_len.clone()  # [B]
        self._commit(st, ver, eos, gs)
        if on_step is not None:
            on_step(st.ids, before - st.prompt_len, st.seq_len - before, logits, ver)
        n, k = ver.num_accepted, prop.num_drafted  # [B], [B]
        rows = st.ids.numel()
        if k_loop > 0 or rows != self._auto_rows:  # a step without drafts teaches nothing:
            # the choice stands until the batch changes
            tracker.update(n, k, self._expected(logits, prop, sampling, n, ops, gs))
            self._auto_age += 1
            self._auto_taught += 1
            # a batch's choice (on the CPU PassCosts.finish_k: ~0.07 ms hot, ~0.3 ms right
            # after a target pass at batch 3; on a device finish_rates's ~50 small ops, ~0.4 ms
            # at batch 4) is renewed after each of the first AUTO_EVERY steps, while the
            # estimate leaves the prior, then every AUTO_EVERY steps and whenever the batch
            # changes; one row's (a few host ops) after every step
            early = rows == 1 or self._auto_taught <= AUTO_EVERY
            due = rows != self._auto_rows or self._auto_age >= (1 if early else AUTO_EVERY)
            if self.auto and due:
                # a run the prior started drafting goes on drafting for its first AUTO_EVERY
                # taught steps (the best K >= 1: K = 0 weighs nothing at a margin of -1), so that
                # a rejection or two in the first step, which pull a row's estimate far below
                # its acceptance, do not stop the draft for good (a stopped draft measures
                # nothing more: "auto" at batch 4 had stopped after one step, 0.95x of the
                # target alone where K = 4 measured 1.13x)
                probe = self._probing and self._auto_taught < AUTO_EVERY
                left = st.limit - st.seq_len
                # the tokens a stopped draft would read first (on the CPU: no sync)
                cpu = st.seq_len.device.type == "cpu"
                cold = int(st.seq_len.sum()) if self._draft_cold and cpu else 0
                st.num_draft = self._auto_k(tracker, left, -1.0 if probe else None, None, cold)
                self._auto_rows, self._auto_age = rows, 0
        return n, k

    def _expected(self, logits, prop, sampling: Sampling, n, ops, gs):
        """``[B]``: the step's expected passed accept tests over the positions it tested
        (:func:`~specdec_kernels.adaptive.expected_accepts`), what ``"auto"``'s estimate
        counts where a chain was verified on the CPU by token-level rejection sampling of the
        full vocabulary; ``None`` elsewhere (greedy steps, whose tests are not coins; block
        verification, which passes more; trees; a grammar's masks; a vocabulary-sharded
        target; a device, where it would be the reference's ``[B, K, V]`` softmax in PyTorch
        ops, the materialisation the verification kernels avoid): the tracker counts the
        accepted drafts."""
        counted = (
            self.auto
            and not sampling.greedy
            and sampling.verify_method == "token"
            and ops is None
            and gs is None
            and logits.device.type == "cpu"
            and isinstance(prop, ChainProposal)
            and prop.draft_probs is not None
        )
        if not counted:
            return None
        return expected_accepts(
            logits,
            prop.draft_probs,
            n,
            prop.num_draft,
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
        )

    def _auto_k(
        self,
        tracker,
        left: torch.Tensor,
        margin: float | None = None,
        alpha=None,
        cold_tokens: int = 0,
    ) -> torch.Tensor:
        """``[B]``: the batch's ``K`` for rows with ``left`` ``[B]`` tokens to go: the fastest
        to finish them all (:meth:`PassCosts.finish_rates`), on the device: the step's one
        sync reads it with the rest (on the CPU: the same choice from host floats,
        :meth:`PassCosts.finish_k`). ``K = 0`` unless drafting is predicted to gain ``margin``.
        ``alpha`` ``[B]``: the rows' acceptance, by default ``tracker``'s estimate.

        By default (``margin=None``) a draft that is not running restarts where it gains
        ``DRAFT_MARGIN`` at the estimate; a running one goes on with the best ``K >= 1`` at the
        estimate unless it loses (gains under ``STOP_MARGIN``) even at the estimate's upper
        bound (``STOP_OPTIMISM`` deviations of the batch's mean estimate, each row's estimate
        raised by ``STOP_OPTIMISM / sqrt(B)`` of its own): the stop is final while the batch is
        unchanged, and is not taken on an early run of rejections.

        A draft that is not running starts only where the time it is predicted to save over
        the rows' ``left`` tokens exceeds its prefill of the ``cold_tokens`` it must read first
        (:attr:`PassCosts.draft_prefill_ms` a token; on the CPU, where the choice is made from
        host floats)."""
        running = self.drafter is not None and not self._draft_cold
        # on the CPU the estimate as host floats (one read of the counts, not a dozen small
        # tensor ops: a one-row loop renews its choice after every step)
        host = alpha is None and tracker.accepted.device.type == "cpu"
        estimate = tracker.host_alpha if host else tracker.alpha
        alpha = estimate() if alpha is None else alpha  # [B]
        if margin is not None or not running:
            k = self._choose_k(alpha, left, DRAFT_MARGIN if margin is None else margin)
            if running or cold_tokens <= 0 or self.costs.draft_prefill_ms <= 0:
                return k
            return self._unless_prefill_costs_more(k, alpha, left, cold_tokens)
        if host:  # one evaluation where the estimate itself gains STOP_MARGIN
            rows, ahead = left.numel(), left.tolist()
            values = self.costs.finish_values(alpha, ahead, self.max_k)
            best = pick_k_host(values, -1.0)  # the best K >= 1 at the estimate
            if values[best] <= values[0] * (1.0 + STOP_MARGIN):  # not at the estimate: the bound
                bound = estimate(STOP_OPTIMISM / math.sqrt(rows))
                if self.costs.finish_k(bound, ahead, self.max_k, STOP_MARGIN) == 0:
                    best = 0
            # (a gain at the estimate is a gain at its upper bound: each K >= 1 yields more
            # tokens a step the higher the acceptance, at the same cost; the bound's evaluation,
            # as long as the estimate's at batch 4, is skipped: ~0.07-0.3 ms a choice there)
            return torch.full((rows,), best, dtype=torch.int64)
        # the bound of the batch's gain: its rows' estimates are independent, their mean has
        # 1 / sqrt(B) of one row's deviation (a row's own bound kept 16 rows drafting a loss)
        bound = estimate(STOP_OPTIMISM / math.sqrt(left.numel()))
        goes_on = self._choose_k(bound, left, STOP_MARGIN) > 0  # no sync
        k = self._choose_k(alpha, left, -1.0)
        return torch.where(goes_on, k, torch.zeros_like(k))

    def _unless_prefill_costs_more(self, k, alpha, left, cold_tokens: int) -> torch.Tensor:
        """``k`` ``[B]`` (one ``K`` for the batch), or zeros where starting the draft at that
        ``K`` is predicted to save less time until the last row is done
        (:meth:`PassCosts.finish_ms`) than its prefill of ``cold_tokens`` costs. Host floats
        only: on a device the choice stands."""
        kk = int(k.max()) if k.device.type == "cpu" else 0
        if kk == 0:
            return k
        a = alpha if isinstance(alpha, list) else alpha.tolist()
        times = self.costs.finish_ms(a, left.tolist(), kk)
        if times[0] - times[kk] > self.costs.draft_prefill_ms * cold_tokens:
            return k
        return torch.zeros_like(k)

    def _choose_k(self, alpha, left: torch.Tensor, margin: float) -> torch.Tensor:
        """``[B]``: the one ``K`` of :meth:`PassCosts.finish_rates` for acceptance ``alpha``
        (``[B]``, or host floats), ``K = 0`` unless another gains ``margin`` (``-1``: the best
        ``K >= 1``)."""
        if isinstance(alpha, list) or alpha.device.type == "cpu":  # the choice from host floats
            a = alpha if isinstance(alpha, list) else alpha.tolist()  # on the CPU: no sync
            k = self.costs.finish_k(a, left.tolist(), self.max_k, margin)
            return torch.full((len(a),), k, dtype=torch.int64)
        rates = self.costs.finish_rates(alpha.float(), left, self.max_k)  # [K+1]
        return pick_k(rates, margin).expand(alpha.numel()).clone()

    @staticmethod
    def _commit(st: _Rows, ver, eos, gs=None) -> None:
        """Append the emitted tokens, cut at the row's limit and at its first eos (after which
        the row is done: ``limit`` drops to its length); under a grammar (``gs``) the matchers
        take the kept tokens, and a row whose grammar ended is cut after its stop token and
        done likewise."""
        width = ver.tokens.shape[1]
        j = torch.arange(width, device=st.ids.device)
        keep = torch.minimum(ver.num_emitted, st.limit - st.seq_len)  # [B]
        if eos is not None:
            is_eos = (ver.tokens == eos) & (j[None] < keep[:, None])
            first = torch.where(is_eos, j[None], width).amin(-1)
            hit = first < keep
            keep = torch.where(hit, first + 1, keep)
            st.limit = torch.where(hit, st.seq_len + keep, st.limit)
        if gs is not None:
            ended = gs.advance(ver.tokens, keep)  # [B] bool
            keep = torch.where(ended, gs.num_advanced.to(keep.device), keep)
            st.limit = torch.where(ended, st.seq_len + keep, st.limit)
        pos = st.seq_len[:, None] + j  # [B, width]
        st.tokens.scatter_(1, pos, ver.tokens.clamp_min(0))
        st.from_draft.scatter_(1, pos, j[None] < ver.num_accepted[:, None])
        if st.logprobs is not None:  # in step with the tokens; the cut is seq_len's
            st.logprobs.scatter_(1, pos, ver.logprobs)
        if st.top_values is not None:
            at = pos[..., None].expand_as(ver.top_logprobs)
            st.top_values.scatter_(1, at, ver.top_logprobs)
            st.top_ids.scatter_(1, at, ver.top_ids)
        st.seq_len = st.seq_len + keep

    def _retire(self, st: _Rows, tracker, done: list, results: dict, gs=None):
        """Collect finished rows and keep the others (caches and matchers included). Returns
        ``(state, tracker, order)``, or ``None`` when no row is left."""
        if not any(done):
            return st, tracker, list(range(len(done)))
        gone = torch.tensor([i for i, d in enumerate(done) if d], device=st.ids.device)
        ids, toks, fd, sl = (
            t.tolist()
            for t in (st.ids[gone], st.tokens[gone], st.from_draft[gone], st.seq_len[gone])
        )
        pl = st.prompt_len[gone].tolist()
        lp, tv, ti = (None if t is None else t[gone].cpu() for t in st.serving_tensors())
        for i, row in enumerate(ids):
            span = slice(pl[i], sl[i])  # the generated positions
            results[row] = (
                toks[i][: sl[i]],
                fd[i][: sl[i]],
                None if lp is None else lp[i, span].clone(),
                None if tv is None else TopLogprobs(tv[i, span].clone(), ti[i, span].clone()),
            )
        if all(done):
            return None
        order = swap_remove_order([bool(d) for d in done])
        order_t = torch.tensor(order, device=st.ids.device)
        self.target.select(order_t)
        if self.drafter is not None and not self._draft_cold:
            self.drafter.select(order_t)
        if gs is not None:
            gs.select(order)
        return st.select(order_t), tracker.select(order_t), order

    def _finish(self, rows_in, results, steps, stats: GenerationStats, start) -> DecodeResult:
        n = torch.cat([a for a, _ in steps]).cpu() if steps else torch.zeros(0, dtype=torch.int64)
        drafted = int(torch.cat([k for _, k in steps]).sum()) if steps else 0
        accepted = int(n.sum())
        hist = torch.bincount(n, minlength=self.max_k + 1)[: self.max_k + 1].tolist()
        lens = [len(r) for r in rows_in]
        seqs = [results[b][0] for b in range(len(rows_in))]
        from_draft = [results[b][1][lens[b] :] for b in range(len(rows_in))]
        logprobs = [results[b][2] for b in range(len(rows_in))]
        top = [results[b][3] for b in range(len(rows_in))]
        stats.wall_seconds = time.perf_counter() - start
        stats.accepted_histogram = hist
        stats.accepted_tokens, stats.drafted_tokens = accepted, drafted
        passes = sum(hist)
        stats.mean_accepted = accepted / max(passes, 1)
        stats.acceptance_rate = accepted / max(drafted, 1)
        stats.generated_tokens = sum(len(s) - n for s, n in zip(seqs, lens))
        stats.tokens_per_second = stats.generated_tokens / max(stats.wall_seconds, 1e-9)
        return DecodeResult(
            seqs,
            from_draft,
            stats,
            None if logprobs[0] is None else logprobs,
            None if top[0] is None else top,
        )


def verifiable(x: torch.Tensor | None) -> torch.Tensor | None:
    """``x`` as the verification ops take it: float32/bfloat16/float16 pass through, other
    floats (float64 test models) are cast to float32."""
    if x is None or x.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return x
    return x.float()
