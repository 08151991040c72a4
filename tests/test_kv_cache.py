"""KV-cache rollback: the C++/CUDA ops against the pure-PyTorch reference (bit for bit), the
ops' registration (opcheck, schemas, fallback), and the KVCache / PagedKVCache classes."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import specdec_kernels as sk
from specdec_kernels import _extension
from specdec_kernels.kv_cache import _ops as kv_registry
from specdec_kernels.reference import kv_cache as ref

from kv_helpers import (
    DEVICES,
    assert_same,
    compaction,
    disjoint_block_tables,
    implementation,
    no_host_sync,
    random_values,
)
from op_registry import kv_args

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
IMPLS = ["native", "fallback"]
# (L, B, H, S, D): heads and head dims that are not powers of two, and a single-everything case.
CACHE_SHAPES = [(2, 3, 5, 17, 7), (1, 1, 1, 1, 1), (3, 4, 3, 37, 96), (2, 2, 8, 33, 128)]
# (L, B, H, block_size, blocks_per_row, D): odd block sizes so runs cross block boundaries.
PAGED_SHAPES = [(2, 3, 5, 3, 4, 7), (1, 1, 1, 1, 3, 1), (3, 4, 3, 5, 5, 96), (2, 2, 8, 16, 3, 128)]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(params=IMPLS)
def impl(request):
    with implementation(request.param):
        yield request.param


def _native_or_skip():
    if not sk.extension_available():
        pytest.skip("specdec_kernels._C is not built")


# ============================================================================================
# Ops: C++ kernel vs reference, bit for bit
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", CACHE_SHAPES)
@pytest.mark.parametrize("strided", [False, True])
def test_kv_write_matches_reference(shape, dtype, strided):
    _native_or_skip()
    L, B, H, S, D = shape
    T = max(1, S // 3)
    cache = random_values((L, 2, B, H, S, D), dtype)
    if strided:  # [B, T, H, D] transposed: strided B, H, T dims, last dim contiguous
        k = random_values((B, T, H, D), dtype).transpose(1, 2)
        v = random_values((B, T, H, D), dtype).transpose(1, 2)
    else:
        k, v = random_values((B, H, T, D), dtype), random_values((B, H, T, D), dtype)
    offsets = torch.randint(0, S - T + 1, (B,))
    expected = cache.clone()
    ref.kv_write_(expected, L - 1, k, v, offsets)
    torch.ops.specdec.kv_write_(cache, L - 1, k, v, offsets)
    assert_same(cache, expected, "kv_write_")
    b = B - 1  # spot-check the reference itself
    assert_same(expected[L - 1, 0, b, :, offsets[b] : offsets[b] + T], k[b], "reference write")


@pytest.mark.parametrize("kind", ["random", "reverse", "shift", "same"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", CACHE_SHAPES)
def test_kv_compact_matches_reference(shape, dtype, kind):
    _native_or_skip()
    L, B, H, S, D = shape
    cache = random_values((L, 2, B, H, S, D), dtype)
    src, keep, start = compaction(B, S, max_keep=min(S, 9), kind=kind)
    expected = cache.clone()
    ref.kv_compact_(expected, src, keep, start)
    torch.ops.specdec.kv_compact_(cache, src, keep, start)
    assert_same(cache, expected, f"kv_compact_ ({kind})")
    # The reference against the definition, row by row: the old entries, in order.
    before = cache.clone()
    after = cache.clone()
    ref.kv_compact_(after, src, keep, start)
    for b in range(B):
        n, s = int(keep[b]), int(start[b])
        assert_same(after[:, :, b, :, s : s + n], before[:, :, b, :, src[b, :n]], f"row {b}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", PAGED_SHAPES)
def test_paged_kv_write_matches_reference(shape, dtype):
    _native_or_skip()
    L, B, H, BS, per_row, D = shape
    NB = B * per_row + 2
    cache = random_values((L, 2, NB, H, BS, D), dtype)
    tables = disjoint_block_tables(B, per_row, per_row + 1, NB)
    capacity = per_row * BS
    T = max(1, capacity // 2)
    k, v = random_values((B, H, T, D), dtype), random_values((B, H, T, D), dtype)
    offsets = torch.randint(0, capacity - T + 1, (B,))
    expected = cache.clone()
    ref.paged_kv_write_(expected, 0, k, v, tables, offsets)
    torch.ops.specdec.paged_kv_write_(cache, 0, k, v, tables, offsets)
    assert_same(cache, expected, "paged_kv_write_")
    for t in range(T):  # the reference against the definition
        p = int(offsets[0]) + t
        blk = int(tables[0, p // BS])
        assert_same(expected[0, 1, blk, :, p % BS], v[0, :, t], f"row 0 position {p}")


@pytest.mark.parametrize("kind", ["random", "reverse", "shift"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", PAGED_SHAPES)
def test_paged_kv_compact_matches_reference(shape, dtype, kind):
    _native_or_skip()
    L, B, H, BS, per_row, D = shape
    NB = B * per_row + 2
    cache = random_values((L, 2, NB, H, BS, D), dtype)
    tables = disjoint_block_tables(B, per_row, per_row + 2, NB)
    src, keep, start = compaction(B, per_row * BS, max_keep=min(per_row * BS, 11), kind=kind)
    expected = cache.clone()
    ref.paged_kv_compact_(expected, tables, src, keep, start)
    torch.ops.specdec.paged_kv_compact_(cache, tables, src, keep, start)
    assert_same(cache, expected, f"paged_kv_compact_ ({kind})")


def test_compact_nothing_kept_is_a_no_op(impl):
    cache = random_values((2, 2, 3, 2, 6, 4), torch.float32)
    before = cache.clone()
    src = torch.full((3, 4), -1)
    torch.ops.specdec.kv_compact_(
        cache, src, torch.zeros(3, dtype=torch.int64), torch.tensor([0, 5, 2])
    )
    assert_same(cache, before, "kv_compact_ with num_keep = 0")
    paged = random_values((1, 2, 4, 2, 3, 4), torch.float32)
    before = paged.clone()
    tables = torch.tensor([[-1, -1], [2, 0]], dtype=torch.int32)
    torch.ops.specdec.paged_kv_compact_(
        paged,
        tables,
        torch.zeros(2, 3, dtype=torch.int64),
        torch.zeros(2, dtype=torch.int64),
        torch.zeros(2, dtype=torch.int64),
    )
    assert_same(paged, before, "paged_kv_compact_ with num_keep = 0")


def test_native_ops_reject_bad_values():
    """The C++ CPU op checks values itself (cheap on the host) and names the row."""
    _native_or_skip()
    cache = torch.zeros(1, 2, 2, 1, 5, 3)
    k = torch.ones(2, 1, 2, 3)
    with pytest.raises(ValueError, match=r"row 1: write positions \[4, 6\) are outside \[0, 5\)"):
        torch.ops.specdec.kv_write_(cache, 0, k, k, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="row 0: num_keep 3 is outside"):
        torch.ops.specdec.kv_compact_(
            cache, torch.zeros(2, 2, dtype=torch.int64), torch.tensor([3, 0]), torch.tensor([0, 0])
        )
    with pytest.raises(ValueError, match="row 0: source positions \\[7, 8\\)"):
        torch.ops.specdec.kv_compact_(
            cache, torch.tensor([[7], [0]]), torch.tensor([1, 0]), torch.tensor([0, 0])
        )
    paged = torch.zeros(1, 2, 3, 1, 2, 3)
    tables = torch.tensor([[0, -1], [1, 2]], dtype=torch.int32)
    with pytest.raises(
        ValueError, match="row 0: write positions \\[1, 3\\) need block-table entry 1, which is -1"
    ):
        torch.ops.specdec.paged_kv_write_(paged, 0, k, k, tables, torch.tensor([1, 0]))
    assert not cache.any() and not paged.any()


# Positions and lengths near INT64_MAX (issue 19): `first + count` wraps negative, so a range test
# written as `first + count <= capacity` passes them. Each case: op name, its arguments (the
# cache first), and the error the C++ CPU op must raise.
I64_MAX = 2**63 - 1


def _near_int64_max_cases():
    def cache():
        return torch.arange(2 * 2 * 4 * 3.0).view(1, 2, 2, 1, 4, 3)

    def paged():
        return torch.arange(2 * 4 * 2 * 3.0).view(1, 2, 4, 1, 2, 3)

    k = torch.ones(2, 1, 2, 3)
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    zero, two = torch.tensor([0, 0]), torch.tensor([2, 0])
    cases = []
    for first in (I64_MAX, I64_MAX - 1):  # + 2 wraps
        off = torch.tensor([0, first])
        run = rf"\[{first}, {first} \+ 2\)"
        cases += [
            ("kv_write_", (cache(), 0, k, k, off), rf"row 1: write positions {run} are outside"),
            (
                "paged_kv_write_",
                (paged(), 0, k, k, tables, off),
                rf"row 1: write positions {run} are outside \[0, 4\)",
            ),
            (
                "kv_compact_",
                (cache(), torch.tensor([[0, 1], [0, 0]]), two, torch.tensor([first, 0])),
                rf"row 0: destination positions {run} are outside \[0, 4\)",
            ),
            (
                "paged_kv_compact_",
                (paged(), tables, torch.tensor([[0, 1], [0, 0]]), two, torch.tensor([first, 0])),
                rf"row 0: destination positions {run} are outside \[0, 4\)",
            ),
        ]
    for src in (I64_MAX, I64_MAX - 1, -(2**63)):  # sources: one position each
        end = f"{src} \\+ 1" if src == I64_MAX else str(src + 1)
        message = rf"row 0: source positions \[{src}, {end}\) are outside \[0, 4\)"
        srcs = torch.tensor([[1, src], [0, 0]])
        cases += [
            ("kv_compact_", (cache(), srcs, two, zero), message),
            ("paged_kv_compact_", (paged(), tables, srcs, two, zero), message),
        ]
    return cases


@pytest.mark.parametrize(
    "name, args, message",
    _near_int64_max_cases(),
    ids=[f"{c[0]}-{i}" for i, c in enumerate(_near_int64_max_cases())],
)
def test_native_ops_reject_positions_near_int64_max(name, args, message):
    """The C++ CPU ops test ranges as `first <= capacity - count`: positions whose end passes
    INT64_MAX raise like every other out-of-range one (they used to wrap negative and pass the
    test: skipped silently, or, paged, a block-table read far out of bounds), and nothing moves."""
    _native_or_skip()
    before = args[0].clone()
    with pytest.raises(ValueError, match=message):
        getattr(torch.ops.specdec, name)(*args)
    assert_same(args[0], before, f"{name}: the cache after the failed call")


@pytest.mark.parametrize("name, args, message", _near_int64_max_cases()[:8])
def test_fallback_skips_positions_near_int64_max(name, args, message):
    """The pure-PyTorch fallback skips such positions (as the CUDA kernels do), like any other
    position past the cache: the result is the one with those values replaced by 4 (the
    capacity)."""
    del message

    def tame(a):
        if isinstance(a, torch.Tensor) and a.dtype == torch.int64:
            return torch.where(a > 2**62, 4, a)
        return a.clone() if isinstance(a, torch.Tensor) else a

    expected = [tame(a) for a in args]
    getattr(ref, name)(*expected)
    getattr(ref, name)(*args)
    assert_same(args[0], expected[0], f"{name}: the cache")


@pytest.mark.parametrize("impl_name", IMPLS)
def test_paged_ops_with_an_empty_block_table(impl_name):
    """A `[B, 0]` block table (rows that own no block) has no data pointer; the kernels used to
    take that for "no table" and write row b of the cache's blocks (out of bounds for b >=
    num_blocks; found by scripts/fuzz_native.py). Its rows own no position: the C++ op raises,
    the fallback skips, and no block changes."""
    cache = random_values((1, 2, 1, 1, 4, 3), torch.float32)  # one block
    before = cache.clone()
    k = random_values((3, 1, 2, 3), torch.float32)
    tables = torch.zeros(3, 0, dtype=torch.int32)
    zero = torch.zeros(3, dtype=torch.int64)
    calls = [
        lambda: torch.ops.specdec.paged_kv_write_(cache, 0, k, k, tables, zero),
        lambda: torch.ops.specdec.paged_kv_compact_(
            cache, tables, torch.zeros(3, 1, dtype=torch.int64), zero + 1, zero
        ),
    ]
    with implementation(impl_name):
        for call in calls:
            if impl_name == "native":
                with pytest.raises(ValueError, match=r"row 0: (write|destination) positions "):
                    call()
            else:
                call()
    assert_same(cache, before, "the one block")


def test_issue_19_reproduction_raises_and_changes_nothing():
    """The three calls of issue 19: each raises a ValueError naming the positions; none changes
    the cache (the paged cache's bookkeeping included)."""
    _native_or_skip()
    paged = sk.PagedKVCache(num_layers=1, num_blocks=4, block_size=2, num_kv_heads=1, head_dim=1)
    paged.add_rows(1)
    paged.write(0, torch.ones(1, 1, 3, 1), torch.ones(1, 1, 3, 1))
    paged.advance(3)
    state = (paged.kv.clone(), paged.lengths.clone(), paged.block_tables.clone())
    free = paged.num_free_blocks
    with pytest.raises(
        ValueError,
        match=r"paged_kv_compact_: row 0: destination positions "
        r"\[9223372036854775806, 9223372036854775806 \+ 2\) are outside \[0, 8\)",
    ):
        paged.compact(
            torch.tensor([[0, 1]]), torch.tensor([2]), torch.tensor([2**63 - 2]), validate=False
        )
    for what, x, y in zip(
        ("contents", "lengths", "block_tables"),
        state,
        (paged.kv, paged.lengths, paged.block_tables),
    ):
        assert_same(y, x, f"paged cache {what}")
    assert paged.num_free_blocks == free

    cache = torch.zeros(1, 2, 4, 1, 2, 1)
    table = torch.tensor([[0, 1, -1, -1]], dtype=torch.int32)
    k = torch.ones(1, 1, 1, 1)
    with pytest.raises(
        ValueError,
        match=r"paged_kv_write_: row 0: write positions "
        r"\[9223372036854775807, 9223372036854775807 \+ 1\) are outside \[0, 8\)",
    ):
        torch.ops.specdec.paged_kv_write_(cache, 0, k, k, table, torch.tensor([2**63 - 1]))
    assert not cache.any()

    c = torch.arange(8.0).view(1, 2, 1, 1, 4, 1).clone()
    with pytest.raises(
        ValueError,
        match=r"kv_compact_: row 0: source positions "
        r"\[9223372036854775807, 9223372036854775807 \+ 1\) are outside \[0, 4\)",
    ):
        torch.ops.specdec.kv_compact_(
            c, torch.tensor([[2**63 - 1]]), torch.tensor([1]), torch.tensor([0])
        )
    assert_same(c, torch.arange(8.0).view(1, 2, 1, 1, 4, 1), "contiguous cache")


def _out_of_cache_cases(device="cpu"):
    """Op arguments with positions outside the cache or in unowned blocks (what the ops may get
    from a cache used with validate=False), and the expected result, computed position by
    position: such positions are skipped, nothing else changes."""
    g = torch.Generator().manual_seed(3)
    cache = random_values((1, 2, 3, 2, 5, 4), torch.float32, generator=g)
    k, v = (random_values((3, 2, 3, 4), torch.float32, generator=g) for _ in range(2))
    offsets = torch.tensor([3, -2, 7])  # row 0: 3, 4 exist, 5 not; row 1: only 0; row 2: none
    written = cache.clone()
    for b in range(3):
        for t in range(3):
            p = int(offsets[b]) + t
            if 0 <= p < 5:
                written[0, 0, b, :, p], written[0, 1, b, :, p] = k[b, :, t], v[b, :, t]
    src = torch.tensor([[4, 9], [0, -1], [2, 3]])
    keep, start = torch.tensor([2, 2, 1]), torch.tensor([3, 0, 4])
    compacted = cache.clone()
    for b in range(3):
        for i in range(int(keep[b])):
            p, q = int(src[b, i]), int(start[b]) + i
            if 0 <= p < 5 and 0 <= q < 5:
                compacted[:, :, b, :, q] = cache[:, :, b, :, p]
    paged = random_values((1, 2, 4, 2, 2, 4), torch.float32, generator=g)  # 4 blocks of 2
    tables = torch.tensor([[1, -1], [2, 9], [-1, -1]], dtype=torch.int32)  # -1 and 9: no block
    paged_offsets = torch.tensor([1, 1, 0])
    paged_written = paged.clone()
    for b in range(3):
        for t in range(3):
            p = int(paged_offsets[b]) + t
            blk = int(tables[b, p // 2]) if p < 4 else -1
            if 0 <= blk < 4:
                paged_written[0, 0, blk, :, p % 2] = k[b, :, t]
                paged_written[0, 1, blk, :, p % 2] = v[b, :, t]
    cases = {
        "kv_write_": ((cache, 0, k, v, offsets), written),
        "kv_compact_": ((cache, src, keep, start), compacted),
        "paged_kv_write_": ((paged, 0, k, v, tables, paged_offsets), paged_written),
    }
    return {
        name: (tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args), expected)
        for name, (args, expected) in cases.items()
    }


@pytest.mark.parametrize("name", ["kv_write_", "kv_compact_", "paged_kv_write_"])
def test_fallback_skips_positions_outside_the_cache(name):
    """The fallback, like the CUDA kernels, neither raises on positions that do not exist nor
    lets them touch any other entry (a -1 block id must not wrap around to the last block)."""
    args, expected = _out_of_cache_cases()[name]
    cache = args[0].clone()
    getattr(ref, name)(cache, *args[1:])
    assert_same(cache, expected, name)


@pytest.mark.parametrize("impl_name", IMPLS)
def test_ops_reject_bad_metadata(impl_name):
    """Shape / dtype / device / layer mismatches raise ValueError naming the argument."""
    with implementation(impl_name):
        cache = torch.zeros(2, 2, 3, 4, 8, 5)
        k = torch.zeros(3, 4, 2, 5)
        off = torch.zeros(3, dtype=torch.int64)
        cases = [
            (("kv_write_", cache, 2, k, k, off), "layer 2 is outside"),
            (
                ("kv_write_", cache, 0, k[:, :3], k[:, :3], off),
                r"key must have shape \[B, H, T, D\]",
            ),
            (("kv_write_", cache, 0, k.half(), k.half(), off), "key is (torch.float16|Half)"),
            (("kv_write_", cache, 0, k, k[:, :, :1], off), "key and value must have the same"),
            (("kv_write_", cache, 0, k, k, off.int()), "offsets must be"),
            (("kv_write_", cache, 0, k, k, off[:2]), "offsets has shape"),
            (("kv_write_", cache[0], 0, k, k, off), "kv_cache must be 6-d"),
            (("kv_compact_", cache, off[:, None], off, off[:2]), "start has shape"),
            (("kv_compact_", cache, off, off, off), "src_positions must be 2-d"),
            (("paged_kv_write_", cache, 0, k, k, off.view(3, 1), off), "block_tables must be"),
        ]
        for (name, *args), message in cases:
            with pytest.raises(ValueError, match=message):
                getattr(torch.ops.specdec, name)(*args)
        assert not cache.any()


# ============================================================================================
# Registration


ROOT = Path(__file__).resolve().parents[1]


def bindings_schemas() -> dict[str, str]:
    """``{op name: "(args) -> ()"}`` of every ``m.def("...")`` in csrc/bindings.cpp (adjacent
    C++ string literals joined), read from the source, not from the registry."""
    text = (ROOT / "csrc" / "bindings.cpp").read_text()
    schemas = {}
    for call in re.findall(r"\bm\.def\((.*?)\);", text, flags=re.S):
        schema = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', call))
        name, _, rest = schema.partition("(")
        schemas[name] = "(" + rest
    return schemas


@pytest.mark.parametrize("name", list(kv_registry.SCHEMAS))
def test_python_schemas_match_bindings_cpp(name):
    """The public op (defined in Python) and its native kernel (defined in C++) take the same
    arguments: the routing kernel passes them through positionally."""
    native = bindings_schemas()
    assert native.get(_extension.NATIVE_PREFIX + name) == kv_registry.SCHEMAS[name], (
        f"csrc/bindings.cpp and kv_registry.SCHEMAS disagree on {name}"
    )


def test_bindings_cpp_defines_no_other_kv_op():
    kv_ops = {n for n in bindings_schemas() if "kv_" in n}
    assert kv_ops == {_extension.NATIVE_PREFIX + n for n in kv_registry.SCHEMAS}


@pytest.mark.parametrize("name", list(kv_registry.SCHEMAS))
def test_registered_schemas(name):
    """What the dispatcher holds: the public op as SCHEMAS says; where the extension is built,
    the native op as bindings.cpp says (the compiled library, not its source)."""
    public = str(getattr(torch.ops.specdec, name).default._schema)
    assert public == f"specdec::{name}{kv_registry.SCHEMAS[name]}"
    if not _extension.loaded():
        pytest.skip(f"extension not built: {_extension.load_error()}")
    native_name = _extension.NATIVE_PREFIX + name
    native = str(getattr(torch.ops.specdec, native_name).default._schema)
    assert native == f"specdec::{native_name}{bindings_schemas()[native_name]}"


@pytest.mark.parametrize("name", list(kv_registry.SCHEMAS))
def test_fallback_and_fake_signatures_match_schema(name):
    """The reference (the fallback) and the fake kernel take the schema's arguments, by name."""
    args = [a.split()[-1] for a in kv_registry.SCHEMAS[name].split(") ->")[0][1:].split(", ")]
    for fn in (getattr(ref, name), kv_registry.FAKES[name]):
        assert list(inspect.signature(fn).parameters) == args, fn


def test_fake_kernels_propagate_under_torch_compile_tracing():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        args = {
            n: tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in t)
            for n, t in kv_args().items()
        }
        for name, a in args.items():
            getattr(torch.ops.specdec, name)(*a)
        with pytest.raises(ValueError, match="layer 5 is outside"):
            torch.ops.specdec.kv_write_(args["kv_write_"][0], 5, *args["kv_write_"][2:])


def test_extension_is_built_and_fallback_can_be_forced():
    if os.environ.get("SPECDEC_REQUIRE_EXTENSION") == "1":
        assert sk.extension_available(), _extension.load_error()
    if not sk.extension_available():
        pytest.skip(f"extension not in use: {_extension.load_error()}")
    with kv_registry.force_fallback():
        assert not sk.extension_available()
    assert sk.extension_available()


def test_without_extension_the_fallback_registers_the_same_ops(tmp_path):
    """A fresh interpreter with SPECDEC_FORCE_FALLBACK=1 (what a machine without the extension
    sees): same op names and schemas, one warning, working caches."""
    native = {n: v for n, v in bindings_schemas().items() if "kv_" in n}
    script = f"NATIVE = {native!r}\n" + textwrap.dedent("""
        import sys
        import warnings
        warnings.simplefilter("always")
        import torch
        import specdec_kernels as sk
        from specdec_kernels import _extension
        assert not sk.extension_available()
        assert "SPECDEC_FORCE_FALLBACK" in _extension.load_error()
        assert "specdec_kernels._C" not in sys.modules  # so no native op is registered
        assert not _extension.has_op("native_kv_write_")
        for name, schema in NATIVE.items():  # csrc/bindings.cpp's schemas, parsed by the test
            name = name.removeprefix("native_")
            assert str(getattr(torch.ops.specdec, name).default._schema) == \\
                f"specdec::{name}{schema}", name
        with warnings.catch_warnings(record=True) as caught:
            cache = sk.KVCache(2, 2, 3, 4, 8)
            k = torch.randn(2, 3, 3, 4)
            cache.write(0, k, k)
            cache.write(0, k, k)
            cache.advance(3)
            cache.compact(torch.tensor([[2, 0], [1, 1]]), torch.tensor([2, 1]), 0)
        messages = [str(w.message) for w in caught if "fallback" in str(w.message)]
        assert len(messages) == 2, messages   # one per op used, once each
        assert torch.equal(cache.key(0)[0, :, :2], k[0, :, [2, 0]])
        print("OK", cache.lengths.tolist())
    """)
    env = dict(os.environ, SPECDEC_FORCE_FALLBACK="1")
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK [2, 1]" in result.stdout


def test_no_warning_from_registration_or_forced_fallback():
    """A fresh interpreter with warnings as errors: importing the package, the native kernels
    and force_fallback raise no warning (nothing is overridden, nothing is filtered)."""
    script = textwrap.dedent("""
        import warnings
        warnings.simplefilter("error")
        import torch
        import specdec_kernels as sk
        from specdec_kernels.kv_cache import force_fallback
        native = sk.extension_available()
        for _ in range(2):
            with force_fallback():
                assert not sk.extension_available()
                cache = sk.KVCache(1, 2, 1, 3, 4)
                cache.write(0, torch.ones(2, 1, 2, 3), torch.ones(2, 1, 2, 3))
            assert sk.extension_available() == native
            if native:  # (without it the unforced fallback warns, once, by design)
                cache.write(0, torch.ones(2, 1, 2, 3), torch.ones(2, 1, 2, 3))
        print("OK", native)
    """)
    env = {k: v for k, v in os.environ.items() if k != _extension.FORCE_FALLBACK_ENV}
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK" in result.stdout


# ============================================================================================
# KVCache
def _kv(cache: sk.KVCache):
    return cache.kv.clone(), cache.lengths.clone()


def _assert_unchanged(cache, snapshot, what):
    assert_same(cache.kv, snapshot[0], f"{what}: contents")
    assert_same(cache.lengths, snapshot[1], f"{what}: lengths")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kvcache_write_advance_rollback(impl, dtype, device):
    L, B, H, D, S = 3, 4, 5, 7, 13
    cache = sk.KVCache(L, B, H, D, S, dtype=dtype, device=device)
    assert cache.key(1).shape == (B, H, S, D) and cache.value(2).shape == (B, H, S, D)
    assert cache.key(1).data_ptr() == cache.kv[1, 0].data_ptr()  # a view, no copy
    ks = [random_values((B, H, 4, D), dtype, device) for _ in range(L)]
    for layer in range(L):
        cache.write(layer, ks[layer], -ks[layer])
    assert cache.lengths.tolist() == [0] * B  # write does not commit
    cache.advance(torch.tensor([4, 1, 0, 3], device=device))
    for layer in range(L):
        assert_same(cache.key(layer)[:, :, :4], ks[layer], "keys")
        assert_same(cache.value(layer)[:, :, :4], -ks[layer], "values")
    before = cache.kv.clone()
    cache.rollback(torch.tensor([2, 1, 0, 0], device=device))
    assert cache.lengths.tolist() == [2, 0, 0, 3]
    assert_same(cache.kv, before, "rollback moves no data")
    k2 = random_values((B, H, 2, D), dtype, device)
    cache.write(0, k2, k2)  # at the new lengths
    assert_same(cache.key(0)[0, :, 2:4], k2[0], "row 0 after rollback")
    assert_same(cache.key(0)[3, :, 3:5], k2[3], "row 3")
    assert_same(cache.key(0)[0, :, :2], ks[0][0, :, :2], "kept prefix")
    cache.advance(2)
    assert cache.lengths.tolist() == [4, 2, 2, 5]
    cache.reset()
    assert cache.lengths.tolist() == [0] * B


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_tree_compaction_flow(impl, device):
    """Write a tree of 6 nodes after a prefix, commit it, keep one path per row."""
    L, B, H, D = 2, 3, 3, 5
    cache = sk.KVCache(L, B, H, D, 16, device=device)
    prefix = random_values((B, H, 4, D), torch.float32, device)
    tree = random_values((B, H, 6, D), torch.float32, device)
    for layer in range(L):
        cache.write(layer, prefix + layer, prefix - layer)
    cache.advance(torch.tensor([4, 2, 3], device=device))
    start = cache.lengths.clone()
    for layer in range(L):
        cache.write(layer, tree + layer, tree - layer)
    cache.advance(6)
    path = torch.tensor([[0, 2, 5], [1, 3, 0], [4, 0, 0]], device=device)  # node indices
    keep = torch.tensor([3, 2, 1], device=device)
    cache.compact(start[:, None] + path, keep, start)
    assert cache.lengths.tolist() == [7, 4, 4]
    for layer in range(L):
        for b in range(B):
            n, s = int(keep[b]), int(start[b])
            assert_same(
                cache.key(layer)[b, :, s : s + n],
                (tree + layer)[b, :, path[b, :n]],
                f"layer {layer} row {b} keys",
            )
            assert_same(
                cache.value(layer)[b, :, s : s + n],
                (tree - layer)[b, :, path[b, :n]],
                f"layer {layer} row {b} values",
            )
            assert_same(cache.key(layer)[b, :, :s], (prefix + layer)[b, :, :s], "prefix kept")


def test_kvcache_bad_input_raises_and_leaves_cache_unchanged(impl):
    cache = sk.KVCache(2, 3, 2, 4, 10)
    k = random_values((3, 2, 5, 4), torch.float32)
    cache.write(0, k, k)
    cache.write(1, k, k)
    cache.advance(torch.tensor([5, 2, 0]))
    cache.write(0, k[:, :, :3], k[:, :, :3])
    lengths = cache.lengths
    k_ok = random_values((3, 2, 6, 4), torch.float32)
    cases = [
        (
            lambda: cache.rollback(torch.tensor([1, 3, 0])),
            "row 1 holds 2 tokens; cannot roll back 3",
        ),
        (lambda: cache.rollback(-1), "row 0 .* cannot roll back -1"),
        (
            lambda: cache.advance(torch.tensor([0, 0, 11])),
            "row 2 holds 0 tokens; cannot advance by 11",
        ),
        (
            lambda: cache.advance(torch.tensor([2**63 - 1, 0, 0])),
            "row 0 holds 5 tokens; cannot advance by 9223372036854775807",
        ),
        (
            lambda: cache.rollback(torch.tensor([-(2**63), 0, 0])),
            "row 0 holds 5 tokens; cannot roll back -9223372036854775808",
        ),
        (lambda: cache.advance(torch.tensor([1, 2])), r"must be an int or have shape \[3\]"),
        (lambda: cache.advance(1.5), "must be an int or an integer tensor"),
        (
            lambda: cache.write(0, k_ok, k_ok),
            "row 0 holds 5 tokens; writing 6 more passes max_seq_len = 10",
        ),
        (lambda: cache.write(2, k, k), r"layer must be an int in \[0, 2\)"),
        (
            lambda: cache.write(0, k.half(), k.half()),
            "k is torch.float16 but the cache is torch.float32",
        ),
        (
            lambda: cache.write(0, k[:2], k[:2]),
            r"k must have shape \[B, H, T, D\] = \[3, 2, T, 4\]",
        ),
        (lambda: cache.write(0, k, k[:, :, :2]), "k and v must have the same shape"),
        (lambda: cache.write(0, k, k.to("meta")), "v is on meta but the cache is on cpu"),
        (
            lambda: cache.compact(
                torch.tensor([[4, 5], [0, 1], [0, 0]]),
                torch.tensor([2, 2, 0]),
                torch.tensor([3, 0, 0]),
            ),
            r"row 0: src_positions\[0, 1\] = 5 is outside \[start, lengths\) = \[3, 5\)",
        ),
        (
            lambda: cache.compact(
                torch.tensor([[4, 3], [0, 1], [0, 0]]),
                torch.tensor([2, 2, 0]),
                torch.tensor([-1, 0, 0]),
            ),
            r"row 0: start -1 \+ num_keep 2 must lie in \[0, lengths\] = \[0, 5\]",
        ),
        (
            lambda: cache.compact(torch.tensor([[4], [0], [0]]), torch.tensor([1, 3, 0]), 0),
            r"row 1: num_keep 3 is outside \[0, 1\]",
        ),
        (
            lambda: cache.compact(
                torch.tensor([[4], [0], [0]]), torch.tensor([1, 0, 0]), torch.tensor([1, 3, 0])
            ),
            r"row 1: start 3 \+ num_keep 0 must lie in \[0, lengths\] = \[0, 2\]",
        ),
        (
            lambda: cache.compact(torch.tensor([[4], [0], [0]]), 1, 0),
            r"row 2: start 0 \+ num_keep 1 must lie in \[0, lengths\] = \[0, 0\]",
        ),
        (lambda: cache.compact(torch.tensor([[4.0], [0], [0]]), 0, 0), "integer tensor"),
        (lambda: cache.compact(torch.tensor([4, 0, 0]), 0, 0), r"shape \[3, P\]"),
    ]
    for i, (call, message) in enumerate(cases):
        snapshot = _kv(cache)
        with pytest.raises(ValueError, match=message):
            call()
        _assert_unchanged(cache, snapshot, f"case {i} ({message})")
    assert cache.lengths is lengths


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_without_validation_never_syncs_and_clamps(impl, device):
    """validate=False: same results for valid input; lengths clamped to [0, max_seq_len]."""
    cache = sk.KVCache(2, 2, 3, 4, 6, device=device)
    k = random_values((2, 3, 4, 4), torch.float32, device)
    args = [
        torch.tensor(x, device=device) for x in ([4, 2], [[3, 1], [0, 0]], [2, 1], [1, 1], [5, 1])
    ]
    with no_host_sync():
        cache.write(0, k, -k, validate=False)
        cache.advance(args[0], validate=False)
        cache.compact(args[1], args[2], args[3], validate=False)
    assert cache.lengths.tolist() == [3, 2]
    assert_same(cache.key(0)[0, :, :3], k[0, :, [0, 3, 1]], "row 0")
    with no_host_sync():
        cache.rollback(args[4], validate=False)
    assert cache.lengths.tolist() == [0, 1]
    with no_host_sync():
        cache.advance(9, validate=False)
    assert cache.lengths.tolist() == [6, 6]


@pytest.mark.parametrize("cls", [sk.KVCache, sk.PagedKVCache])
@pytest.mark.parametrize("verb", ["write", "advance", "rollback", "compact"])
def test_every_verb_takes_validate_and_documents_it(cls, verb):
    """The two caches share the validate contract, written once (kv_cache._checks)."""
    from specdec_kernels.kv_cache._checks import VALIDATE_DOC

    fn = getattr(cls, verb)
    param = inspect.signature(fn).parameters["validate"]
    assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is True
    doc = inspect.cleandoc(fn.__doc__)
    assert "{validate}" not in doc and VALIDATE_DOC in doc, f"{cls.__name__}.{verb}"


def test_kvcache_constructor_rejects_bad_sizes():
    with pytest.raises(ValueError, match="max_seq_len must be an int >= 1"):
        sk.KVCache(1, 1, 1, 1, 0)
    with pytest.raises(ValueError, match="num_blocks must be an int >= 1"):
        sk.PagedKVCache(1, 0, 4, 1, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_over_ragged_rows_without_copying(device):
    """The batched decoder's view: SDPA over key(layer)[:, :, :kv_len] with attention_mask
    equals per-row attention over each row's own entries."""
    B, H, D, S, T = 3, 2, 8, 20, 3
    cache = sk.KVCache(1, B, H, D, S, device=device)
    cache.write(0, *(random_values((B, H, 9, D), torch.float32, device) for _ in range(2)))
    cache.advance(torch.tensor([9, 4, 1], device=device))
    k_new, v_new = (random_values((B, H, T, D), torch.float32, device) for _ in range(2))
    assert cache.positions(T).tolist() == [[9, 10, 11], [4, 5, 6], [1, 2, 3]]
    cache.write(0, k_new, v_new)
    q = random_values((B, H, T, D), torch.float32, device)
    kv_len = 12
    mask = cache.attention_mask(T, kv_len)
    assert mask.shape == (B, 1, T, kv_len) and mask.dtype == torch.bool
    out = F.scaled_dot_product_attention(
        q, cache.key(0)[:, :, :kv_len], cache.value(0)[:, :, :kv_len], attn_mask=mask
    )
    for b in range(B):
        n = int(cache.lengths[b]) + T
        expected = F.scaled_dot_product_attention(
            q[b : b + 1],
            cache.key(0)[b : b + 1, :, :n],
            cache.value(0)[b : b + 1, :, :n],
            attn_mask=torch.ones(T, n, dtype=torch.bool, device=device).tril(n - T),
        )
        torch.testing.assert_close(out[b : b + 1], expected, atol=1e-5, rtol=1e-5)


# ============================================================================================
# PagedKVCache
def test_paged_blocks_are_allocated_freed_and_reused(impl):
    paged = sk.PagedKVCache(2, 6, 3, 2, 4, max_blocks_per_row=4)
    assert paged.add_rows(2).tolist() == [0, 1]
    k = random_values((2, 2, 5, 4), torch.float32)
    paged.write(0, k, -k)
    paged.write(1, k, -k)
    assert paged.num_free_blocks == 2
    assert paged.block_tables.tolist() == [[0, 1, -1, -1], [2, 3, -1, -1]]
    paged.advance(torch.tensor([5, 4]))
    got_k, got_v = paged.gather(1)
    assert_same(got_k[0], k[0], "row 0")
    assert_same(got_v[1, :, :4], -k[1, :, :4], "row 1")
    assert paged.rollback(torch.tensor([3, 4])) == [[1], [2, 3]]
    assert paged.lengths.tolist() == [2, 0] and paged.num_free_blocks == 5
    assert paged.block_tables.tolist() == [[0, -1, -1, -1], [-1, -1, -1, -1]]
    ids = paged.add_rows(1)
    assert ids.tolist() == [2]
    k3 = random_values((3, 2, 4, 4), torch.float32)
    paged.write(0, k3, k3)  # freed blocks are reused first, the most recently freed first
    assert paged.block_tables.tolist() == [[0, 2, -1, -1], [3, 1, -1, -1], [4, 5, -1, -1]]
    paged.advance(torch.tensor([4, 4, 4]))
    got, _ = paged.gather(0)
    assert_same(got[0, :, :2], k[0, :, :2], "row 0 prefix kept across the rollback")
    assert_same(got[0, :, 2:6], k3[0], "row 0 new entries")
    assert_same(got[2, :, :4], k3[2], "new row")
    assert paged.remove_rows([0]) == [[0, 2]]
    assert paged.row_ids.tolist() == [1, 2] and paged.num_free_blocks == 2
    assert paged.lengths.tolist() == [4, 4]
    got, _ = paged.gather(0)
    assert_same(got[1, :, :4], k3[2], "rows keep their data when others leave")


@pytest.mark.parametrize("device", DEVICES)
def test_paged_tree_compaction_frees_blocks(impl, device):
    paged = sk.PagedKVCache(2, 12, 2, 3, 5, device=device)
    paged.add_rows(2)
    tree = random_values((2, 3, 7, 5), torch.float32, device)
    for layer in range(2):
        paged.write(layer, tree + layer, tree - layer)
    paged.advance(7)
    freed = paged.compact(
        torch.tensor([[1, 6, 2], [5, 4, 0]], device=device),
        torch.tensor([3, 1], device=device),
        torch.tensor([1, 2], device=device),
    )
    assert paged.lengths.tolist() == [4, 3]
    assert [len(f) for f in freed] == [2, 2] and paged.num_free_blocks == 12 - 4
    for layer in range(2):
        k, v = paged.gather(layer)
        assert_same(k[0, :, :4], (tree + layer)[0, :, [0, 1, 6, 2]], "row 0 keys")
        assert_same(v[1, :, :3], (tree - layer)[1, :, [0, 1, 5]], "row 1 values")


@pytest.mark.parametrize("device", DEVICES)
def test_paged_without_validation_never_syncs_and_clamps(impl, device):
    """validate=False: write and advance read no tensor on the host; rollback and compact
    return the freed blocks as lists, as with validation (reading them is their one sync); bad
    counts clamp the lengths into [0, blocks owned * block_size]."""
    paged = sk.PagedKVCache(2, 8, 2, 3, 4, device=device, max_blocks_per_row=3)
    paged.add_rows(2)
    k = random_values((2, 3, 5, 4), torch.float32, device)
    n, src, keep, start = (
        torch.tensor(x, device=device) for x in ([5, 3], [[4, 1], [0, 2]], [2, 1], [1, 0])
    )
    with no_host_sync():
        for layer in range(2):
            paged.write(layer, k, -k, validate=False)
        paged.advance(n, validate=False)
    assert paged.compact(src, keep, start, validate=False) == [[2], [4, 5]]
    assert paged.lengths.tolist() == [3, 1] and paged.num_free_blocks == 5
    got, _ = paged.gather(0)
    assert_same(got[0, :, :3], k[0, :, [0, 4, 1]], "row 0 after compact")
    assert_same(got[1, :, :1], k[1, :, [0]], "row 1 after compact")
    assert paged.rollback(torch.tensor([0, 7], device=device), validate=False) == [[], [3]]
    # made before the blocks: a host-to-device copy is itself a sync under CUDA's debug mode
    nine, grow = (torch.tensor(x, device=device) for x in ([9, 9], [2, 5]))
    with no_host_sync():
        paged.advance(nine, validate=False)
    assert paged.lengths.tolist() == [4, 0]  # row 0 owns 2 blocks of 2; row 1 owns none
    with no_host_sync():
        for layer in range(2):  # the most recently freed block first
            paged.write(layer, k[:, :, :2], k[:, :, :2], validate=False)
        paged.advance(grow, validate=False)
    assert paged.lengths.tolist() == [6, 2] and paged.num_free_blocks == 4
    assert paged.block_tables.tolist() == [[0, 1, 3], [4, -1, -1]]
    got, _ = paged.gather(1)
    assert_same(got[0, :, 4:6], k[0, :, :2], "row 0 grew into a reused block")
    assert_same(got[1, :, :2], k[1, :, :2], "row 1 took a freed block")


def test_paged_bad_input_raises_and_leaves_cache_unchanged(impl):
    paged = sk.PagedKVCache(2, 5, 3, 2, 4, max_blocks_per_row=3)
    paged.add_rows(2)
    k = random_values((2, 2, 4, 4), torch.float32)
    paged.write(0, k, k)
    paged.write(1, k, k)
    paged.advance(torch.tensor([4, 2]))

    def snapshot():
        return (
            paged.kv.clone(),
            paged.lengths.clone(),
            paged.block_tables.clone(),
            paged.num_free_blocks,
            paged.row_ids.clone(),
        )

    big = random_values((2, 2, 6, 4), torch.float32)
    cases = [
        (
            lambda: paged.write(0, big, big),
            r"row 0 \(id 0\) holds 4 tokens; writing 6 more needs "
            r"4 blocks of 3, a row holds at most 3",
        ),
        (
            lambda: paged.write(0, big[:, :, :5], big[:, :, :5]),
            "out of free blocks: the rows need 2 more blocks, 1 are free",
        ),
        (
            lambda: paged.advance(torch.tensor([3, 0])),
            r"row 0 \(id 0\) holds 4 tokens and owns 2 blocks \(6 positions\); cannot advance by 3",
        ),
        (
            lambda: paged.rollback(torch.tensor([0, 3])),
            r"row 1 \(id 1\) holds 2 tokens; cannot "
            "roll back 3",
        ),
        (
            lambda: paged.compact(torch.tensor([[3], [2]]), 1, torch.tensor([0, 1])),
            r"row 1: src_positions\[1, 0\] = 2 is outside \[start, lengths\) = \[1, 2\)",
        ),
        (lambda: paged.write(0, k.double(), k.double()), "k is torch.float64"),
        (lambda: paged.remove_rows([1, 7]), "7 is not the id of a live row"),
        (lambda: paged.remove_rows([1, 1]), "duplicate ids"),
    ]
    for i, (call, message) in enumerate(cases):
        before = snapshot()
        with pytest.raises(ValueError, match=message):
            call()
        after = snapshot()
        for what, x, y in zip(("contents", "lengths", "block_tables"), after, before):
            assert_same(x, y, f"case {i} ({message}): {what}")
        assert after[3:4] == before[3:4] and after[4].tolist() == before[4].tolist()


@pytest.mark.parametrize("cls", ["KVCache", "PagedKVCache"])
def test_cache_verbs_with_values_near_int64_max(impl, cls):
    """Every verb that takes a position or a count, with values near INT64_MAX (issue 19).

    validate=True: each raises the message of its check (compact's `start + num_keep <= lengths`
    used to wrap and report a source instead) and changes nothing. validate=False: compact with
    such a start raises in the C++ op (the fallback skips the positions) and changes nothing
    either way but the documented clamping of the lengths; advance / rollback clamp."""
    if cls == "KVCache":
        cache = sk.KVCache(2, 2, 1, 3, 8)
        rows = "row 0"
    else:
        cache = sk.PagedKVCache(2, 6, 2, 1, 3, max_blocks_per_row=4)
        cache.add_rows(2)
        rows = r"row 0 \(id 0\)"
    k = random_values((2, 1, 5, 3), torch.float32)
    for layer in range(2):
        cache.write(layer, k, -k)
    cache.advance(torch.tensor([5, 3]))

    def state():
        extra = [cache.block_tables.clone()] if cls == "PagedKVCache" else []
        return [cache.kv.clone(), cache.lengths.clone(), *extra]

    def unchanged(before, what):
        for x, y in zip(state(), before):
            assert_same(x, y, what)

    src = torch.tensor([[3, 4], [0, 1]])
    for first in (I64_MAX, I64_MAX - 1):
        for keep in (torch.tensor([2, 0]), torch.tensor([1, 0])):
            before = state()
            with pytest.raises(
                ValueError,
                match=rf"row 0: start {first} \+ num_keep {int(keep[0])} must lie in "
                r"\[0, lengths\] = \[0, 5\]",
            ):
                cache.compact(src, keep, torch.tensor([first, 0]))
            unchanged(before, f"compact(start={first}) validated")
    for n in (I64_MAX, I64_MAX - 1):
        for verb, what in (("advance", "advance by"), ("rollback", "roll back")):
            before = state()
            with pytest.raises(ValueError, match=rf"{rows} holds 5 tokens.*cannot {what} {n}"):
                getattr(cache, verb)(torch.tensor([n, 0]))
            unchanged(before, f"{verb}({n}) validated")

    # validate=False
    before = state()
    cap = cache.max_seq_len if cls == "KVCache" else 6  # the paged rows own 3 blocks of 2
    cache.advance(torch.tensor([I64_MAX, I64_MAX - 1]), validate=False)
    assert cache.lengths.tolist() == [cap, cap]
    cache.rollback(torch.tensor([1, I64_MAX]), validate=False)
    assert cache.lengths.tolist() == [cap - 1, 0]
    assert_same(cache.kv, before[0], "advance / rollback move no data")
    before = state()
    if impl == "native":
        with pytest.raises(ValueError, match=rf"row 0: destination positions \[{I64_MAX - 1}, "):
            cache.compact(src, torch.tensor([2, 0]), torch.tensor([I64_MAX - 1, 0]), validate=False)
        unchanged(before, "compact(start=INT64_MAX - 1) without validation, native")
    else:
        cache.compact(src, torch.tensor([2, 0]), torch.tensor([I64_MAX - 1, 0]), validate=False)
        assert_same(cache.kv, before[0], "compact(start=INT64_MAX - 1) skipped, fallback")


# ============================================================================================
# CUDA kernels against the CPU kernel (runs where a GPU is present)
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["kv_write_", "kv_compact_", "paged_kv_write_"])
def test_cuda_kernels_skip_positions_outside_the_cache(name):
    _native_or_skip()
    args, expected = _out_of_cache_cases("cuda")[name]
    cache = args[0].clone()
    getattr(torch.ops.specdec, name)(cache, *args[1:])
    assert_same(cache.cpu(), expected, name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name, args, message", _near_int64_max_cases()[:8])
def test_cuda_kernels_skip_positions_near_int64_max(name, args, message):
    """The CUDA kernels test `first < capacity - i` before forming `first + i`: such positions
    are skipped, as by the fallback (issue 19)."""
    del message
    _native_or_skip()
    expected = args[0].clone()
    getattr(ref, name)(expected, *args[1:])
    cuda_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    getattr(torch.ops.specdec, name)(*cuda_args)
    assert_same(cuda_args[0].cpu(), expected, name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", CACHE_SHAPES + [(4, 8, 8, 300, 128)])
def test_cuda_kernels_match_cpu_kernel(shape, dtype):
    _native_or_skip()
    L, B, H, S, D = shape
    cache = random_values((L, 2, B, H, S, D), dtype)
    T = max(1, S // 4)
    k, v = random_values((B, H, T, D), dtype), random_values((B, H, T, D), dtype)
    offsets = torch.randint(0, S - T + 1, (B,))
    src, keep, start = compaction(B, S, max_keep=min(S, 40), kind="random")
    big_src, big_keep, big_start = compaction(B, S, max_keep=S, kind="reverse")  # scratch path
    on_gpu = cache.cuda()
    for c, dev in ((cache, "cpu"), (on_gpu, "cuda")):
        torch.ops.specdec.kv_write_(c, L - 1, k.to(dev), v.to(dev), offsets.to(dev))
        torch.ops.specdec.kv_compact_(c, src.to(dev), keep.to(dev), start.to(dev))
        torch.ops.specdec.kv_compact_(c, big_src.to(dev), big_keep.to(dev), big_start.to(dev))
    assert_same(on_gpu.cpu(), cache, "cuda vs cpu")
    NB, BS, per_row = B * 4 + 1, 5, 4
    paged = random_values((L, 2, NB, H, BS, D), dtype)
    tables = disjoint_block_tables(B, per_row, per_row, NB)
    src, keep, start = compaction(B, per_row * BS, max_keep=9, kind="random")
    T = 7
    k, v = random_values((B, H, T, D), dtype), random_values((B, H, T, D), dtype)
    offsets = torch.randint(0, per_row * BS - T + 1, (B,))
    on_gpu = paged.cuda()
    for c, dev in ((paged, "cpu"), (on_gpu, "cuda")):
        torch.ops.specdec.paged_kv_write_(
            c, 0, k.to(dev), v.to(dev), tables.to(dev), offsets.to(dev)
        )
        torch.ops.specdec.paged_kv_compact_(
            c, tables.to(dev), src.to(dev), keep.to(dev), start.to(dev)
        )
    assert_same(on_gpu.cpu(), paged, "paged cuda vs cpu")


def _paged_pair(device):
    """Two paged caches in the same state: three rows of 7, 3 and 5 tokens in blocks of 2."""
    caches = []
    for _ in range(2):
        paged = sk.PagedKVCache(1, 12, 2, 1, 2, device=device, max_blocks_per_row=4)
        paged.add_rows(3)
        k = torch.arange(3 * 8 * 2, dtype=torch.float32, device=device).reshape(3, 1, 8, 2)
        paged.write(0, k, -k)
        paged.advance(torch.tensor([7, 3, 5], device=device))
        caches.append(paged)
    return caches


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [0, 1, [6, 0, 3], [7, 3, 5]])
def test_paged_rollback_returns_the_same_type_whatever_validate(impl, device, n):
    """rollback returns, per row, the list of block ids it freed, for validate=True and
    validate=False alike: the same type, the same lists, the same state afterwards."""
    checked, unchecked = _paged_pair(device)
    arg = n if isinstance(n, int) else torch.tensor(n, device=device)
    want, got = checked.rollback(arg), unchecked.rollback(arg, validate=False)
    assert type(want) is type(got) is list and len(got) == 3
    assert all(type(row) is list and all(type(i) is int for i in row) for row in got)
    assert got == want
    assert_same(unchecked.lengths, checked.lengths, "lengths")
    assert_same(unchecked.block_tables, checked.block_tables, "block tables")


@pytest.mark.parametrize("device", DEVICES)
def test_paged_compact_returns_the_same_type_whatever_validate(impl, device):
    checked, unchecked = _paged_pair(device)
    src = torch.tensor([[3, 5, 6], [1, 2, 2], [4, 4, 4]], device=device)
    keep, start = torch.tensor([3, 1, 0], device=device), torch.tensor([1, 1, 2], device=device)
    want = checked.compact(src, keep, start)
    got = unchecked.compact(src, keep, start, validate=False)
    assert type(want) is type(got) is list and got == want == [[2, 3], [5, 6, 7], [9, 10, 11]]
    assert_same(unchecked.kv, checked.kv, "data")
