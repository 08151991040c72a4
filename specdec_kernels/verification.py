"""Public verification ops: :func:`verify_greedy`, :func:`verify_sampling`, :func:`verify_typical`,
:func:`accept_reject`.

The three chain verifications are one ``torch.library`` custom op,
``torch.ops.specdec.verify_chain`` (called from a checked record, :class:`ChainCall`), and
:func:`accept_reject` is ``torch.ops.specdec.accept_reject``; each has a fake implementation of the
same signature, so ``torch.compile(fullgraph=True)`` traces through them (with ``validate=False``).
The Python functions here parse their arguments once (:func:`parse_chain` for the padded chain
calls): check them, turn scalars into per-row tensors, pick the backend
(:func:`specdec_kernels._dispatch.resolve_backend`); then they call the op, whose body is one
lookup in the routing table (:func:`specdec_kernels._dispatch.kernel`). The chain op takes
every input form: padded ``[B, K+1, V]`` rows or vLLM's flattened layout
(``cu_num_draft_tokens=``, read in place through per-row offsets), logits or probabilities (the
drop-in adapters of :mod:`specdec_kernels.compat`).

Vocabulary (vLLM's rejection sampler's, used for chains and trees throughout the package, in
docstrings, comments and local names; public argument names keep their own):

*accepted*
    the draft tokens the target keeps: the longest prefix of a row's ``k_b`` drafts (a path of
    a tree) that passes verification, ``num_accepted[b]`` of them, ``0 <= num_accepted <= k_b``.
*recovered*
    the token the target supplies at the first rejection: sampled from the residual
    ``norm(max(0, p - q))`` (the target's argmax in greedy verification, a draw from ``p`` in
    typical acceptance or where the residual has no mass).
*bonus*
    the token the target supplies after all ``k_b`` drafts were accepted (at a tree's leaf):
    sampled from (greedy: the argmax of) the target's distribution at position ``k_b``.
*emitted*
    what a row outputs per step: the accepted drafts, then exactly one recovered or bonus token,
    ``num_emitted = num_accepted + 1``. Code that treats the recovered and the bonus token alike
    names it ``recovered_or_bonus``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from specdec_kernels import _processors as processors
from specdec_kernels import _validate as check
from specdec_kernels._dispatch import fused_kernel, kernel, resolve_backend
from specdec_kernels.logprobs import emitted_logprobs
from specdec_kernels.reference import rng


class Verification(NamedTuple):
    """The result of a verification step.

    Attributes
    ----------
    tokens : Tensor
        `[B, K+1]` int64. Row ``b`` holds ``num_emitted[b]`` tokens left-aligned (the accepted
        draft tokens, then the recovered or bonus token), then ``-1``.
    num_accepted : Tensor
        `[B]` int64, ``0 <= num_accepted[b] <= num_draft_tokens[b]``.
    num_emitted : Tensor
        `[B]` int64, always ``num_accepted + 1``.
    logprobs : Tensor or None
        With ``logprobs="raw"|"processed"``: `[B, K+1]` float32, the log-probability of each
        emitted token (``-inf`` at padding); else ``None``.
    top_logprobs, top_ids : Tensor or None
        With ``num_logprobs = n > 0``: `[B, K+1, n]` float32 / int64, the ``n`` most likely
        tokens of the same distribution at each emitted position, most likely first, ties by the
        lower id (``-inf`` / ``-1`` at padding and past the tokens with nonzero probability).
    """

    tokens: Tensor
    num_accepted: Tensor
    num_emitted: Tensor
    logprobs: Tensor | None = None
    top_logprobs: Tensor | None = None
    top_ids: Tensor | None = None


# --- the custom ops --------------------------------------------------------------------------


#: ``verify_sampling``'s acceptance rules: token by token, block verification, or the target's
#: own sample at every position (``"match"``).
METHODS = ("token", "block", "match")
#: The chain op's mode of each acceptance rule (``"match"`` runs the sampling mode with no
#: drafts at every position: :meth:`ChainCall.run`).
_RULES = {"token": "sampling", "block": "block", "match": "match"}
#: The low 63 bits: seeds are non-negative int64.
_SEED_MASK = (1 << 63) - 1
#: The routing table's kernel of each chain mode other than greedy and sampling.
_CHAIN_KERNELS = {"block": "verify_block", "typical": "verify_typical"}


def _chain(
    target_logits: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    num_draft_tokens: Tensor,
    temperature: Tensor | None,
    top_k: Tensor | None,
    top_p: Tensor | None,
    seeds: Tensor | None,
    logits_row_start: Tensor | None,
    probs_row_start: Tensor | None,
    token_bitmask: Tensor | None,
    mode: str,
    log_input: bool,
    posterior_threshold: float,
    posterior_alpha: float,
    min_p: Tensor | None,
    edit_ids: Tensor | None,
    edit_vals: Tensor | None,
    draft_vocab_inv: Tensor | None,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """One verification step in every input form (:class:`ChainCall` documents the arguments;
    :func:`specdec_kernels.reference.verify_chain.verify_chain` is the specification)."""
    op = _CHAIN_KERNELS.get(mode, "verify_chain")
    tokens, accepted = kernel(op, backend)(
        target_logits, draft_tokens, draft_probs, num_draft_tokens, temperature, top_k, top_p,
        seeds, logits_row_start, probs_row_start, token_bitmask, mode, log_input,
        posterior_threshold, posterior_alpha, min_p, edit_ids, edit_vals, draft_vocab_inv,
    )  # fmt: skip
    return tokens, accepted, accepted + 1


_verify_chain_op = torch.library.custom_op("specdec::verify_chain", _chain, mutates_args=())


@_verify_chain_op.register_fake
def _(target_logits, draft_tokens, *args):
    b, k = draft_tokens.shape
    tokens = target_logits.new_empty((b, k + 1), dtype=torch.int64)
    return tokens, tokens.new_empty((b,)), tokens.new_empty((b,))


def _chain_logprobs(
    target_logits: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    num_draft_tokens: Tensor,
    temperature: Tensor | None,
    top_k: Tensor | None,
    top_p: Tensor | None,
    seeds: Tensor | None,
    logits_row_start: Tensor | None,
    probs_row_start: Tensor | None,
    token_bitmask: Tensor | None,
    mode: str,
    log_input: bool,
    posterior_threshold: float,
    posterior_alpha: float,
    min_p: Tensor | None,
    edit_ids: Tensor | None,
    edit_vals: Tensor | None,
    draft_vocab_inv: Tensor | None,
    processed: bool,
    num_logprobs: int,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One verification step and the log-probabilities of what it emits (``processed``: of the
    distribution it samples from, else ``log_softmax`` of the logits; ``num_logprobs = n``: the
    ``n`` most likely tokens too): ``(tokens, accepted, emitted, logprobs [B, K+1],
    top_logprobs [B, K+1, n], top_ids [B, K+1, n])``. Where the backend verifies and scores in
    one pass (:func:`specdec_kernels._dispatch.fused_kernel`), its kernel; else the chain op's
    kernel, then ``emitted_logprobs``'s over the emitted rows (a second read of them)."""
    args = (
        target_logits, draft_tokens, draft_probs, num_draft_tokens, temperature, top_k, top_p,
        seeds, logits_row_start, probs_row_start, token_bitmask, mode, log_input,
        posterior_threshold, posterior_alpha, min_p, edit_ids, edit_vals, draft_vocab_inv,
    )  # fmt: skip
    fused = fused_kernel("verify_chain_logprobs", backend, mode)
    if fused is not None:
        tokens, accepted, lp, top, ids = fused(*args, processed, num_logprobs)
        return tokens, accepted, accepted + 1, lp, top, ids
    tokens, accepted, emitted = _chain(*args, backend)
    lp, top, ids = _emitted_scores(
        target_logits, logits_row_start, tokens, emitted, mode,
        "processed" if processed else "raw", num_logprobs, backend, token_bitmask, temperature,
        top_k, top_p, min_p, edit_ids, edit_vals,
    )  # fmt: skip
    k1 = tokens.shape[1]
    if num_logprobs == 0:
        top = lp.new_empty((tokens.shape[0], k1, 0))
        ids = tokens.new_empty((tokens.shape[0], k1, 0))
    return tokens, accepted, emitted, lp, top, ids


