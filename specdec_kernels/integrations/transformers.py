"""Speculative decoding for Hugging Face causal LMs, batched, on ``sk.verify_*``.

``transformers``' assisted generation refuses batches larger than one; here every row of a
left-padded batch accepts its own number of draft tokens. The loop is the package's one decoding
core (:mod:`specdec_kernels.decoding`) over :class:`~specdec_kernels.decoding.HFAdapter`: each
model keeps its own ``DynamicCache``, the positions a row rejected stay as *holes* that its
attention mask hides (cropped once every row has rejected them), rows that finish are removed
from both caches, and one host synchronisation per target pass decides which rows are done.
With ``return_dict_in_generate=True`` the result is a :class:`SpeculativeGenerateOutput`,
``generate()``'s ``GenerateDecoderOnlyOutput`` (``scores`` / ``logits`` with its meaning) plus
the verification pass's ``logprobs`` / ``top_logprobs`` / ``top_ids``.

Requires ``transformers`` (``pip install -e ".[hf]"``).
"""

from __future__ import annotations

import functools

import torch

from specdec_kernels._dispatch import check_backend
from specdec_kernels.decoding import Decoder, HFAdapter, ModelDrafter, NgramDrafter, Sampling
from specdec_kernels.decoding.core import verifiable
from specdec_kernels.reference.verify_sampling import filter_mask, filters_alike
from specdec_kernels.verification import verify_sampling

__all__ = [
    "measure_pass_costs_hf",
    "speculative_generate",
    "speculative_sampling",
]  # and SpeculativeGenerateOutput


