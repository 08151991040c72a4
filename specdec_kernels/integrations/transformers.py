"""Speculative decoding for Hugging Face causal LMs, batched, on ``sk.verify_*``.

``transformers``' assisted generation refuses batches larger than one; here every row of a
left-padded batch accepts its own number of draft tokens. The loop is the package's one decoding
core (:mod:`specdec_kernels.decoding`) over :class:`~specdec_kernels.decoding.HFAdapter`: each
model keeps its own ``DynamicCache``, the positions a row rejected stay as *holes* that its
attention mask hides (cropped once every row has rejected them), rows that finish are removed
from both caches, and one host synchronisation per target pass decides which rows are done.

Requires ``transformers`` (``pip install -e ".[hf]"``).
"""

from __future__ import annotations

import torch

from specdec_kernels._dispatch import check_backend
from specdec_kernels.decoding import Decoder, HFAdapter, ModelDrafter, Sampling
from specdec_kernels.decoding.core import verifiable
from specdec_kernels.verification import verify_sampling

__all__ = ["speculative_generate", "speculative_sampling"]


def speculative_generate(
    target_model,
    draft_model,
    input_ids,
    attention_mask=None,
    max_new_tokens: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_speculative_tokens: int | str = 4,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    seed: int | None = None,
    max_speculative_tokens: int = 8,
    *,
    backend: str | None = None,
    grammar=None,
) -> torch.Tensor:
    """Lossless batched speculative decoding with two Hugging Face causal LMs.

    Parameters
    ----------
    target_model, draft_model : transformers.PreTrainedModel
        Causal LMs sharing a tokenizer (same vocabulary size), on the same device and dtype.
        They must accept ``position_ids`` and a 2-D ``attention_mask`` with zeros anywhere.
    input_ids : Tensor
        ``[B, T]`` int64, left-padded like ``generate()``'s input.
    attention_mask : Tensor, optional
        ``[B, T]``, 0 on padding. Default: all ones.
    max_new_tokens : int
        ``>= 1``.
    do_sample, temperature, top_k, top_p
        As in ``generate()``: greedy by default (then each row equals
        ``target_model.generate(..., do_sample=False)``); with ``do_sample`` the output is
        distributed as the target's under the same warpers.
    num_speculative_tokens : int or "auto"
        Draft tokens per target pass, ``K >= 1``, or ``"auto"``: per row, the
        ``K <= max_speculative_tokens`` maximising expected tokens per unit of cost from the
        row's measured acceptance and the models' parameter-count ratio (Leviathan et al.).
    eos_token_id, pad_token_id : int, optional
        A row stops after ``eos_token_id``; later positions hold ``pad_token_id`` (default:
        ``eos_token_id``, else 0).
    seed : int, optional
        Makes sampling reproducible. With the same seed, a ``CausalLM`` pair in
        ``sk.SpeculativeGenerator`` and the same pair converted with ``to_hf()`` here give the
        same tokens (one loop, one seed function).
    backend : {None, "triton", "native", "reference"}
        The implementation of the verification ops, as their ``backend``
        (:func:`specdec_kernels.verify_greedy`); ``None`` (default): their automatic choice.
        A bad name raises ``ValueError`` before any work.
    grammar : xgrammar.CompiledGrammar or list of them, optional
        Constrain each row's new tokens (API.md section 9): compile with
        ``specdec_kernels.grammar.tokenizer_info(tokenizer, vocab_size=config.vocab_size)``. A
        row stops when its grammar ends (its stop token, the tokenizer's eos by default).

    Returns
    -------
    Tensor
        ``[B, T + max_new_tokens]`` int64: each input row followed by its new tokens, padded.

    Examples
    --------
    >>> from transformers import AutoModelForCausalLM, AutoTokenizer  # doctest: +SKIP
    >>> tok = AutoTokenizer.from_pretrained("./gpt2", padding_side="left")  # doctest: +SKIP
    >>> tok.pad_token = tok.eos_token  # doctest: +SKIP
    >>> target = AutoModelForCausalLM.from_pretrained("./gpt2")  # doctest: +SKIP
    >>> draft = AutoModelForCausalLM.from_pretrained("./distilgpt2")  # doctest: +SKIP
    >>> batch = tok(["The quick brown", "Speculative decoding is"], return_tensors="pt",
    ...             padding=True)  # doctest: +SKIP
    >>> out = speculative_generate(target, draft, **batch, max_new_tokens=32)  # doctest: +SKIP
    """
    check_backend(backend)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be a non-empty [B, T] tensor, got "
            f"{list(getattr(input_ids, 'shape', []))}"
        )
    target, draft = HFAdapter(target_model), HFAdapter(draft_model)
    if (target.device, target.dtype) != (draft.device, draft.dtype):
        raise ValueError(
            f"draft is on {draft.device}/{draft.dtype} but the target is on "
            f"{target.device}/{target.dtype}"
        )
    if target.vocab_size != draft.vocab_size:
        raise ValueError(
            f"draft vocabulary size {draft.vocab_size} differs from the target's "
            f"{target.vocab_size}"
        )
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    mask = mask.to(input_ids.device).long()
    if bool((mask.sum(1) == 0).any()):
        raise ValueError("a row of attention_mask has no tokens (empty prompt)")
    if bool((mask[:, -1] == 0).any()):
        raise ValueError("input must be left-padded: the last column of attention_mask must be 1")
    prompts = [row[m.bool()].tolist() for row, m in zip(input_ids, mask)]
    cost = sum(p.numel() for p in draft_model.parameters()) / sum(
        p.numel() for p in target_model.parameters()
    )
    decoder = Decoder(
        target,
        ModelDrafter(draft),
        num_speculative_tokens,
        max_speculative_tokens=max_speculative_tokens,
        cost_ratio=cost,
        backend=backend,
    )
    sampling = Sampling(temperature if do_sample else 0.0, top_k, top_p)
    result = decoder.run(
        prompts, max_new_tokens, sampling, eos_token_id=eos_token_id, seed=seed, grammar=grammar
    )
    pad = pad_token_id if pad_token_id is not None else (eos_token_id or 0)
    out = torch.full((len(prompts), max_new_tokens), pad, dtype=torch.int64)
    for b, (seq, prompt) in enumerate(zip(result.sequences, prompts)):
        new = seq[len(prompt) :]
        out[b, : len(new)] = torch.tensor(new, dtype=torch.int64)
    return torch.cat([input_ids, out.to(input_ids.device)], 1)


