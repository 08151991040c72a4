"""Argument checks of the vocabulary-parallel ops, agreed over the group.

A check that fails on one rank must fail on every rank, or the others would wait forever in the
next collective. With ``validate=True`` each rank runs its local checks, catching the error,
then one ``all_gather_object`` round shares every rank's outcome and a small summary (its shard
bounds, a fingerprint of the arguments that must agree, and the per-row partial statistics the
global value checks need); every rank then raises the same error, or none does.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass

import torch
import torch.distributed as dist

from specdec_kernels import _validate as check

_RENAMES = (("target_logits", "logits_shard"), ("draft_probs", "draft_probs_shard"))


def renamed(fn, *args):
    """Call a single-device check, naming the shard arguments in its message."""
    try:
        return fn(*args)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        for old, new in _RENAMES:
            message = message.replace(old, new)
        raise type(exc)(message) from None


def check_shard_bounds(vocab_start, vocab_size, width: int) -> None:
    for name, value in (("vocab_start", vocab_start), ("vocab_size", vocab_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if not 0 <= vocab_start or vocab_start + width > vocab_size:
        raise ValueError(
            f"the shard's columns [vocab_start, vocab_start + V_r) = [{vocab_start}, "
            f"{vocab_start + width}) must lie inside [0, vocab_size) = [0, {vocab_size})"
        )


def fingerprint(*values) -> str:
    """A digest of the arguments every rank must pass alike (tensors by value)."""
    h = hashlib.sha256()
    for v in values:
        if isinstance(v, torch.Tensor):
            t = v.detach().to("cpu").contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


def local_value_checks(logits_shard, draft_tokens, num_draft, vocab_start, vocab_size, **rows):
    """Value checks one rank can make alone; indices in messages are global."""
    b, k1, _ = logits_shard.shape
    k = k1 - 1
    bad = (num_draft < 0) | (num_draft > k)
    if bool(bad.any()):
        (row,) = check.first_index(bad)
        raise ValueError(
            f"num_draft_tokens must lie in [0, K] = [0, {k}], got "
            f"num_draft_tokens[{row}] = {int(num_draft[row])}"
        )
    live = torch.arange(k, device=draft_tokens.device)[None, :] < num_draft[:, None]
    bad = live & ((draft_tokens < 0) | (draft_tokens >= vocab_size))
    if bool(bad.any()):
        row, pos = check.first_index(bad)
        raise ValueError(
            f"draft_tokens[{row}, {pos}] = {int(draft_tokens[row, pos])} is outside "
            f"[0, vocab_size) = [0, {vocab_size})"
        )
    bad = torch.isnan(logits_shard) | (logits_shard == float("inf"))
    if bool(bad.any()):
        row, pos, tok = check.first_index(bad)
        raise ValueError(
            f"logits must not hold NaN or +inf (-inf masks a token), got logits[{row}, {pos}, "
            f"{tok + vocab_start}] = {float(logits_shard[row, pos, tok])}"
        )
    q = rows.get("draft_probs")
    if q is not None:
        bad = (q < 0).any(dim=-1) & live
        if bool(bad.any()):
            row, pos = check.first_index(bad)
            raise ValueError(f"draft_probs_shard[{row}, {pos}] has negative entries")
    temperature, top_k, top_p = rows.get("temperature"), rows.get("top_k"), rows.get("top_p")
    if temperature is not None:
        bad = ~(temperature >= 0) | ~torch.isfinite(temperature)
        if bool(bad.any()):
            (row,) = check.first_index(bad)
            raise ValueError(f"temperature must be finite and >= 0, got {temperature.tolist()}")
    if top_k is not None and bool((top_k < 0).any()):
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k.tolist()}")
    if top_p is not None and bool((~((top_p > 0) & (top_p <= 1))).any()):
        raise ValueError(f"top_p must be in (0, 1], got {top_p.tolist()}")


@dataclass
class Summary:
    """What one rank tells the others when validating."""

    vocab_start: int
    width: int
    vocab_size: int
    fingerprint: str
    any_finite: torch.Tensor  # [B, K+1] bool: the shard has a finite logit
    max_abs: torch.Tensor  # [B] float32: largest finite |logit| of the shard
    q_sums: torch.Tensor | None  # [B, K] float32: partial sums of the draft probabilities
    q_tolerance: float  # how far from 1 the draft probabilities' dtype lets a row sum
    plan: tuple | None = None  # the rank's host plan of the verification collectives (sampling)


def summarise(logits_shard, vocab_start, vocab_size, digest, draft_probs=None) -> Summary:
    finite = torch.isfinite(logits_shard)
    biggest = torch.where(finite, logits_shard.float().abs(), 0.0).amax(dim=(1, 2))
    q_sums = None if draft_probs is None else draft_probs.float().sum(dim=-1).cpu()
    return Summary(
        vocab_start,
        logits_shard.shape[-1],
        vocab_size,
        digest,
        finite.any(dim=-1).cpu(),
        biggest.cpu(),
        q_sums,
        check.probs_tolerance(draft_probs.dtype) if draft_probs is not None else 0.0,
    )


def _outcome(error: Exception | None):
    """What a rank tells the others of its local phase: ``None``, or ``(type, message)`` with
    a type every rank can unpickle (else ``RuntimeError``, the type's name in the message)."""
    if error is None:
        return None
    kind, message = type(error), str(error)
    try:
        pickle.loads(pickle.dumps(kind))
    except Exception:
        kind, message = RuntimeError, f"{type(error).__name__}: {message}"
    return kind, message


def _rebuilt(kind: type, message: str) -> Exception:
    try:
        return kind(message)
    except Exception:  # a type whose constructor wants more than a message
        return RuntimeError(f"{kind.__name__}: {message}")


def agree(
    group, error: Exception | None, summary: Summary | None, num_draft, temperature
) -> list[Summary]:
    """One ``all_gather_object`` round, then raise on every rank if any check failed anywhere;
    return every rank's summary, in rank order.

    ``error`` is whatever the rank's local phase raised (any exception, not only argument
    errors): every rank raises it, as the same type, prefixed by the rank that found it."""
    world = dist.get_world_size(group)
    gathered = [None] * world
    dist.all_gather_object(gathered, (_outcome(error), summary), group=group)
    for rank, (outcome, _) in enumerate(gathered):
        if outcome is not None:
            kind, message = outcome
            raise _rebuilt(kind, f"rank {rank}: {message}") from error
    summaries = [s for _, s in gathered]
    _check_tiling(summaries)
    _check_same(summaries)
    _check_global_values(summaries, num_draft, temperature)
    return summaries


def _check_tiling(summaries: list[Summary]) -> None:
    sizes = sorted({s.vocab_size for s in summaries})
    if len(sizes) > 1:
        raise ValueError(f"ranks disagree on vocab_size: {[s.vocab_size for s in summaries]}")
    end = 0
    for s in summaries:
        if s.vocab_start != end:
            break
        end += s.width
    else:
        if end == sizes[0]:
            return
    spans = [(s.vocab_start, s.vocab_start + s.width) for s in summaries]
    raise ValueError(
        f"the shards [vocab_start, vocab_start + V_r) of ranks 0..{len(spans) - 1} are "
        f"{spans}: they must tile [0, vocab_size) = [0, {sizes[0]}) in rank order"
    )


def _check_same(summaries: list[Summary]) -> None:
    digests = [s.fingerprint for s in summaries]
    if len(set(digests)) > 1:
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        raise ValueError(
            "every rank must pass the same draft_tokens, num_draft_tokens, seeds and per-row "
            f"arguments (and shapes [B, K+1]); ranks {odd} differ from rank 0"
        )


def _check_global_values(summaries: list[Summary], num_draft, temperature) -> None:
    any_finite = torch.stack([s.any_finite for s in summaries]).any(dim=0)
    if not bool(any_finite.all()):
        row, pos = check.first_index(~any_finite)
        raise ValueError(
            f"logits[{row}, {pos}] has no finite entry on any rank (every token is masked "
            f"with -inf): there is nothing to emit"
        )
    if summaries[0].q_sums is not None:
        sums = torch.stack([s.q_sums for s in summaries]).sum(dim=0)  # [B, K]
        k = sums.shape[1]
        live = torch.arange(k)[None, :] < num_draft.cpu()[:, None]
        tol = summaries[0].q_tolerance
        off = live & (~torch.isfinite(sums) | ((sums - 1).abs() > tol))
        if bool(off.any()):
            row, pos = check.first_index(off)
            raise ValueError(
                f"draft_probs[{row}, {pos}] (all shards together) does not sum to 1: "
                f"sum = {float(sums[row, pos]):.6g}"
            )
    if temperature is not None:
        biggest = torch.stack([s.max_abs for s in summaries]).amax(dim=0)
        temp = temperature.float().cpu()
        overflow = (temp > 0) & torch.isinf(biggest / torch.where(temp > 0, temp, 1.0))
        if bool(overflow.any()):
            (row,) = check.first_index(overflow)
            raise ValueError(
                f"temperature[{row}] = {float(temp[row]):.3g} is so small that logits / "
                f"temperature overflows float32; use temperature 0 for greedy decoding"
            )