def _emitted_scores(target_logits, logits_row_start, tokens, emitted, mode, logprobs,
                    num_logprobs, backend, token_bitmask, temperature, top_k, top_p, min_p,
                    edit_ids, edit_vals):  # fmt: skip
    """``emitted_logprobs`` over a verification's emitted positions (a second read of their
    rows): the rows of positions ``< emitted`` (flat layout: from ``logits_row_start``); the
    processed distribution of a greedy call has no controls (temperature 1, no filters)."""
    k1 = tokens.shape[1]
    positions = torch.arange(k1, device=tokens.device)[None, :]
    if logits_row_start is not None:  # flat layout: request b's rows start there
        rows = logits_row_start[:, None] + positions
    else:
        rows = positions.expand(tokens.shape[0], -1)
    rows = torch.where(positions < emitted[:, None], rows, -1)
    greedy = mode == "greedy"
    return emitted_logprobs(
        target_logits, rows, tokens, mode=logprobs, num_logprobs=num_logprobs, backend=backend,
        token_bitmask=token_bitmask, temperature=None if greedy else temperature,
        top_k=None if greedy else top_k, top_p=None if greedy else top_p,
        min_p=None if greedy else min_p, edit_ids=edit_ids, edit_vals=edit_vals,
    )  # fmt: skip


_verify_chain_logprobs_op = torch.library.custom_op(
    "specdec::verify_chain_logprobs", _chain_logprobs, mutates_args=()
)


@_verify_chain_logprobs_op.register_fake
def _(target_logits, draft_tokens, *args):
    b, k = draft_tokens.shape
    n = args[-2]
    tokens = target_logits.new_empty((b, k + 1), dtype=torch.int64)
    lp = target_logits.new_empty((b, k + 1), dtype=torch.float32)
    return (
        tokens, tokens.new_empty((b,)), tokens.new_empty((b,)), lp, lp.new_empty((b, k + 1, n)),
        tokens.new_empty((b, k + 1, n)),
    )  # fmt: skip


@dataclass(frozen=True, eq=False)
class ChainCall:
    """One chain verification, checked: ``torch.ops.specdec.verify_chain``'s arguments and the
    serving keywords to add after it. Made by :func:`parse_chain` (the padded public calls and
    the decoding loop), by the flattened layouts' parsing in :func:`verify_greedy` /
    :func:`verify_sampling` and by :func:`verify_typical` and the drop-in adapters of
    :mod:`specdec_kernels.compat` from their own checked inputs; :meth:`run` checks nothing.

    ``target_logits`` is ``[B, K+1, V]``, or with ``logits_row_start [B]`` a flat ``[R, V]``
    (position ``j`` of row ``b`` is row ``logits_row_start[b] + j``, clamped into ``[0, R)``);
    ``draft_probs`` (``[B, K, V]`` or ``None``: one-hot drafts) likewise with
    ``probs_row_start``. ``draft_tokens [B, K]`` (contiguous) fixes ``B`` and ``K``;
    ``num_draft_tokens [B]`` int64. ``temperature``, ``top_k``, ``top_p``: ``[B]`` tensors or
    ``None`` (off; ``temperature`` and ``seeds`` are read only by the sampling and typical modes).
    ``token_bitmask``: ``None`` or int32 with the logits' row layout (``[B, K+1, W]`` or
    ``[R, W]``, read through ``logits_row_start``). ``mode``: ``"greedy"``, ``"sampling"``,
    ``"block"`` (block verification) or ``"typical"`` (with ``posterior_threshold`` and
    ``posterior_alpha``). ``log_input``: the inputs are probabilities. ``backend``: resolved
    (:func:`specdec_kernels._dispatch.resolve_backend`). ``logprobs`` / ``num_logprobs``:
    checked (:func:`verify_greedy`'s), added by :meth:`run` after the op.
    """

    target_logits: Tensor  # [B, K+1, V], or flat [R, V] with logits_row_start
    draft_tokens: Tensor  # [B, K] contiguous
    num_draft_tokens: Tensor  # [B] int
    mode: str
    backend: str
    draft_probs: Tensor | None = None  # [B, K, V], or flat [T, V] with probs_row_start
    temperature: Tensor | None = None  # [B] float32
    top_k: Tensor | None = None  # [B] int64
    top_p: Tensor | None = None  # [B] float32
    seeds: Tensor | None = None  # [B] int64
    logits_row_start: Tensor | None = None  # [B] int64
    probs_row_start: Tensor | None = None  # [B] int64
    token_bitmask: Tensor | None = None  # int32 [B, K+1, W] or [R, W]
    log_input: bool = False
    posterior_threshold: float = 0.0
    posterior_alpha: float = 0.0
    min_p: Tensor | None = None  # [B] float32
    edit_ids: Tensor | None = None  # [B, E] int32, sorted, unique, padded with V
    edit_vals: Tensor | None = None  # [B, K+1, E] float32
    draft_vocab_inv: Tensor | None = None  # [V] int32: draft column of each target id, or -1
    logprobs: str | None = None
    num_logprobs: int = 0

    def run(self, direct: bool = False) -> Verification:
        """The op's result, with the log-probabilities asked for. ``direct``: run the op's body
        itself, not through the dispatcher (in eager mode; under ``torch.compile`` the op): the
        decoding loop's call, where the dispatch cost more than the kernel (docs: kernels.md)."""
        dispatched = not direct or torch.compiler.is_compiling()
        op = torch.ops.specdec.verify_chain if dispatched else _chain
        if self.mode == "match":
            ver = self._match(op)
            return ver if self.logprobs is None else self._add_logprobs(ver)
        args = (
            self.target_logits, self.draft_tokens, self.draft_probs, self.num_draft_tokens,
            self.temperature, self.top_k, self.top_p, self.seeds, self.logits_row_start,
            self.probs_row_start, self.token_bitmask, self.mode, self.log_input,
            float(self.posterior_threshold), float(self.posterior_alpha), self.min_p,
            self.edit_ids, self.edit_vals, self.draft_vocab_inv,
        )  # fmt: skip
        if self.logprobs is None:
            return Verification(*op(*args, self.backend))
        op = torch.ops.specdec.verify_chain_logprobs if dispatched else _chain_logprobs
        n = int(self.num_logprobs)
        tokens, accepted, emitted, lp, top, ids = op(
            *args, self.logprobs == "processed", n, self.backend
        )
        if n == 0:
            top = ids = None
        return Verification(tokens, accepted, emitted, lp, top, ids)

    def _match(self, op) -> Verification:
        """``method="match"``: the target's own sample at every position ``j`` (the sampling
        mode with no drafts, on the position's row alone, keyed by the seed ``seed[b] + j``), then
        the drafts accepted while they equal it. One op over ``B (K+1)`` rows of one token."""
        b, k = self.draft_tokens.shape
        k1, dev = k + 1, self.draft_tokens.device
        flat, rows = _position_rows(self.target_logits, self.logits_row_start, k1)  # rows [B, K+1]
        n = b * k1
        offsets = torch.arange(k1, device=dev).repeat(b)  # [B (K+1)]: j of each pseudo-row
        each = lambda t: None if t is None else t.repeat_interleave(k1, 0)  # noqa: E731
        mask = self.token_bitmask
        if mask is not None and mask.dim() == 3:  # padded [B, K+1, W]: in the flat numbering
            words = mask.reshape(n, mask.shape[-1])
            mask = words.new_zeros((flat.shape[0], words.shape[-1]))
            mask[rows.flatten()] = words
        seeds = (each(self.seeds) + offsets) & _SEED_MASK
        samples, _, _ = op(
            flat, self.draft_tokens.new_zeros((n, 0)), None, torch.zeros_like(offsets),
            each(self.temperature), each(self.top_k), each(self.top_p), seeds,
            rows.flatten().contiguous(), None, mask, "sampling", self.log_input, 0.0, 0.0,
            each(self.min_p), each(self.edit_ids),
            None if self.edit_vals is None else self.edit_vals.reshape(n, 1, -1), None,
            self.backend,
        )  # fmt: skip
        samples = samples[:, 0].view(b, k1)  # [B, K+1]: the target's token at each position
        positions = torch.arange(k, device=dev)[None, :]
        same = (self.draft_tokens.to(torch.int64) == samples[:, :k]) & (
            positions < self.num_draft_tokens[:, None]
        )
        accepted = same.to(torch.int64).cumprod(1).sum(1)  # [B]
        keep = torch.arange(k1, device=dev)[None, :] <= accepted[:, None]
        return Verification(torch.where(keep, samples, -1), accepted, accepted + 1)

    def _add_logprobs(self, ver: Verification) -> Verification:
        """``ver`` with ``logprobs`` / ``top_logprobs`` / ``top_ids``: the processed
        distribution's controls are none for a greedy call (temperature 1, no filters)."""
        lp, top, ids = _emitted_scores(
            self.target_logits, self.logits_row_start, ver.tokens, ver.num_emitted, self.mode,
            self.logprobs, self.num_logprobs, self.backend, self.token_bitmask, self.temperature,
            self.top_k, self.top_p, self.min_p, self.edit_ids, self.edit_vals,
        )  # fmt: skip
        return ver._replace(logprobs=lp, top_logprobs=top, top_ids=ids)


