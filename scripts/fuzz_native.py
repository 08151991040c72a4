"""Fuzz the native C++ ops with garbage: every call must return or raise a Python exception.

Calls the extension's ops (``torch.ops.specdec.native_*``: the KV-cache ops, the verification
ops, the accept-test count and estimate, the cost model, the logprob op; and the model kernels,
passes and draft chains), the public KV ops that route to them, and the cache
classes' verbs with ``validate=False``, with random small shapes and garbage values: positions and
counts near ``INT64_MAX`` / ``INT64_MIN``, ``-1``, out-of-range token ids, block ids and parents,
NaN / inf logits and probabilities, wrong dtypes, shapes and strides. Nothing is compared: the
point is that no call reads or writes out of bounds, overflows a signed integer or crashes, which
is what ``scripts/sanitize.sh`` checks by running this under AddressSanitizer and UBSan.

Usage: ``python scripts/fuzz_native.py [--calls N] [--seed S]`` (needs the extension built). Prints
how many calls returned and how many raised (by exception type); exits 1 if the extension is not
loaded.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time

import torch

import specdec_kernels as sk
from specdec_kernels import _extension

I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
I32_MAX, I32_MIN = 2**31 - 1, -(2**31)
EXTREMES = [I64_MAX, I64_MAX - 1, I64_MIN, I64_MIN + 1, 2**62, -(2**62), 2**32, I32_MAX, I32_MIN]
FLOATS = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e38, -1e38, 1e-45, 65504.0]
FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class Garbage:
    """Random arguments: plausible ones, and in `wild` calls (half of them) extreme values,
    wrong dtypes and wrong shapes too."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.g = torch.Generator().manual_seed(seed)
        self.wild = True

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def size(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """``(lo, hi)`` (the valid range of a value), widened by 3 on each side when wild."""
        return (lo - 3, hi + 3) if self.wild else (lo, max(lo, hi))

    def int_value(self, lo: int = -3, hi: int = 12) -> int:
        if self.wild and self.chance(0.2):
            return self.r.choice(EXTREMES)
        return self.r.randint(lo, hi)

    def ints(self, shape, lo: int = -3, hi: int = 12, dtype=torch.int64) -> torch.Tensor:
        """Integers mostly in [lo, hi], some extreme (clipped to ``dtype``); sometimes another
        dtype than asked (int32 for int64, a float, a bool)."""
        n = 1
        for s in shape:
            n *= s
        values = [self.int_value(lo, hi) for _ in range(n)]
        if self.wild and self.chance(0.05):
            dtype = self.r.choice([torch.int32, torch.float32, torch.bool, torch.int16])
        info = torch.iinfo(dtype) if not (dtype.is_floating_point or dtype == torch.bool) else None
        if info is not None:
            values = [min(max(v, info.min), info.max) for v in values]
        else:
            values = [float(v) if dtype.is_floating_point else bool(v) for v in values]
        return self.strided(torch.tensor(values, dtype=dtype).view(shape))

    def floats(self, shape, dtype=None) -> torch.Tensor:
        dtype = dtype or self.r.choice(FLOAT_DTYPES)
        x = torch.randn(shape, generator=self.g) * self.r.choice([0.1, 1.0, 5.0, 100.0])
        if x.numel() and self.chance(0.3):
            flat = x.view(-1)
            for _ in range(self.size(1, 4)):
                flat[self.r.randrange(flat.numel())] = self.r.choice(FLOATS)
        if self.wild and self.chance(0.05):
            dtype = self.r.choice([torch.float64, torch.int64])
        return self.strided(x.to(dtype))

    def probs(self, shape, dtype=None) -> torch.Tensor:
        x = self.floats(shape, dtype)
        if x.is_floating_point() and self.chance(0.7):  # mostly rows that sum to about 1
            p = x.float().abs().nan_to_num(0.5, 1.0, 0.0)
            x = (p / p.sum(-1, keepdim=True).clamp(min=1e-6)).to(x.dtype)
        return x

    def strided(self, t: torch.Tensor) -> torch.Tensor:
        """Sometimes a non-contiguous view of the same values (leading dims transposed, or an
        expanded / sliced copy)."""
        if t.dim() >= 3 and self.chance(0.15):
            return t.transpose(0, 1).contiguous().transpose(0, 1)
        if t.dim() >= 1 and t.numel() and self.wild and self.chance(0.1):
            return torch.cat([t, t], dim=-1)[..., ::2]  # last dim strided
        return t

    def bitmask(self, lead: list[int], vocab: int) -> torch.Tensor | None:
        """A token bitmask ``lead + [ceil(V / 32)]`` of random int32 words (or None); when wild,
        sometimes a wrong width or leading shape, another dtype or a strided last dim (the
        ints' own garbage)."""
        if self.chance(0.4):
            return None
        width = (vocab + 31) // 32
        if self.wild and self.chance(0.1):
            width = max(0, width + self.r.choice([-1, 1]))
        words = self.ints(self.maybe_wrong_shape([*lead, width]), I32_MIN, I32_MAX, torch.int32)
        if words.dtype == torch.int32 and words.numel() and self.chance(0.3):
            words = words | self.r.choice([-1, 0x55555555, 1])  # mostly allowed, every other
        return words

    def maybe_wrong_shape(self, shape: list[int]) -> list[int]:
        shape = list(shape)
        if shape and self.wild and self.chance(0.05):
            i = self.r.randrange(len(shape))
            shape[i] = max(0, shape[i] + self.r.choice([-1, 1]))
        return shape


# --------------------------------------------------------------------------------------------
# The calls: each builds garbage arguments and calls one op.
def kv_write(z: Garbage, paged: bool, native: bool) -> None:
    L, B, H, D = z.size(1, 2), z.size(0, 3), z.size(1, 2), z.size(1, 4)
    R, P = (z.size(1, 6), z.size(1, 4)) if paged else (B, z.size(1, 8))
    T = z.size(0, 5)
    dtype = z.r.choice(FLOAT_DTYPES)
    cache = z.strided(torch.zeros(z.maybe_wrong_shape([L, 2, R, H, P, D]), dtype=dtype))
    kv = [z.floats(z.maybe_wrong_shape([B, H, T, D]), dtype) for _ in range(2)]
    layer = z.int_value(*z.span(0, L - 1))
    M = z.size(0, 5)
    offsets = z.ints(z.maybe_wrong_shape([B]), *z.span(0, (M if paged else 1) * P - T))
    if paged:
        tables = z.ints(z.maybe_wrong_shape([B, M]), *z.span(0, R - 1), dtype=torch.int32)
        ops = torch.ops.specdec
        op = ops.native_paged_kv_write_ if native else ops.paged_kv_write_
        op(cache, layer, kv[0], kv[1], tables, offsets)
    else:
        op = torch.ops.specdec.native_kv_write_ if native else torch.ops.specdec.kv_write_
        op(cache, layer, kv[0], kv[1], offsets)


def kv_compact(z: Garbage, paged: bool, native: bool) -> None:
    L, B, H, D = z.size(1, 2), z.size(0, 3), z.size(1, 2), z.size(1, 4)
    R, P = (z.size(1, 6), z.size(1, 4)) if paged else (B, z.size(1, 8))
    cache = z.strided(torch.zeros(z.maybe_wrong_shape([L, 2, R, H, P, D])))
    cols, M = z.size(0, 6), z.size(1, 5)
    cap = M * P if paged else P
    src = z.ints(z.maybe_wrong_shape([B, cols]), *z.span(0, cap - 1))
    keep = z.ints(z.maybe_wrong_shape([B]), *z.span(0, min(cols, cap)))
    start = z.ints(z.maybe_wrong_shape([B]), *z.span(0, cap - min(cols, cap)))
    if paged:
        tables = z.ints(z.maybe_wrong_shape([B, M]), *z.span(0, R - 1), dtype=torch.int32)
        op = (
            torch.ops.specdec.native_paged_kv_compact_
            if native
            else torch.ops.specdec.paged_kv_compact_
        )
        op(cache, tables, src, keep, start)
    else:
        op = torch.ops.specdec.native_kv_compact_ if native else torch.ops.specdec.kv_compact_
        op(cache, src, keep, start)


def cache_verbs(z: Garbage) -> None:
    """A few verbs of a KVCache or PagedKVCache with garbage counts, validate=False."""
    H, D = z.size(1, 2), z.size(1, 3)
    if z.chance(0.5):
        B, S = z.size(1, 3), z.size(1, 8)
        cache = sk.KVCache(z.size(1, 2), B, H, D, S)
        rows, cap = B, S
    else:
        cache = sk.PagedKVCache(z.size(1, 2), z.size(1, 8), z.size(1, 3), H, D)
        rows = z.size(0, 3)
        cache.add_rows(rows)
        cap = cache.max_blocks_per_row * cache.block_size
    for _ in range(z.size(1, 6)):
        verb = z.r.choice(["write", "advance", "rollback", "compact"])
        if verb == "write":
            k = z.floats([rows, H, z.size(0, 4), D], torch.float32)
            cache.write(0, k, k, validate=False)
        elif verb in ("advance", "rollback"):
            n = z.ints([rows], *z.span(0, 3)) if z.chance(0.6) else z.int_value(*z.span(0, 3))
            getattr(cache, verb)(n, validate=False)
        else:
            cols = z.size(0, 5)
            src = z.ints([rows, cols], *z.span(0, cap - 1))
            keep = z.ints([rows], *z.span(0, cols))
            start = z.ints([rows], *z.span(0, 3)) if z.chance(0.7) else z.int_value(*z.span(0, 3))
            cache.compact(src, keep, start, validate=False)


def _controls(z: Garbage, B: int) -> dict:
    return dict(
        temperature=z.floats([B], torch.float32).abs() if z.chance(0.9) else None,
        top_k=z.ints([B], -2, 50) if z.chance(0.5) else None,
        top_p=z.floats([B], torch.float32).sigmoid() if z.chance(0.5) else None,
        seeds=z.ints([B], -5, 10**6) if z.chance(0.9) else None,
    )


def verify(z: Garbage, flat: bool) -> None:
    B, K, V = z.size(0, 4), z.size(0, 5), z.size(1, 40) if z.chance(0.95) else 0
    dtype = z.r.choice(FLOAT_DTYPES)
    drafts = z.ints(z.maybe_wrong_shape([B, K]), -2, V + 2)
    nd = z.ints(z.maybe_wrong_shape([B]), -2, K + 2, dtype=z.r.choice([torch.int64, torch.int32]))
    c = _controls(z, B)
    greedy = z.chance(0.3)
    if flat:
        rows = z.size(0, B * (K + 1) + 2)
        logits = z.floats(z.maybe_wrong_shape([rows, V]), dtype)
        lstart = z.ints([B], -3, rows + 2)
        q = z.probs([z.size(0, rows + 1), V], dtype) if z.chance(0.6) else None
        pstart = z.ints([B], -3, rows + 2) if q is not None and z.chance(0.8) else None
        if q is not None and pstart is None:
            q = z.probs(z.maybe_wrong_shape([B, K, V]), dtype)
        layout = (  # logits_row_start ... posterior_alpha
            lstart,
            pstart,
            z.bitmask([rows], V),
            z.chance(0.3),
            z.r.choice([0, 1, 2, -1, 3, I64_MAX] if z.wild else [0, 1, 2]),
            z.r.choice([0.0, 0.09, 1.0, -1.0, float("nan"), float("inf")]),
            z.r.choice([0.0, 0.3, -1.0, float("nan"), 1e30]),
        )
    else:
        logits = z.floats(z.maybe_wrong_shape([B, K + 1, V]), dtype)
        q = z.probs(z.maybe_wrong_shape([B, K, V]), dtype) if z.chance(0.6) else None
        mode = z.r.choice([0, 1]) if not z.wild else z.r.choice([0, 1, 2, -1])
        layout = (None, None, z.bitmask([B, K + 1], V), False, mode, 0.0, 0.0)  # padded logits
    torch.ops.specdec.native_verify_ex(
        logits, drafts, q, nd, c["temperature"], c["top_k"], c["top_p"], c["seeds"], greedy, *layout
    )


def verify_tree(z: Garbage) -> None:
    B, N, V = z.size(0, 3), z.size(0 if z.wild else 1, 7), z.size(1, 30)
    dtype = z.r.choice(FLOAT_DTYPES)
    logits = z.floats(z.maybe_wrong_shape([B, N, V]), dtype)
    tokens = z.ints(z.maybe_wrong_shape([B, N]), -2, V + 2)
    parents = z.ints(z.maybe_wrong_shape([B, N]), -2, N + 1)
    q = z.probs(z.maybe_wrong_shape([B, N, V]), dtype) if z.chance(0.8) else None
    num_nodes = z.ints(z.maybe_wrong_shape([B]), -2, N + 2)
    mode = z.r.choice([0, 1, 2, 2, -1, 3, I64_MAX] if z.wild else [0, 1, 2])
    c = _controls(z, B)
    torch.ops.specdec.native_verify_tree(
        logits,
        tokens,
        parents,
        q,
        num_nodes,
        mode,
        c["temperature"],
        c["top_k"],
        c["top_p"],
        c["seeds"],
        z.bitmask([B, N], V),
        z.chance(0.3),
    )


def emitted_logprobs(z: Garbage) -> None:
    B, N, P, V = z.size(0, 4), z.size(0 if z.wild else 1, 6), z.size(0, 6), z.size(1, 70)
    logits = z.floats(z.maybe_wrong_shape([B, N, V]))
    if z.chance(0.2) and logits.dim() == 3 and logits.shape[0] > 0:
        logits = logits[:1].expand(B, -1, -1)  # a flat layout's view (stride 0 in dim 0)
    rows = z.ints(z.maybe_wrong_shape([B, P]), -2, N + 2)
    tokens = z.ints(z.maybe_wrong_shape([B, P]), -2, V + 2)
    words = (V + 31) // 32
    mask = z.ints(z.maybe_wrong_shape([B, N, words]), I32_MIN, I32_MAX, dtype=torch.int32)
    c = _controls(z, B)
    n = z.r.choice([0, 1, 5, 20, 21, -1, I64_MAX] if z.wild else [0, 1, 5, 20])
    torch.ops.specdec.native_emitted_logprobs(
        logits, rows, tokens, mask if z.chance(0.5) else None, c["temperature"], c["top_k"],
        c["top_p"], z.chance(0.7), n,
    )  # fmt: skip


def accept_reject(z: Garbage) -> None:
    B, K = z.size(0, 4), z.size(0, 6)
    d = z.ints(z.maybe_wrong_shape([B, K]), -2, 5)
    v = z.ints(z.maybe_wrong_shape([B, K]), -2, 5)
    torch.ops.specdec.native_accept_reject(d, v)


def accept_tests_passed(z: Garbage) -> None:
    B, n, V = z.size(0, 4), z.size(0, 6), z.size(0, 20)
    q = z.probs(z.maybe_wrong_shape([B, n, V]), z.r.choice(FLOAT_DTYPES + [torch.float64]))
    p = z.probs(z.maybe_wrong_shape([B, n + z.size(0, 1), V]))
    drafts = z.ints(
        z.maybe_wrong_shape([B, n]), -2, V + 2, dtype=z.r.choice([torch.int64, torch.int32])
    )
    after = z.ints(z.maybe_wrong_shape([B]), *z.span(-1, n))  # INT64_MAX: after + 1 overflowed
    seeds = z.ints(z.maybe_wrong_shape([B]), -5, 10**6)
    torch.ops.specdec.native_accept_tests_passed(q, drafts, p, seeds, after)


def expected_accepts(z: Garbage) -> None:
    B, K, V = z.size(0, 4), z.size(0, 6), z.size(0, 40)
    logits = z.floats(z.maybe_wrong_shape([B, K + z.size(0, 1), V]))
    q = z.probs(z.maybe_wrong_shape([B, K, V]), z.r.choice(FLOAT_DTYPES + [torch.float64]))
    accepted = z.ints(
        z.maybe_wrong_shape([B]), *z.span(0, K), dtype=z.r.choice([torch.int64, torch.int32])
    )
    drafted = z.ints(z.maybe_wrong_shape([B]), *z.span(0, K))
    temperature = z.r.choice(
        [1.0, 0.7, 1e-6, 1e4] + ([0.0, -1.0, float("nan"), float("inf")] if z.wild else [])
    )
    torch.ops.specdec.native_expected_accepts(logits, q, accepted, drafted, temperature)


def finish_ms(z: Garbage) -> None:
    B, Q = z.size(0 if z.wild else 1, 5), z.size(0 if z.wild else 1, 4)
    alpha = [z.r.choice([0.0, 1.0, z.r.random(), *(FLOATS if z.wild else [])]) for _ in range(B)]
    left = [
        float(z.int_value(0, 40))
        for _ in range(B + (z.r.choice([-1, 1]) if z.wild and z.chance(0.1) else 0))
    ]
    quantiles = [z.r.choice([-1.5, 0.0, 1.5, *(FLOATS if z.wild else [])]) for _ in range(Q)]
    max_k = z.int_value(*z.span(0, 8))  # near INT64_MAX: (max_k + 1) * B * Q overflowed
    rows = max_k + 1 if 0 <= max_k <= 8 and not (z.wild and z.chance(0.2)) else z.size(0, 10)
    costs = [z.r.random() for _ in range(rows * B * Q)]
    torch.ops.specdec.native_finish_ms(alpha, left, quantiles, costs, max_k)


def rowinv_linear(z: Garbage) -> None:
    M, C, N = z.size(0, 9), z.size(0, 70), z.size(0, 40)
    dtype = z.r.choice([torch.float32, torch.bfloat16, torch.float16, torch.float64])
    x = z.floats(z.maybe_wrong_shape([M, C]), dtype)
    if z.chance(0.3):
        x = x.t() if x.dim() == 2 else x  # non-contiguous rows
    w = z.floats(z.maybe_wrong_shape([N, C]), z.r.choice([dtype, dtype, torch.float32]))
    b = z.floats(z.maybe_wrong_shape([N]), dtype) if z.chance(0.6) else None
    torch.ops.specdec.rowinv_linear(x, w, b)


def rowinv_attention(z: Garbage) -> None:
    B, H, T, L = z.size(0, 3), z.size(0, 3), z.size(0, 6), z.size(0, 40)
    D = z.r.choice([16, 32, 64, 8, 0, 17])
    dtype = z.r.choice([torch.float32, torch.bfloat16, torch.float16])
    q = z.floats(z.maybe_wrong_shape([B, H, T, D]), dtype)
    k = z.floats(z.maybe_wrong_shape([B, H, L, D]), dtype)
    v = z.floats(z.maybe_wrong_shape([B, H, L, D]), z.r.choice([dtype, dtype, torch.float32]))
    shape = z.maybe_wrong_shape([B, z.r.choice([1, H]), T, L])
    mask = z.ints(shape, 0, 2).bool() if z.chance(0.9) else z.ints(shape, 0, 2)
    if z.chance(0.3) and mask.dim() == 4 and mask.shape[1] == 1 and H > 1:
        mask = mask.expand(-1, H, -1, -1)  # broadcast (stride 0) head dim
    torch.ops.specdec.rowinv_attention(q, k, v, mask)


def _causal_lm(z: Garbage, room: int = 0) -> tuple:
    """A causal LM's garbage: ``(input_ids [B, T], kv_cache, lengths [B], weights, H, B, T,
    S)``, the lengths mostly leaving ``room`` slots after the T tokens."""
    layers, B, T, H = z.size(0, 2), z.size(0, 3), z.size(0, 5), z.size(0, 2)
    D, S, V, P = z.r.choice([16, 32, 8, 0]), z.size(0, 24), z.size(1, 20), z.size(0, 24)
    C = H * D
    dtype = z.r.choice([torch.float32, torch.float32, torch.bfloat16, torch.float16])

    def w(*shape):
        odd = z.wild and z.chance(0.02)
        return z.floats(z.maybe_wrong_shape(list(shape)), torch.float64 if odd else dtype)

    weights = [w(V, C), w(P, C)]
    for _ in range(layers):
        weights += [w(C), w(C), w(3 * C, C), w(3 * C), w(C, C), w(C), w(C), w(C)]
        weights += [w(4 * C, C), w(4 * C), w(C, 4 * C), w(C)]
    weights += [w(C), w(C), w(V, C)]
    if z.wild and z.chance(0.2):
        weights = weights[: z.size(0, len(weights))]
    kv = z.floats(z.maybe_wrong_shape([layers, 2, B, H, S, D]), dtype)
    ids = z.ints(z.maybe_wrong_shape([B, T]), *z.span(0, V - 1))
    lengths = z.ints(z.maybe_wrong_shape([B]), *z.span(0, S - T - room))
    return ids, kv, lengths, weights, H, B, T, S


def causal_lm_pass(z: Garbage, name: str = "causal_lm_pass") -> None:
    """``specdec::causal_lm_pass`` or ``causal_lm_draft_pass`` (whose logits_index is not
    optional)."""
    ids, kv, lengths, weights, H, B, T, S = _causal_lm(z)
    index = z.ints(z.maybe_wrong_shape([B]), *z.span(-T, T - 1))
    if name == "causal_lm_pass" and z.chance(0.5):
        index = None
    kv_len = z.int_value(*z.span(S, S))
    getattr(torch.ops.specdec, name)(ids, kv, lengths, kv_len, index, weights, H, 1e-5)


def causal_lm_chain(z: Garbage, name: str) -> None:
    """A chain of passes: num_tokens near INT64_MAX once overflowed the fit test
    ``lengths + num_valid + num_tokens - 1 <= S`` (and, with no rows, looped ~2**63 times)."""
    num_tokens = z.int_value(*z.span(1, 3))
    room = min(max(num_tokens - 1, 0), 3)
    ids, kv, lengths, weights, H, B, T, S = _causal_lm(z, room)
    num_valid = z.ints(z.maybe_wrong_shape([B]), *z.span(1, max(T, 1)))
    kv_len = z.int_value(*z.span(S - room, S - room))
    args = (ids, kv, lengths, num_valid, kv_len, num_tokens, weights, H, 1e-5)
    if name == "causal_lm_draft_sample_chain":
        wild = [0.0, -1.0, float("nan"), float("inf")] if z.wild else []
        temperature = z.r.choice([1.0, 0.7, 1e-6, 1e4, *wild])
        top_k = z.int_value(0, 25)
        top_p = z.r.choice([1.0, 0.9, 1e-9, *wild])
        args += (z.ints(z.maybe_wrong_shape([B]), -5, 10**6), temperature, top_k, top_p)
    getattr(torch.ops.specdec, name)(*args)


CALLS = {
    "native_kv_write_": lambda z: kv_write(z, paged=False, native=True),
    "native_paged_kv_write_": lambda z: kv_write(z, paged=True, native=True),
    "native_kv_compact_": lambda z: kv_compact(z, paged=False, native=True),
    "native_paged_kv_compact_": lambda z: kv_compact(z, paged=True, native=True),
    "kv_write_": lambda z: kv_write(z, paged=z.chance(0.5), native=False),
    "kv_compact_": lambda z: kv_compact(z, paged=z.chance(0.5), native=False),
    "cache verbs (validate=False)": cache_verbs,
    "native_verify_ex (padded)": lambda z: verify(z, flat=False),
    "native_verify_ex (flat)": lambda z: verify(z, flat=True),
    "native_verify_tree": verify_tree,
    "native_accept_reject": accept_reject,
    "native_emitted_logprobs": emitted_logprobs,
    "rowinv_linear": rowinv_linear,
    "rowinv_attention": rowinv_attention,
    "native_accept_tests_passed": accept_tests_passed,
    "native_expected_accepts": expected_accepts,
    "native_finish_ms": finish_ms,
    "causal_lm_pass": causal_lm_pass,
    "causal_lm_draft_pass": lambda z: causal_lm_pass(z, "causal_lm_draft_pass"),
    "causal_lm_greedy_chain": lambda z: causal_lm_chain(z, "causal_lm_greedy_chain"),
    "causal_lm_draft_chain": lambda z: causal_lm_chain(z, "causal_lm_draft_chain"),
    "causal_lm_draft_sample_chain": lambda z: causal_lm_chain(z, "causal_lm_draft_sample_chain"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="number of calls (default 3000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not _extension.has_op("native_verify_ex"):
        print("fuzz_native: the C++ extension is not loaded", file=sys.stderr)
        return 1
    z = Garbage(args.seed)
    names = list(CALLS)
    outcomes = collections.Counter()
    threads = torch.get_num_threads()
    began = time.perf_counter()
    try:
        for i in range(args.calls):
            name = names[i % len(names)]
            z.wild = z.chance(0.5)
            if i % 7 == 0:  # 1 thread walks rows; more threads than rows split them
                torch.set_num_threads(z.r.choice([1, 2, 3]))
            try:
                CALLS[name](z)
                outcomes[(name, "returned")] += 1
            except Exception as exc:  # every Python exception is fine; a crash is not
                outcomes[(name, type(exc).__name__)] += 1
    finally:
        torch.set_num_threads(threads)
    for name in names:
        seen = ", ".join(f"{k[1]} {n}" for k, n in sorted(outcomes.items()) if k[0] == name)
        print(f"  {name:30s} {seen}")
    print(
        f"fuzz_native: {args.calls} calls (seed {args.seed}) in "
        f"{time.perf_counter() - began:.1f} s, no crash"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
