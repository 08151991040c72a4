"""Drop-in ``vllm.v1.sample.rejection_sampler.rejection_sample`` on this package's kernels.

Follows vLLM at commit ``7f6fc1c5`` (``vllm/v1/sample/rejection_sampler.py``: ``rejection_sample``
with ``rejection_greedy_sample_kernel``, ``rejection_random_sample_kernel``,
``sample_recovered_tokens``; ``PLACEHOLDER_TOKEN_ID = -1``, ``GREEDY_TEMPERATURE = 0``). Earlier
v1 releases (e.g. ``0097a7bb``) marked greedy requests with temperature ``-1`` and passed raw
logits as ``target_probs`` when every request was greedy; both are handled. Switch over with::

    from specdec_kernels.compat.vllm import rejection_sample

Vocabulary (vLLM's): *accepted* tokens pass the test against the raw draft and target
probabilities; a *recovered* token is drawn from the adjusted distribution ``max(0, p - q)`` at
the first rejection; the *bonus* token (sampled by the caller, passed in) follows when every
draft of a request is accepted.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec_kernels import _validate as check
from specdec_kernels._dispatch import check_backend, resolve_backend
from specdec_kernels.compat._common import require
from specdec_kernels.reference import rng
from specdec_kernels.verification import ChainCall, flat_inputs

__all__ = ["PLACEHOLDER_TOKEN_ID", "rejection_sample"]

PLACEHOLDER_TOKEN_ID = -1
_GREEDY_TEMPERATURES = (0.0, -1.0)  # vLLM's GREEDY_TEMPERATURE: 0 now, -1 in early v1


def rejection_sample(
    draft_token_ids: Tensor,
    num_draft_tokens: list[int],
    max_spec_len: int,
    cu_num_draft_tokens: Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    bonus_token_ids: Tensor,
    sampling_metadata,
    *,
    backend: str | None = None,
) -> Tensor:
    """vLLM v1's rejection sampler on the flattened ragged layout, with its output layout.

    Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (ICML 2023).
    Request ``b`` owns the draft tokens ``start_b .. cu[b] - 1`` (``start_b = cu[b-1]``, 0 for
    the first) of ``draft_token_ids`` and the same rows of ``target_probs`` / ``draft_probs``.
    Greedy requests (``sampling_metadata.temperature[b] == 0``; ``-1`` of early v1 releases too)
    accept the longest draft prefix equal to ``argmax(target_probs)`` and emit the argmax at the
    first mismatch. Random requests accept draft ``x`` with probability ``min(1, p(x) / q(x))``
    (``q`` one-hot when ``draft_probs`` is None: n-gram drafts) and at the first rejection emit a
    recovered token drawn from ``norm(max(0, p - q))``. A request whose drafts are all accepted
    emits ``bonus_token_ids[b]``. Runs on :func:`specdec_kernels.verify_sampling`'s kernels:
    they read the flat ``target_probs`` / ``draft_probs`` rows in place through per-request
    offsets and take ``x = log p`` as they load (no ``[.., V]`` tensor is made, and only the
    rejected position's recovered token is drawn, not one per position as upstream does).

    ``sampling_metadata`` is duck-typed: ``all_greedy`` (bool), ``all_random`` (bool),
    ``temperature`` (`[B]` float tensor, or None when ``all_greedy``) and ``generators``
    (``dict[int, torch.Generator]``: request index -> its generator). Top-k / top-p are not
    read: as upstream, ``target_probs`` already carries them (``apply_sampling_constraints``).
    The fast paths are kept: ``all_greedy`` runs the greedy kernel only (on the values as
    given, so raw logits work too), ``all_random`` skips the greedy mask.

    Deliberate differences:

    * Randomness: each random request gets one int64 seed (drawn from its generator when it
      has one and drafts, else from torch's default generator, as upstream draws only for
      requests with drafts) and this package's counter-based numbers follow from it; tokens
      differ from vLLM's for the same generator state, the distribution is the same.
    * The accept test is ``u * q(x) < p(x)`` with ``u`` strictly inside ``(0, 1)``: a draft with
      ``p(x) = 0`` or ``q(x) = 0`` is never accepted (upstream ``p / q >= u`` accepts ``p = 0``
      when ``u = 0``).
    * When ``max(0, p - q)`` has no mass the recovered token is drawn from ``p`` (upstream takes
      the argmax of zeros: token 0, possibly of probability 0).
    * ``target_probs`` rows are used renormalised (``p / sum(p)``, identical for rows that sum
      to 1); float32, bfloat16 and float16 are read as they are.
    * Draft ids outside ``[0, V)`` are never read: they are rejected. No value is validated (no
      host synchronisation, as upstream).

    Parameters
    ----------
    draft_token_ids : Tensor
        `[num_tokens]` int32/int64.
    num_draft_tokens : list of int
        `[B]` draft counts (host list, as upstream; only its length and which requests have
        drafts are used: the counts come from ``cu_num_draft_tokens``).
    max_spec_len : int
        The largest count; the output has ``max_spec_len + 1`` columns.
    cu_num_draft_tokens : Tensor
        `[B]` int32/int64, inclusive cumulative counts.
    draft_probs : Tensor or None
        `[num_tokens, V]` float, or None (n-gram drafts).
    target_probs : Tensor
        `[num_tokens, V]` float: the target distributions at the draft positions.
    bonus_token_ids : Tensor
        `[B, 1]` (or `[B]`) integer.
    sampling_metadata : object
        As above.
    backend : {None, "triton", "native", "reference"}
        Keyword-only, not in the upstream signature: the implementation of this package's
        verification kernels (as :func:`specdec_kernels.verify_sampling`'s ``backend``); ``None``
        (default): the automatic choice. A bad name raises ``ValueError`` before any work.

    Returns
    -------
    Tensor
        `[B, max_spec_len + 1]` int32: each request's output tokens, then ``-1``.

    Raises
    ------
    TypeError, ValueError
        An argument has the wrong type, dtype, shape or device.

    Examples
    --------
    >>> import torch
    >>> from types import SimpleNamespace
    >>> from specdec_kernels.compat.vllm import rejection_sample
    >>> probs = torch.eye(4)[[1, 2, 3, 0, 1, 2]]  # one-hot targets of 6 draft positions
    >>> meta = SimpleNamespace(all_greedy=True, all_random=False, temperature=None,
    ...                        generators={})
    >>> out = rejection_sample(
    ...     torch.tensor([1, 2, 0, 0, 1, 2]), [3, 0, 2, 0, 1], 3,
    ...     torch.tensor([3, 3, 5, 5, 6]), None, probs,
    ...     torch.tensor([[7], [8], [9], [10], [11]]), meta)
    >>> out.tolist()  # request 0 rejects its third draft; 2 and 4 accept all: bonus 9, 11
    [[1, 2, 3, -1], [8, -1, -1, -1], [0, 1, 9, -1], [10, -1, -1, -1], [2, 11, -1, -1]]
    """
    check_backend(backend)
    require("target_probs", target_probs, 2, check.FLOAT_DTYPES)
    device = target_probs.device
    b = len(num_draft_tokens)
    require("cu_num_draft_tokens", cu_num_draft_tokens, 1, check.INT_DTYPES, device)
    check.require_shape(
        "cu_num_draft_tokens", cu_num_draft_tokens, (b,), "[B] = [len(num_draft_tokens)]"
    )
    bonus = require("bonus_token_ids", bonus_token_ids, bonus_token_ids.dim(), check.INT_DTYPES)
    if tuple(bonus.shape) not in ((b, 1), (b,)):
        raise ValueError(f"bonus_token_ids must have shape [B, 1] = [{b}, 1], got {bonus.shape}")
    check.require_device("bonus_token_ids", bonus, device)
    bonus = bonus.reshape(b).to(torch.int64)
    all_greedy = bool(sampling_metadata.all_greedy)
    flat = flat_inputs(
        target_probs,
        draft_token_ids,
        None if all_greedy else draft_probs,
        cu_num_draft_tokens,
        max_spec_len,
        None,
        validate=False,
        bonus_rows=False,
        name="target_probs",
    )
    if target_probs.shape[0] == 0:  # no request has drafts: every output is its bonus token
        out = torch.full((b, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
        out = out.to(device)
        out[:, 0] = bonus.to(torch.int32)
        return out

    backend = resolve_backend(backend, device)
    if all_greedy:
        tokens, accepted, _, *_ = ChainCall(  # argmax of the values as given (probs or logits)
            target_probs,
            flat.drafts,
            num_draft_tokens=flat.num_draft_tokens,
            logits_row_start=flat.logits_row_start,
            mode="greedy",
            backend=backend,
        ).run()
    else:
        if sampling_metadata.all_random:
            temperature = torch.ones(b, dtype=torch.float32, device=device)
        else:
            t = sampling_metadata.temperature
            check.require_tensor("sampling_metadata.temperature", t)
            check.require_shape("sampling_metadata.temperature", t, (b,), "[B]")
            greedy = torch.zeros(b, dtype=torch.bool, device=device)
            for value in _GREEDY_TEMPERATURES:
                greedy |= t.to(device) == value
            temperature = (~greedy).to(torch.float32)  # 0: greedy row, 1: p as given
        seeds = _seeds(b, device, num_draft_tokens, sampling_metadata.generators)
        tokens, accepted, _, *_ = ChainCall(
            target_probs,
            flat.drafts,
            draft_probs=draft_probs,
            num_draft_tokens=flat.num_draft_tokens,
            temperature=temperature,
            seeds=seeds,
            logits_row_start=flat.logits_row_start,
            probs_row_start=flat.probs_row_start if draft_probs is not None else None,
            mode="sampling",
            log_input=True,  # probability inputs: x = log p, read in place
            backend=backend,
        ).run()
    # Every draft accepted: the bonus token is the caller's bonus token, not the kernels' draw
    # (they read some other request's row there: clamped in bounds, and discarded here).
    positions = torch.arange(max_spec_len + 1, device=device)
    at_bonus = (positions[None, :] == accepted[:, None]) & (accepted == flat.num_draft_tokens)[
        :, None
    ]
    tokens = torch.where(at_bonus, bonus[:, None], tokens)
    return tokens.to(torch.int32)


def _seeds(b: int, device, num_draft_tokens, generators) -> Tensor:
    """One int64 seed per request: from its generator when it has one and drafts (advancing
    that generator once, as upstream advances it only then), else from torch's default."""
    seeds = rng.seeds_for_batch(b, device)
    for index, gen in (generators or {}).items():
        if 0 <= index < b and num_draft_tokens[index] > 0:
            draw = torch.randint(0, 2**62, (1,), generator=gen, device=gen.device)
            seeds[index] = draw.to(device)[0]
    return seeds