def _position_rows(logits: Tensor, row_start: Tensor | None, k1: int) -> tuple[Tensor, Tensor]:
    """``(flat [R, V], rows [B, K+1])``: the logits as rows of one ``[R, V]`` tensor and the row
    of each position, read in place where the strides allow (a padded ``[B, K+1, V]`` whose
    batch stride is a multiple of its position stride: every slice of a bigger buffer), else a
    contiguous copy."""
    if row_start is not None:  # the flat layout: clamped as the kernels clamp it
        j = torch.arange(k1, device=logits.device)
        return logits, (row_start[:, None] + j[None, :]).clamp(0, logits.shape[0] - 1)
    b, _, v = logits.shape
    s0, s1 = logits.stride(0), logits.stride(1)
    step = 1 if k1 == 1 else (s0 // s1 if s1 > 0 and s0 % s1 == 0 and s0 >= s1 * k1 else 0)
    if step == 0 or b == 0:
        logits, step = logits.reshape(b * k1, v).view(b, k1, v), k1
        s0, s1 = logits.stride(0), logits.stride(1)
    unit = s0 if k1 == 1 else s1
    flat = logits.as_strided(((b - 1) * step + k1 if b else 0, v), (unit, 1))
    j = torch.arange(k1, device=logits.device)
    return flat, torch.arange(b, device=logits.device)[:, None] * step + j[None, :]


def run_chain(target_logits: Tensor, draft_tokens: Tensor, **fields) -> Verification:
    """``torch.ops.specdec.verify_chain`` by keyword (:class:`ChainCall`'s fields): the one chain
    op behind every chain verification. Checks nothing: its callers have."""
    return ChainCall(target_logits, draft_tokens, **fields).run()


@torch.library.custom_op("specdec::accept_reject", mutates_args=())
def _accept_reject_op(draft_tokens: Tensor, verifier_tokens: Tensor, backend: str) -> Tensor:
    return kernel("accept_reject", backend)(draft_tokens, verifier_tokens)


@_accept_reject_op.register_fake
def _(draft_tokens, verifier_tokens, backend):
    return draft_tokens.new_empty((draft_tokens.shape[0],), dtype=torch.int64)


@torch.library.custom_op("specdec::accept_tests_passed", mutates_args=())
def _accept_tests_op(
    draft_probs: Tensor,
    draft_tokens: Tensor,
    target_probs: Tensor,
    seeds: Tensor,
    after: Tensor,
    backend: str,
) -> Tensor:
    """``[B]`` int64: positions ``i > after[b]`` whose own accept test passes
    (:func:`specdec_kernels.reference.accept_tests.accept_tests_passed`): the FlashInfer drop-in's
    accepted-token counter, in one kernel where the reference takes ~60 small ops."""
    return kernel("accept_tests_passed", backend)(
        draft_probs, draft_tokens, target_probs, seeds, after
    )


@_accept_tests_op.register_fake
def _(draft_probs, draft_tokens, target_probs, seeds, after, backend):
    return seeds.new_empty((draft_probs.shape[0],), dtype=torch.int64)


# --- public functions ------------------------------------------------------------------------


class _FlatInputs(NamedTuple):
    drafts: Tensor  # [B, K] padded with -1 (tiny: the kernels read it, not the [.., V] rows)
    num_draft_tokens: Tensor  # [B] int64
    logits_row_start: Tensor  # [B] int64: row of request b's position 0 in target_logits
    probs_row_start: Tensor  # [B] int64: row of request b's first draft in draft_probs


def flat_inputs(
    target_logits,
    draft_tokens,
    draft_probs,
    cu_num_draft_tokens,
    max_spec_len,
    num_draft_tokens,
    validate: bool,
    bonus_rows: bool = True,
    name: str = "target_logits",
    draft_width: int | None = None,
) -> _FlatInputs:
    """Check vLLM's flattened layout and derive the per-request offsets (no ``[.., V]`` copy).

    ``bonus_rows``: ``target_logits`` holds ``k_b + 1`` rows per request (``[num_tokens + B,
    V]``, the core ops); without, ``k_b`` rows (``[num_tokens, V]``, vLLM's ``rejection_sample``:
    the bonus row of a request is then the next request's first row, clamped into the tensor).
    """
    if num_draft_tokens is not None:
        raise ValueError(
            "pass num_draft_tokens or cu_num_draft_tokens, not both (the flattened layout "
            "takes the counts from cu_num_draft_tokens)"
        )
    b, t, v = check.check_flat_structure(
        target_logits, draft_tokens, cu_num_draft_tokens, max_spec_len, bonus_rows, name
    )
    device = target_logits.device
    if draft_probs is not None:
        check.check_flat_draft_probs(draft_probs, t, draft_width or v, device)
    cu = cu_num_draft_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1)) if b > 0 else cu
    start = cu - counts  # [B] first draft of each request
    if max_spec_len is None:  # host synchronisation; garbage counts must not size the output
        max_spec_len = min(max(int(counts.max()), 0), t) if b > 0 else 0
    if validate:
        check.check_flat_counts(cu, t, max_spec_len)
        check.check_flat_values(target_logits, draft_tokens, draft_probs)
    positions = torch.arange(max_spec_len, device=device)
    live = positions[None, :] < counts[:, None]  # [B, K]
    if t > 0:
        index = (start[:, None] + positions[None, :]).clamp(0, t - 1)
        drafts = torch.where(live, draft_tokens.to(torch.int64)[index], -1)
    else:
        drafts = torch.full((b, max_spec_len), -1, dtype=torch.int64, device=device)
    rows = start + torch.arange(b, device=device) if bonus_rows else start
    return _FlatInputs(drafts, counts, rows, start)