def speculative_sampling(
    candidate_input_ids,
    candidate_logits,
    candidate_length,
    new_logits,
    assistant_ensemble_weight: float | None = None,
    *,
    backend: str | None = None,
):
    """Drop-in for ``transformers.generation.utils._speculative_sampling`` on
    :func:`sk.verify_sampling` (Leviathan et al. 2023, algorithm 1).

    Parameters
    ----------
    candidate_input_ids : Tensor
        ``[1, T + gamma]``: the sequence ending with the ``gamma`` draft tokens.
    candidate_logits : Tensor
        ``[1, gamma, V]``: the (processed) draft logits the candidates were sampled from.
    candidate_length : int
        ``gamma``.
    new_logits : Tensor
        ``[1, gamma + 1, V]``: the target's processed logits.
    assistant_ensemble_weight : None
        Only ``None`` / ``1.0`` (exact speculative sampling) is supported.
    backend : {None, "triton", "native", "reference"}
        Keyword-only, not in the upstream signature: the verification op's ``backend``
        (:func:`specdec_kernels.verify_sampling`); ``None`` (default): its automatic choice.

    Returns
    -------
    valid_tokens : Tensor
        ``[1, n_matches + 1]`` int64: the accepted candidates and one more token.
    n_matches : Tensor
        0-d int64, the number of accepted candidates. (With ``B > 1`` rows, ``valid_tokens`` is
        ``[B, max(n_matches) + 1]`` padded with -1 and ``n_matches`` is ``[B]``.)

    The random draws come from ``torch``'s global generator (like the function it replaces), so
    ``torch.manual_seed`` makes them reproducible.
    """
    check_backend(backend)
    if assistant_ensemble_weight is not None and assistant_ensemble_weight != 1.0:
        raise ValueError(
            "speculative_sampling: assistant_ensemble_weight (a lossy variant) is not supported"
        )
    gamma = int(candidate_length)
    drafts = candidate_input_ids[:, -gamma:] if gamma > 0 else candidate_input_ids[:, :0]
    q = candidate_logits.float().softmax(-1)  # [B, gamma, V]
    seed = int(torch.randint(0, 2**62, (1,)).item())
    ver = verify_sampling(
        verifiable(new_logits[:, : gamma + 1]),
        drafts,
        q,
        temperature=1.0,
        seed=seed,
        backend=backend,
    )
    n = ver.num_accepted
    if n.numel() == 1:
        n0 = n[0]
        return ver.tokens[:, : int(n0) + 1], n0
    return ver.tokens[:, : int(n.max()) + 1], n