def _single_token_bias(sequence_bias) -> dict | None:
    """``generate()``'s ``sequence_bias`` (``{(id, ...): bias}`` or ``[[[id, ...], bias], ...]``)
    of single tokens as the loop's ``logit_bias`` ``{id: bias}``."""
    if sequence_bias is None:
        return None
    items = sequence_bias.items() if isinstance(sequence_bias, dict) else sequence_bias
    out: dict = {}
    for key, bias in items:
        ids = list(key) if isinstance(key, (tuple, list)) else [key]
        if len(ids) != 1:
            raise ValueError(
                f"sequence_bias {tuple(ids)}: only single-token sequences can be biased under "
                "speculation (a multi-token bias depends on the tokens before each position)"
            )
        out[int(ids[0])] = out.get(int(ids[0]), 0.0) + float(bias)
    return out


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
    return_dict_in_generate: bool = False,
    output_scores: bool = False,
    output_logits: bool = False,
    logprobs: str | None = None,
    num_logprobs: int = 0,
    verify_method: str = "token",
    grammar=None,
    assistant_confidence_threshold: float | None = None,
    costs=None,
    ngram_size: int = 3,
    repetition_penalty: float | None = None,
    min_p: float | None = None,
    sequence_bias: dict | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    logits_processor=None,
):
    """Lossless batched speculative decoding with two Hugging Face causal LMs.

    Parameters
    ----------
    target_model, draft_model : transformers.PreTrainedModel
        Causal LMs sharing a tokenizer (same vocabulary size), on the same device and dtype.
        They must accept ``position_ids`` and a 2-D ``attention_mask`` with zeros anywhere.
        ``draft_model=None``: prompt-lookup drafting instead of a model (the drafts are the
        tokens that followed the row's last ``ngram_size`` tokens where they occurred before
        in the row; :func:`specdec_kernels.ngram_draft`).
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
    return_dict_in_generate, output_scores, output_logits : bool
        As in ``generate()``: return a :class:`SpeculativeGenerateOutput` (a
        ``transformers`` ``GenerateDecoderOnlyOutput``) with ``sequences``, and ``scores`` /
        ``logits`` when asked for (see Notes).
    logprobs : {None, "raw", "processed"}
        With ``return_dict_in_generate``: also ``logprobs``, the log-probability of every new
        token, computed by the verification pass without any ``[B, V]`` copy per token
        (:class:`specdec_kernels.decoding.Sampling`'s ``logprobs``).
    num_logprobs : int
        ``0 .. 20``: also ``top_logprobs`` / ``top_ids``, the most likely tokens at each step.
    verify_method : {"token", "block", "match"}
        The acceptance rule when sampling: ``"block"`` is block verification (Sun et al. 2024,
        arXiv 2403.10444), lossless and accepting at least as many drafts in expectation;
        ``"match"`` emits the target's own sample at every position, keyed by (seed, row,
        position): the tokens this function gives with any draft, or without one, for the
        same seed (not the tokens of ``generate(do_sample=True)``, which draws other noise).
        Greedy decoding is the same either way.
    repetition_penalty, min_p, sequence_bias
        As in ``generate()``: ``RepetitionPenaltyLogitsProcessor`` (the prompt and the new
        tokens counted; drafts count at the positions after them), ``MinPLogitsWarper``
        (after top-p) and ``SequenceBiasLogitsProcessor`` with single-token keys
        (``{(token_id,): bias}``; longer sequences raise ``ValueError``), in transformers'
        order: sequence bias, repetition penalty, temperature, top-k, top-p, min-p. Left
        padding is not counted (``generate()`` counts the pad token of a padded row too).
    presence_penalty, frequency_penalty : float, optional
        OpenAI's penalties (no ``generate()`` equivalent), after the repetition penalty.
    logits_processor
        Other logits processors cannot run inside verification: a non-empty one raises
        ``ValueError`` naming it.
    assistant_confidence_threshold : float, optional
        ``transformers``' option of the same name: a row stops drafting after a draft token
        whose probability under the draft is below it (the draft is unsure: its next tokens
        would likely be rejected), and the step's drafting ends when every row has stopped
        (:class:`~specdec_kernels.decoding.ModelDrafter`'s ``stop_below``). ``None`` (default):
        every row drafts its ``K``. Lossless either way.
    ngram_size : int
        With ``draft_model=None``: the n-gram the lookup matches (default 3).
    costs : specdec_kernels.tuning.PassCosts, optional
        What ``"auto"`` prices a step with: measured passes of this pair on this machine
        (:func:`measure_pass_costs_hf`). Default: the parameter-count
        ratio as the draft's cost per token and a target pass costing the same for any
        token count (a GPU's shape, not a CPU's).
    grammar : xgrammar.CompiledGrammar or list of them, optional
        Constrain each row's new tokens (docs: serving.md): compile with
        ``specdec_kernels.grammar.tokenizer_info(tokenizer, vocab_size=config.vocab_size)``. A
        row stops when its grammar ends (its stop token, the tokenizer's eos by default).

    Returns
    -------
    Tensor or SpeculativeGenerateOutput
        ``[B, T + max_new_tokens]`` int64: each input row followed by its new tokens, padded;
        with ``return_dict_in_generate``, that tensor as ``sequences`` of the output.

    Notes
    -----
    ``scores`` and ``logits`` have ``generate()``'s meaning, one ``[B, V]`` float32 tensor per
    new token (``max_new_tokens`` of them, so that ``len(scores) == sequences.shape[1] - T`` as
    ``compute_transition_scores`` assumes), taken from the rows of the target pass that decided
    each token (an accepted draft, the recovered or the bonus token): no second model pass.

    ============  ==========================================  ================================
    field         ``generate(output_scores=True, ...)``       here
    ============  ==========================================  ================================
    ``scores``    processed logits: after the logits          the same: the target's logits,
                  processors and, with ``do_sample``, the     divided by ``temperature`` with
                  warpers (temperature, top-k, top-p: the     ``-inf`` outside top-k / top-p
                  filtered tokens at ``-inf``)                (greedy: the raw logits)
    ``logits``    raw logits (``output_logits=True``)         the same: the target's logits
    ``logprobs``  (none; ``compute_transition_scores(...,     ``[B, max_new_tokens]`` float32
                  normalize_logits=True)`` from ``scores``)   at the emitted tokens: equal to
                                                              that for ``"processed"``
    ============  ==========================================  ================================

    Positions past a row's end (after its eos, or rows all done) are ``-inf`` in ``scores``,
    ``logits`` and ``logprobs`` (``generate()`` keeps scoring its padding there), and ``-1`` in
    ``top_ids``. Like ``generate()``, ``scores`` holds ``B x max_new_tokens x V`` floats:
    ``logprobs`` / ``num_logprobs`` give what most callers want from it without that memory.

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
    if logits_processor:
        names = ", ".join(type(p).__name__ for p in logits_processor)
        raise ValueError(
            f"logits_processor ({names}) cannot run inside speculative verification; the "
            "supported processors are repetition_penalty, min_p, sequence_bias (single tokens), "
            "presence_penalty and frequency_penalty"
        )
    logit_bias = _single_token_bias(sequence_bias)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be a non-empty [B, T] tensor, got "
            f"{list(getattr(input_ids, 'shape', []))}"
        )
    target = HFAdapter(target_model)
    draft = None if draft_model is None else HFAdapter(draft_model)
    if draft is not None and (target.device, target.dtype) != (draft.device, draft.dtype):
        raise ValueError(
            f"draft is on {draft.device}/{draft.dtype} but the target is on "
            f"{target.device}/{target.dtype}"
        )
    if draft is not None and target.vocab_size != draft.vocab_size:
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
    if draft is None:  # prompt lookup: drafting costs (almost) nothing
        cost, drafter = 0.0, NgramDrafter(ngram_size)
    else:
        cost = draft_model.num_parameters() / target_model.num_parameters()
        drafter = ModelDrafter(draft, stop_below=assistant_confidence_threshold)
    decoder = Decoder(
        target,
        drafter,
        num_speculative_tokens,
        max_speculative_tokens=max_speculative_tokens,
        cost_ratio=cost,
        costs=costs,
        backend=backend,
    )
    sampling = Sampling(
        temperature if do_sample else 0.0,
        top_k,
        top_p,
        verify_method,
        logprobs if return_dict_in_generate else None,
        num_logprobs if return_dict_in_generate else 0,
        min_p if do_sample else None,
        repetition_penalty,
        presence_penalty,
        frequency_penalty,
        logit_bias,
    )
    if output_scores and return_dict_in_generate and (sampling.processes_logits or sampling.min_p):
        raise ValueError(
            "output_scores with repetition_penalty / min_p / sequence_bias / presence_penalty / "
            "frequency_penalty is not supported: use logprobs='processed' (the log-probabilities "
            "of the distribution each token was drawn from, processors included)"
        )
    keep = ("scores",) * bool(output_scores) + ("logits",) * bool(output_logits)
    keep = keep if return_dict_in_generate else ()
    rows = _StepRows(len(prompts), max_new_tokens, target.vocab_size, sampling, keep, target.device)
    result = decoder.run(
        prompts,
        max_new_tokens,
        sampling,
        eos_token_id=eos_token_id,
        seed=seed,
        on_step=rows if keep else None,
        grammar=grammar,
    )
    pad = pad_token_id if pad_token_id is not None else (eos_token_id or 0)
    out = torch.full((len(prompts), max_new_tokens), pad, dtype=torch.int64)
    for b, (seq, prompt) in enumerate(zip(result.sequences, prompts)):
        new = seq[len(prompt) :]
        out[b, : len(new)] = torch.tensor(new, dtype=torch.int64)
    sequences = torch.cat([input_ids, out.to(input_ids.device)], 1)
    if not return_dict_in_generate:
        return sequences
    return _output(sequences, rows, result, max_new_tokens, input_ids.device)


def measure_pass_costs_hf(
    target_model,
    draft_model,
    *,
    max_k: int = 8,
    batch_sizes: tuple[int, ...] = (1,),
    context: int = 64,
    repeats: int = 3,
    cache: bool = True,
):
    """Time a ``transformers`` pair's passes on this machine, once, for ``"auto"``
    (``speculative_generate(..., costs=...)``): target passes of ``1 .. max_k + 1`` tokens and
    draft passes of one token, at each of ``batch_sizes`` after a ``context``-token prefix in a
    ``DynamicCache`` (the passes a step makes), each the lower quartile of ``repeats`` calls
    timed round-robin; a pass never costs less with more tokens or rows (running maximum).

    Cached like :func:`specdec_kernels.tuning.measure_pass_costs` (per models, dtypes, thread
    count, torch version and CPU; ``cache=False``: measure afresh).

    Returns
    -------
    specdec_kernels.tuning.PassCosts
    """
    import itertools
    import json
    import time

    from transformers import DynamicCache

    from specdec_kernels.tuning import PassCosts
    from specdec_kernels.tuning._timing import cpu_name, kernels_id, remembered

    batch = tuple(sorted(set(batch_sizes)))
    tokens = tuple(range(1, max_k + 2))

    def describe(m):
        p = next(m.parameters())
        linear = type(m.get_output_embeddings()).__name__
        return [m.config.model_type, m.num_parameters(), str(p.dtype), str(p.device), linear]

    key = "hf_pass_costs:" + json.dumps(
        dict(
            models=[describe(target_model), describe(draft_model)],
            grid=[max_k, list(batch), context],
            cpu=cpu_name(),
            kernels=kernels_id(),
            threads=torch.get_num_threads(),
            torch=torch.__version__,
        ),
        sort_keys=True,
    )

    @torch.inference_mode()
    def timed(model, b: int, counts) -> list[float]:
        dev, v = next(model.parameters()).device, model.config.vocab_size
        kv = DynamicCache()
        cache_kw = HFAdapter(model)._cache_kw  # "cache", or "past_key_values" before 5.x
        ids = torch.randint(0, v, (b, context), device=dev)
        model(input_ids=ids, **{cache_kw: kv}, use_cache=True, logits_to_keep=1)
        times = [[] for _ in counts]
        for _ in range(repeats + 1):  # a warm-up round first
            for i, t in enumerate(counts):
                x = torch.randint(0, v, (b, t), device=dev)
                t0 = time.perf_counter()
                model(input_ids=x, **{cache_kw: kv}, use_cache=True)
                times[i].append(time.perf_counter() - t0)
                kv.crop(-t)
        return [sorted(ts[1:])[len(ts[1:]) // 4] * 1e3 for ts in times]

    def measure() -> PassCosts:
        rows, prev = [], [0.0] * len(tokens)
        for b in batch:
            prev = [
                max(x, y)
                for x, y in zip(itertools.accumulate(timed(target_model, b, tokens), max), prev)
            ]
            rows.append(tuple(prev))
        draft = tuple(itertools.accumulate((timed(draft_model, b, (1,))[0] for b in batch), max))
        return PassCosts(batch, tokens, tuple(rows), draft)

    return remembered(key, measure, dump=PassCosts.to_dict, load=PassCosts.from_dict, cache=cache)


class _StepRows:
    """The decoding loop's ``on_step`` hook that keeps, per new token, the ``[V]`` row of the
    target pass that decided it: ``scores`` (processed) and / or ``logits`` (raw), each a
    ``[B, max_new_tokens + 1, V]`` float32 buffer (the last column takes the positions a step
    did not commit), written in place without a host sync."""

    def __init__(self, b, max_new_tokens, v, sampling, keep, device):
        self.sampling, self.max_new = sampling, max_new_tokens
        shape = (b, max_new_tokens + 1, v)
        self.buffers = {k: torch.full(shape, -torch.inf, device=device) for k in keep}

    def __call__(self, rows, start, count, logits, ver):
        w = logits.shape[1]  # chains: emitted token j was decided at logits[:, j]
        j = torch.arange(w, device=logits.device)
        pos = torch.where(j[None] < count[:, None], start[:, None] + j, self.max_new)  # [B, W]
        index = (rows[:, None].expand(-1, w), pos)
        raw = logits.float()
        for name, buf in self.buffers.items():
            buf.index_put_(index, raw if name == "logits" else _processed(raw, self.sampling))

    def steps(self, name):
        buf = self.buffers.get(name)
        return None if buf is None else tuple(buf[:, i] for i in range(self.max_new))


def _processed(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """``generate()``'s processed scores of ``logits`` ``[B, W, V]`` float32: greedy, the logits;
    sampling, ``logits / temperature`` with ``-inf`` outside top-k / top-p (the verifier's own
    kept set, :func:`specdec_kernels.reference.verify_sampling.filter_mask`)."""
    if sampling.greedy:
        return logits
    x = logits / sampling.temperature
    top_k, top_p = filters_alike(x.shape[0], x.device, sampling.top_k or None, sampling.top_p)
    return x.masked_fill(~filter_mask(x, top_k, top_p), -torch.inf)


def _output(sequences, rows: _StepRows, result, max_new_tokens: int, device):
    """A :class:`SpeculativeGenerateOutput` of the loop's result."""
    b = sequences.shape[0]
    lp = top = ids = None
    if result.logprobs is not None:
        lp = torch.full((b, max_new_tokens), -torch.inf)
        for i, row in enumerate(result.logprobs):
            lp[i, : row.numel()] = row
        lp = lp.to(device)
    if result.top_logprobs is not None:
        n = result.top_logprobs[0].values.shape[1]
        top = torch.full((b, max_new_tokens, n), -torch.inf)
        ids = torch.full((b, max_new_tokens, n), -1, dtype=torch.int64)
        for i, row in enumerate(result.top_logprobs):
            top[i, : row.values.shape[0]] = row.values
            ids[i, : row.ids.shape[0]] = row.ids
        top, ids = top.to(device), ids.to(device)
    return _output_class()(
        sequences=sequences,
        scores=rows.steps("scores"),
        logits=rows.steps("logits"),
        logprobs=lp,
        top_logprobs=top,
        top_ids=ids,
        stats=result.stats,
    )