def _check_serving(
    target_logits, token_bitmask, logprobs, num_logprobs, validate, flat=None, nd=None
) -> int:
    """Check the serving keywords: ``token_bitmask`` has the logits' row layout (padded
    ``[B, K+1, W]`` with ``nd``, or flat ``[R, W]`` with ``flat``); ``validate=True`` also
    checks that every decided position allows a finite logit. Returns ``num_logprobs``."""
    n = check.check_logprob_args(logprobs, num_logprobs)
    if token_bitmask is not None:
        *leading, v = target_logits.shape
        labels = "[num_tokens + B, W]" if flat is not None else "[B, K+1, W]"
        check.check_token_bitmask(token_bitmask, tuple(leading), v, target_logits.device, labels)
        if validate:
            if flat is not None:  # every flat row is some request's position <= k_b
                decided = torch.ones(leading, dtype=torch.bool, device=target_logits.device)
            else:
                decided = torch.arange(leading[1], device=nd.device)[None, :] <= nd[:, None]
            check.check_bitmask_values(target_logits, token_bitmask, decided)
    return n


def verify_greedy(
    target_logits: Tensor,
    draft_tokens: Tensor,
    *,
    num_draft_tokens: Tensor | None = None,
    cu_num_draft_tokens: Tensor | None = None,
    max_spec_len: int | None = None,
    token_bitmask: Tensor | None = None,
    logprobs: str | None = None,
    num_logprobs: int = 0,
    logit_bias: tuple[Tensor, Tensor] | None = None,
    repetition_penalty: float | Tensor | None = None,
    presence_penalty: float | Tensor | None = None,
    frequency_penalty: float | Tensor | None = None,
    context_tokens: Tensor | None = None,
    backend: str | None = None,
    validate: bool = True,
) -> Verification:
    """Greedy verification of a batch of drafts in one fused pass over the target logits.

    Row ``b`` accepts the longest prefix of ``draft_tokens[b, :k_b]`` equal to
    ``argmax(target_logits[b, j])`` (first index on ties, like :func:`torch.argmax`) and then
    emits the target's argmax at the first mismatch, or the bonus token at position ``k_b``.

    Parameters
    ----------
    target_logits : Tensor
        `[B, K+1, V]` float32, bfloat16 or float16; last dim stride 1 (other dims may be strided,
        e.g. a slice of a bigger logits buffer). Row ``j`` scores the token after draft ``j-1``.
    draft_tokens : Tensor
        `[B, K]` int32 or int64. Entries at positions ``>= k_b`` are ignored (``-1`` padding).
    num_draft_tokens : Tensor, optional
        `[B]` integer, ``0 <= k_b <= K`` (ragged batches). Default: ``K`` for every row.
    cu_num_draft_tokens : Tensor, optional
        vLLM's flattened layout instead of the padded one: `[B]` int32/int64, the inclusive
        cumulative sum of the requests' draft counts (``k_b = cu[b] - cu[b-1]``). Then
        ``target_logits`` is `[num_tokens + B, V]` (request ``b``'s ``k_b + 1`` rows start at row
        ``cu[b] - k_b + b``: its drafts' rows then its bonus row, as vLLM's logits are laid out),
        ``draft_tokens`` is `[num_tokens]` and ``num_draft_tokens`` must be None. The kernels
        index the flat rows through per-request offsets: no padded copy of the logits is made.
        The output is `[B, max_spec_len + 1]`.
    max_spec_len : int, optional
        With ``cu_num_draft_tokens``: ``K`` of the output, at least every ``k_b``. ``None``
        computes it from ``cu_num_draft_tokens`` (one host synchronisation).
    token_bitmask : Tensor, optional
        int32 `[B, K+1, W]` (flat layout: `[num_tokens + B, W]`, like the logits' rows),
        ``W = ceil(V / 32)``, xgrammar's layout (``xgrammar.allocate_token_bitmask``): bit ``j``
        of word ``w`` set means token ``32 w + j`` is allowed at that position; bits past ``V``
        are ignored. A disallowed token is a ``-inf`` logit, before temperature and filters:
        the result equals the call on ``logits.masked_fill(~allowed, -inf)`` for the same seeds,
        without that copy being written. A disallowed draft token is rejected. With
        ``validate=True`` a position ``<= k_b`` whose allowed tokens all have ``-inf`` logits
        raises ``ValueError`` naming the row and position.
    logprobs : {None, "raw", "processed"}
        Also return ``Verification.logprobs`` `[B, K+1]` float32: the log-probability of each
        emitted token (``-inf`` at padding). ``"raw"``: ``log_softmax(target_logits)`` at the
        token, before temperature, filters and mask. ``"processed"``: the log of the
        distribution the token was decided from (temperature, top-k, top-p, mask; greedy rows:
        the masked ``log_softmax`` at temperature 1). Within ``1e-5`` of a float64 computation
        for float32 logits. The native and Triton kernels score the emitted tokens in the pass
        that verifies (``torch.ops.specdec.verify_chain_logprobs``); the reference backend runs
        one more op (``torch.ops.specdec.emitted_logprobs``) that reads only the emitted
        positions' rows. No `[B, K+1, V]` tensor is written.
    num_logprobs : int
        ``n`` in ``[0, 20]`` (``> 0`` needs ``logprobs``): also ``top_logprobs`` float32 and
        ``top_ids`` int64, `[B, K+1, n]`: the ``n`` most likely tokens of the same distribution
        at each emitted position, most likely first, ties by the lower id; ``-inf`` / ``-1`` at
        padding and in slots past the tokens with nonzero probability.
    logit_bias : tuple of Tensor, optional
        ``(ids [B, M] integer, -1 padded; bias [B, M] float)``: ``bias`` is added to the logits
        of those tokens (finite or ``-inf``; the biases of an id repeated in a row add up).
    repetition_penalty, presence_penalty, frequency_penalty : float or Tensor, optional
        Scalar or `[B]`. transformers' repetition rule (``r > 0``, ``1`` = off: a counted
        token's logit ``l`` becomes ``l * r`` if ``l < 0`` else ``l / r``) and OpenAI's
        ``l - presence * [c > 0] - frequency * c`` (``0`` = off), with ``c`` the token's count
        in ``context_tokens[b]`` **plus draft tokens** ``0 .. j-1`` at position ``j``: what plain
        decoding would have generated before it. Order: bias, repetition, presence /
        frequency, then the token bitmask (and, when sampling, temperature, top-k, top-p,
        ``min_p``). The result is the call's on the logits processed densely position by
        position (:func:`specdec_kernels.reference.processors.processed_logits`), for the same
        seeds; the kernels read an edit list of the few changed logits
        (:func:`specdec_kernels.reference.processors.logit_edits`), no `[B, K+1, V]` copy.
        ``logprobs="processed"`` scores the processed distribution, ``"raw"`` the logits as given.
    context_tokens : Tensor, optional
        `[B, L]` integer, ``-1`` padded: the tokens already in row ``b`` (prompt and generated;
        pass only the generated ones for OpenAI's output-only presence / frequency counts).
        Needed when a penalty is on. In the flat layout ``B`` is the number of requests.
    backend : {None, "triton", "native", "reference"}
        ``None``: Triton for CUDA tensors; for CPU tensors the native C++ kernels where the
        extension is built, else the reference; unless the environment variable
        ``SPECDEC_BACKEND`` says otherwise. ``"triton"`` on CPU runs Triton's interpreter.
        ``"native"`` is CPU only (other devices fall back to their automatic choice, and a
        missing extension to the reference, each with a one-time ``RuntimeWarning``).
    validate : bool
        Check values (ids in ``[0, V)``, no NaN or ``+inf`` logits and a finite entry in every
        row, ``k_b`` in ``[0, K]``) before any work; ``-inf`` logits mask tokens (never emitted);
        this synchronises. With ``False`` nothing synchronises (CUDA-graph safe) and bad values
        still never cause out-of-bounds accesses or ids outside ``[0, V)`` other than ``-1``.

    Returns
    -------
    Verification
        ``tokens [B, K+1]`` int64 (-1 padded), ``num_accepted [B]``, ``num_emitted [B]``.

    Raises
    ------
    TypeError
        An argument is not a tensor or has an unsupported dtype.
    ValueError
        Shapes or devices disagree, or (``validate=True``) a value is out of range.

    Examples
    --------
    >>> import torch, specdec_kernels as sk
    >>> logits = torch.tensor([[[0., 5., 0.], [0., 0., 5.], [5., 0., 0.]]])  # argmax 1, 2, 0
    >>> out = sk.verify_greedy(logits, torch.tensor([[1, 0]]))
    >>> out.tokens.tolist(), out.num_accepted.tolist()
    ([[1, 2, -1]], [1])

    The same request in vLLM's flattened layout, next to a request without drafts:

    >>> flat = torch.cat([logits[0], torch.tensor([[0., 0., 7.]])])  # [num_tokens + B, V]
    >>> out = sk.verify_greedy(flat, torch.tensor([1, 0]), cu_num_draft_tokens=torch.tensor([2, 2]))
    >>> out.tokens.tolist()
    [[1, 2, -1], [2, -1, -1]]
    """
    if cu_num_draft_tokens is not None:
        flat = flat_inputs(
            target_logits,
            draft_tokens,
            None,
            cu_num_draft_tokens,
            max_spec_len,
            num_draft_tokens,
            validate,
        )
        n = _check_serving(target_logits, token_bitmask, logprobs, num_logprobs, validate, flat)
        b, v = flat.drafts.shape[0], target_logits.shape[-1]
        procs = processors.parse(
            b, v, target_logits.device, logit_bias=logit_bias,
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, context_tokens=context_tokens, validate=validate,
        )  # fmt: skip
        resolved = resolve_backend(backend, target_logits.device)
        ids, vals = procs.edits(
            target_logits, flat.drafts, flat.num_draft_tokens, flat.logits_row_start,
            validate=validate, backend=resolved,
        )  # fmt: skip
        return ChainCall(
            target_logits,
            flat.drafts,
            flat.num_draft_tokens,
            "greedy",
            resolved,
            logits_row_start=flat.logits_row_start,
            token_bitmask=token_bitmask,
            edit_ids=ids,
            edit_vals=vals,
            logprobs=logprobs,
            num_logprobs=n,
        ).run()
    return parse_chain(
        target_logits,
        draft_tokens,
        num_draft_tokens=num_draft_tokens,
        token_bitmask=token_bitmask,
        logprobs=logprobs,
        num_logprobs=num_logprobs,
        logit_bias=logit_bias,
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        context_tokens=context_tokens,
        backend=backend,
        validate=validate,
    ).run()


