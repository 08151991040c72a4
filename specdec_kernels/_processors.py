"""The verification ops' processor keywords (API.md section 10): ``min_p``, ``logit_bias``, the
repetition / presence / frequency penalties and the ``context_tokens`` they count, checked and
turned into what the kernels take: ``min_p [B]`` and the edit list of
:func:`specdec_kernels.reference.processors.logit_edits` (the same for every backend)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec_kernels import _extension
from specdec_kernels import _validate as check
from specdec_kernels.reference.processors import logit_edits

FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
INT_DTYPES = (torch.int32, torch.int64)
#: Each penalty's value that turns it off.
_OFF = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


@dataclass(frozen=True)
class Processors:
    """The checked processor keywords of one call (``None`` = off): ``min_p`` ``[B]`` float32;
    ``bias`` ``(ids [B, M] int64, bias [B, M] float64)``; the penalties ``[B]`` float64;
    ``context`` ``[B, L]`` int64."""

    min_p: Tensor | None = None
    bias: tuple[Tensor, Tensor] | None = None
    repetition: Tensor | None = None
    presence: Tensor | None = None
    frequency: Tensor | None = None
    context: Tensor | None = None

    @property
    def edits_logits(self) -> bool:
        """Whether any processor changes logits (an edit list is due)."""
        return self.bias is not None or any(
            p is not None for p in (self.repetition, self.presence, self.frequency)
        )

    def edits(
        self,
        target_logits: Tensor,
        draft_tokens: Tensor,
        num_draft_tokens: Tensor,
        logits_row_start: Tensor | None = None,
        temperature: Tensor | None = None,
        validate: bool = True,
        backend: str = "reference",
    ) -> tuple[Tensor | None, Tensor | None]:
        """``(edit_ids [B, E] int32, edit_vals [B, K+1, E] float32)`` of this call, or
        ``(None, None)`` when no processor changes logits. ``validate``: also reject a
        ``temperature`` under which a processed logit overflows float32. ``backend``: the
        resolved backend of the call; the native one builds the list with the extension's
        ``native_logit_edits`` (one op, bit for bit the reference's
        :func:`~specdec_kernels.reference.processors.logit_edits`, a few dozen tensor ops)."""
        if not self.edits_logits:
            return None, None
        args = (
            target_logits, draft_tokens, num_draft_tokens, self.context, self.bias,
            self.repetition, self.presence, self.frequency, logits_row_start,
        )  # fmt: skip
        if backend == "native" and _extension.has_op("native_logit_edits"):
            ids, vals = _native_edits(*args)
        else:
            ids, vals = logit_edits(*args)
        if validate:
            _check_processed(vals, temperature)
            _check_some_finite(target_logits, ids, vals, num_draft_tokens, logits_row_start)
        return ids, vals


def _native_edits(logits, drafts, nd, context, bias, rep, pres, freq, row_start):
    bias_ids, bias_values = (None, None) if bias is None else bias
    return torch.ops.specdec.native_logit_edits(
        logits, drafts, nd, context, bias_ids, bias_values, rep, pres, freq, row_start
    )


def _per_row_float(name: str, value, b: int, device, dtype=torch.float64) -> Tensor:
    return check.per_row(name, value, b, device, dtype, FLOAT_DTYPES, numbers.Real)


def _is_off(name: str, value) -> bool:
    return value is None or (
        isinstance(value, numbers.Real) and not isinstance(value, bool) and value == _OFF[name]
    )


def parse(
    b: int,
    v: int,
    device: torch.device,
    *,
    min_p=None,
    logit_bias=None,
    repetition_penalty=None,
    presence_penalty=None,
    frequency_penalty=None,
    context_tokens=None,
    validate: bool = True,
) -> Processors:
    """Check the processor keywords of a ``B``-row call over ``V`` tokens (types, shapes and
    devices always; values with ``validate``, which synchronises) and return them as tensors.

    Raises
    ------
    TypeError, ValueError
        A bad argument, named with the values seen; a penalty without ``context_tokens``.
    """
    penalties = {
        "repetition_penalty": repetition_penalty,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
    }
    rows = {
        name: None if _is_off(name, value) else _per_row_float(name, value, b, device)
        for name, value in penalties.items()
    }
    on = [name for name, value in rows.items() if value is not None]
    context = None
    if context_tokens is not None:
        context = check.require_tensor("context_tokens", context_tokens)
        check.require_dtype("context_tokens", context, INT_DTYPES)
        if context.dim() != 2 or context.shape[0] != b:
            raise ValueError(
                f"context_tokens must be [B, L] = [{b}, L], got {check.shape_str(context)}"
            )
        check.require_device("context_tokens", context, device)
        context = context.to(torch.int64)
    elif on:
        raise ValueError(
            f"{on[0]} counts the tokens already in each row: pass context_tokens [B, L] "
            "(the prompt and generated tokens, -1 padded)"
        )
    bias = None
    if logit_bias is not None:
        bias = _parse_bias(logit_bias, b, device)
    minp = None
    if not (min_p is None or (isinstance(min_p, numbers.Real) and min_p == 0)):
        if isinstance(min_p, numbers.Real) and not 0 <= min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {min_p}")
        minp = _per_row_float("min_p", min_p, b, device, torch.float32)
    parsed = Processors(minp, bias, rows["repetition_penalty"], rows["presence_penalty"],
                        rows["frequency_penalty"], context)  # fmt: skip
    if validate:
        _check_values(parsed, v)
    return parsed


def _parse_bias(logit_bias, b: int, device) -> tuple[Tensor, Tensor]:
    if not isinstance(logit_bias, (tuple, list)) or len(logit_bias) != 2:
        raise TypeError(
            "logit_bias must be None or a pair (ids [B, M] integer, -1 padded; bias [B, M] "
            f"float), got {type(logit_bias).__name__}"
        )
    ids = check.require_tensor("logit_bias ids", logit_bias[0])
    values = check.require_tensor("logit_bias values", logit_bias[1])
    check.require_dtype("logit_bias ids", ids, INT_DTYPES)
    check.require_dtype("logit_bias values", values, FLOAT_DTYPES)
    if ids.dim() != 2 or ids.shape[0] != b or values.shape != ids.shape:
        raise ValueError(
            f"logit_bias must be (ids [B, M], bias [B, M]) with B = {b}, got ids "
            f"{check.shape_str(ids)} and bias {check.shape_str(values)}"
        )
    check.require_device("logit_bias ids", ids, device)
    check.require_device("logit_bias values", values, device)
    return ids.to(torch.int64), values.to(torch.float64)


def _check_values(p: Processors, v: int) -> None:
    for name, value in (("repetition_penalty", p.repetition), ("presence_penalty", p.presence),
                        ("frequency_penalty", p.frequency)):  # fmt: skip
        if value is None:
            continue
        bad = ~torch.isfinite(value) | ((value <= 0) if name == "repetition_penalty" else False)
        if bool(bad.any()):
            (row,) = check.first_index(bad)
            rule = "finite and > 0 (1 = off)" if name == "repetition_penalty" else "finite"
            raise ValueError(f"{name} must be {rule}, got {name}[{row}] = {float(value[row])}")
    if p.min_p is not None:
        bad = ~((p.min_p >= 0) & (p.min_p <= 1))
        if bool(bad.any()):
            (row,) = check.first_index(bad)
            raise ValueError(
                f"min_p must be in [0, 1] (0 = off), got min_p[{row}] = {float(p.min_p[row])}"
            )
    if p.context is not None:
        bad = (p.context < -1) | (p.context >= v)
        if bool(bad.any()):
            row, col = check.first_index(bad)
            raise ValueError(
                f"context_tokens[{row}, {col}] = {int(p.context[row, col])} is outside "
                f"[0, V) with V = {v} (-1 pads)"
            )
    if p.bias is not None:
        ids, values = p.bias
        bad = (ids < -1) | (ids >= v)
        if bool(bad.any()):
            row, col = check.first_index(bad)
            raise ValueError(
                f"logit_bias ids[{row}, {col}] = {int(ids[row, col])} is outside [0, V) with "
                f"V = {v} (-1 pads)"
            )
        bad = torch.isnan(values) | (values == torch.inf)
        if bool(bad.any()):
            row, col = check.first_index(bad)
            raise ValueError(
                f"logit_bias values[{row}, {col}] = {float(values[row, col])}: a bias must be "
                "finite or -inf (to allow only some tokens, pass a token_bitmask)"
            )


def _check_some_finite(logits, ids, vals, num_draft_tokens, row_start) -> None:
    """Every decided position (``j <= k_b``) keeps a finite processed logit: the finite logits
    of the row, less the edited ones, plus the finite edited values (one more pass over the
    logits, as the other value checks make)."""
    b, k1, e = vals.shape
    v = logits.shape[-1]
    finite = torch.isfinite(logits).sum(-1)  # [B, K+1] or flat [R]
    cols = ids.clamp(max=v - 1).to(torch.int64)[:, None, :].expand(b, k1, e)
    pos = torch.arange(k1, device=vals.device)
    if row_start is not None:
        rows = (row_start.to(torch.int64)[:, None] + pos[None, :]).clamp(0, logits.shape[0] - 1)
        finite, raw = finite[rows], logits.take(rows[:, :, None] * v + cols)
    else:
        raw = logits.gather(-1, cols)
    live = (ids < v)[:, None, :]
    left = finite - (torch.isfinite(raw) & live).sum(-1) + (torch.isfinite(vals) & live).sum(-1)
    bad = (left == 0) & (pos[None, :] <= num_draft_tokens.to(torch.int64)[:, None])
    if bool(bad.any()):
        row, j = check.first_index(bad)
        raise ValueError(
            f"the processed logits of row {row} at position {j} have no finite entry "
            "(logit_bias -inf or penalties on every token the logits allow)"
        )


def _check_processed(vals: Tensor, temperature: Tensor | None) -> None:
    """The processed logits stay finite or ``-inf`` (a huge penalty or bias can overflow
    float32), and ``logits / temperature`` must not overflow on them either."""
    bad = torch.isnan(vals) | (vals == torch.inf)
    if bool(bad.any()):
        row, pos, _ = check.first_index(bad)
        raise ValueError(
            f"the processed logits of row {row} at position {pos} overflow float32 (logit_bias "
            "and penalties too large for the logits)"
        )
    if temperature is None or vals.numel() == 0:
        return
    biggest = torch.where(torch.isfinite(vals), vals.abs(), 0.0).flatten(1).amax(1)  # [B]
    temp = temperature.float()
    overflow = (temp > 0) & torch.isinf(biggest / torch.where(temp > 0, temp, 1.0))
    if bool(overflow.any()):
        (row,) = check.first_index(overflow)
        raise ValueError(
            f"temperature[{row}] = {float(temperature[row]):.3g} is so small that the processed "
            f"logits / temperature overflow float32 (max |processed logit| in row {row} is "
            f"{float(biggest[row]):.4g})"
        )
