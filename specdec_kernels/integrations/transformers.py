"""Speculative decoding for Hugging Face causal LMs, batched, on ``sk.verify_*``.

``transformers``' assisted generation refuses batches larger than one; here every row of a
left-padded batch accepts its own number of draft tokens. Both models keep their own
``DynamicCache``; the positions a row rejected stay in the cache as *holes* that its attention
mask hides (and that are cropped once every row has rejected them), so rows that accept
different counts never see each other's tokens and nothing is recomputed. Rows that finish are
removed from both caches. One host synchronisation per target pass decides which rows are done.

Requires ``transformers`` (``pip install -e ".[hf]"``).
"""

from __future__ import annotations

import inspect

import torch

from specdec_kernels.adaptive import AcceptanceTracker, best_num_draft_tokens
from specdec_kernels.generation import filter_logits, sample, verifiable
from specdec_kernels.verification import verify_greedy, verify_sampling

__all__ = ["speculative_generate", "speculative_sampling"]


def _cache_kw(model) -> str:
    """The name under which ``model.forward`` takes its cache (``cache`` since transformers 5.x
    renamed ``past_key_values``)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _context(model) -> int | None:
    c = model.config
    for name in ("max_position_embeddings", "n_positions"):
        v = getattr(c, name, None)
        if isinstance(v, int):
            return v
    return None


class _Stream:
    """One model's cache with per-slot validity (``mask`` ``[B, S]``), fed with explicit
    position ids."""

    def __init__(self, model, ctx):
        from transformers import DynamicCache

        self.model, self.ctx = model, ctx
        self.kw = _cache_kw(model)
        self.cache = DynamicCache()
        self.mask = None  # [B, S] long
        self.keep_arg = "logits_to_keep" in inspect.signature(model.forward).parameters

    def feed(self, ids, valid, pos, last_only=False):
        """Append slots ``ids`` ``[B, T]`` (``valid`` ``[B, T]``) at positions ``pos`` ``[B, T]``;
        return logits ``[B, T, V]`` (or ``[B, 1, V]`` with ``last_only``)."""
        self.mask = valid.long() if self.mask is None else torch.cat([self.mask, valid.long()], 1)
        if self.ctx is not None:
            pos = pos.clamp(max=self.ctx - 1)
        kw = {self.kw: self.cache, "attention_mask": self.mask, "position_ids": pos,
              "use_cache": True}
        if last_only and self.keep_arg:
            kw["logits_to_keep"] = 1
        out = self.model(input_ids=ids, **kw)
        return out.logits[:, -1:] if last_only else out.logits

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]

    def crop_holes(self, n: int) -> None:
        """Drop the last ``n`` slots (holes in every row)."""
        if n > 0:
            self.cache.crop(-n)  # negative: remove n (absolute sizes are legacy in 5.x)
            self.mask = self.mask[:, :-n]


@torch.inference_mode()
def speculative_generate(target_model, draft_model, input_ids, attention_mask=None,
                         max_new_tokens: int = 32, do_sample: bool = False,
                         temperature: float = 1.0, top_k: int | None = None,
                         top_p: float | None = None, num_speculative_tokens: int | str = 4,
                         eos_token_id: int | None = None, pad_token_id: int | None = None,
                         seed: int | None = None, max_speculative_tokens: int = 8) -> torch.Tensor:
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
        Makes sampling reproducible.

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
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty [B, T] tensor, got "
                         f"{list(input_ids.shape)}")
    if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    auto = num_speculative_tokens == "auto"
    if not auto and (not isinstance(num_speculative_tokens, int)
                     or isinstance(num_speculative_tokens, bool) or num_speculative_tokens < 1):
        raise ValueError(f"num_speculative_tokens must be an int >= 1 or 'auto', got "
                         f"{num_speculative_tokens!r}")
    if auto and max_speculative_tokens < 1:
        raise ValueError(f"max_speculative_tokens must be >= 1, got {max_speculative_tokens}")
    tp, dp = next(target_model.parameters()), next(draft_model.parameters())
    if tp.device != dp.device or tp.dtype != dp.dtype:
        raise ValueError(f"draft is on {dp.device}/{dp.dtype} but the target is on "
                         f"{tp.device}/{tp.dtype}")
    V = target_model.get_output_embeddings().weight.shape[0]
    Vd = draft_model.get_output_embeddings().weight.shape[0]
    if V != Vd:
        raise ValueError(f"draft vocabulary size {Vd} differs from the target's {V}")
    dev = tp.device
    input_ids = input_ids.to(dev)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = attention_mask.to(dev).long()
    if (attention_mask.sum(1) == 0).any():
        raise ValueError("a row of attention_mask has no tokens (empty prompt)")
    if (attention_mask[:, -1] == 0).any():
        raise ValueError("input must be left-padded: the last column of attention_mask must be 1")
    real = input_ids[attention_mask.bool()]
    if ((real < 0) | (real >= V)).any():
        raise ValueError(f"input_ids has token ids outside [0, {V})")
    ctx = _context(target_model)
    lengths = attention_mask.sum(1)  # [B]
    if ctx is not None and int(lengths.max()) > ctx:
        raise ValueError(f"a prompt has {int(lengths.max())} tokens, more than the target's "
                         f"context of {ctx}")
    greedy = not do_sample or temperature == 0
    if do_sample and temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    pad = pad_token_id if pad_token_id is not None else (eos_token_id or 0)
    B, T = input_ids.shape
    K = max_speculative_tokens if auto else num_speculative_tokens
    cost = (sum(p.numel() for p in draft_model.parameters())
            / sum(p.numel() for p in target_model.parameters()))
    tracker = AcceptanceTracker.new(B, dev)
    k_next = torch.full((B,), K, dtype=torch.int64, device=dev)  # [B] per-row K
    if auto:  # the prior's choice until acceptance is measured
        k_next = best_num_draft_tokens(tracker.alpha(), cost, K)
    gen = torch.Generator(device=dev).manual_seed(seed) if seed is not None else None
    base_seed = seed if seed is not None or greedy else int(torch.randint(0, 2**31, (1,)))
    limit_ctx = ctx if ctx is not None else 2**62

    out = torch.full((B, max_new_tokens + K + 1), pad, dtype=torch.int64, device=dev)
    n_out = torch.zeros(B, dtype=torch.int64, device=dev)  # [B] new tokens so far
    rows = torch.arange(B, device=dev)  # live rows -> original index
    t, d = _Stream(target_model, ctx), _Stream(draft_model, _context(draft_model))
    pos_all = (attention_mask.cumsum(1) - 1).clamp_min(0)  # [B, T]
    if T > 1:  # prefill everything but the last token
        for s in (t, d):
            s.feed(input_ids[:, :-1], attention_mask[:, :-1], pos_all[:, :-1])
    cur = input_ids[:, -1]  # [B]: the last token, not yet in the caches
    pos = lengths - 1  # [B]: its position
    x0 = torch.zeros_like(cur)  # the draft's missing token after a full acceptance
    x0_valid = torch.zeros(B, dtype=torch.bool, device=dev)
    done = (lengths >= limit_ctx).tolist()
    k_loop = int(k_next.max())  # host: draft steps this pass (the largest per-row K)
    while True:
        if any(done):
            keep = torch.tensor([i for i, x in enumerate(done) if not x], dtype=torch.int64,
                                device=dev)
            if len(keep) == 0:
                break
            rows, cur, pos = rows[keep], cur[keep], pos[keep]
            x0, x0_valid, k_next = x0[keep], x0_valid[keep], k_next[keep]
            tracker = tracker.select(keep)
            for s in (t, d):
                s.select(keep)
        b = len(rows)
        K = k_loop
        j = torch.arange(K + 1, device=dev)
        k = torch.minimum(k_next, (limit_ctx - 1 - pos).clamp(0, K))  # [b] drafts per row
        # ---- draft K tokens: slots [x0 (maybe a hole), cur, d1 .. d_{K-1}]
        feed = torch.stack([x0, cur], 1)
        valid = torch.stack([x0_valid, torch.ones_like(x0_valid)], 1)
        logits = d.feed(feed, valid, torch.stack([pos - 1, pos], 1).clamp_min(0), True)[:, 0]
        drafts, probs = [], []
        for i in range(K):
            if greedy:
                x = logits.argmax(-1)
            else:
                p = filter_logits(logits, temperature, top_k, top_p).softmax(-1)
                x = sample(p, gen)
                probs.append(p)
            drafts.append(x)
            if i + 1 < K:
                logits = d.feed(x[:, None], torch.ones(b, 1, dtype=torch.bool, device=dev),
                                (pos + i + 1)[:, None], True)[:, 0]
        drafts = torch.stack(drafts, 1)  # [b, K]
        # ---- target pass over [cur, d1 .. dK]
        logits = t.feed(torch.cat([cur[:, None], drafts], 1),
                        torch.ones(b, K + 1, dtype=torch.bool, device=dev),
                        pos[:, None] + j)  # [b, K+1, V]
        if greedy:
            ver = verify_greedy(verifiable(logits), drafts, num_draft_tokens=k,
                                validate=False)
        else:
            seeds = (base_seed * 1_000_003 + rows * 7_919 + pos * 104_729) & ((1 << 62) - 1)
            ver = verify_sampling(verifiable(logits), drafts, verifiable(torch.stack(probs, 1)),
                                  temperature=temperature,
                                  top_k=top_k, top_p=top_p, num_draft_tokens=k, seed=seeds,
                                  validate=False)
        n = ver.num_accepted  # [b]
        # ---- holes: target slots j > n, draft slots d_i with i > n
        t.mask[:, -(K + 1):] = (j[None] <= n[:, None]).long()
        if K > 1:
            d.mask[:, -(K - 1):] = (j[None, 1:K] <= n[:, None]).long()
        full = n == K
        x0 = torch.where(full, drafts[:, -1], 0)
        x0_valid = full
        # ---- commit, cut at eos / max_new_tokens / context
        room = torch.minimum(max_new_tokens - n_out[rows], limit_ctx - 1 - pos)  # [b]
        keep_n = torch.minimum(ver.num_emitted, room)
        eos_hit = torch.zeros_like(full)
        if eos_token_id is not None:
            is_eos = (ver.tokens == eos_token_id) & (j[None] < keep_n[:, None])
            first = torch.where(is_eos, j[None], K + 1).amin(-1)
            eos_hit = first < keep_n
            keep_n = torch.where(eos_hit, first + 1, keep_n)
        dst = n_out[rows][:, None] + j  # [b, K+1]
        vals = torch.where(j[None] < keep_n[:, None], ver.tokens, pad)
        out[rows[:, None], dst] = vals
        n_out[rows] += keep_n
        cur = ver.tokens.gather(1, n[:, None])[:, 0]
        pos = pos + n + 1
        finished = eos_hit | (n_out[rows] >= max_new_tokens) | (pos + 1 >= limit_ctx)
        tracker.update(n, k)
        if auto:
            k_next = best_num_draft_tokens(tracker.alpha(), cost, max_speculative_tokens)
        # ---- the one host sync: which rows are done, how many trailing holes all rows share
        host = torch.stack([finished.long(), K - n, k_next]).tolist()
        done = [bool(x) for x in host[0]]
        live_k = [r for r, f in zip(host[2], done) if not f]
        k_loop = max(live_k) if live_k else K
        live_tail = [r for r, f in zip(host[1], done) if not f]
        if live_tail and min(live_tail) > 0:
            t.crop_holes(min(live_tail))
        if live_tail and K > 1 and min(live_tail) > 1:
            d.crop_holes(min(live_tail) - 1)
    return torch.cat([input_ids, out[:, :max_new_tokens]], 1)


def speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                         assistant_ensemble_weight: float | None = None):
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
    if assistant_ensemble_weight is not None and assistant_ensemble_weight != 1.0:
        raise ValueError("speculative_sampling: assistant_ensemble_weight (a lossy variant) is "
                         "not supported")
    gamma = int(candidate_length)
    drafts = candidate_input_ids[:, -gamma:] if gamma > 0 else candidate_input_ids[:, :0]
    q = candidate_logits.float().softmax(-1)  # [B, gamma, V]
    seed = int(torch.randint(0, 2**62, (1,)).item())
    ver = verify_sampling(verifiable(new_logits[:, : gamma + 1]), drafts, q, temperature=1.0,
                          seed=seed)
    n = ver.num_accepted
    if n.numel() == 1:
        n0 = n[0]
        return ver.tokens[:, : int(n0) + 1], n0
    return ver.tokens[:, : int(n.max()) + 1], n