def parse_chain(
    target_logits: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | None = None,
    *,
    temperature: float | Tensor = 0.0,
    top_k: int | Tensor | None = None,
    top_p: float | Tensor | None = None,
    num_draft_tokens: Tensor | None = None,
    seed: int | Tensor | None = None,
    generator: torch.Generator | None = None,
    method: str = "token",
    token_bitmask: Tensor | None = None,
    logprobs: str | None = None,
    num_logprobs: int = 0,
    min_p: float | Tensor | None = None,
    logit_bias: tuple[Tensor, Tensor] | None = None,
    repetition_penalty: float | Tensor | None = None,
    presence_penalty: float | Tensor | None = None,
    frequency_penalty: float | Tensor | None = None,
    context_tokens: Tensor | None = None,
    draft_vocab_map: Tensor | None = None,
    backend: str | None = None,
    validate: bool = True,
) -> ChainCall:
    """The one parse of a padded chain call (``[B, K+1, V]`` logits, ``[B, K]`` drafts):
    :func:`verify_greedy`'s (the default ``temperature`` 0), :func:`verify_sampling`'s (``method``
    in :data:`METHODS`, ``seed`` and ``generator`` not both: checked by it) and the decoding
    loop's (:class:`~specdec_kernels.decoding.Sampling` checked them).
    A host ``temperature == 0`` makes the call greedy: its controls, seeds and ``draft_probs``
    (checked) are not used. Raises what the public functions document."""
    b, k, v = check.check_logits(target_logits)
    device = target_logits.device
    check.check_draft_tokens(draft_tokens, b, k, device)
    draft_tokens = draft_tokens.contiguous()  # [B, K]: tiny, the kernels want unit stride
    inv = _draft_vocab_inverse(draft_vocab_map, draft_probs, v, device, validate)
    if draft_probs is not None:
        if inv is None:
            check.check_draft_probs(draft_probs, b, k, v, device)
        else:
            labels = "[B, K, V_draft] (V_draft = len(draft_vocab_map))"
            check.check_draft_probs(draft_probs, b, k, draft_vocab_map.shape[0], device, labels)
    nd = check.num_draft_tensor(num_draft_tokens, b, k, device)
    check.check_scalar_ranges(temperature, top_k, top_p)
    check.check_seed(seed, b, device)
    n = _check_serving(target_logits, token_bitmask, logprobs, num_logprobs, validate, nd=nd)
    resolved = resolve_backend(backend, device)
    procs = processors.parse(
        b, v, device, min_p=min_p, logit_bias=logit_bias, repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        context_tokens=context_tokens, validate=validate,
    )  # fmt: skip
    if check.all_greedy(temperature):
        if validate:
            check.check_values(target_logits, draft_tokens, nd)
        ids, vals = procs.edits(
            target_logits, draft_tokens, nd, validate=validate, backend=resolved
        )
        return ChainCall(
            target_logits,
            draft_tokens,
            nd,
            "greedy",
            resolved,
            token_bitmask=token_bitmask,
            edit_ids=ids,
            edit_vals=vals,
            logprobs=logprobs,
            num_logprobs=n,
        )
    temp, topk, topp = check.controls_per_row(b, device, temperature, top_k, top_p)
    if validate:
        check.check_values(target_logits, draft_tokens, nd, draft_probs, temp, topk, topp)
    ids, vals = procs.edits(
        target_logits, draft_tokens, nd, temperature=temp, validate=validate, backend=resolved
    )
    return ChainCall(
        target_logits,
        draft_tokens,
        nd,
        _RULES[method],
        resolved,
        draft_probs=draft_probs,
        temperature=temp,
        top_k=topk,
        top_p=topp,
        seeds=rng.seeds_for_batch(b, device, seed, generator),
        token_bitmask=token_bitmask,
        min_p=procs.min_p,
        edit_ids=ids,
        edit_vals=vals,
        draft_vocab_inv=inv,
        logprobs=logprobs,
        num_logprobs=n,
    )