@functools.cache
def _output_class():
    """:class:`SpeculativeGenerateOutput`, defined once ``transformers`` is imported."""
    from dataclasses import dataclass

    from transformers.generation.utils import GenerateDecoderOnlyOutput

    @dataclass
    class SpeculativeGenerateOutput(GenerateDecoderOnlyOutput):
        """``generate()``'s ``GenerateDecoderOnlyOutput`` (``sequences``, ``scores``,
        ``logits``; see :func:`speculative_generate`'s Notes) with the verification pass's
        ``logprobs`` ``[B, max_new_tokens]`` float32 and, with ``num_logprobs = n``,
        ``top_logprobs`` / ``top_ids`` ``[B, max_new_tokens, n]`` float32 / int64 (``-inf`` /
        ``-1`` past each row's end), and ``stats``, the loop's
        :class:`specdec_kernels.GenerationStats` (acceptance, passes, wall time)."""

        logprobs: torch.FloatTensor | None = None
        stats: object | None = None
        top_logprobs: torch.FloatTensor | None = None
        top_ids: torch.LongTensor | None = None

    SpeculativeGenerateOutput.__module__ = __name__
    return SpeculativeGenerateOutput


def __getattr__(name):
    if name == "SpeculativeGenerateOutput":  # needs transformers: built on first use
        return _output_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
