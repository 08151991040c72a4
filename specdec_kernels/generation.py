"""Batched, lossless speculative generation: draft ``K`` tokens, verify them in one target pass
with :func:`sk.verify_greedy` / :func:`sk.verify_sampling`, roll both KV caches back.

Every row of the batch accepts its own number of tokens; the caches (``sk.KVCache``) keep a
length per row, so nothing is recomputed and no row waits for another. Rows that finish (eos,
``max_new_tokens``, the model's context) are dropped from the batch, caches included, so they cost
no more work. The loop synchronises with the device once per target pass, to learn which rows
are done (and the largest per-row draft count that the next pass needs).

References: Leviathan et al. 2023 (https://arxiv.org/abs/2211.17192), Chen et al. 2023
(https://arxiv.org/abs/2302.01318); gpt-fast's ``speculative_decode``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specdec_kernels.adaptive import AcceptanceTracker, best_num_draft_tokens
from specdec_kernels.ngram import ngram_draft
from specdec_kernels.verification import verify_greedy, verify_sampling

_MIX = 0x9E3779B97F4A7C15 & ((1 << 62) - 1)


@dataclass
class GenerationStats:
    """What a :meth:`SpeculativeGenerator.generate` call did.

    ``target_forwards`` / ``draft_forwards`` count decoding passes (prefill excluded);
    ``acceptance_rate`` = accepted draft tokens / drafted tokens; ``mean_accepted`` = mean
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


@dataclass
class GenerationOutput:
    """``sequences[b]``: prompt + generated tokens of row ``b``; ``draft_accepted[b][i]``: whether
    generated token ``i`` of row ``b`` was a draft token the target accepted."""

    sequences: list[list[int]]
    stats: GenerationStats
    draft_accepted: list[list[bool]]
    prompt_lengths: list[int]


# ----------------------------------------------------------------------------- helpers
def filter_logits(logits: torch.Tensor, temperature: float, top_k: int | None,
                  top_p: float | None) -> torch.Tensor:
    """Temperature, then top-k, then top-p (``transformers``' warper order), as logits
    (``-inf`` where filtered). ``logits``: ``[..., V]``."""
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=False, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum <= 1 - top_p
        drop[..., -1] = False
        logits = logits.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))
    return logits


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of ``probs`` ``[B, V]`` without a host sync: ``argmax(p / Exp(1))``."""
    e = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / e).argmax(-1)


def verifiable(x: torch.Tensor | None) -> torch.Tensor | None:
    """``x`` as the verification ops take it: float32/bfloat16/float16 pass through, other
    floats (float64 test models) are cast to float32."""
    if x is None or x.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return x
    return x.float()


def _row_seeds(seed: int, row_ids: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64 seeds keyed by (seed, original row, sequence position): the verification
    draws of a row do not depend on the rest of the batch."""
    x = (seed * 1_000_003 + row_ids * 7_919 + position * 104_729) & ((1 << 62) - 1)
    return (x * 31 + _MIX) & ((1 << 62) - 1)


def _as_token_lists(prompts) -> list[list[int]]:
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2:
            raise ValueError(f"prompts tensor must be [B, T], got {list(prompts.shape)}")
        return [list(map(int, r)) for r in prompts.tolist()]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists or a [B, T] tensor")
    return [list(map(int, p)) for p in prompts]