def verify_sampling(
    target_logits: Tensor,
    draft_tokens: Tensor,
    draft_probs: Tensor | None = None,
    *,
    temperature: float | Tensor = 1.0,
    top_k: int | Tensor | None = None,
    top_p: float | Tensor | None = None,
    num_draft_tokens: Tensor | None = None,
    seed: int | Tensor | None = None,
    generator: torch.Generator | None = None,
    cu_num_draft_tokens: Tensor | None = None,
    max_spec_len: int | None = None,
    method: str = "token",
    token_bitmask: Tensor | None = None,
    logprobs: str | None = None,
    num_logprobs: int = 0,
    min_p: float | Tensor | None = None,
    logit_bias: tuple[Tensor, Tensor] | None = None,
    repetition_penalty: float | Tensor | None = None,
    presence_penalty: float | Tensor | None = None,
    frequency_penalty: float | Tensor | None = None,
    context_tokens: Tensor | None = None,
    draft_vocab_map: Tensor | None = None,
    backend: str | None = None,
    validate: bool = True,
) -> Verification:
    """Lossless rejection-sampling verification (speculative sampling), fused over the logits.

    Implements Leviathan et al., "Fast Inference from Transformers via Speculative Decoding"
    (ICML 2023, https://arxiv.org/abs/2211.17192) and Chen et al., "Accelerating Large Language
    Model Decoding with Speculative Sampling" (2023, https://arxiv.org/abs/2302.01318). With
    ``p_j`` the target distribution at position ``j`` (``softmax(logits / temperature)`` filtered by
    top-k then top-p, as transformers' warpers do) and ``q_j`` the draft's, draft token ``x_j`` is
    accepted with probability ``min(1, p_j(x_j) / q_j(x_j))``, in order; at the first rejection the
    recovered token is drawn from ``norm(max(0, p_j - q_j))``, after ``k_b`` acceptances the bonus
    token from ``p_{k_b}``. The emitted tokens are distributed exactly as tokens sampled from the
    target one at a time. No ``[B, K+1, V]`` probability tensor is materialised by the Triton and
    native backends.

    Parameters
    ----------
    target_logits : Tensor
        `[B, K+1, V]` float32/bfloat16/float16, last dim stride 1 (others may be strided).
    draft_tokens : Tensor
        `[B, K]` int32/int64; positions ``>= k_b`` ignored.
    draft_probs : Tensor, optional
        `[B, K, V]` float, the distribution each draft token was sampled from, used as given:
        not renormalised (see Notes: a row that sums to ``s != 1`` biases the output by up to
        ``|s - 1|``). ``None`` for a deterministic drafter (greedy, n-gram): ``q`` is one-hot at
        the draft token.
    temperature : float or Tensor
        Scalar or `[B]`; ``0`` makes that row greedy (exactly :func:`verify_greedy`'s result).
    top_k : int or Tensor, optional
        Scalar or `[B]` int; ``0``/``None`` is off. Ties at the k-th value are kept.
    top_p : float or Tensor, optional
        Scalar or `[B]` float in ``(0, 1]``; ``1``/``None`` is off. Keeps the tokens whose
        strictly-more-probable mass is below ``top_p`` (at least the most probable one). All
        tokens tied at the threshold are kept; transformers' ``TopPLogitsWarper`` keeps only the
        ones its sort puts last, so the two differ exactly there (and agree without ties).
    num_draft_tokens : Tensor, optional
        `[B]` integer in ``[0, K]``; default ``K``.
    seed : int or Tensor, optional
        An int, or a `[B]` int64 tensor: then row ``b``'s result depends only on its own inputs
        and ``seed[b]`` (batch invariance). Same inputs and seed, same output, on every call.
    generator : torch.Generator, optional
        Draws the per-row seeds when ``seed`` is None (default: torch's default generator).
    cu_num_draft_tokens, max_spec_len
        vLLM's flattened layout, as in :func:`verify_greedy`: ``target_logits [num_tokens + B,
        V]``, ``draft_tokens [num_tokens]``, ``draft_probs [num_tokens, V]`` (or None), read in
        place through per-request offsets; same tokens as the padded call with the same seeds.
    method : {"token", "block", "match"}
        ``"token"``: the rule above, draft by draft. ``"block"``: block verification (Sun et
        al., "Block Verification Accelerates Speculative Decoding", 2024,
        https://arxiv.org/abs/2403.10444; vLLM's ``use_block_verification``), which judges the
        draft block jointly: lossless like ``"token"`` and never fewer accepted tokens in
        expectation on the same inputs (the specification, with the paper's notation, is
        :func:`specdec_kernels.reference.verify_block.verify_block`). Same random numbers as
        ``"token"``; greedy rows are unaffected. ``"match"``: at every position ``j`` the
        target's own sample (the exponential race over the fully processed ``p_j``, keyed by the
        seed ``(seed[b] + j) mod 2**63``: the token a call with no drafts and that seed draws);
        drafts are accepted while they equal it, and the token after them is the target's
        sample there. Lossless for any logits and any drafter (``draft_probs`` are not read);
        a caller that passes ``seed[b] = base + the row's output position`` (the decoding loop)
        gets, at each output position, the token plain seeded decoding draws there, whatever
        the drafts: sampled speculation that reproduces the target's own samples. Accepts no
        more drafts than ``"token"`` in expectation (the probability a draft equals the
        target's sample is at most ``sum min(p, q)``) unless the drafter shares the noise
        (the loop's ``coupled`` drafters).
    token_bitmask, logprobs, num_logprobs
        As in :func:`verify_greedy`; ``"processed"`` is the filtered ``p_j`` above (greedy rows:
        the masked ``log_softmax`` at temperature 1).
    min_p : float or Tensor, optional
        Scalar or `[B]` in ``[0, 1]`` (``0``/``None`` = off): after top-p, keep the tokens whose
        probability is at least ``min_p`` times the largest (transformers' and vLLM's rule).
    logit_bias, repetition_penalty, presence_penalty, frequency_penalty, context_tokens
        As in :func:`verify_greedy` (applied before the bitmask, temperature and filters).
    draft_vocab_map : Tensor, optional
        `[V_draft]` integer, unique ids in ``[0, V)``: a draft with a reduced vocabulary
        (EAGLE-3's draft-to-target map ``d2t``, as absolute target ids). ``draft_probs`` is then
        `[B, K, V_draft]` (flat: `[num_tokens, V_draft]`), column ``i`` the probability of target
        token ``draft_vocab_map[i]``; a target token outside the map has ``q = 0``.
        ``draft_tokens`` stay target ids. The result equals the call on ``draft_probs``
        scattered to `[B, K, V]`, without that scatter.
    backend, validate
        As in :func:`verify_greedy`. ``validate`` also checks that ``draft_probs`` rows at live
        positions are non-negative and sum to 1 (tolerance ``max(1e-3, eps(dtype))``: bfloat16
        softmax rows pass), ``temperature >= 0`` and not so small that ``logits / temperature``
        overflows float32 (with ``validate=False`` such a row gives some in-bounds token), and
        ``top_p`` in ``(0, 1]``. ``-inf`` logits are valid (masked tokens, never emitted).

    Returns
    -------
    Verification
        ``tokens [B, K+1]`` int64 (-1 padded), ``num_accepted [B]``, ``num_emitted [B]``.

    Raises
    ------
    TypeError, ValueError
        As in :func:`verify_greedy`; also when both ``seed`` and ``generator`` are given.

    Notes
    -----
    Draft rows are used as given, not renormalised (that would read every ``[V]`` row of
    ``draft_probs``, a pass over the whole tensor that the kernels otherwise skip: they read
    ``q_j(x_j)`` and the one row of the first rejection). ``validate=True`` accepts rows whose
    sum ``s`` is within ``max(1e-3, eps(dtype))`` of 1; if ``x_j`` was drawn from the row
    normalised, ``q / s``, the tests ``min(1, p / q)`` and the residual ``max(0, p - q)`` see
    ``q = s (q / s)`` and the emitted token's distribution is off the target's by at most
    ``|s - 1| / min(s, 1)`` in total variation (per position; ``s > 1`` lowers the acceptance
    rate by up to ``1 - 1/s``). So float32 rows within the tolerance give a bias below about
    ``1e-3``, bfloat16 rows about ``2**-7``; divide by ``draft_probs.sum(-1, keepdim=True)``
    (in float32) before the call where that matters. Target rows are normalised exactly.

    Randomness is counter based (:mod:`specdec_kernels.reference.rng`): the accept uniform of
    position ``j`` and the race uniforms of the residual draw are pure functions of
    ``(seed_b, j, purpose, token)``. Residual and bonus tokens are drawn by the exponential race
    ``argmax_x w(x) / E_x`` (``E_x ~ Exp(1)``). The reference, the Triton and the native backends
    use the same numbers and formulas and agree token for token except where float rounding
    decides a near-tie.

    Examples
    --------
    >>> import torch, specdec_kernels as sk
    >>> logits = torch.tensor([[[0., 9., 0.], [0., 0., 9.]]])  # p puts ~1 on token 1, then 2
    >>> out = sk.verify_sampling(logits, torch.tensor([[1]]), seed=0)
    >>> out.tokens.tolist()
    [[1, 2]]
    """
    if seed is not None and generator is not None:
        raise ValueError("pass at most one of seed and generator, got both")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if cu_num_draft_tokens is not None:
        flat = flat_inputs(
            target_logits,
            draft_tokens,
            draft_probs,
            cu_num_draft_tokens,
            max_spec_len,
            num_draft_tokens,
            validate,
            draft_width=getattr(draft_vocab_map, "shape", (None,))[0],
        )
        b = flat.drafts.shape[0]
        if draft_probs is not None and draft_probs.shape[0] == 0:
            draft_probs = None  # no request has drafts: nothing to read
        temp, topk, topp = _controls(b, target_logits.device, temperature, top_k, top_p, seed)
        if validate:
            check.check_control_values(temp, topk, topp)
            check.check_flat_temperature_range(target_logits, flat.num_draft_tokens + 1, temp)
        n = _check_serving(target_logits, token_bitmask, logprobs, num_logprobs, validate, flat)
        seeds = rng.seeds_for_batch(b, target_logits.device, seed, generator)
        inv = _draft_vocab_inverse(
            draft_vocab_map, draft_probs, target_logits.shape[-1], target_logits.device, validate
        )
        procs = processors.parse(
            b, target_logits.shape[-1], target_logits.device, min_p=min_p,
            logit_bias=logit_bias, repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
            context_tokens=context_tokens, validate=validate,
        )  # fmt: skip
        resolved = resolve_backend(backend, target_logits.device)
        ids, vals = procs.edits(
            target_logits, flat.drafts, flat.num_draft_tokens, flat.logits_row_start,
            temperature=temp, validate=validate, backend=resolved,
        )  # fmt: skip
        greedy = check.all_greedy(temperature)
        return ChainCall(
            target_logits,
            flat.drafts,
            flat.num_draft_tokens,
            "greedy" if greedy else _RULES[method],
            resolved,
            draft_probs=draft_probs,
            temperature=temp,
            top_k=topk,
            top_p=topp,
            seeds=seeds,
            logits_row_start=flat.logits_row_start,
            probs_row_start=flat.probs_row_start if draft_probs is not None else None,
            token_bitmask=token_bitmask,
            min_p=None if greedy else procs.min_p,
            edit_ids=ids,
            edit_vals=vals,
            draft_vocab_inv=inv,
            logprobs=logprobs,
            num_logprobs=n,
        ).run()
    return parse_chain(
        target_logits,
        draft_tokens,
        draft_probs,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        num_draft_tokens=num_draft_tokens,
        seed=seed,
        generator=generator,
        method=method,
        token_bitmask=token_bitmask,
        logprobs=logprobs,
        num_logprobs=num_logprobs,
        min_p=min_p,
        logit_bias=logit_bias,
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        context_tokens=context_tokens,
        draft_vocab_map=draft_vocab_map,
        backend=backend,
        validate=validate,
    ).run()


