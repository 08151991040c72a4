"""Argument checks of the verification ops.

Structural problems (types, shapes, dtypes, devices) always raise; value checks (``check_values``)
run only with ``validate=True`` because they read tensor contents and so synchronise with the
device. Every message names the argument, what was expected and what was seen.
"""

from __future__ import annotations

import numbers

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INT_DTYPES = (torch.int32, torch.int64)


def shape_str(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def require_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_dtype(name: str, t: torch.Tensor, allowed) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(
            f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}"
        )


def require_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but target_logits is on {device}")


def require_shape(name: str, t: torch.Tensor, expected: tuple, labels: str) -> None:
    if tuple(t.shape) != tuple(expected):
        want = "[" + ", ".join(str(s) for s in expected) + "]"
        raise ValueError(f"{name} must have shape {labels} = {want}, got {shape_str(t)}")


def check_logits(target_logits, rows: str = "K+1") -> tuple[int, int, int]:
    """``target_logits [B, K+1, V]`` float, last stride 1. Returns ``(B, K, V)``. ``rows``
    names the middle dim in messages (the tree ops' ``"N"``: nodes, the root included)."""
    require_tensor("target_logits", target_logits)
    if target_logits.dim() != 3:
        raise ValueError(
            f"target_logits must have shape [B, {rows}, V] (3 dims), got {shape_str(target_logits)}"
        )
    require_dtype("target_logits", target_logits, FLOAT_DTYPES)
    b, k1, v = target_logits.shape
    if k1 < 1 or v < 1:
        raise ValueError(
            f"target_logits must have {rows} >= 1 and V >= 1, got {shape_str(target_logits)}"
        )
    if target_logits.stride(-1) != 1 and v > 1:
        raise ValueError(
            "target_logits must have stride 1 in its last (vocabulary) dim, got "
            f"strides {tuple(target_logits.stride())}"
        )
    return b, k1 - 1, v


def check_draft_tokens(draft_tokens, b: int, k: int, device: torch.device) -> None:
    require_tensor("draft_tokens", draft_tokens)
    require_dtype("draft_tokens", draft_tokens, INT_DTYPES)
    require_shape("draft_tokens", draft_tokens, (b, k), "[B, K] (from target_logits [B, K+1, V])")
    require_device("draft_tokens", draft_tokens, device)


def check_draft_probs(
    draft_probs, b: int, k: int, v: int, device: torch.device, labels: str = "[B, K, V]"
) -> None:
    require_tensor("draft_probs", draft_probs)
    require_dtype("draft_probs", draft_probs, FLOAT_DTYPES)
    require_shape("draft_probs", draft_probs, (b, k, v), labels)
    require_device("draft_probs", draft_probs, device)
    if draft_probs.stride(-1) != 1 and v > 1:
        raise ValueError(
            "draft_probs must have stride 1 in its last dim, got strides "
            f"{tuple(draft_probs.stride())}"
        )


