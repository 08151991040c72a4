"""What the decoding loop is asked for and what it returns: :class:`Sampling` (how tokens are
chosen and what is reported about them), :class:`DecodeResult` and :class:`GenerationStats`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from specdec_kernels._validate import check_logprob_args, require_int64
from specdec_kernels.reference import rng
from specdec_kernels.reference.verify_sampling import filtered_probs_alike
from specdec_kernels.verification import METHODS


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen and what is reported about them (docs: generation.md, serving.md).

    Parameters
    ----------
    temperature, top_k, top_p
        ``temperature == 0`` is greedy; otherwise temperature, then top-k, then top-p
        (``transformers``' warper order), the same filter for draft and target.
    verify_method : {"token", "block", "match"}
        The acceptance rule of sampled chains (:func:`sk.verify_sampling`'s ``method``):
        token-by-token, block verification (Sun et al. 2024, arXiv 2403.10444), lossless
        too and never fewer accepted drafts in expectation, or ``"match"``: the target's own
        sample at every output position, keyed by (seed, row, output position), so the tokens
        are exactly those of :func:`~specdec_kernels.autoregressive_generate` with the same seed
        and arguments wherever the target's logits do not depend on how many tokens share a
        pass (the bundled CPU models). Greedy rows are decided by argmax either way. Token trees
        have neither rule (``Decoder.run`` raises ``ValueError`` for a tree drafter).
    logprobs : {None, "raw", "processed"}
        Report the log-probability of every generated token (``DecodeResult.logprobs``):
        ``"raw"``: ``log_softmax`` of the target's logits, before temperature and filters;
        ``"processed"``: the log of the distribution the token was drawn from (temperature,
        top-k, top-p; greedy: ``log_softmax`` at temperature 1). As the verification ops define
        them (``logprobs=``), from the pass that verifies.
    num_logprobs : int
        ``n`` in ``[0, 20]``: also the ``n`` most likely tokens of the same distribution at
        every generated position (``DecodeResult.top_logprobs``); needs ``logprobs``.
    min_p : float, optional
        In ``[0, 1]``: after top-p, keep the tokens at least ``min_p`` times as likely as the
        most likely one (the draft's filter too).
    repetition_penalty, presence_penalty, frequency_penalty : float, optional
        transformers' repetition penalty (``> 0``, ``1`` = off) and OpenAI's presence /
        frequency penalties (``0`` = off), counting each row's prompt and generated tokens
        (:func:`sk.verify_sampling`'s ``context_tokens``; drafts count at the positions after
        them, so the output follows plain decoding with the same penalties).
    logit_bias : dict, optional
        ``{token id: bias}`` added to those logits (finite or ``-inf``), every row alike.

    The processors (bias, penalties) change the target's distribution before the bitmask,
    temperature and filters, in that order (API.md section 10); the drafters draw from their
    own filtered distribution without them, which keeps the output exact and costs acceptance
    where the processors move much mass.

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
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None

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
        self._check_processors()

    def _check_processors(self) -> None:
        def real(name, value, low=-math.inf, low_ok=True):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = ok and math.isfinite(value) and (value >= low if low_ok else value > low)
            if not ok:
                bound = f" and {'>=' if low_ok else '>'} {low}" if low != -math.inf else ""
                raise ValueError(f"{name} must be None or a finite float{bound}, got {value!r}")

        if self.min_p is not None:
            real("min_p", self.min_p, 0.0)
            if self.min_p > 1:
                raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty is not None:
            real("repetition_penalty", self.repetition_penalty, 0.0, low_ok=False)
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) is not None:
                real(name, getattr(self, name))
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(
                    f"logit_bias must be None or a dict {{token id: bias}}, got "
                    f"{type(self.logit_bias).__name__}"
                )
            for t, bias in self.logit_bias.items():
                if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                    raise ValueError(f"logit_bias keys must be token ids (ints >= 0), got {t!r}")
                if not isinstance(bias, (int, float)) or math.isnan(bias) or bias == math.inf:
                    raise ValueError(
                        f"logit_bias[{t}] must be a finite float or -inf, got {bias!r}"
                    )

    @property
    def processes_logits(self) -> bool:
        """Whether a logit processor is on (bias or a penalty that is not off): the
        verification ops then need each row's context."""
        return bool(self.logit_bias) or any(
            v is not None and v != off
            for v, off in (
                (self.repetition_penalty, 1.0),
                (self.presence_penalty, 0.0),
                (self.frequency_penalty, 0.0),
            )
        )

    def processor_kwargs(self, context: torch.Tensor | None) -> dict:
        """The verification ops' processor keywords for rows whose tokens so far are
        ``context`` ``[B, L]`` (``-1`` padded; read only when a processor is on)."""
        kw = {} if not self.min_p else {"min_p": self.min_p}
        if not self.processes_logits:
            return kw
        kw.update(
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            context_tokens=context,
        )
        if self.logit_bias:
            b, dev = context.shape[0], context.device
            ids = torch.tensor(list(self.logit_bias), dtype=torch.int64, device=dev)
            bias = torch.tensor(list(self.logit_bias.values()), dtype=torch.float32, device=dev)
            kw["logit_bias"] = (ids.expand(b, -1), bias.expand(b, -1))
        return kw

    @property
    def logprob_kwargs(self) -> dict:
        """The verification ops' ``logprobs`` / ``num_logprobs`` keywords (empty when no
        logprobs are asked for, so ops without them, a sharded target's, still apply)."""
        if self.logprobs is None:
            return {}
        return {"logprobs": self.logprobs, "num_logprobs": self.num_logprobs}

    @property
    def filter_kwargs(self) -> dict:
        """The verification ops' ``temperature`` / ``top_k`` / ``top_p`` keywords."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

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
            logits[:, None], self.temperature, self.top_k or None, self.top_p, self.min_p or None
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


def collect(rows_in, results: dict, steps: list, stats: GenerationStats, start: float, max_k: int):
    """The :class:`DecodeResult` of a run: ``rows_in`` the prompts, ``results[b]`` row ``b``'s
    ``(tokens, from_draft, logprobs, top)`` as it retired, ``steps`` the ``[B]`` accepted and
    drafted counts of every step, ``stats`` its pass counts (filled in here), ``start`` its
    ``time.perf_counter()``, ``max_k`` the most drafts a step (the histogram's length - 1)."""
    n = torch.cat([a for a, _ in steps]).cpu() if steps else torch.zeros(0, dtype=torch.int64)
    drafted = int(torch.cat([k for _, k in steps]).sum()) if steps else 0
    accepted = int(n.sum())
    hist = torch.bincount(n, minlength=max_k + 1)[: max_k + 1].tolist()
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