def _draft_vocab_inverse(draft_vocab_map, draft_probs, v: int, device, validate: bool):
    """``[V]`` int32 (the draft column of each target id, ``-1`` outside the map) of a checked
    ``draft_vocab_map``, or ``None`` without one. A ``V``-sized index, not a ``[B, K, V]``
    scatter of the draft's probabilities."""
    if draft_vocab_map is None:
        return None
    m = check.require_tensor("draft_vocab_map", draft_vocab_map)
    check.require_dtype("draft_vocab_map", m, check.INT_DTYPES)
    if m.dim() != 1 or m.shape[0] == 0:
        raise ValueError(f"draft_vocab_map must be [V_draft], got {check.shape_str(m)}")
    check.require_device("draft_vocab_map", m, device)
    if draft_probs is None:
        raise ValueError(
            "draft_vocab_map maps draft_probs' columns to target ids: pass draft_probs "
            "[B, K, V_draft] with it"
        )
    if validate:
        bad = (m < 0) | (m >= v)
        if bool(bad.any()):
            (i,) = check.first_index(bad)
            raise ValueError(f"draft_vocab_map[{i}] = {int(m[i])} is outside [0, V) with V = {v}")
        ordered = m.sort().values
        if bool((ordered[1:] == ordered[:-1]).any()):
            (i,) = check.first_index(ordered[1:] == ordered[:-1])
            raise ValueError(
                f"draft_vocab_map must not repeat a target id; {int(ordered[i])} appears twice"
            )
    inv = torch.full((v,), -1, dtype=torch.int32, device=device)
    inv[m.clamp(0, v - 1).to(torch.int64)] = torch.arange(m.shape[0], dtype=torch.int32,
                                                           device=device)  # fmt: skip
    return inv


