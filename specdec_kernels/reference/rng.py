"""Counter-based random numbers shared by the reference and the Triton kernels.

Every random number of verification is a pure function of ``(seed, position, purpose, index)``:
a 64-bit per-row seed, the draft position ``j``, what the number is for (the accept test or the
resampling race), and the vocabulary index for the race. The decoding loop's drafters draw from
the same scheme with a purpose of their own (:func:`draft_exponentials`). Nothing depends on the
batch index, on the launch grid or on a global generator, so

* the reference (this module, in int64 PyTorch arithmetic) and the kernels
  (:mod:`specdec_kernels.ops._common`, in uint32 Triton arithmetic) draw bit-identical numbers;
* a row's result depends only on its own seed (batch invariance);
* no state is advanced, so nothing synchronises with the host.

The mixer is MurmurHash3's 32-bit finaliser (``fmix32``), applied to the key words in sequence.
Every 32-bit draw ``r`` becomes a float32 uniform ``v`` that is fine near 0, where the race needs
it (:func:`unit_interval`):

    v = (r + 0.5) * 2**-32          if r < 2**23      (v < 2**-9: steps of 2**-32)
    v = ((r >> 9) + 0.5) * 2**-23   otherwise         (steps of 2**-23)

Both are exact in float32 (at most 24 significant bits before a power-of-two scale), so every
backend draws the same bits, and ``2**-33 <= v <= 1 - 2**-24``: strictly inside ``(0, 1)``.
It is a uniform quantised to the cell midpoints of a grid that is 512 times finer below
``2**-9``.

The exponential of the resampling race is ``E = -log(1 - v)`` (:func:`exponential`): for
``v < 2**-9`` its series ``v (1 + v (1/2 + v/3))`` (the next term is below float32's rounding),
else ``-log(1 - v)`` with ``1 - v`` exact. The smallest exponential is ``~2**-33``, so a token
``g`` nats below the winner can win while ``g < ~23 + log E_winner``. A race token beats one
with ``e**g`` times its probability only when its ``E`` is ``e**g`` times smaller; with 23-bit
uniforms (``E >= 6e-8``) tokens more than ~16.6 nats down were starved, and beyond ~19.4 never
won, which on a 128k vocabulary loses a visible part of the tail's mass
(``tests/test_tail.py``). ``E > 0`` always, and is finite.
"""

from __future__ import annotations

import math

import torch

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9  # added to the high seed word before mixing
POS_MULT = 0x85EBCA77  # position multiplier
PURPOSE_MULT = 0xC2B2AE3D  # purpose multiplier
INDEX_MULT = 0x27D4EB2F  # vocabulary-index multiplier

UNIFORM_SHIFT = 9  # coarse cells: the top 32 - 9 = 23 bits
UNIFORM_SCALE = 2.0**-23
FINE_LIMIT = 2**23  # draws below it keep all 32 bits (v < 2**-9)
FINE_SCALE = 2.0**-32
SERIES_LIMIT = 2.0**-9  # E = -log(1 - v) by its series below it

PURPOSE_ACCEPT = 0  # the uniform of the accept test at position j
PURPOSE_SAMPLE = 1  # the per-token uniforms of the exponential race at position j
PURPOSE_DRAFT = 2  # the drafter's race for the children of a depth-j node (decoding loop only)


def mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """``(h * c) mod 2**32`` for ``0 <= h, c < 2**32`` held in int64.

    The full product can pass 2**63; PyTorch's int64 multiply wraps around in two's complement
    (on CPU and CUDA alike), which leaves the low 32 bits exact. The bit-equality test against
    the kernels' uint32 arithmetic (tests/test_verify_sampling.py) guards this.
    """
    return (h * c) & MASK32


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 ``fmix32`` on int64 tensors holding uint32 values (``h`` is not modified)."""
    h = h ^ (h >> 16)  # a new tensor; the steps below update it in place (2x fewer temporaries)
    h.mul_(0x85EBCA6B).bitwise_and_(MASK32)  # mul32, see above
    h ^= h >> 13
    h.mul_(0xC2B2AE35).bitwise_and_(MASK32)
    h ^= h >> 16
    return h


def row_key(seeds: torch.Tensor) -> torch.Tensor:
    """Mix a 64-bit seed (int64 tensor, any shape) into a 32-bit row key."""
    lo = seeds & MASK32
    hi = (seeds >> 32) & MASK32
    return fmix32(lo ^ fmix32((hi + GOLDEN) & MASK32))


def stream_key(key: torch.Tensor, position: torch.Tensor | int, purpose: int) -> torch.Tensor:
    """The key of one (row, position, purpose) stream."""
    if isinstance(position, int):  # mixed on the host: no scalar tensor copied to the device
        pos = ((position & MASK32) * POS_MULT) & MASK32
    else:
        position = torch.as_tensor(position, dtype=torch.int64, device=key.device)
        pos = mul32(position & MASK32, POS_MULT)
    mixed = key + pos + ((purpose * PURPOSE_MULT) & MASK32)
    return fmix32(mixed & MASK32)


def uniform(stream: torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
    """Float32 uniforms in ``[2**-33, 1 - 2**-24]`` for ``index`` (broadcast against ``stream``)."""
    index = torch.as_tensor(index, dtype=torch.int64, device=stream.device)
    r = fmix32(stream ^ mul32(index & MASK32, INDEX_MULT))
    r += stream  # r is fmix32's own tensor
    return unit_interval(fmix32(r.bitwise_and_(MASK32)))


def accept_uniforms(seeds: torch.Tensor, num_positions: int) -> torch.Tensor:
    """``[B, n]`` float32: the uniforms of the accept tests of positions ``0 .. n-1`` for
    ``seeds`` ``[B]`` int64, ``uniform(stream_key(row_key(seed), j, PURPOSE_ACCEPT), 0)``: the
    very numbers the chain kernels draw (block verification and the accept-test counter too)."""
    positions = torch.arange(num_positions, device=seeds.device)
    key = row_key(seeds)[:, None]
    return uniform(stream_key(key, positions[None, :], PURPOSE_ACCEPT), 0)


def unit_interval(r: torch.Tensor) -> torch.Tensor:
    """Map 32-bit draws ``r`` (int64 holding uint32) to float32 uniforms in
    ``[2**-33, 1 - 2**-24]``: ``(r + 0.5) * 2**-32`` below ``2**23``, else
    ``((r >> 9) + 0.5) * 2**-23`` (exact)."""
    fine = (r.to(torch.float32) + 0.5) * FINE_SCALE  # exact where it is kept (r < 2**23)
    coarse = ((r >> UNIFORM_SHIFT).to(torch.float32) + 0.5) * UNIFORM_SCALE
    return torch.where(r < FINE_LIMIT, fine, coarse)


def exponential(v: torch.Tensor) -> torch.Tensor:
    """The race's Exp(1) draws ``-log(1 - v)`` of uniforms ``v`` (float32): the series
    ``v (1 + v (1/2 + v/3))`` for ``v < 2**-9``, else ``-log(1 - v)`` (``1 - v`` is exact there).
    Always finite and ``>= v > 0``, with full relative precision down to ``v = 2**-33``."""
    series = v * (1.0 + v * (0.5 + v * (1.0 / 3.0)))
    return torch.where(v < SERIES_LIMIT, series, -torch.log(1.0 - v))


def draft_exponentials(seeds: torch.Tensor, position: int, shape) -> torch.Tensor:
    """The drafter's Exp(1) draws ``[B, *shape]`` (float32) for the children of depth-``position``
    nodes: entry ``(b, i)`` (``i`` the flat index into ``shape``, e.g. ``node * V + token``) is
    ``exponential(uniform(stream_key(row_key(seeds[b]), position, PURPOSE_DRAFT), i))``.

    With the step seeds of :func:`step_seeds` these are keyed by (seed, row, position,
    purpose = draft): batch invariant like verification's draws, and a stream of their own (a
    draft drawing with the verifier's noise would bias the output). No state, no host sync.

    Examples
    --------
    >>> s = torch.tensor([3, 4])
    >>> e = draft_exponentials(s, 0, (5,))
    >>> e.shape, bool(torch.equal(draft_exponentials(s[1:], 0, (5,)), e[1:]))
    (torch.Size([2, 5]), True)
    """
    u = _draft_uniforms(seeds, position, math.prod(shape))  # [B, n]
    return exponential(u).view(seeds.shape[0], *shape)


def _draft_uniforms(seeds: torch.Tensor, position, n: int) -> torch.Tensor:
    """The drafter's uniforms of indices ``0 .. n-1``: ``[B, n]`` at an int ``position``,
    ``[B, P, n]`` at a ``[P]`` tensor of positions (integer steps and exact conversions: the
    same bits either way)."""
    key = row_key(seeds.to(torch.int64))  # [B]
    if isinstance(position, torch.Tensor):
        key, position = key[:, None], position[None]  # [B, 1], [1, P]
    stream = stream_key(key, position, PURPOSE_DRAFT)  # [B] or [B, P]
    index = torch.arange(n, dtype=torch.int64, device=seeds.device)
    return uniform(stream[..., None], index)


def draft_exponentials_upto(seeds: torch.Tensor, positions: int, shape) -> list[torch.Tensor]:
    """``[draft_exponentials(seeds, j, shape) for j in range(positions)]``, bit for bit, with
    the integer mixing of every position in one pass (a chain drafter's ``K`` draws cost one
    set of tensor ops instead of ``K``). The logarithm runs per position on a contiguous
    ``[B, *shape]`` tensor, as :func:`draft_exponentials` runs it (a vectorised loop and its
    scalar tail may round differently, so the layout is kept).

    >>> s = torch.tensor([3, 4])
    >>> all(torch.equal(e, draft_exponentials(s, j, (5,)))
    ...     for j, e in enumerate(draft_exponentials_upto(s, 3, (5,))))
    True
    """
    pos = torch.arange(positions, dtype=torch.int64, device=seeds.device)
    u = _draft_uniforms(seeds, pos, math.prod(shape))  # [B, positions, n]
    b = seeds.shape[0]
    return [exponential(u[:, j].contiguous()).view(b, *shape) for j in range(positions)]


def step_seeds(seed: int, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The ``[B]`` verification seeds of one decoding step: a pure function of
    ``(seed, rows[b], positions[b])``, in ``[0, 2**63)``.

    The generation loops key each row's draws by the call's seed, the row's index in the caller's
    batch and the number of tokens the row holds before the step, so a row's tokens never depend
    on which other rows share the batch or when they finished.

    Examples
    --------
    >>> a = step_seeds(7, torch.tensor([0, 1]), torch.tensor([5, 5]))
    >>> b = step_seeds(7, torch.tensor([1]), torch.tensor([5]))
    >>> bool(a[1] == b[0]), bool(a[0] != a[1])
    (True, True)
    """
    s = torch.as_tensor(int(seed) & 0x7FFFFFFFFFFFFFFF, dtype=torch.int64, device=rows.device)
    lo = fmix32((s & MASK32) ^ mul32(rows.to(torch.int64) & MASK32, GOLDEN))
    hi = fmix32(((s >> 32) ^ mul32(positions.to(torch.int64) & MASK32, POS_MULT)) & MASK32)
    return (hi << 31) ^ lo