def check_prompts(prompts, vocab_size: int, max_seq_len: int) -> list[list[int]]:
    """Token-id lists of ``prompts``; ``ValueError`` for empty rows, ids outside the vocabulary
    or rows longer than the context."""
    rows = _as_token_lists(prompts)
    for b, row in enumerate(rows):
        if not row:
            raise ValueError(f"prompt {b} is empty")
        if len(row) > max_seq_len:
            raise ValueError(f"prompt {b} has {len(row)} tokens, more than the model's context "
                             f"of {max_seq_len}")
        bad = [t for t in row if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {b} has token ids outside [0, {vocab_size}): {bad[:5]}")
    return rows


def _pad(rows: list[list[int]], width: int, device) -> torch.Tensor:
    out = torch.zeros(len(rows), max(width, 1), dtype=torch.int64)
    for b, r in enumerate(rows):
        out[b, : len(r)] = torch.tensor(r[:width], dtype=torch.int64)
    return out.to(device)


def _select_cache(model, cache, rows: torch.Tensor, kv_len: int):
    """A new cache holding only ``rows`` of ``cache`` (copied with the public write/advance)."""
    new = model.new_cache(len(rows), cache.key(0).shape[2])
    for layer in range(model.config.n_layer):
        new.write(layer, cache.key(layer)[rows, :, :kv_len], cache.value(layer)[rows, :, :kv_len])
    new.advance(cache.lengths[rows])
    return new


def cost_per_token(model) -> float:
    """Multiply-adds per token of a GPT-2-layout model (layers and LM head)."""
    c = model.config
    inner = c.n_inner or 4 * c.n_embd
    return c.n_layer * (4 * c.n_embd**2 + 2 * c.n_embd * inner) + c.n_embd * c.vocab_size


# ----------------------------------------------------------------------------- state
@dataclass
class _Rows:
    """Device state of the live rows (all tensors share the batch dim)."""

    ids: torch.Tensor  # [B] int64: original row index
    tokens: torch.Tensor  # [B, cap] int64: sequence buffer, valid in [:seq_len]
    from_draft: torch.Tensor  # [B, cap] bool
    seq_len: torch.Tensor  # [B] int64
    limit: torch.Tensor  # [B] int64: seq_len at which the row is done
    num_draft: torch.Tensor  # [B] int64: draft tokens for the next pass

    def select(self, rows: torch.Tensor) -> _Rows:
        return _Rows(*(t[rows] for t in (self.ids, self.tokens, self.from_draft, self.seq_len,
                                          self.limit, self.num_draft)))


class SpeculativeGenerator:
    """Lossless batched speculative decoding with a draft model (or n-gram lookup).

    Parameters
    ----------
    target : sk.models.CausalLM
        The model whose distribution is produced.
    draft : sk.models.CausalLM or "ngram"
        A cheaper model with the same vocabulary, dtype and device, or ``"ngram"`` for
        prompt-lookup drafting (no model).
    num_speculative_tokens : int or "auto"
        Draft tokens per pass ``K >= 1``, or ``"auto"``: per row, the
        ``K <= max_speculative_tokens`` that maximises expected tokens per unit of cost (see
        :mod:`specdec_kernels.adaptive`), from the row's measured acceptance and the draft/target
        cost ratio ``cost_ratio``. The choice depends only on the tokens accepted so far, never on
        timings, so the same seed gives the same output on every call.
    max_speculative_tokens : int
        Upper bound of ``K`` for ``"auto"`` (default 8).
    cost_ratio : float, optional
        Draft cost per token over target cost per pass, for ``"auto"``, fixed for the object's
        life. Default: the ratio of multiply-adds per token (:func:`cost_per_token`).
        :func:`specdec_kernels.adaptive.measure_cost_ratio` times the two models once on this
        machine, for a value to pass here.
    ngram_size : int
        Longest n-gram matched by the ``"ngram"`` drafter.

    Raises
    ------
    ValueError
        Draft and target with different vocabulary sizes, devices or dtypes; a bad ``K``.

    Examples
    --------
    >>> import specdec_kernels as sk
    >>> target, draft = sk.models.load_bundled()
    >>> gen = sk.SpeculativeGenerator(target, draft, num_speculative_tokens=4)
    >>> out = gen.generate([sk.models.encode("def main():\\n")], max_new_tokens=16)
    >>> len(out.sequences[0])
    28
    """

    def __init__(self, target, draft, num_speculative_tokens: int | str = 4, *,
                 max_speculative_tokens: int = 8, cost_ratio: float | None = None,
                 ngram_size: int = 3):
        auto = num_speculative_tokens == "auto"
        if not auto and (not isinstance(num_speculative_tokens, int)
                         or isinstance(num_speculative_tokens, bool)
                         or num_speculative_tokens < 1):
            raise ValueError("num_speculative_tokens must be an int >= 1 or 'auto', got "
                             f"{num_speculative_tokens!r}")
        if auto and max_speculative_tokens < 1:
            raise ValueError(f"max_speculative_tokens must be >= 1, got {max_speculative_tokens}")
        self.target, self.draft = target, draft
        self.ngram = isinstance(draft, str)
        if self.ngram and draft != "ngram":
            raise ValueError(f"draft must be a model or 'ngram', got {draft!r}")
        tp = next(target.parameters())
        if not self.ngram:
            dp = next(draft.parameters())
            if draft.vocab_size != target.vocab_size:
                raise ValueError(f"draft vocabulary size {draft.vocab_size} differs from the "
                                 f"target's {target.vocab_size}")
            if dp.device != tp.device or dp.dtype != tp.dtype:
                raise ValueError(f"draft is on {dp.device}/{dp.dtype} but the target is on "
                                 f"{tp.device}/{tp.dtype}; move one of them")
        self.device, self.auto = tp.device, auto
        self.max_k = max_speculative_tokens if auto else num_speculative_tokens
        self.ngram_size = ngram_size
        if cost_ratio is not None and not cost_ratio >= 0:
            raise ValueError(f"cost_ratio must be >= 0, got {cost_ratio}")
        self.cost_ratio = cost_ratio if cost_ratio is not None else (
            0.0 if self.ngram else cost_per_token(draft) / cost_per_token(target))

    # ------------------------------------------------------------------------ public
    @torch.inference_mode()
    def generate(self, prompts, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None,
                 eos_token_id: int | None = None, seed: int | None = None,
                 progress=None) -> GenerationOutput:
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
            Seeds the draft's sampling and the verification draws (sampling only).
        progress : callable, optional
            Called as ``progress(generated_tokens_so_far, live_rows)`` after each target pass.

        Returns
        -------
        GenerationOutput
        """
        if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        target, V, ctx = self.target, self.target.vocab_size, self.target.max_seq_len
        rows_in = check_prompts(prompts, V, ctx)
        if eos_token_id is not None and not 0 <= eos_token_id < V:
            raise ValueError(f"eos_token_id {eos_token_id} is outside [0, {V})")
        start = time.perf_counter()
        greedy = temperature == 0
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(seed)
        base_seed = seed if seed is not None or greedy else int(torch.randint(0, 2**31, (1,)))
        B, K = len(rows_in), self.max_k
        lens = [len(r) for r in rows_in]
        cap = max(lens) + max_new_tokens + K + 2
        dev = self.device
        st = _Rows(ids=torch.arange(B, device=dev), tokens=_pad(rows_in, cap, dev),
                   from_draft=torch.zeros(B, cap, dtype=torch.bool, device=dev),
                   seq_len=torch.tensor(lens, device=dev),
                   limit=torch.tensor([min(n + max_new_tokens, ctx) for n in lens], device=dev),
                   num_draft=torch.full((B,), K, dtype=torch.int64, device=dev))
        tracker = AcceptanceTracker.new(B, dev)
        if self.auto:  # the prior's choice until acceptance is measured
            st.num_draft = best_num_draft_tokens(tracker.alpha(), self.cost_ratio, K)
        hist = torch.zeros(K + 1, dtype=torch.int64, device=dev)
        accepted = torch.zeros((), dtype=torch.int64, device=dev)
        drafted = torch.zeros((), dtype=torch.int64, device=dev)
        stats = GenerationStats()
        results: dict[int, tuple[list[int], list[bool]]] = {}

        # prefill: the target holds all but the last token, the draft all but the last two
        tcache = target.new_cache(B, ctx + K + 2)
        mx = max(lens)
        if mx > 1:
            target.hidden_states(_pad([r[:-1] for r in rows_in], mx - 1, dev), tcache, mx - 1)
        tcache.advance(st.seq_len - 1)
        dcache = None
        if not self.ngram:
            dcache = self.draft.new_cache(B, ctx + K + 2)
            if mx > 2:
                self.draft.hidden_states(_pad([r[:-2] for r in rows_in], mx - 2, dev), dcache,
                                         mx - 2)
            dcache.advance((st.seq_len - 2).clamp_min(0))
        done_now = [lens[b] >= min(lens[b] + max_new_tokens, ctx) for b in range(B)]
        host_max_len, k_loop = mx, max(1, int(st.num_draft.max()))
        live = list(range(B))  # host copy of st.ids
        finished_tokens = 0  # generated tokens of rows already collected

        while True:
            if any(done_now):  # drop finished rows (and their cache rows)
                keep = [i for i, d in enumerate(done_now) if not d]
                gone = [i for i, d in enumerate(done_now) if d]
                self._collect(st, gone, lens, results)
                finished_tokens += sum(len(results[live[i]][1]) for i in gone)
                live = [live[i] for i in keep]
                if not keep:
                    break
                keep_t = torch.tensor(keep, device=dev)
                st, tracker = st.select(keep_t), tracker.select(keep_t)
                tcache = _select_cache(target, tcache, keep_t, host_max_len)
                if dcache is not None:
                    dcache = _select_cache(self.draft, dcache, keep_t, host_max_len)
            # ---- draft
            k = st.num_draft.clamp(max=(ctx - 1 - st.seq_len).clamp_min(0))  # [B]
            if self.ngram:
                drafts, found = ngram_draft(st.tokens, st.seq_len, K, self.ngram_size)
                k = torch.minimum(k, found)
                k_loop, draft_probs = K, None
            else:
                drafts, draft_probs = self._draft(dcache, st, k_loop, host_max_len, greedy,
                                                  temperature, top_k, top_p, gen)
                stats.draft_forwards += k_loop
            # ---- target pass over [last token, drafts]
            cur = st.tokens.gather(1, (st.seq_len - 1)[:, None])  # [B, 1]
            feed = torch.cat([cur, drafts.clamp_min(0)], 1)  # [B, k_loop+1]
            logits = target(feed, tcache, kv_len=host_max_len + k_loop,
                            validate=False)  # [B, k_loop+1, V]
            stats.target_forwards += 1
            if greedy:
                ver = verify_greedy(verifiable(logits), drafts, num_draft_tokens=k,
                                    validate=False)
            else:
                ver = verify_sampling(verifiable(logits), drafts, verifiable(draft_probs),
                                      temperature=temperature,
                                      top_k=top_k, top_p=top_p, num_draft_tokens=k,
                                      seed=_row_seeds(base_seed, st.ids, st.seq_len),
                                      validate=False)
            n, e = ver.num_accepted, ver.num_emitted  # [B]
            tcache.advance(n + 1, validate=False)
            if dcache is not None:
                dcache.rollback(k_loop - n, validate=False)
            # ---- commit emitted tokens, cut at eos / limit
            j = torch.arange(k_loop + 1, device=dev)
            keep_n = torch.minimum(e, st.limit - st.seq_len)
            eos_hit = torch.zeros_like(n, dtype=torch.bool)
            if eos_token_id is not None:
                is_eos = (ver.tokens == eos_token_id) & (j[None] < keep_n[:, None])
                first = torch.where(is_eos, j[None], k_loop + 1).amin(-1)
                eos_hit = first < keep_n
                keep_n = torch.where(eos_hit, first + 1, keep_n)
            pos = st.seq_len[:, None] + j  # [B, k_loop+1]
            st.tokens.scatter_(1, pos, ver.tokens.clamp_min(0))
            st.from_draft.scatter_(1, pos, j[None] < n[:, None])
            st.seq_len = st.seq_len + keep_n
            # ---- statistics and next K, on device
            hist += torch.bincount(n, minlength=K + 1)[: K + 1]
            accepted += n.sum()
            drafted += k.sum()
            tracker.update(n, k)
            if self.auto:
                st.num_draft = best_num_draft_tokens(tracker.alpha(), self.cost_ratio, K)
            done = eos_hit | (st.seq_len >= st.limit)
            # ---- the one host sync of the pass
            host = torch.stack([done.long(), st.seq_len, st.num_draft]).tolist()
            done_now, host_max_len = [bool(d) for d in host[0]], max(host[1])
            k_loop = max(1, max(host[2]))
            if progress is not None:
                progress(finished_tokens + sum(host[1]) - sum(lens[i] for i in live),
                         len(live))

        stats.wall_seconds = time.perf_counter() - start
        h = hist.tolist()
        passes = sum(h)
        stats.accepted_histogram = h
        stats.accepted_tokens, stats.drafted_tokens = int(accepted), int(drafted)
        stats.mean_accepted = stats.accepted_tokens / max(passes, 1)
        stats.acceptance_rate = stats.accepted_tokens / max(stats.drafted_tokens, 1)
        seqs = [results[b][0] for b in range(B)]
        stats.generated_tokens = sum(len(s) - n for s, n in zip(seqs, lens))
        stats.tokens_per_second = stats.generated_tokens / max(stats.wall_seconds, 1e-9)
        return GenerationOutput(seqs, stats, [results[b][1] for b in range(B)], lens)

    # ------------------------------------------------------------------------ pieces
    def _draft(self, cache, st: _Rows, k_loop: int, host_max_len: int, greedy: bool,
               temperature: float, top_k, top_p, gen):
        """Run the draft ``k_loop`` times; returns drafts ``[B, k_loop]`` and their
        distributions ``[B, k_loop, V]`` (``None`` when greedy)."""
        draft, dev = self.draft, self.device
        # catch up: feed the 1 or 2 committed tokens the draft cache lacks
        c = st.seq_len - cache.lengths  # [B] in {1, 2}
        idx = (cache.lengths[:, None] + torch.arange(2, device=dev)).clamp(max=st.tokens.shape[1]
                                                                            - 1)
        feed = st.tokens.gather(1, idx)  # [B, 2]
        logits = draft(feed, cache, logits_index=c - 1, kv_len=host_max_len,
                       validate=False)  # [B, V]
        cache.advance(c, validate=False)
        tokens, probs = [], []
        for i in range(k_loop):
            if greedy:
                x = logits.argmax(-1)
            else:
                p = filter_logits(logits, temperature, top_k, top_p).softmax(-1)  # [B, V]
                x = sample(p, gen)
                probs.append(p)
            tokens.append(x)
            if i + 1 < k_loop:
                logits = draft(x[:, None], cache, logits_index=torch.zeros_like(x),
                               kv_len=host_max_len + i + 1, validate=False)
                cache.advance(1, validate=False)
        drafts = torch.stack(tokens, 1)  # [B, k_loop]
        return drafts, (torch.stack(probs, 1) if probs else None)

    @staticmethod
    def _collect(st: _Rows, gone: list[int], lens: list[int], results: dict) -> None:
        g = torch.tensor(gone, device=st.ids.device)
        ids, toks, fd, sl = (t.tolist() for t in (st.ids[g], st.tokens[g], st.from_draft[g],
                                                   st.seq_len[g]))
        for i, row in enumerate(ids):
            n = lens[row]
            results[row] = (toks[i][: sl[i]], [bool(x) for x in fd[i][n: sl[i]]])


@torch.inference_mode()
def autoregressive_generate(model, prompts, max_new_tokens: int = 64, temperature: float = 0.0,
                            top_k: int | None = None, top_p: float | None = None,
                            eos_token_id: int | None = None, seed: int | None = None,
                            progress=None) -> GenerationOutput:
    """The target alone: one token per forward pass, batched over ragged prompts with a KV
    cache. The baseline that speculative generation must equal (greedy) and beat (speed).
    Same arguments and output as :meth:`SpeculativeGenerator.generate`."""
    if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    V, ctx = model.vocab_size, model.max_seq_len
    rows = check_prompts(prompts, V, ctx)
    start = time.perf_counter()
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed) if seed is not None else None
    B, lens = len(rows), [len(r) for r in rows]
    cap = max(lens) + max_new_tokens + 1
    tokens, seq_len = _pad(rows, cap, dev), torch.tensor(lens, device=dev)
    limit = torch.tensor([min(n + max_new_tokens, ctx) for n in lens], device=dev)
    cache = model.new_cache(B, ctx + 1)
    mx = max(lens)
    if mx > 1:
        model.hidden_states(_pad([r[:-1] for r in rows], mx - 1, dev), cache, mx - 1)
    cache.advance(seq_len - 1)
    done = seq_len >= limit
    steps = 0
    while True:
        # the one host sync of a step: are all rows done, and the longest row (the attention span)
        host_done, host_len = torch.stack([done.long(), seq_len]).tolist()
        if all(host_done):
            break
        host_max = max(host_len)
        cur = tokens.gather(1, (seq_len - 1)[:, None])  # [B, 1]
        logits = model(cur, cache, logits_index=torch.zeros(B, dtype=torch.int64, device=dev),
                       kv_len=host_max, validate=False)  # [B, V]
        steps += 1
        if temperature == 0:
            x = logits.argmax(-1)
        else:
            x = sample(filter_logits(logits, temperature, top_k, top_p).softmax(-1), gen)
        live = ~done
        tokens.scatter_(1, seq_len[:, None], torch.where(live, x, 0)[:, None])
        cache.advance(live.long(), validate=False)
        seq_len = seq_len + live.long()
        hit = live & (x == eos_token_id) if eos_token_id is not None else torch.zeros_like(live)
        done = done | hit | (seq_len >= limit)
        if progress is not None:
            progress(int(seq_len.sum()) - sum(lens), B)
    wall = time.perf_counter() - start
    toks, sl = tokens.tolist(), seq_len.tolist()
    seqs = [toks[b][: sl[b]] for b in range(B)]
    generated = sum(sl) - sum(lens)
    stats = GenerationStats(target_forwards=steps, wall_seconds=wall, generated_tokens=generated,
                            tokens_per_second=generated / max(wall, 1e-9))
    return GenerationOutput(seqs, stats, [[False] * (sl[b] - lens[b]) for b in range(B)], lens)