def _controls(b: int, device: torch.device, temperature, top_k, top_p, seed):
    """Check the sampling controls and the seed; the controls as ``[B]`` tensors (None = off)."""
    check.check_seed(seed, b, device)
    return check.sampling_controls(b, device, temperature, top_k, top_p)


def verify_typical(
    target_logits: Tensor,
    draft_tokens: Tensor,
    *,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
    temperature: float | Tensor = 1.0,
    top_k: int | Tensor | None = None,
    top_p: float | Tensor | None = None,
    num_draft_tokens: Tensor | None = None,
    seed: int | Tensor | None = None,
    generator: torch.Generator | None = None,
    backend: str | None = None,
    validate: bool = True,
) -> Verification:
    """Typical acceptance (lossy by design): accept drafts the target finds typical enough.

    Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
    Heads" (2024, https://arxiv.org/abs/2401.10774, the typical acceptance section, 3.3.1 as vLLM
    cites it), as vLLM V0's ``TypicalAcceptanceSampler`` applies it to chains
    (``vllm/model_executor/layers/typical_acceptance_sampler.py`` at commit ``0244fee8``). With
    ``p_j`` the filtered target distribution (temperature, top-k, top-p exactly as
    :func:`verify_sampling`), draft ``x_j`` is accepted when

        ``p_j(x_j) > min(posterior_threshold, posterior_alpha * exp(-H(p_j)))``,

    ``H(p) = -sum_x p(x) log p(x)``, in order, stopping at the first rejection; no draft
    probabilities are needed and no random number decides acceptance. At the first rejection
    ``j`` the recovered token is sampled from ``p_j``, after ``k_b`` acceptances from ``p_{k_b}``
    (the exponential race of :func:`verify_sampling`, same counters: with the same seed the bonus
    token equals :func:`verify_sampling`'s). The output is not distributed as the target's.

    Differences from vLLM V0 (deliberate): the entropy is the exact one (vLLM V0 and Medusa's
    code use ``log(p + 1e-5)``, which lowers ``H`` of flat distributions by up to about
    ``1e-5 * V``); the recovered token is drawn here, from the filtered ``p_j`` with this package's
    counters (vLLM V0 takes the token its target sampler already drew at that position, also a
    draw from ``p_j``); ``temperature=0`` rows are exactly :func:`verify_greedy`'s; per-row seeds
    as in :func:`verify_sampling`.

    Parameters
    ----------
    target_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, seed, generator
        As in :func:`verify_sampling` (`[B, K+1, V]` logits, `[B, K]` drafts).
    posterior_threshold : float
        Hard acceptance threshold ``epsilon`` on ``p_j(x_j)``, finite and ``>= 0`` (Medusa's
        default 0.09).
    posterior_alpha : float
        Entropy-scaled threshold factor ``delta``, finite and ``>= 0`` (Medusa's default 0.3,
        about ``sqrt(0.09)``).
    backend : {None, "triton", "native", "reference"}
        As in :func:`verify_greedy`. The native C++ kernel and the reference implement it;
        ``"triton"`` (and so CUDA tensors) runs the reference, with a one-time warning.
    validate : bool
        As in :func:`verify_sampling`.

    Returns
    -------
    Verification
        ``tokens [B, K+1]`` int64 (-1 padded), ``num_accepted [B]``, ``num_emitted [B]``.

    Raises
    ------
    TypeError, ValueError
        As in :func:`verify_sampling`; also for a negative or non-finite threshold or alpha.

    Examples
    --------
    >>> import torch, specdec_kernels as sk
    >>> logits = torch.tensor([[[0., 4., 0.], [0., 0., 9.]]])  # p_0(1) ~ 0.96: typical
    >>> out = sk.verify_typical(logits, torch.tensor([[1]]), seed=0)
    >>> out.tokens.tolist(), out.num_accepted.tolist()
    ([[1, 2]], [1])
    """
    for name, value in (
        ("posterior_threshold", posterior_threshold),
        ("posterior_alpha", posterior_alpha),
    ):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a float, got {type(value).__name__}")
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {value}")
    b, k, v = check.check_logits(target_logits)
    device = target_logits.device
    check.check_draft_tokens(draft_tokens, b, k, device)
    draft_tokens = draft_tokens.contiguous()
    nd = check.num_draft_tensor(num_draft_tokens, b, k, device)
    if seed is not None and generator is not None:
        raise ValueError("pass at most one of seed and generator, got both")
    temp, topk, topp = _controls(b, device, temperature, top_k, top_p, seed)
    resolved = resolve_backend(backend, device)
    if validate:
        check.check_values(target_logits, draft_tokens, nd, None, temp, topk, topp)
    return ChainCall(
        target_logits,
        draft_tokens,
        nd,
        "typical",
        resolved,
        temperature=temp,
        top_k=topk,
        top_p=topp,
        seeds=rng.seeds_for_batch(b, device, seed, generator),
        posterior_threshold=posterior_threshold,
        posterior_alpha=posterior_alpha,
    ).run()


def accept_reject(
    draft_tokens: Tensor, verifier_tokens: Tensor, *, backend: str | None = None
) -> Tensor:
    """Length of the longest common prefix of draft and verifier tokens.

    The ``accept_reject/2`` of the Edifice ``SpeculativeDecoding`` module: the number of leading
    positions where ``draft_tokens == verifier_tokens`` (0 when the first token differs).

    Parameters
    ----------
    draft_tokens, verifier_tokens : Tensor
        `[K]` or `[B, K]` integer tensors of the same shape, on the same device.
    backend : {None, "triton", "native", "reference"}
        As in :func:`verify_greedy`.

    Returns
    -------
    Tensor
        A 0-d int64 tensor for `[K]` inputs, `[B]` int64 for `[B, K]` inputs.

    Raises
    ------
    TypeError
        Not integer tensors.
    ValueError
        Shapes or devices differ, or inputs are not 1-d or 2-d.

    Examples
    --------
    >>> import torch, specdec_kernels as sk
    >>> sk.accept_reject(torch.tensor([5, 7, 9]), torch.tensor([5, 7, 1]))
    tensor(2)
    """
    for name, t in (("draft_tokens", draft_tokens), ("verifier_tokens", verifier_tokens)):
        check.require_tensor(name, t)
        check.require_dtype(
            name, t, (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
        )
    if draft_tokens.shape != verifier_tokens.shape:
        raise ValueError(
            f"draft_tokens and verifier_tokens must have the same shape, got "
            f"{check.shape_str(draft_tokens)} and {check.shape_str(verifier_tokens)}"
        )
    if draft_tokens.dim() not in (1, 2):
        raise ValueError(f"draft_tokens must be [K] or [B, K], got {check.shape_str(draft_tokens)}")
    if draft_tokens.device != verifier_tokens.device:
        raise ValueError(
            f"draft_tokens is on {draft_tokens.device} but verifier_tokens is on "
            f"{verifier_tokens.device}"
        )
    single = draft_tokens.dim() == 1
    d2 = draft_tokens.reshape(1, -1) if single else draft_tokens
    v2 = verifier_tokens.reshape(1, -1) if single else verifier_tokens
    out = torch.ops.specdec.accept_reject(
        d2.contiguous(), v2.contiguous(), resolve_backend(backend, draft_tokens.device)
    )
    return out[0] if single else out