def num_draft_tensor(num_draft_tokens, b: int, k: int, device: torch.device) -> torch.Tensor:
    """``num_draft_tokens`` as a ``[B]`` integer tensor (``K`` everywhere when None)."""
    if num_draft_tokens is None:
        return torch.full((b,), k, dtype=torch.int64, device=device)
    require_tensor("num_draft_tokens", num_draft_tokens)
    require_dtype("num_draft_tokens", num_draft_tokens, INT_DTYPES)
    require_shape("num_draft_tokens", num_draft_tokens, (b,), "[B]")
    require_device("num_draft_tokens", num_draft_tokens, device)
    return num_draft_tokens


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def require_int64(name: str, value: int) -> None:
    """A host ``int`` argument that becomes an int64 must fit one (else a ``ValueError``, not
    torch's ``OverflowError``)."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{name} must fit in int64 [-2**63, 2**63 - 1], got {value}")


def per_row(
    name: str, value, b: int, device: torch.device, dtype: torch.dtype, allowed, python_type
) -> torch.Tensor:
    """A float/int scalar or a ``[B]`` tensor as a ``[B]`` tensor of ``dtype`` on ``device``."""
    if isinstance(value, torch.Tensor):
        require_dtype(name, value, allowed)
        if value.dim() == 0:
            return value.to(device=device, dtype=dtype).expand(b).contiguous()
        require_shape(name, value, (b,), "[B]")
        require_device(name, value, device)
        return value.to(dtype).contiguous()
    if isinstance(value, bool) or not isinstance(value, python_type):
        raise TypeError(f"{name} must be a number or a [B] tensor, got {type(value).__name__}")
    if not dtype.is_floating_point:
        require_int64(name, value)
    return torch.full((b,), value, dtype=dtype, device=device)


def check_seed(seed, b: int, device: torch.device) -> None:
    """``seed``: None, an int (any size: only its low 63 bits are used) or a ``[B]`` int64
    tensor on ``device``."""
    if isinstance(seed, torch.Tensor):
        require_dtype("seed", seed, (torch.int64,))
        require_shape("seed", seed, (b,), "[B]")
        require_device("seed", seed, device)
    elif seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise TypeError(
            f"seed must be None, an int or a [B] int64 tensor, got {type(seed).__name__}"
        )


def sampling_controls(b: int, device: torch.device, temperature, top_k, top_p):
    """Check the sampling controls' types and scalar ranges and turn them into ``[B]`` tensors:
    ``(temperature float32, top_k int64 or None, top_p float32 or None)``, None where a scalar
    turns the filter off (``top_k`` None/0, ``top_p`` None/1)."""
    check_scalar_ranges(temperature, top_k, top_p)
    return controls_per_row(b, device, temperature, top_k, top_p)


def controls_per_row(b: int, device: torch.device, temperature, top_k, top_p):
    """:func:`sampling_controls` of controls whose scalar ranges are checked already."""
    temp = per_row("temperature", temperature, b, device, torch.float32, FLOAT_DTYPES, numbers.Real)
    topk = (
        None
        if top_k is None or (isinstance(top_k, numbers.Integral) and top_k == 0)
        else per_row("top_k", top_k, b, device, torch.int64, INT_DTYPES, numbers.Integral)
    )
    topp = (
        None
        if top_p is None or (isinstance(top_p, numbers.Real) and top_p == 1)
        else per_row("top_p", top_p, b, device, torch.float32, FLOAT_DTYPES, numbers.Real)
    )
    return temp, topk, topp


def all_greedy(temperature) -> bool:
    """The one rule "temperature 0 is greedy" for a whole call: a host scalar ``0`` (a ``[B]``
    tensor decides per row, inside the kernels)."""
    return isinstance(temperature, numbers.Real) and temperature == 0


def check_scalar_ranges(temperature, top_k, top_p) -> None:
    """Range checks of Python-number arguments: free, so they always run."""
    if isinstance(temperature, numbers.Real) and not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if isinstance(top_k, numbers.Integral) and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if isinstance(top_k, numbers.Integral):
        require_int64("top_k", top_k)
    if isinstance(top_p, numbers.Real) and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def probs_tolerance(dtype: torch.dtype) -> float:
    """How far from 1 a valid probability row of ``dtype`` may sum: ``max(1e-3, eps(dtype))``.

    Rounding each entry of an exact distribution to ``dtype`` moves the sum by at most the unit
    roundoff ``eps / 2`` (relative, summed over entries whose total is 1), so ``eps`` leaves a
    factor of two: bfloat16 ``torch.softmax`` rows (off by up to ~2e-3) pass, float32 keeps 1e-3.
    Rows are then used as given: the bias that a sum ``s`` within it causes is bounded in
    ``verify_sampling``'s Notes (``|s - 1| / min(s, 1)`` in total variation).
    """
    return max(1e-3, torch.finfo(dtype).eps)


def check_logit_values(target_logits: torch.Tensor) -> None:
    """NaN and ``+inf`` logits are bad values, and so is a row with no finite entry; ``-inf``
    marks a masked token (transformers' warpers produce them) and is valid. Any layout
    (``[B, K+1, V]``, flat ``[R, V]``): the message names the first bad entry's index.

    One reduction when the logits are fine: a row's max is finite exactly when the row has no
    NaN (``amax`` propagates it), no ``+inf`` and a finite entry; only a bad call pays for the
    elementwise search that names the entry."""
    if target_logits.numel() == 0 or bool(torch.isfinite(target_logits.amax(dim=-1)).all()):
        return
    bad = torch.isnan(target_logits) | (target_logits == float("inf"))
    if bool(bad.any()):
        index = first_index(bad)
        raise ValueError(
            f"target_logits must not hold NaN or +inf (-inf masks a token), got "
            f"target_logits[{', '.join(map(str, index))}] = {float(target_logits[index])}"
        )
    empty = ~torch.isfinite(target_logits).any(dim=-1)
    if bool(empty.any()):
        index = first_index(empty)
        raise ValueError(
            f"target_logits[{', '.join(map(str, index))}] has no finite entry (every token is "
            f"masked with -inf): there is nothing to emit"
        )


def check_temperature_range(target_logits: torch.Tensor, temperature: torch.Tensor) -> None:
    """Reject a temperature so small that ``logits / temperature`` overflows float32.

    The kernels compute ``x = logit / T`` in float32; where that is ``+-inf`` the max and the
    filters are meaningless. ``T = 0`` is the greedy row and always fine. The logits have
    passed :func:`check_logit_values` (no NaN, no ``+inf``).
    """
    low = target_logits.amin(dim=(1, 2)).float()  # [B]
    if bool(torch.isfinite(low).all()):  # no -inf: max |x| from two reductions, no copy
        biggest = torch.maximum(target_logits.amax(dim=(1, 2)).float().abs(), low.abs())
    else:  # masked tokens: max |x| over the finite entries
        finite = torch.isfinite(target_logits)
        biggest = torch.where(finite, target_logits.float().abs(), 0.0).amax(dim=(1, 2))
    temp = temperature.float()
    overflow = (temp > 0) & torch.isinf(biggest / torch.where(temp > 0, temp, 1.0))
    if bool(overflow.any()):
        (row,) = first_index(overflow)
        raise ValueError(
            f"temperature[{row}] = {float(temperature[row]):.3g} is so small that "
            f"logits / temperature overflows float32 (max |logit| in row {row} is "
            f"{float(biggest[row]):.4g}); use temperature 0 for greedy decoding"
        )


def first_index(mask: torch.Tensor) -> tuple:
    return tuple(int(i) for i in mask.nonzero()[0])


def check_values(
    target_logits,
    draft_tokens,
    num_draft_tokens,
    draft_probs=None,
    temperature=None,
    top_k=None,
    top_p=None,
) -> None:
    """Value checks of ``validate=True`` (reads the tensors; synchronises)."""
    b, k1, v = target_logits.shape
    k = k1 - 1
    bad_nd = (num_draft_tokens < 0) | (num_draft_tokens > k)
    if bool(bad_nd.any()):
        (row,) = first_index(bad_nd)
        raise ValueError(
            f"num_draft_tokens must lie in [0, K] = [0, {k}], got "
            f"num_draft_tokens[{row}] = {int(num_draft_tokens[row])}"
        )
    live = torch.arange(k, device=draft_tokens.device)[None, :] < num_draft_tokens[:, None]
    bad_ids = live & ((draft_tokens < 0) | (draft_tokens >= v))
    if bool(bad_ids.any()):
        row, pos = first_index(bad_ids)
        raise ValueError(
            f"draft_tokens[{row}, {pos}] = {int(draft_tokens[row, pos])} is outside "
            f"[0, V) with V = {v} (positions < num_draft_tokens[{row}] = "
            f"{int(num_draft_tokens[row])} must be real token ids)"
        )
    check_logit_values(target_logits)
    if draft_probs is not None:
        check_probability_values("draft_probs", draft_probs, live)
    check_control_values(temperature, top_k, top_p)
    if temperature is not None:
        check_temperature_range(target_logits, temperature)


def check_control_values(temperature=None, top_k=None, top_p=None) -> None:
    """Value checks of the per-row ``[B]`` sampling controls (reads them; synchronises)."""
    if temperature is not None:
        bad = ~(temperature >= 0) | ~torch.isfinite(temperature)
        if bool(bad.any()):
            (row,) = first_index(bad)
            raise ValueError(
                "temperature must be finite and >= 0, got "
                f"temperature[{row}] = {float(temperature[row])}"
            )
    if top_k is not None:
        bad = top_k < 0
        if bool(bad.any()):
            (row,) = first_index(bad)
            raise ValueError(f"top_k must be >= 0 (0 = off), got top_k[{row}] = {int(top_k[row])}")
    if top_p is not None:
        bad = ~((top_p > 0) & (top_p <= 1))
        if bool(bad.any()):
            (row,) = first_index(bad)
            raise ValueError(f"top_p must be in (0, 1], got top_p[{row}] = {float(top_p[row])}")


# --- vLLM's flattened layout -------------------------------------------------------------------


def check_flat_structure(
    target_logits,
    draft_tokens,
    cu_num_draft_tokens,
    max_spec_len,
    bonus_rows: bool,
    name: str = "target_logits",
) -> tuple[int, int, int]:
    """Shapes of the flattened layout: ``draft_tokens [T]``, ``cu_num_draft_tokens [B]``,
    ``target_logits [T + B, V]`` (``[T, V]`` without bonus rows; ``name`` is how the caller
    calls it). Returns ``(B, T, V)``."""
    require_tensor(name, target_logits)
    require_dtype(name, target_logits, FLOAT_DTYPES)
    rows_label = "[num_tokens + B, V]" if bonus_rows else "[num_tokens, V]"
    if target_logits.dim() != 2:
        raise ValueError(
            f"with cu_num_draft_tokens, {name} must have shape {rows_label} (2 dims), "
            f"got {shape_str(target_logits)}"
        )
    v = target_logits.shape[1]
    if v < 1 or (v > 1 and target_logits.stride(1) != 1):
        raise ValueError(
            f"{name} must have V >= 1 and stride 1 in its last dim, got shape "
            f"{shape_str(target_logits)}, strides {tuple(target_logits.stride())}"
        )
    device = target_logits.device
    require_tensor("draft_tokens", draft_tokens)
    require_dtype("draft_tokens", draft_tokens, INT_DTYPES)
    if draft_tokens.dim() != 1:
        raise ValueError(
            f"with cu_num_draft_tokens, draft_tokens must have shape [num_tokens], got "
            f"{shape_str(draft_tokens)}"
        )
    if draft_tokens.device != device:
        raise ValueError(f"draft_tokens is on {draft_tokens.device} but {name} is on {device}")
    require_tensor("cu_num_draft_tokens", cu_num_draft_tokens)
    require_dtype("cu_num_draft_tokens", cu_num_draft_tokens, INT_DTYPES)
    if cu_num_draft_tokens.dim() != 1:
        raise ValueError(
            f"cu_num_draft_tokens must have shape [B], got {shape_str(cu_num_draft_tokens)}"
        )
    if cu_num_draft_tokens.device != device:
        raise ValueError(
            f"cu_num_draft_tokens is on {cu_num_draft_tokens.device} but {name} is on {device}"
        )
    b = cu_num_draft_tokens.shape[0]
    t = draft_tokens.shape[0]
    rows = t + b if bonus_rows else t
    if target_logits.shape[0] != rows:
        raise ValueError(
            f"{name} must have shape {rows_label} = [{rows}, {v}] (num_tokens = "
            f"{t} from draft_tokens, B = {b} from cu_num_draft_tokens), got "
            f"{shape_str(target_logits)}"
        )
    if max_spec_len is not None and (
        isinstance(max_spec_len, bool)
        or not isinstance(max_spec_len, numbers.Integral)
        or max_spec_len < 0
    ):
        raise ValueError(f"max_spec_len must be None or an int >= 0, got {max_spec_len!r}")
    if max_spec_len is not None:
        require_int64("max_spec_len", max_spec_len)
    return b, t, v


def check_flat_draft_probs(draft_probs, t: int, v: int, device: torch.device) -> None:
    require_tensor("draft_probs", draft_probs)
    require_dtype("draft_probs", draft_probs, FLOAT_DTYPES)
    require_shape("draft_probs", draft_probs, (t, v), "[num_tokens, V]")
    require_device("draft_probs", draft_probs, device)
    if v > 1 and draft_probs.stride(1) != 1:
        raise ValueError(
            f"draft_probs must have stride 1 in its last dim, got strides "
            f"{tuple(draft_probs.stride())}"
        )


def check_flat_counts(cu_num_draft_tokens, num_tokens: int, max_spec_len: int) -> None:
    """``cu_num_draft_tokens`` is the inclusive cumulative sum of counts in ``[0, max_spec_len]``
    ending at ``num_tokens`` (reads the tensor; synchronises)."""
    b = cu_num_draft_tokens.shape[0]
    if b == 0:
        if num_tokens != 0:
            raise ValueError(f"cu_num_draft_tokens is empty but draft_tokens has {num_tokens}")
        return
    cu = cu_num_draft_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    bad = (counts < 0) | (counts > max_spec_len)
    if bool(bad.any()):
        (row,) = first_index(bad)
        raise ValueError(
            f"cu_num_draft_tokens must be non-decreasing with steps in [0, max_spec_len] = "
            f"[0, {max_spec_len}], got cu_num_draft_tokens[{row}] = {int(cu[row])} "
            f"(request {row} has {int(counts[row])} draft tokens)"
        )
    if int(cu[-1]) != num_tokens:
        raise ValueError(
            f"cu_num_draft_tokens[-1] = {int(cu[-1])} must equal num_tokens = {num_tokens} "
            f"(the length of draft_tokens)"
        )


def check_flat_values(target_logits, draft_tokens, draft_probs=None) -> None:
    """Value checks of the flat tensors: ids in ``[0, V)``, logits rows as in
    :func:`check_logit_values`, draft probability rows (reads them; synchronises)."""
    v = target_logits.shape[1]
    bad = (draft_tokens < 0) | (draft_tokens >= v)
    if bool(bad.any()):
        (i,) = first_index(bad)
        raise ValueError(
            f"draft_tokens[{i}] = {int(draft_tokens[i])} is outside [0, V) with V = {v}"
        )
    check_logit_values(target_logits)
    if draft_probs is not None:
        check_probability_values("draft_probs", draft_probs)


def check_probability_values(name: str, probs: torch.Tensor, live=None, describe=None) -> None:
    """The one check of probability rows (``[..., V]``; only those ``live`` marks, all when
    None): non-negative, finite, summing to 1 within :func:`probs_tolerance` (reads them;
    synchronises). The message names the first bad row, ``name[i, j]`` then ``describe(index)``
    (what that row is), and its sum and minimum."""
    tol = probs_tolerance(probs.dtype)
    sums = probs.float().sum(dim=-1)
    negative = (probs < 0).any(dim=-1)
    off = ((sums - 1).abs() > tol) | ~torch.isfinite(sums)
    if live is not None:
        negative, off = negative & live, off & live
    for bad, what in (
        (negative, "has negative entries"),
        (off, f"does not sum to 1 (tolerance {tol:.3g} for {probs.dtype})"),
    ):
        if bool(bad.any()):
            index = first_index(bad)
            where = ", ".join(str(i) for i in index)
            about = describe(index) if describe is not None else ""
            raise ValueError(
                f"{name}[{where}]{about} {what}: sum = {float(sums[index]):.6g}, "
                f"min = {float(probs[index].min()):.6g}"
            )


def check_flat_temperature_range(
    target_logits: torch.Tensor, rows_per_request: torch.Tensor, temperature: torch.Tensor
) -> None:
    """:func:`check_temperature_range` for flat ``[R, V]`` logits whose request ``b`` owns
    ``rows_per_request[b]`` consecutive rows."""
    finite = torch.isfinite(target_logits)
    row_max = torch.where(finite, target_logits.float().abs(), 0.0).amax(dim=1)  # [R]
    owner = torch.repeat_interleave(
        torch.arange(rows_per_request.shape[0], device=target_logits.device),
        rows_per_request.to(torch.int64),
        output_size=target_logits.shape[0],
    )
    biggest = torch.zeros(rows_per_request.shape[0], device=target_logits.device)
    biggest = biggest.scatter_reduce(0, owner, row_max, "amax")
    check_temperature_range(biggest[:, None, None], temperature)


# --- tree verification -------------------------------------------------------------------------


def check_tree_tensor(name: str, t, b: int, n: int, device: torch.device) -> None:
    """``tree_tokens`` / ``parents``: ``[B, N]`` int32/int64 on the logits' device."""
    require_tensor(name, t)
    require_dtype(name, t, INT_DTYPES)
    require_shape(name, t, (b, n), "[B, N] (from target_logits [B, N, V])")
    require_device(name, t, device)


def num_nodes_tensor(num_nodes, b: int, n: int, device: torch.device) -> torch.Tensor:
    """``num_nodes`` as a ``[B]`` integer tensor (``N`` everywhere when None)."""
    if num_nodes is None:
        return torch.full((b,), n, dtype=torch.int64, device=device)
    require_tensor("num_nodes", num_nodes)
    require_dtype("num_nodes", num_nodes, INT_DTYPES)
    require_shape("num_nodes", num_nodes, (b,), "[B]")
    require_device("num_nodes", num_nodes, device)
    return num_nodes


def check_parents(parents: torch.Tensor, num_nodes: torch.Tensor) -> None:
    """Value checks of a tree's shape (synchronises): ``num_nodes`` in ``[1, N]``, the root's
    parent ``-1`` and ``0 <= parents[b, i] < i`` for the real nodes ``1 <= i < n_b``."""
    b, n = parents.shape
    bad_nn = (num_nodes < 1) | (num_nodes > n)
    if bool(bad_nn.any()):
        (row,) = first_index(bad_nn)
        raise ValueError(
            f"num_nodes must lie in [1, N] = [1, {n}] (the root is a node), got "
            f"num_nodes[{row}] = {int(num_nodes[row])}"
        )
    if b == 0 or n == 0:
        return
    bad_root = parents[:, 0] != -1
    if bool(bad_root.any()):
        (row,) = first_index(bad_root)
        raise ValueError(
            f"parents[{row}, 0] must be -1 (node 0 is the root), got {int(parents[row, 0])}"
        )
    nodes = torch.arange(n, device=parents.device)[None, :]
    live = (nodes >= 1) & (nodes < num_nodes[:, None])
    bad = live & ((parents < 0) | (parents >= nodes))
    if bool(bad.any()):
        row, node = first_index(bad)
        raise ValueError(
            f"parents[{row}, {node}] = {int(parents[row, node])} is not a node before node "
            f"{node}: a real node's parent must lie in [0, {node}) (nodes are in topological "
            f"order; num_nodes[{row}] = {int(num_nodes[row])})"
        )


def check_tree_values(
    target_logits,
    tree_tokens,
    parents,
    num_nodes,
    draft_probs=None,
    temperature=None,
    top_k=None,
    top_p=None,
) -> None:
    """Value checks of ``validate=True`` for the tree ops (synchronises). Padding nodes
    (``>= n_b``) may hold anything: their logits, tokens and draft rows are not read."""
    b, n, v = target_logits.shape
    check_parents(parents, num_nodes)
    nodes = torch.arange(n, device=parents.device)[None, :]
    real = nodes < num_nodes[:, None]  # [B, N]
    bad_ids = real & (nodes >= 1) & ((tree_tokens < 0) | (tree_tokens >= v))
    if bool(bad_ids.any()):
        row, node = first_index(bad_ids)
        raise ValueError(
            f"tree_tokens[{row}, {node}] = {int(tree_tokens[row, node])} is outside [0, V) "
            f"with V = {v} (nodes 1 .. num_nodes[{row}] - 1 = {int(num_nodes[row]) - 1} must be "
            f"real token ids)"
        )
    live_logits = torch.where(real[:, :, None], target_logits, 0)
    check_logit_values(live_logits)
    if draft_probs is not None:
        # rows of the real nodes that have a real child
        child = real & (nodes >= 1)
        index = parents.to(torch.int64).clamp(0, n - 1)
        has_child = torch.zeros((b, n), dtype=torch.int64, device=parents.device)
        has_child = has_child.scatter_add(1, index, child.to(torch.int64)) > 0
        check_probability_values(
            "draft_probs",
            draft_probs,
            has_child,
            lambda index: f" (the proposal of node {index[1]}'s children)",
        )
    check_control_values(temperature, top_k, top_p)
    if temperature is not None:
        check_temperature_range(live_logits, temperature)


def check_token_bitmask(token_bitmask, leading: tuple, v: int, device, labels: str) -> None:
    """Structure of ``token_bitmask``: int32 ``leading + (ceil(V / 32),)`` on ``device``, last
    dim stride 1 (``labels`` names the expected shape, e.g. ``"[B, K+1, W]"``)."""
    require_tensor("token_bitmask", token_bitmask)
    if token_bitmask.dtype != torch.int32:
        raise TypeError(
            f"token_bitmask must be int32 (xgrammar's layout), got {token_bitmask.dtype}"
        )
    w = (v + 31) // 32
    if tuple(token_bitmask.shape) != (*leading, w):
        raise ValueError(
            f"token_bitmask must be {labels} = {[*leading, w]} (W = ceil(V / 32) for the "
            f"logits' V = {v}), got {shape_str(token_bitmask)}"
        )
    require_device("token_bitmask", token_bitmask, device)
    if w > 1 and token_bitmask.stride(-1) != 1:
        raise ValueError(
            f"token_bitmask must have stride 1 in its last dim, got {token_bitmask.stride()}"
        )


def check_bitmask_values(logits, token_bitmask, decided, where: str = "position") -> None:
    """``validate=True``: every decided row (``decided``: bool, ``logits``' leading shape) has an
    allowed finite logit. Reads the tensors (synchronises)."""
    from specdec_kernels.reference.bitmask import allowed

    ok = (allowed(token_bitmask, logits.shape[-1]) & torch.isfinite(logits)).any(dim=-1)
    bad = decided & ~ok
    if bool(bad.any()):
        index = first_index(bad)
        raise ValueError(
            f"token_bitmask allows no token with a finite logit at row {index[0]}, {where} "
            f"{index[-1]}, which must be decided (every token is masked or -inf)"
        )


LOGPROB_MODES = ("raw", "processed")
MAX_LOGPROBS = 20


def check_logprob_args(logprobs, num_logprobs) -> int:
    """``logprobs`` in ``(None, "raw", "processed")``, ``num_logprobs`` an int in ``[0, 20]``
    (``> 0`` only with ``logprobs``); returns ``num_logprobs`` as an int."""
    if logprobs is not None and logprobs not in LOGPROB_MODES:
        raise ValueError(f"logprobs must be None, 'raw' or 'processed', got {logprobs!r}")
    if isinstance(num_logprobs, bool) or not isinstance(num_logprobs, numbers.Integral):
        raise TypeError(f"num_logprobs must be an int, got {type(num_logprobs).__name__}")
    if not 0 <= num_logprobs <= MAX_LOGPROBS:
        raise ValueError(f"num_logprobs must lie in [0, {MAX_LOGPROBS}], got {num_logprobs}")
    if num_logprobs and logprobs is None:
        raise ValueError(
            f"num_logprobs = {num_logprobs} needs logprobs='raw' or 'processed' (which "
            "distribution the top tokens come from), got logprobs=None"
        )
    return int(num_logprobs)
