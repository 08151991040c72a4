"""The decoding loop: draft -> one target pass -> verify -> commit -> retire.

Vocabulary of this file: a *row* is one sequence of the caller's batch; *live* rows are still
generating; a *step* is one target pass; ``k_loop`` (host int) is the number of draft slots of a
step, ``k`` (``[B]``) the real draft tokens of each row (``<= k_loop``); *committed* tokens are
the prompt and everything emitted so far (``tokens[b, :seq_len[b]]``).

Every row keeps its own length, budget (``limit``), draft count and seed; finished rows are
retired from the batch (caches included), so they cost no more work. The loop synchronises with
the device once per step (:class:`_Sync`), to learn which rows are done and the next ``k_loop``.
How many tokens a step drafts is the policy's (:mod:`specdec_kernels.decoding.policy`): the loop
asks it once at the start of a run and after every step, and keeps what it learns in the run's
state (:class:`_Run`), so a :class:`Decoder` holds configuration only.

Under a grammar (``run(..., grammar=)``; docs/serving.md) each row has an xgrammar matcher
(:class:`specdec_kernels.grammar.GrammarState`, on the host): the proposal carries the masks of
its positions, verification applies them in the op (``token_bitmask=``), the commit advances the
matchers by the kept tokens, and a row whose grammar has ended is done as at eos. The matchers
read the drafts and the emitted tokens on the host: a few more transfers per step.

References: Leviathan et al. 2023 (https://arxiv.org/abs/2211.17192), Chen et al. 2023
(https://arxiv.org/abs/2302.01318); gpt-fast's ``speculative_decode``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdec_kernels._dispatch import check_backend
from specdec_kernels.decoding.policy import AutoK, FixedK
from specdec_kernels.decoding.proposals import ChainProposal
from specdec_kernels.decoding.sampling import (
    DecodeResult,
    GenerationStats,
    Sampling,
    TopLogprobs,
    collect,
)
from specdec_kernels.reference import rng
from specdec_kernels.tuning import AcceptanceTracker, PassCosts, expected_accepts

__all__ = ["DecodeResult", "Decoder", "GenerationStats", "Sampling", "TopLogprobs"]


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


@dataclass
class _Run:
    """One run's state: the live rows, the policy's state, and the draft's."""

    rows: _Rows
    policy: object  # what the K policy learns during the run (its first() made it)
    capacity: int  # cache slots of a row
    draft_cold: bool  # the draft does not follow the rows (not prefilled, or stopped)


class _Sync(NamedTuple):
    """The step's one host read, one entry per live row."""

    done: list[int]  # 1 where the row has reached its limit (budget, context, eos, grammar)
    useful: list[int]  # drafts its next step can keep (the next k_loop is their maximum)
    generated: list[int]  # tokens it has generated
    target: list[int]  # the target adapter's sync_value()
    draft: list[int] | None  # the drafter's, while it follows the rows

    @classmethod
    def read(cls, st: _Rows, target_value, draft_value) -> _Sync:
        parts = [st.seq_len >= st.limit, _useful(st.num_draft, st), st.seq_len - st.prompt_len]
        parts += [target_value] + ([] if draft_value is None else [draft_value])
        host = torch.stack([x.long() for x in parts]).tolist()  # the sync
        return cls(*host) if draft_value is not None else cls(*host, None)