def position_seeds(seed: int, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The ``[B]`` verification seeds of one decoding step, linear in the position:
    ``(step_seeds(seed, rows, 0) + positions) mod 2**63``.

    ``sk.verify_sampling(method="match")`` keys position ``j`` of a call by ``seed[b] + j``, so
    with these seeds (``positions`` = the tokens a row holds before the step) the target's
    sample at every output position is keyed by (seed, row, that position), however the
    positions are split into passes: the decoding loop's samples at ``K = 0`` and with any
    drafts are the same draws.

    Examples
    --------
    >>> s = position_seeds(7, torch.tensor([0, 0]), torch.tensor([5, 8]))
    >>> int(s[1] - s[0])
    3
    """
    base = step_seeds(seed, rows, torch.zeros_like(positions))
    return (base + positions.to(torch.int64)) & 0x7FFFFFFFFFFFFFFF


def seeds_for_batch(
    batch_size: int, device: torch.device, seed=None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Turn the user's ``seed`` / ``generator`` into one int64 seed per row, on ``device``.

    ``seed`` may be ``None``, an int (row ``b`` gets a seed derived from ``(seed, b)``) or a
    ``[B]`` int64 tensor (used as is: batch invariance). With neither, the seeds are drawn from
    ``generator`` or, failing that, from torch's default generator of ``device``. No host sync.
    """
    if isinstance(seed, torch.Tensor):
        return seed.to(device=device, dtype=torch.int64)
    if seed is not None:
        rows = torch.arange(batch_size, device=device, dtype=torch.int64)
        return (int(seed) & 0x7FFFFFFFFFFFFFFF) ^ (mul32(rows, GOLDEN) << 31) ^ rows
    gen_device = generator.device if generator is not None else device
    draws = torch.randint(
        0, 2**62, (batch_size,), generator=generator, device=gen_device, dtype=torch.int64
    )
    return draws.to(device, non_blocking=True)