@dataclass(frozen=True)
class Capabilities:
    """What the loop's collaborators offer beyond the protocols' required verbs (the optional
    members of :class:`~specdec_kernels.decoding.adapters.CachedModel` and
    :class:`~specdec_kernels.decoding.drafters.Drafter`), read once."""

    tree: object | None  # the drafter's token-tree shape (a TreeDrafter), else None
    compacts: bool  # the target keeps a tree's accepted path (compact, extend(..., tree=))
    verify_ops: tuple | None  # a sharded target's (verify_greedy, verify_sampling)
    shared_seed: Callable[[], int] | None  # a sharded target's seed for every rank
    drafts_under_grammar: bool  # the drafter masks its own drafts under a grammar

    @classmethod
    def of(cls, target, drafter) -> Capabilities:
        return cls(
            tree=getattr(drafter, "tree", None),
            compacts=hasattr(target, "compact"),
            verify_ops=getattr(target, "verify_ops", None),
            shared_seed=getattr(target, "shared_seed", None),
            drafts_under_grammar=bool(getattr(drafter, "drafts_under_grammar", False)),
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

    A decoder holds configuration only (every run keeps its own state), so one serves every
    call of a :class:`~specdec_kernels.SpeculativeGenerator`; its adapters hold the caches of
    the run in progress, so it runs one call at a time.

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
        ``K >= 1`` (:class:`~specdec_kernels.decoding.policy.FixedK`), or ``"auto"``
        (:class:`~specdec_kernels.decoding.policy.AutoK`): before each step, the ``K`` in
        ``0 .. max_speculative_tokens`` that finishes the live batch soonest under ``costs``
        (:meth:`specdec_kernels.tuning.PassCosts.finish_ms`), from the rows' accepted counts;
        ``K = 0`` decodes with the target alone while drafting would not pay. Never from timings
        taken while generating, so the same seed gives the same tokens on every call.
    cost_ratio : float
        Draft cost per token over target cost per pass (``"auto"`` without ``costs``).
    verify_cost : float
        The target's extra cost per verified draft token, in one-token passes (``"auto"``
        without ``costs``; 0 where a ``K+1``-token pass costs one token's, as on a GPU).
    costs : PassCosts, optional
        Measured pass costs of the pair (:func:`specdec_kernels.tuning.measure_pass_costs`),
        which price each batch size; default: the batch-blind
        ``PassCosts.linear(cost_ratio, verify_cost, max_speculative_tokens)``.
    backend : {None, "triton", "native", "reference"}
        The implementation of the verification ops (chain and tree), as their ``backend``
        (:func:`specdec_kernels.verify_greedy`); ``None`` (default) is their automatic choice
        (``SPECDEC_BACKEND`` included). Every backend gives the same tokens (greedy: exactly).
        A vocabulary-sharded target verifies with its own ops, which take none.
    acceptance_prior : float
        ``"auto"``'s acceptance estimate of each row before any of its drafts is tested (worth
        8 tested drafts: :class:`~specdec_kernels.tuning.AcceptanceTracker`), in ``(0, 1)``;
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
        if costs is not None and not isinstance(costs, PassCosts):
            raise ValueError(f"costs must be a PassCosts or None, got {type(costs).__name__}")
        self.target, self.drafter = target, drafter
        self.caps = caps = Capabilities.of(target, drafter)
        k = max_speculative_tokens if auto else num_speculative_tokens
        self.max_k = self.width = 0 if drafter is None else k  # width: slots a step writes
        if caps.tree is not None:  # a tree drafter: paths up to tree.depth, N - 1 nodes
            if auto:
                raise ValueError("num_speculative_tokens='auto' does not apply to token trees")
            if not caps.compacts:
                raise ValueError(
                    f"token trees need a target adapter with tree support (extend(..., tree=), "
                    f"compact); {type(target).__name__} has none"
                )
            self.max_k, self.width = (
                caps.tree.depth,
                max(caps.tree.num_nodes - 1, caps.tree.num_fed),
            )
        costs = costs or PassCosts.linear(cost_ratio, verify_cost, max(self.max_k, 1))
        self.policy = (
            AutoK(costs, self.max_k, float(acceptance_prior))
            if auto and drafter is not None
            else FixedK(self.max_k)
        )

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

            if self.caps.verify_ops is not None:
                raise ValueError(
                    "grammar-constrained decoding with a vocabulary-sharded target is not supported"
                )
            gs = GrammarState(grammar, len(rows_in), v, self.target.device)
        start = time.perf_counter()
        if seed is None and self.caps.shared_seed is not None:
            seed = self.caps.shared_seed()  # the ranks of a sharded target must draw alike
        # every draw of the call (drafts and verification) is keyed by this seed, the row and
        # its position (rng.position_seeds): no generator state, batch invariant
        base_seed = (
            seed if seed is not None or sampling.greedy else int(torch.randint(0, 2**62, (1,)))
        )
        run = self._start(rows_in, max_new_tokens, sampling)
        stats = GenerationStats()
        steps: list[tuple[torch.Tensor, torch.Tensor]] = []  # (accepted, drafted) [B] a step
        results: dict[int, tuple] = {}  # row -> (tokens, from_draft, logprobs, top)
        done_tokens = 0  # generated tokens of retired rows
        st = run.rows
        order = self._retire(run, (st.seq_len >= st.limit).tolist(), results, gs)
        # the first step drafts what the policy chose (with "auto" the prior's K, maybe 0), as
        # every later step does
        k_loop = int(_useful(st.num_draft, st).max()) if self.max_k else 0
        while order is not None:
            n, k = self._step(run, k_loop, sampling, eos_token_id, base_seed, on_step, gs)
            stats.target_forwards += 1
            if self.drafter is not None:
                stats.draft_forwards += self.drafter.forwards_per_step(k_loop)
            steps.append((n, k))  # counted once, at the end
            warm = self.drafter is not None and not run.draft_cold
            dvalue = self.drafter.sync_value() if warm else None
            sync = _Sync.read(run.rows, self.target.sync_value(), dvalue)  # the step's one sync
            done_tokens += sum(g for g, d in zip(sync.generated, sync.done) if d)
            order = self._retire(run, sync.done, results, gs)
            if order is None:
                break
            self.target.on_sync([sync.target[i] for i in order])
            if sync.draft is not None:
                self.drafter.on_sync([sync.draft[i] for i in order])
            k_loop = max(sync.useful[i] for i in order) if self.max_k else 0
            if progress is not None:
                progress(done_tokens + sum(sync.generated[i] for i in order), len(order))
        return collect(rows_in, results, steps, stats, start, self.max_k)

    def _check_sampling(self, sampling) -> None:
        """``ValueError`` for what ``sampling`` asks that this decoder cannot do."""
        if not isinstance(sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling, got {type(sampling).__name__}")
        if sampling.verify_method == "block" and self.caps.tree is not None:
            raise ValueError(
                "verify_method='block' does not apply to token trees (a TreeDrafter): block "
                "verification is a chain rule; use verify_method='token'"
            )
        if self.caps.verify_ops is not None and (sampling.logprob_kwargs or sampling.method_kwargs):
            raise ValueError(
                "a vocabulary-sharded target verifies with its own ops, which take no "
                "logprobs and no verify_method='block' or 'match'"
            )
        procs = [
            name
            for name, on in (
                ("min_p", bool(sampling.min_p)),
                ("logit_bias / repetition_penalty / presence_penalty / frequency_penalty",
                 sampling.processes_logits),
                ("verify_method='match'", sampling.verify_method == "match"),
            )
            if on
        ]  # fmt: skip
        if procs and self.caps.tree is not None:
            raise ValueError(
                f"{procs[0]} is not supported with token trees (a TreeDrafter): the tree "
                "verification ops take no logit processors; use a chain drafter"
            )
        if procs and self.caps.verify_ops is not None:
            raise ValueError(
                f"{procs[0]} is not supported with a vocabulary-sharded target (its "
                "verification ops take no logit processors)"
            )

    # ------------------------------------------------------------------------------ verbs
    def _start(self, rows_in: list[list[int]], max_new_tokens: int, sampling=Sampling()) -> _Run:
        """The run's state, the policy's first choice, and the caches prefilled with all but
        each prompt's last token (the draft's only where that choice drafts)."""
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
        state, st.num_draft, drafting = self.policy.first(st, st.limit - st.seq_len, sum(lens))
        # the caches hold what the rows can reach (a row stops at its limit; a step writes up to
        # width tokens past it), not the model's whole context: a fresh cache is zero-filled, and
        # 16 rows of the bundled target's 256 positions took 7.4 ms to allocate where the 104 a
        # 64-token prompt and 32 new tokens reach took 0.36 (AMD EPYC, bfloat16)
        capacity = max(limits) + self.width + 2
        self.target.prefill([r[:-1] for r in rows_in], capacity)
        # a draft the policy will not use at this batch size (the prior predicts a loss) is
        # neither prefilled nor fed: the first step that drafts prefills it with the committed
        # rows then (after rows retire, say)
        cold = self.drafter is not None and not drafting
        if self.drafter is not None and not cold:
            self.drafter.prefill(rows_in, capacity)
        return _Run(st, state, capacity, cold)

    def _step(self, run: _Run, k_loop: int, sampling: Sampling, eos, base_seed, on_step, gs):
        """Draft, one target pass, verify, commit; the policy learns from the step. Returns
        ``(num_accepted, k)``.

        The step's seeds ``[B]`` key the drafter's draws (``rng.PURPOSE_DRAFT``) and the
        verifier's (accept / sample): one stream per purpose, none shared. ``gs``: the rows'
        :class:`~specdec_kernels.grammar.GrammarState`, or ``None``."""
        st, dev, ctx = run.rows, run.rows.ids.device, self.target.max_seq_len
        room = (
            st.num_draft
            if ctx is None
            else st.num_draft.clamp(max=(ctx - 1 - st.seq_len).clamp_min(0))
        )
        k = _useful(room, st).clamp(max=k_loop)  # [B]: tokens a path may add (chain, depth)
        seeds = None if sampling.greedy else rng.position_seeds(base_seed, st.ids, st.seq_len)
        if self.drafter is not None and k_loop == 0:
            run.draft_cold = True  # the policy chose the target alone: the draft stops following
        if self.drafter is not None and k_loop > 0:
            if run.draft_cold:  # drafting again: the draft reads the committed rows afresh
                rows = [r[:n] for r, n in zip(st.tokens.tolist(), st.seq_len.tolist())]
                self.drafter.prefill(rows, run.capacity)
                run.draft_cold = False
            kw = {"grammar": gs} if gs is not None and self.caps.drafts_under_grammar else {}
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
        ops = self.caps.verify_ops
        context = None
        if sampling.processes_logits:  # the penalties count each row's tokens so far
            held = torch.arange(st.tokens.shape[1], device=dev)[None, :] < st.seq_len[:, None]
            context = torch.where(held, st.tokens, -1)  # [B, cap]
        ver = prop.verify(logits, sampling, seeds, ops, backend=self.backend, context=context)
        prop.keep(self.target, self.drafter, ver)
        before = None if on_step is None else st.seq_len.clone()  # [B]
        self._commit(st, ver, eos, gs)
        if on_step is not None:
            on_step(st.ids, before - st.prompt_len, st.seq_len - before, logits, ver)
        n, k = ver.num_accepted, prop.num_drafted  # [B], [B]
        running = self.drafter is not None and not run.draft_cold
        chosen = self.policy.after_step(
            run.policy, st, n, k, k_loop, running,
            lambda: self._expected(logits, prop, sampling, n, ops, gs),
        )  # fmt: skip
        if chosen is not None:
            st.num_draft = chosen
        return n, k

    def _expected(self, logits, prop, sampling: Sampling, n, ops, gs):
        """``[B]``: the step's expected passed accept tests over the positions it tested
        (:func:`~specdec_kernels.tuning.expected_accepts`), what ``"auto"``'s estimate
        counts where a chain was verified on the CPU by token-level rejection sampling of the
        full vocabulary; ``None`` elsewhere (greedy steps, whose tests are not coins; block
        verification, which passes more; trees; a grammar's masks; a vocabulary-sharded
        target; a device, where it would be the reference's ``[B, K, V]`` softmax in PyTorch
        ops, the materialisation the verification kernels avoid): the tracker counts the
        accepted drafts."""
        counted = (
            not sampling.greedy
            and sampling.verify_method == "token"
            and not sampling.processes_logits
            and not sampling.min_p
            and ops is None
            and gs is None
            and logits.device.type == "cpu"
            and isinstance(prop, ChainProposal)
            and prop.draft_probs is not None
        )
        if not counted:
            return None
        return expected_accepts(
            logits, prop.draft_probs, n, prop.num_draft, **sampling.filter_kwargs
        )

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

    def _retire(self, run: _Run, done: list, results: dict, gs=None) -> list[int] | None:
        """Collect finished rows and keep the others (caches, matchers and the policy's state
        included). Returns the order of the kept rows, or ``None`` when no row is left."""
        if not any(done):
            return list(range(len(done)))
        st = run.rows
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
        if self.drafter is not None and not run.draft_cold:
            self.drafter.select(order_t)
        if gs is not None:
            gs.select(order)
        run.rows = st.select(order_t)
        run.policy = self.policy.select(run.policy, order_t)
        return order


def verifiable(x: torch.Tensor | None) -> torch.Tensor | None:
    """``x`` as the verification ops take it: float32/bfloat16/float16 pass through, other
    floats (float64 test models) are cast to float32."""
    if x is None or x.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return x
    return x.float()
