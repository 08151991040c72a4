"""The row-invariant CPU model kernels (specdec::rowinv_linear, specdec::rowinv_attention) and
the models on them: a token's logits must be bitwise the same whatever else shares the pass, so
that speculative greedy output is exactly the target's own greedy decoding."""

import math
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

import specdec_kernels as sk
from specdec_kernels import _extension
from specdec_kernels.models import CausalLM, CausalLMConfig
from specdec_kernels.models.bundled import fastest_dtype, heldout_text, row_invariant_available
from specdec_kernels.tuning import PassCosts, measure_pass_costs, pick_k

pytestmark = pytest.mark.skipif(
    not _extension.has_op("rowinv_linear"), reason="the C++ extension is not built"
)
op = torch.ops.specdec

DTYPES = [(torch.float32, 2e-5, 1e-5), (torch.bfloat16, 0.0, 1.6e-2)]
I64_MAX, I64_MIN = 2**63 - 1, -(2**63)


@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
@pytest.mark.parametrize("n, c", [(1152, 384), (7, 37), (1000, 32), (257, 128), (40, 1540)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch_and_is_row_invariant(dtype, atol, rtol, n, c, bias):
    """Every row count a tile treats its own way (the AVX2 tile: one or two rows two weight tiles
    at a time, then groups of six with a remainder of 1-5; partial tiles of 16 weight rows)
    gives each row bitwise its one-row result."""
    w = torch.randn(n, c).to(dtype)
    b = torch.randn(n).to(dtype) if bias else None
    x = torch.randn(64, c).to(dtype)
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    got = op.rowinv_linear(x, w, b)
    assert got.dtype == dtype and got.shape == (64, n)
    # bfloat16: one rounding of the float32 sum, so within a bfloat16 ulp of the exact value
    torch.testing.assert_close(got.double(), want, atol=atol + 1e-4 * c**0.5, rtol=rtol)
    rows = torch.cat([op.rowinv_linear(x[i : i + 1], w, b) for i in range(64)])
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 45, 47, 48, 64):
        assert torch.equal(op.rowinv_linear(x[:m], w, b), rows[:m]), m
    # leading dims fold into rows; the thread count splits columns, never a sum
    assert torch.equal(op.rowinv_linear(x.view(8, 8, c), w, b), rows.view(8, 8, n))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(op.rowinv_linear(x, w, b), rows)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [7, 40, 1000])
def test_linear_gelu_epilogue_is_gelu_of_the_rounded_output(dtype, n):
    """activation="gelu_tanh" applies GELU's tanh form to the layer's rounded output (the MLP's
    c_fc) and rounds again: within float32 precision of the exact (float64) GELU of that output,
    so in bfloat16 nearly always its correctly rounded value and never a bfloat16 ulp off,
    including the very negative inputs where torch's 1 + tanh form cancels; row-invariant like
    the layer; any other activation name is refused by name."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(64, 96, generator=g).to(dtype) * 2
    w = torch.randn(n, 96, generator=g).to(dtype) * 0.3
    b = torch.randn(n, generator=g).to(dtype)
    got = op.rowinv_linear(x, w, b, "gelu_tanh")
    pre = op.rowinv_linear(x, w, b).double()
    assert (pre < -4).any() and (pre > 4).any()
    u = (2 / torch.pi) ** 0.5 * (pre + 0.044715 * pre**3)
    exact = pre * torch.sigmoid(2 * u)  # = 0.5 pre (1 + tanh u), without its cancellation
    assert torch.allclose(exact, 0.5 * pre * (1 + torch.tanh(u)), rtol=0, atol=1e-12)
    # float32: the exponent's argument is rounded to float32 (its relative error times up to
    # ~88 in the result); values under 1e-20 (inputs below ~ -10) count as zero
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), exact, atol=1e-20, rtol=1e-5)
    else:
        torch.testing.assert_close(got.double(), exact, atol=1e-20, rtol=2.0**-8)
        seen = exact.abs() > 1e-20
        assert (got == exact.to(dtype))[seen].double().mean() > 0.999
    rows = torch.cat([op.rowinv_linear(x[i : i + 1], w, b, "gelu_tanh") for i in range(64)])
    for m in (1, 2, 3, 7, 13, 64):
        assert torch.equal(op.rowinv_linear(x[:m], w, b, "gelu_tanh"), rows[:m]), m
    with pytest.raises(ValueError, match="activation must be None or 'gelu_tanh', got 'relu'"):
        op.rowinv_linear(x, w, b, "relu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_follows_weights_changed_in_place(dtype):
    """The AVX2 tile keeps a packed copy of each weight it has seen; an in-place update (through
    the tensor or a view of it, in or out of inference mode), a swapped ``.data``, a transposed
    view or an inference tensor must each give the result of a fresh copy of the weight, never
    the stale packing (on other tiles this holds trivially)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 48, generator=g).to(dtype)

    def fresh(w):
        return op.rowinv_linear(x, w.detach().clone(), None)

    w = torch.randn(40, 48, generator=g).to(dtype)
    first = op.rowinv_linear(x, w, None)
    assert torch.equal(op.rowinv_linear(x, w, None), first)  # the packed copy again
    with torch.no_grad():
        w.mul_(2)
    assert torch.equal(op.rowinv_linear(x, w, None), fresh(w))
    assert not torch.equal(op.rowinv_linear(x, w, None), first)
    w[5].zero_()  # through a view: the version counter is shared
    assert torch.equal(op.rowinv_linear(x, w, None), fresh(w))
    with torch.inference_mode():
        w.add_(1)
        assert torch.equal(op.rowinv_linear(x, w, None), fresh(w))
    p = torch.nn.Parameter(torch.randn(40, 48, generator=g).to(dtype))
    with torch.no_grad():
        op.rowinv_linear(x, p, None)
        p.data = torch.randn(40, 48, generator=g).to(dtype)
        assert torch.equal(op.rowinv_linear(x, p, None), fresh(p))
        p.copy_(torch.randn(40, 48, generator=g).to(dtype))
        assert torch.equal(op.rowinv_linear(x, p, None), fresh(p))
    base = torch.randn(48, 40, generator=g).to(dtype)
    assert torch.equal(op.rowinv_linear(x, base.t(), None), fresh(base.t()))
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the once-a-process warning for inference tensors
        wi = torch.randn(40, 48, generator=g).to(dtype)
        op.rowinv_linear(x, wi, None)
        wi.sub_(3)
        assert torch.equal(op.rowinv_linear(x, wi, None), fresh(wi))


@pytest.mark.parametrize("n", [1, 17, 48, 257])
@pytest.mark.parametrize("m", [1, 16, 17, 33, 45])
def test_bfloat16_linear_rounds_exact_sums_to_nearest_even(n, m):
    """Small integers make every float32 sum exact, so the one rounding to bfloat16 must give
    exactly the exact sum's nearest-even bfloat16 (sums above 256 have ties to break), for every
    row and column of whichever tile runs: a transposed, misplaced or twice-rounded element
    fails, as does a lost bias. A NaN input row stays NaN, and only that row."""
    g = torch.Generator().manual_seed(n * 100 + m)
    c = 96
    w = torch.randint(-6, 7, (n, c), generator=g).bfloat16()
    x = torch.randint(-6, 7, (m, c), generator=g).bfloat16()
    b = torch.randint(-40, 41, (n,), generator=g).bfloat16()
    want = F.linear(x.double(), w.double(), b.double()).bfloat16()
    got = op.rowinv_linear(x, w, b)
    assert (want.float().abs() > 256).any() or n * m < 50  # ties to break, where there are many
    assert torch.equal(got, want)
    x[m // 2, 3] = float("nan")
    got = op.rowinv_linear(x, w, b)
    assert got[m // 2].isnan().all()
    others = torch.arange(m) != m // 2
    assert torch.equal(got[others], want[others])


@pytest.mark.parametrize("tile", ["generic", "avx2", "dpbf16", "amx"])
def test_every_kernel_tile_of_this_cpu_is_row_invariant(tile):
    """The linear layer and attention pick their code once per process from the CPU (AVX2+FMA
    where AVX-512F is missing; for bfloat16 AMX's tiles, else AVX512_BF16's dot products, where
    the CPU has them); SPECDEC_LINEAR_TILE forces one, so each this CPU can run passes
    the kernel tests and the one-op pass's and greedy chain's bitwise tests in a process of its
    own, whichever the CPU would pick."""
    import os
    import subprocess
    import sys

    from specdec_kernels.tuning._timing import cpu_flag_set

    from helpers import CAPABILITY_FLAGS

    if tile == "avx2" and not CAPABILITY_FLAGS["avx2"] <= cpu_flag_set():
        pytest.skip("this CPU has no AVX2 with FMA (or no /proc/cpuinfo to say so)")
    if tile == "dpbf16" and "avx512_bf16" not in cpu_flag_set():
        pytest.skip("this CPU has no AVX512_BF16 (or no /proc/cpuinfo to say so)")
    if tile == "amx" and not {"amx_bf16", "amx_tile"} <= cpu_flag_set():
        pytest.skip("this CPU has no AMX-BF16 (or no /proc/cpuinfo to say so)")
    env = dict(os.environ, SPECDEC_LINEAR_TILE=tile)
    names = (
        "test_linear_matches_torch_and_is_row_invariant",
        "test_bfloat16_linear_rounds_exact_sums_to_nearest_even",
        "test_linear_gelu_epilogue_is_gelu_of_the_rounded_output",
        "test_attention_matches_sdpa_and_ignores_other_queries",
        "test_one_op_pass_is_the_python_pass_bitwise",
        "test_greedy_chain_is_the_loop_of_passes_bitwise",
        "test_draft_chain_is_the_network_in_float32",
        "test_sample_chain_draws_as_the_python_drafter_draws",
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += [f"{__file__}::{name}" for name in names]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-1000:]


SIXTEEN_LANES = r"""
import sys, torch, specdec_kernels
torch.manual_seed(5)
op, out = torch.ops.specdec, {}
specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e38, -3e38, 1e-40, -0.0, 0.0])
for dt in (torch.float32, torch.bfloat16):
    for n in (8, 37, 200):  # partial groups of sixteen and of eight columns
        eye, b = torch.eye(n).to(dt), torch.randn(n).to(dt)
        b[:8] = specials.to(dt)  # each column's sum is its x plus its bias: specials pass
        for m in (1, 3, 7):
            x = (torch.randn(m, n) * 4).to(dt)
            x[:, -1] = -0.0
            for key, args in (("gelu", (b, "gelu_tanh")), ("bias", (b,)),
                              ("nobias", (None, "gelu_tanh")), ("plain", (None,))):
                out[str(dt), n, m, key] = op.rowinv_linear(x, eye, *args)
    for d in (16, 48, 64, 80):
        q, k, v = (torch.randn(2, 3, s, d).to(dt) * 3 for s in (5, 41, 41))
        q.view(-1)[:3] = specials[:3].to(dt)
        mask = torch.rand(2, 3, 5, 41) < 0.6
        mask[0, 0, 0] = False  # a query that attends to no key
        out[str(dt), d, "att"] = op.rowinv_attention(q, k, v, mask)
torch.save(out, sys.argv[1])
"""


def test_sixteen_lane_epilogue_and_attention_give_the_eight_lane_bits(tmp_path):
    """On a CPU with AVX-512F the linear layer's epilogue (bias, GELU, the rounding to bfloat16;
    the residual's is the one-op pass's, tested bitwise against the Python pass's separate add)
    and attention run sixteen lanes at a time; every element must have the bits of the AVX2 code
    (SPECDEC_LINEAR_TILE=avx2, which an AVX2-only CPU runs), NaN, infinities, -0 and subnormals
    included. The linear layer's weight is the identity, whose sums are exact on every tile, so
    the two processes differ only in the epilogue's code."""
    import subprocess
    import sys

    from specdec_kernels.tuning._timing import cpu_flag_set

    from helpers import CAPABILITY_FLAGS

    if not (CAPABILITY_FLAGS["avx2"] | {"avx512f"}) <= cpu_flag_set():
        pytest.skip("this CPU has no AVX-512F (or no /proc/cpuinfo to say so): one code path")
    files = {}
    for tile in ("", "avx2"):
        files[tile] = tmp_path / f"out_{tile or 'best'}.pt"
        env = dict(os.environ, SPECDEC_LINEAR_TILE=tile)
        run = subprocess.run(
            [sys.executable, "-c", SIXTEEN_LANES, str(files[tile])],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
    wide, narrow = (torch.load(files[t]) for t in ("", "avx2"))
    assert wide.keys() == narrow.keys() and len(wide) == 2 * (3 * 3 * 4 + 4)

    def bits(t):
        return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)

    differ = [key for key in wide if not torch.equal(bits(wide[key]), bits(narrow[key]))]
    assert not differ, differ
    # the comparison sees what it should: NaN and infinities came out, GELU changed values
    g = wide["torch.float32", 200, 7, "gelu"]
    assert g.isnan().any() and g.isinf().any()
    assert not torch.equal(g, wide["torch.float32", 200, 7, "plain"])


def test_an_unknown_linear_tile_is_refused_by_name():
    import os
    import subprocess
    import sys

    code = (
        "import torch, specdec_kernels\n"
        "torch.ops.specdec.rowinv_linear(torch.ones(1, 4), torch.ones(2, 4), None)"
    )
    env = dict(os.environ, SPECDEC_LINEAR_TILE="avx9")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode != 0
    assert "SPECDEC_LINEAR_TILE must be 'generic', 'avx2', 'dpbf16' or 'amx'" in run.stderr, (
        run.stderr[-2000:]
    )
    assert "'avx9'" in run.stderr


@pytest.mark.parametrize(
    "dtype, atol, rtol", [(torch.float32, 1e-5, 1e-5), (torch.bfloat16, 2e-2, 2e-2)]
)
def test_attention_matches_sdpa_and_ignores_other_queries(dtype, atol, rtol):
    B, H, T, D, L = 3, 2, 5, 32, 37
    q, k, v = (torch.randn(B, H, n, D).to(dtype) for n in (T, L, L))
    pos = torch.tensor([30, 20, 32])[:, None] + torch.arange(T)  # [B, T]
    mask = (torch.arange(L)[None, None] <= pos[..., None])[:, None]  # [B, 1, T, L]
    got = op.rowinv_attention(q, k, v, mask)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol)
    for t in range(T):  # one query alone over a shorter key buffer: the same bits
        end = int(pos[:, t].max()) + 1
        one = op.rowinv_attention(
            q[:, :, t : t + 1], k[:, :, :end], v[:, :, :end], mask[:, :, t : t + 1, :end]
        )
        assert torch.equal(one, got[:, :, t : t + 1])
    none = torch.zeros_like(mask)
    assert torch.equal(op.rowinv_attention(q, k, v, none), torch.zeros_like(q))


def test_bad_arguments_name_what_is_wrong():
    w = torch.randn(4, 8)
    with pytest.raises(ValueError, match="x must be"):
        op.rowinv_linear(torch.randn(2, 7), w, None)
    with pytest.raises(TypeError, match="same dtype"):
        op.rowinv_linear(torch.randn(2, 8).bfloat16(), w, None)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        op.rowinv_linear(torch.randn(2, 8).double(), w.double(), None)
    with pytest.raises(ValueError, match="bias must be"):
        op.rowinv_linear(torch.randn(2, 8), w, torch.randn(3))
    q = torch.randn(1, 1, 2, 16)
    with pytest.raises(ValueError, match="mask must be bool"):
        op.rowinv_attention(q, q, q, torch.ones(1, 1, 2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="multiple of 16"):
        op.rowinv_attention(
            q[..., :8], q[..., :8], q[..., :8], torch.ones(1, 1, 2, 2, dtype=torch.bool)
        )


def _model(dtype):
    cfg = CausalLMConfig(vocab_size=61, n_positions=64, n_embd=64, n_layer=2, n_head=2)
    model = CausalLM(cfg).to(dtype).eval()
    model.row_invariant = True
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 3])
def test_verify_pass_equals_decode_passes_bitwise(dtype, batch):
    """The K+1-token pass of a verify step and K+1 one-token decode passes: the same logits, to
    the bit (plain BLAS differs by ulps here, which is how greedy output diverges)."""
    model = _model(dtype)
    ids = torch.randint(0, 61, (batch, 30))
    with torch.inference_mode():
        a, b = model.new_cache(batch, 64), model.new_cache(batch, 64)
        for cache in (a, b):
            model(ids[:, :24], cache, validate=False)
            cache.advance(24)
        full = model(ids[:, 24:], a, kv_len=30, validate=False)
        one = []
        for t in range(6):
            one.append(model(ids[:, 24 + t : 25 + t], b, kv_len=25 + t, validate=False))
            b.advance(1)
    assert torch.equal(full, torch.cat(one, 1))
    plain = _model(dtype)
    plain.load_state_dict(model.state_dict())
    plain.row_invariant = False
    with torch.inference_mode():  # and close to the ordinary kernels
        ref = plain(ids)
        inv = model(ids)
    tol = 1e-4 if dtype == torch.float32 else 0.1
    torch.testing.assert_close(inv.float(), ref.float(), atol=tol, rtol=tol)


def _python_pass(model, *args, **kwargs):
    """``model(*args, **kwargs)`` through the Python ops, not ``specdec::causal_lm_pass``."""
    model._one_op_pass = lambda cache: False
    try:
        return model(*args, **kwargs)
    finally:
        del model._one_op_pass


def _filled_pair(model, lengths, capacity=64):
    """Two caches of ``model`` with the same random prefix, committed to ``lengths``."""
    caches = (model.new_cache(len(lengths), capacity), model.new_cache(len(lengths), capacity))
    prefix = torch.randint(0, model.vocab_size, (len(lengths), max(lengths) + 1))
    for cache in caches:
        _python_pass(model, prefix, cache, validate=False)
        cache.advance(torch.tensor(lengths))
    return caches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_one_op_pass_is_the_python_pass_bitwise(dtype, threads):
    """``specdec::causal_lm_pass`` (the whole cached pass in one native call) against the same
    pass through the Python ops: the same logits and the same cache, to the bit, for ragged rows,
    one or several tokens, every ``logits_index`` form (negative indices too) and ``kv_len``."""
    model = _model(dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for lengths in ([7], [0, 19, 4]):
                B = len(lengths)
                for T in (1, 2, 5):
                    for index in (
                        None,
                        torch.full((B,), T - 1),
                        torch.randint(-T, T, (B,)),
                        torch.randint(0, T, (B, 3)),
                    ):
                        a, b = _filled_pair(model, lengths)
                        ids = torch.randint(0, 61, (B, T))
                        kv_len = max(lengths) + T + 3
                        assert model._one_op_pass(a)
                        got = model(ids, a, logits_index=index, kv_len=kv_len, validate=False)
                        want = _python_pass(model, ids, b, logits_index=index, kv_len=kv_len)
                        assert got.shape == want.shape and torch.equal(got, want), (lengths, T)
                        assert torch.equal(a.kv, b.kv)
                        assert torch.equal(a.lengths, b.lengths)  # written, not committed
    finally:
        torch.set_num_threads(before)


def test_one_op_pass_runs_only_where_it_is_the_same_pass():
    model = _model(torch.float32)
    cache = model.new_cache(1, 16)
    assert not model._one_op_pass(cache)  # gradients to record: the Python ops
    with torch.no_grad():
        assert model._one_op_pass(cache)
    model.requires_grad_(False)
    model.transformer.h[1].mlp.c_fc.weight.requires_grad_(True)  # one weight still trains
    assert not model._one_op_pass(cache)
    model.transformer.h[1].mlp.c_fc.weight.requires_grad_(False)
    assert model._one_op_pass(cache)  # nothing to differentiate, even with grad mode on
    assert not model._one_op_pass(None)
    model.row_invariant = False
    with torch.no_grad():
        assert not model._one_op_pass(cache)
    gelu = CausalLM(
        CausalLMConfig(
            vocab_size=11,
            n_positions=16,
            n_embd=32,
            n_layer=1,
            n_head=2,
            activation_function="gelu",
        )
    )
    gelu.row_invariant = True
    with torch.no_grad():
        assert not gelu._one_op_pass(gelu.new_cache(1, 16))  # the op computes tanh GELU only


def test_one_op_pass_follows_every_change_of_the_weights():
    """The one-op pass reads its weights through slots found once: a reassigned parameter, a
    replaced layer, a dtype conversion and ``load_state_dict(assign=True)`` all reach it (each
    checked against the Python pass of the changed model, which reads every weight afresh)."""
    model = _model(torch.float32)
    ids = torch.randint(0, 61, (2, 3))

    def same_as_python_pass():
        a, b = _filled_pair(model, [4, 9])
        got = model(ids, a, kv_len=16, validate=False)
        assert torch.equal(got, _python_pass(model, ids, b, kv_len=16))
        return got

    with torch.inference_mode():
        before = same_as_python_pass()
        mlp = model.transformer.h[1].mlp
        mlp.c_fc.weight = torch.nn.Parameter(mlp.c_fc.weight * 1.5)  # reassigned parameter
        after = same_as_python_pass()
        assert not torch.equal(after, before)
        fresh = _model(torch.float32)  # replaced layers, from another model's weights
        model.transformer.h[0] = fresh.transformer.h[0]
        model.lm_head = fresh.lm_head
        replaced = same_as_python_pass()
        assert not torch.equal(replaced, after)
        model.load_state_dict(_model(torch.float32).state_dict(), assign=True)
        assert not torch.equal(same_as_python_pass(), replaced)
        model.bfloat16()
        assert same_as_python_pass().dtype == torch.bfloat16


def test_one_op_pass_refuses_bad_calls_and_leaves_the_cache_as_it_was():
    model = _model(torch.float32)
    cache = model.new_cache(2, 16)
    cache.advance(torch.tensor([3, 14]))
    kv, lengths = cache.kv.clone(), cache.lengths.clone()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with torch.inference_mode():
        with pytest.raises(ValueError, match=r"row 1: 3 tokens at length 14 .* 16 slots"):
            model(ids, cache, validate=False)
        with pytest.raises(IndexError, match=r"logits_index\[0\] = 3 is out of range"):
            model(ids[:, :1], cache, logits_index=torch.tensor([3, 0]), validate=False)
        with pytest.raises(ValueError, match=r"kv_len = 4 must be in .* = \[15, 16\]"):
            model(ids[:, :1], cache, kv_len=4, validate=False)
    assert torch.equal(cache.kv, kv) and torch.equal(cache.lengths, lengths)
    weights = [w.detach() for w in model._pass_weights()]
    with pytest.raises(ValueError, match="weights must be wte, wpe"):
        op.causal_lm_pass(ids, cache.kv, cache.lengths, 16, None, weights[:-1], 2, 1e-5)
    with pytest.raises(ValueError, match="kv_cache must be"):
        op.causal_lm_pass(ids, cache.kv, cache.lengths, 16, None, weights, 4, 1e-5)
    with pytest.raises(TypeError, match="one dtype"):
        op.causal_lm_pass(ids, cache.kv.bfloat16(), cache.lengths, 16, None, weights, 2, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_chain_is_the_loop_of_passes_bitwise(dtype):
    """``specdec::causal_lm_greedy_chain`` (a step's greedy drafts in one native call) against
    the loop it replaces: a ragged pass over the tokens the cache lacks, ``argmax``, then one
    pass per further draft fed the argmax before it; the same drafts and the same cache, to the
    bit, for one and several rows, one or two catch-up tokens and chains of 1 to 5. Ties are
    forced (a model whose logits are all equal) to check that the first index wins, as in
    ``torch.argmax``."""
    model = _model(dtype)
    with torch.inference_mode():
        for lengths, behind in (([7], [1]), ([0, 19, 4], [2, 1, 2])):
            B, n = len(lengths), torch.tensor(behind)
            for k in (1, 2, 5):
                a, b = _filled_pair(model, lengths)
                ids = torch.randint(0, 61, (B, 2))
                kv_len = max(lengths) + 2
                got = model.greedy_chain(ids, a, n, k, kv_len)
                logits = model(ids, b, logits_index=n - 1, kv_len=kv_len, validate=False)
                want = [logits.argmax(-1)]
                b.advance(n)
                for i in range(1, k):
                    one = torch.zeros(B, dtype=torch.int64)
                    x = want[-1][:, None]
                    want.append(model(x, b, logits_index=one, kv_len=kv_len + i).argmax(-1))
                    b.advance(1)
                assert torch.equal(got, torch.stack(want, 1)), (lengths, k)
                assert torch.equal(a.kv, b.kv)
        flat = _model(dtype)
        flat.lm_head.weight = torch.nn.Parameter(torch.zeros_like(flat.lm_head.weight))
        cache = flat.new_cache(2, 16)
        got = flat.greedy_chain(torch.tensor([[3, 4], [5, 6]]), cache, torch.tensor([2, 1]), 3, 2)
        assert torch.equal(got, torch.zeros(2, 3, dtype=torch.int64))  # all tied: token 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draft_chain_is_the_network_in_float32(dtype):
    """``specdec::causal_lm_draft_chain`` (``greedy_chain(exact=False)``, a drafter's chain: the
    same network on float32 activations, its own layer norm and GELU) against a float64 copy of
    the model run pass by pass, fed the same tokens: every draft is the reference's argmax
    wherever the reference's two best logits are more than ``tie`` apart (float32 activations
    may only choose otherwise near a tie), and the keys and values it writes are the
    reference's to the cache dtype's precision. Rows and chain lengths as in the bitwise test;
    a model of tiny logits scaled up so that most steps are decided (>= 80% checked)."""
    torch.manual_seed(0)
    model = _model(dtype)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)  # wider logit gaps: most argmaxes decided
    ref = CausalLM(model.config).double().eval()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    tie, kv_tol = (1e-3, 1e-4) if dtype == torch.float32 else (0.5, 0.06)
    decided = total = 0
    with torch.inference_mode():
        for lengths, behind in (([7], [1]), ([0, 19, 4], [2, 1, 2])):
            B, n = len(lengths), torch.tensor(behind)
            for k in (1, 2, 5):
                prefix = torch.randint(0, 61, (B, max(lengths) + 1))
                a, b = model.new_cache(B, 64), ref.new_cache(B, 64)
                for m, cache in ((model, a), (ref, b)):
                    _python_pass(m, prefix, cache, validate=False)
                    cache.advance(torch.tensor(lengths))
                untouched = a.kv.clone()
                ids = torch.randint(0, 61, (B, 2))
                kv_len = max(lengths) + 2
                got = model.greedy_chain(ids, a, n, k, kv_len, exact=False)
                x, at, one = ids, n - 1, torch.zeros(B, dtype=torch.int64)
                for i in range(k):
                    logits = ref(x, b, logits_index=at, kv_len=kv_len + i, validate=False)
                    b.advance(n if i == 0 else 1)
                    top = logits.topk(2, -1).values
                    sure = top[:, 0] - top[:, 1] > tie
                    want = logits.argmax(-1)
                    assert torch.equal(got[sure, i], want[sure]), (lengths, k, i)
                    decided, total = decided + int(sure.sum()), total + B
                    x, at = got[:, i : i + 1], one  # the chain feeds its own drafts
                for r in range(B):  # the slots the chain wrote, and none past them
                    end = lengths[r] + behind[r] + k - 1
                    new = slice(lengths[r], end)
                    want_kv = b.kv[:, :, r, :, new].to(dtype)
                    torch.testing.assert_close(
                        a.kv[:, :, r, :, new], want_kv, atol=kv_tol, rtol=kv_tol
                    )
                    after = slice(max(end, lengths[r] + 2), None)
                    assert torch.equal(a.kv[:, :, r, :, after], untouched[:, :, r, :, after])
    assert decided >= 0.8 * total, (decided, total)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draft_pass_is_the_network_in_float32(dtype):
    """``specdec::causal_lm_draft_pass`` (``CausalLM.draft_logits``, a drafter's sampled
    drafts) against a float64 copy of the model: ragged rows, one or two tokens, every
    ``logits_index`` (negative too); float32 logits within the activations' precision of the
    reference's, the same cache slots written."""
    torch.manual_seed(1)
    model = _model(dtype)
    ref = CausalLM(model.config).double().eval()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    tol = 2e-4 if dtype == torch.float32 else 0.08
    with torch.inference_mode():
        for lengths in ([7], [0, 19, 4]):
            B = len(lengths)
            prefix = torch.randint(0, 61, (B, max(lengths) + 1))
            a, b = model.new_cache(B, 64), ref.new_cache(B, 64)
            for m, cache in ((model, a), (ref, b)):
                _python_pass(m, prefix, cache, validate=False)
                cache.advance(torch.tensor(lengths))
            for T in (1, 2):
                ids = torch.randint(0, 61, (B, T))
                for index in (torch.zeros(B, dtype=torch.int64), torch.full((B,), -1)):
                    kv_len = max(lengths) + T
                    got = model.draft_logits(ids, a, index, kv_len)
                    want = ref(ids, b, logits_index=index, kv_len=kv_len, validate=False)
                    assert got.dtype == torch.float32 and got.shape == (B, 61)
                    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
                    for r in range(B):
                        new = slice(lengths[r], lengths[r] + T)
                        torch.testing.assert_close(
                            a.kv[:, :, r, :, new],
                            b.kv[:, :, r, :, new].to(dtype),
                            atol=tol,
                            rtol=tol,
                        )
        bad = torch.tensor([2])
        with pytest.raises(IndexError, match=r"logits_index\[0\] = 2 is out of range for 2"):
            model.draft_logits(torch.tensor([[1, 2]]), model.new_cache(1, 8), bad, 2)


SAMPLE_PARAMS = [
    (1.0, None, None),
    (0.7, 20, 0.9),
    (1e-6, None, None),
    (1e4, None, None),
    (1.0, 1, None),
    (1.0, None, 1e-9),
    (1.3, 5, 0.5),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature, top_k, top_p", SAMPLE_PARAMS)
def test_sample_chain_draws_as_the_python_drafter_draws(dtype, temperature, top_k, top_p):
    """``specdec::causal_lm_draft_sample_chain`` (``CausalLM.sample_chain``) against the Python
    drafter's loop of ``draft_logits`` passes, each fed the chain's previous draft: each
    position's ``q`` is ``Sampling.probs`` of those logits (the reference's filter) to float32
    rounding, each draft is ``Sampling.draw``'s with the drafter's exponentials of (seed,
    position), tokens outside the filter have ``q = 0``, and the cache is the loop's, bitwise."""
    from specdec_kernels.decoding import Sampling
    from specdec_kernels.reference import rng

    torch.manual_seed(5)
    model = _model(dtype)
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    with torch.inference_mode():
        a, b = _filled_pair(model, [5, 9, 0])
        ids, n = torch.randint(0, 61, (3, 2)), torch.tensor([2, 1, 2])
        seeds = torch.tensor([11, -3, 2**40])
        kv_len, k = 12, 4
        drafts, q = model.sample_chain(ids, a, n, k, kv_len, seeds, temperature, top_k, top_p)
        assert drafts.shape == (3, k) and q.shape == (3, k, 61) and q.dtype == torch.float32
        for i in range(k):
            if i == 0:
                logits = model.draft_logits(ids, b, n - 1, kv_len)
                b.advance(n)
            else:
                logits = model.draft_logits(
                    drafts[:, i - 1 : i], b, torch.zeros(3).long(), kv_len + i
                )
                b.advance(1)
            want = sampling.probs(logits)
            torch.testing.assert_close(q[:, i], want, atol=1e-6, rtol=1e-4)
            assert torch.equal(q[:, i] > 0, want > 0), i
            race = rng.draft_exponentials(seeds, i, (61,))
            assert torch.equal(drafts[:, i], sampling.draw(logits, seeds, i, race)[0]), i
        a.advance(n + k - 1)
        assert torch.equal(a.kv, b.kv) and torch.equal(a.lengths, b.lengths)


def test_sample_chain_runs_the_bitwise_passes_where_its_tiles_do_not_fit():
    """A hidden size the float32 kernels do not take (an MLP of 40 units): the sampled chain
    then draws from the bitwise passes' logits, as the Python drafter's loop over
    ``CausalLM.forward`` does."""
    from specdec_kernels.decoding import Sampling
    from specdec_kernels.reference import rng

    cfg = CausalLMConfig(vocab_size=61, n_positions=64, n_embd=64, n_layer=1, n_head=2, n_inner=40)
    model = CausalLM(cfg).eval()
    model.row_invariant = True
    sampling = Sampling(temperature=0.9, top_k=30)
    with torch.inference_mode():
        a, b = _filled_pair(model, [5, 9])
        ids, n, seeds = torch.randint(0, 61, (2, 2)), torch.tensor([2, 1]), torch.tensor([4, 5])
        drafts, q = model.sample_chain(ids, a, n, 3, 11, seeds, 0.9, 30, None)
        for i in range(3):
            fed = ids if i == 0 else drafts[:, i - 1 : i]
            index = n - 1 if i == 0 else torch.zeros(2).long()
            logits = model(fed, b, logits_index=index, kv_len=11 + i).float()
            b.advance(n if i == 0 else 1)
            torch.testing.assert_close(q[:, i], sampling.probs(logits), atol=1e-6, rtol=1e-4)
            race = rng.draft_exponentials(seeds, i, (61,))
            assert torch.equal(drafts[:, i], sampling.draw(logits, seeds, i, race)[0])
        a.advance(n + 2)
        assert torch.equal(a.kv, b.kv)


def test_sample_chain_drafts_follow_their_q():
    """4000 rows with the same context and their own seeds: the first drafts' frequencies
    against the q the op reports (chi-square, p > 1e-3; with 4000 draws this detects a total
    variation distance of ~0.06 on the ~20 tokens kept with power near 1), and none outside
    top-k."""
    from scipy.stats import chisquare

    torch.manual_seed(9)
    model = _model(torch.float32)
    rows = 4000
    with torch.inference_mode():
        cache = model.new_cache(rows, 16)
        prefix = torch.randint(0, 61, (1, 6)).expand(rows, 6).contiguous()
        model(prefix, cache, logits_index=torch.full((rows,), 5))
        cache.advance(6)
        ids, n = prefix[:, -1:], torch.ones(rows, dtype=torch.long)
        seeds = torch.arange(rows) * 7919 + 1
        drafts, q = model.sample_chain(ids, cache, n, 1, 7, seeds, 1.5, 20, None)
    assert torch.equal(q[:, 0], q[:1, 0].expand(rows, 61))  # one context: one q
    p = q[0, 0].double()
    counts = torch.bincount(drafts[:, 0], minlength=61).double()
    assert counts[p == 0].sum() == 0 and int((p > 0).sum()) == 20
    keep = p * rows >= 5
    observed = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    expected = torch.cat([p[keep], p[~keep].sum(0, keepdim=True)])
    expected = expected / expected.sum() * rows  # q sums to 1 within float32 rounding
    if expected[-1] == 0:  # every kept token is frequent enough
        observed, expected = observed[:-1], expected[:-1]
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3


WIDE_V = 129_280  # a large vocabulary (DeepSeek-V3's): its tail outweighs float32's last bit


def _constant_logits_model(logits: torch.Tensor) -> CausalLM:
    """A row-invariant ``CausalLM`` whose logits are ``logits`` ``[V]`` at every position:
    ``ln_f`` scales by 0 and adds the unit vector ``e_0``, and ``lm_head``'s column 0 is
    ``logits`` (each logit one exact product; the tied embeddings do not reach the head)."""
    cfg = CausalLMConfig(vocab_size=logits.numel(), n_positions=16, n_embd=32, n_layer=1, n_head=2)
    model = CausalLM(cfg).eval()
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, 0] = logits
    model.row_invariant = True
    return model


@pytest.mark.parametrize("top_p", [None, 0.995])
def test_sample_chain_normalises_q_over_a_wide_peaked_vocabulary(top_p):
    """A peaked row of 129,280 logits (token 0 at 0, token 1 at -100, the rest at -16.65): each
    of the 129,278 tail terms ``exp(-16.65) ~ 5.9e-8`` is below half an ulp of a float32 running
    sum at 1, so a float32 sum drops them all. The chain then reported ``q(0) = 1`` (0.992462
    exact), a ``q`` summing to 1.0076 while its drafts follow the exact ``q`` (the race
    ``argmax(q / E)`` does not see a scale), and rejection sampling with the scaled ``q`` is not
    lossless: the first token's law of a step against a target with ``p(0) = 0.99``, ``p(1) =
    0.01`` gave ``P(0) = 0.9825`` (issue 56, 3.1; 0.9828 over 10,000 loop rows). With top-p 0.995
    the float32 total (1, not 1.0076) kept token 0 alone. ``q`` must be the float64 softmax of
    the kept tokens to float32 rounding (the reference's filter keeps every tail token, a tie).

    No sampled loop here: that bias (0.0072 of P(0)) needs ~7,400 rows for a 4-sigma test with
    power 0.99, ~0.5 MB of ``q`` and a 129k-token race each; the law below is that test's
    expectation, computed exactly."""
    from specdec_kernels.decoding import Sampling

    v = WIDE_V
    logits = torch.full((v,), -16.65)
    logits[0], logits[1] = 0.0, -100.0
    draft = _constant_logits_model(logits)
    with torch.inference_mode():
        cache = draft.new_cache(1, 8)
        one = torch.ones(1, dtype=torch.long)
        _, q = draft.sample_chain(torch.tensor([[3]]), cache, one, 1, 1, one * 5, 1.0, None, top_p)
    q = q[0, 0].double()
    kept = torch.ones(v, dtype=torch.bool) if top_p is None else logits > -100
    exact = torch.softmax(logits.double().masked_fill(~kept, -math.inf), -1)  # the drafts' law
    assert abs(q.sum().item() - 1.0) < 1e-6, q.sum().item()
    assert abs(q[0].item() / exact[0].item() - 1.0) < 1e-6, q[0].item()
    # every entry to float32 rounding (q(1) = exp(-100) / z is subnormal: its own ulp)
    torch.testing.assert_close(q, exact, rtol=1e-6, atol=1e-44)
    want = Sampling(temperature=1.0, top_p=top_p).probs(logits[None]).double()[0]
    torch.testing.assert_close(q, want, rtol=1e-5, atol=1e-44)  # the reference's filter
    # the first token's law of one step: drafts from `exact`, accept tests with the q reported
    target = torch.full((v,), 0.0, dtype=torch.float64)
    target[0], target[1] = 0.99, 0.01
    accept = torch.where(q > 0, exact * torch.clamp(target / q, max=1.0), 0.0)
    residual = (target - q).clamp(min=0.0)
    law = accept + (1.0 - accept.sum()) * residual / residual.sum()
    assert abs(law[0].item() - 0.99) < 1e-6, law[0].item()


def test_sample_chain_refuses_bad_calls_and_leaves_the_cache_as_it_was():
    model = _model(torch.float32)
    cache = model.new_cache(2, 16)
    cache.advance(torch.tensor([3, 12]))
    kv, lengths = cache.kv.clone(), cache.lengths.clone()
    op_ = torch.ops.specdec.causal_lm_draft_sample_chain
    weights = [w.detach() for w in model._pass_weights()]
    ids, n, seeds = torch.tensor([[1, 2], [4, 5]]), torch.tensor([2, 1]), torch.tensor([1, 2])
    base = (ids, cache.kv, cache.lengths, n, 14, 2, weights, 2, 1e-5)
    cases = [
        ((torch.tensor([1]), 1.0, 0, 1.0), r"seeds must be int64 \[B\] on the CPU with B = 2"),
        ((seeds, 0.0, 0, 1.0), "temperature must be a finite float > 0, got 0"),
        ((seeds, float("nan"), 0, 1.0), "temperature must be a finite float > 0, got nan"),
        ((seeds, 1.0, -1, 1.0), r"top_k must be >= 0 \(0: off\), got -1"),
        ((seeds, 1.0, 0, 0.0), r"top_p must be in \(0, 1\], got 0"),
    ]
    for extra, message in cases:
        with pytest.raises(ValueError, match=message):
            op_(*base, *extra)
    with pytest.raises(ValueError, match="kv_len = 14 . 3 later passes exceeds max_seq_len = 16"):
        op_(ids, cache.kv, cache.lengths, n, 14, 4, weights, 2, 1e-5, seeds, 1.0, 0, 1.0)
    with pytest.raises(IndexError, match="outside the vocabulary"):
        op_(torch.tensor([[1, 2], [4, 99]]), *base[1:], seeds, 1.0, 0, 1.0)
    assert torch.equal(cache.kv, kv) and torch.equal(cache.lengths, lengths)


def test_draft_chain_runs_the_bitwise_chain_where_its_tiles_do_not_fit():
    """A hidden size the float32 chain's tiles do not take (an MLP of 40 units, not a multiple
    of 16): the draft chain is then the bitwise chain, drafts and cache alike."""
    cfg = CausalLMConfig(vocab_size=61, n_positions=64, n_embd=64, n_layer=1, n_head=2, n_inner=40)
    model = CausalLM(cfg).eval()
    model.row_invariant = True
    with torch.inference_mode():
        a, b = _filled_pair(model, [5, 9])
        ids, n = torch.randint(0, 61, (2, 2)), torch.tensor([2, 1])
        got = model.greedy_chain(ids, a, n, 3, 11, exact=False)
        assert torch.equal(got, model.greedy_chain(ids, b, n, 3, 11))
        assert torch.equal(a.kv, b.kv)


@pytest.mark.parametrize("name", ["causal_lm_greedy_chain", "causal_lm_draft_chain"])
def test_greedy_chain_refuses_bad_calls_and_leaves_the_cache_as_it_was(name):
    model = _model(torch.float32)
    cache = model.new_cache(2, 16)
    cache.advance(torch.tensor([3, 12]))
    kv, lengths = cache.kv.clone(), cache.lengths.clone()
    ids = torch.tensor([[1, 2], [4, 5]])
    weights = [w.detach() for w in model._pass_weights()]

    def chain(num_valid, num_tokens, kv_len=14, ids=ids):
        n = torch.tensor(num_valid)
        return getattr(op, name)(
            ids, cache.kv, cache.lengths, n, kv_len, num_tokens, weights, 2, 1e-5
        )

    with pytest.raises(ValueError, match=r"row 1: 2 \+ 3 tokens at length 12 .* 16 slots"):
        chain([1, 2], 4)  # the first pass fits; the fourth would not
    with pytest.raises(ValueError, match=r"kv_len = 14 \+ 3 later passes exceeds"):
        chain([1, 1], 4)
    with pytest.raises(ValueError, match=r"num_valid\[0\] = 3 must be in \[1, 2\]"):
        chain([3, 1], 1)
    with pytest.raises(ValueError, match=r"num_valid\[1\] = 0"):
        chain([1, 0], 1)
    with pytest.raises(ValueError, match="num_tokens must be >= 1, got 0"):
        chain([1, 1], 0)
    with pytest.raises(ValueError, match=r"num_valid must be int64 \[B\] with B = 2"):
        chain([1], 1)
    with pytest.raises(ValueError, match=r"kv_len = 3 must be in"):
        chain([1, 1], 1, kv_len=3)  # the first pass's own checks, before any write
    with pytest.raises(IndexError, match=r"61|vocabulary|out of range"):
        chain([1, 1], 2, ids=torch.tensor([[1, 2], [4, 61]]))  # a token past the vocabulary
    assert torch.equal(cache.kv, kv) and torch.equal(cache.lengths, lengths)
    assert chain([1, 2], 2).shape == (2, 2)  # what fits runs
    python_only = _model(torch.float32)
    python_only.row_invariant = False
    cache = python_only.new_cache(2, 16)
    assert python_only.greedy_chain(ids, cache, torch.tensor([1, 1]), 2, 4) is None


CHAINS = ["causal_lm_greedy_chain", "causal_lm_draft_chain", "causal_lm_draft_sample_chain"]


def _chain_call(name, model, ids, kv, lengths, num_valid, kv_len, num_tokens):
    """``specdec::<name>`` on ``model``'s weights (the sampled chain at T = 1, no filter)."""
    weights = [w.detach() for w in model._pass_weights()]
    args = (ids, kv, lengths, num_valid, kv_len, num_tokens, weights, 2, 1e-5)
    if name == "causal_lm_draft_sample_chain":
        args += (torch.arange(ids.shape[0]), 1.0, 0, 1.0)
    return getattr(op, name)(*args)


@pytest.mark.parametrize("name", CHAINS)
def test_chains_refuse_a_num_tokens_near_int64_max_and_leave_the_cache(name):
    """The fit test ``lengths + num_valid + num_tokens - 1 <= S`` overflowed at ``num_tokens =
    2**63 - 1`` (and at a length near it): the greedy chain wrote its passes until the cache ran
    out, then raised, the cache changed against the chain's promise; the float32 chains wrote
    past the cache; with no rows the draft chain looped ~2**63 times (issue 56, 3.2). Each call
    must raise, naming the values, before anything is written."""
    model = _model(torch.float32)
    cache = model.new_cache(2, 16)
    cache.advance(torch.tensor([3, 12]))
    kv, lengths = cache.kv.clone(), cache.lengths.clone()
    ids, one = torch.tensor([[1, 2], [4, 5]]), torch.tensor([1, 1])

    def chain(num_tokens, kv_len=14, lengths=cache.lengths, num_valid=one, ids=ids, kv=cache.kv):
        return _chain_call(name, model, ids, kv, lengths, num_valid, kv_len, num_tokens)

    big = I64_MAX - 1
    with pytest.raises(ValueError, match=rf"row 0: 1 \+ {big} tokens at length 3 do not fit"):
        chain(I64_MAX)
    with pytest.raises(ValueError, match=rf"row 0: 2 \+ {2**62 - 1} tokens at length 3"):
        chain(2**62, num_valid=torch.tensor([2, 1]))
    at_max = torch.tensor([I64_MAX, 3])
    with pytest.raises(ValueError, match=rf"row 0: 1 \+ 0 tokens at length {I64_MAX} do not"):
        chain(1, lengths=at_max)
    with pytest.raises(ValueError, match=rf"row 0: 1 \+ 0 tokens at length {I64_MIN} do not"):
        chain(1, lengths=torch.tensor([I64_MIN, 3]))
    with pytest.raises(ValueError, match=rf"kv_len = {I64_MAX} \+ 1 later passes exceeds"):
        chain(2, kv_len=I64_MAX, lengths=torch.tensor([0, 0]))
    assert torch.equal(cache.kv, kv) and torch.equal(cache.lengths, lengths)
    empty = model.new_cache(1, 16).kv[:, :, :0]  # no rows: only kv_len bounds the passes
    none = torch.zeros(0, dtype=torch.long)
    with pytest.raises(ValueError, match=rf"kv_len = 2 \+ {big} later passes exceeds"):
        chain(I64_MAX, kv_len=2, lengths=none, num_valid=none, ids=ids[:0], kv=empty)
    assert chain(15, kv_len=2, lengths=none, num_valid=none, ids=ids[:0], kv=empty) is not None


@pytest.mark.parametrize("name", ["causal_lm_pass", "causal_lm_draft_pass", *CHAINS])
@pytest.mark.parametrize("heads, head_dim", [(2, 0), (0, 16)])
def test_model_ops_refuse_a_zero_hidden_size(name, heads, head_dim):
    """A hidden size ``C = num_heads * head_dim`` of 0: the float32 kernels indexed an empty
    activation vector (issue 56, 3.2: the draft pass returned zeros; the bitwise pass failed in
    a reshape). Every op refuses it by name, before any write."""
    v, s = 7, 8
    w = [torch.randn(v, 0), torch.randn(s, 0)]
    w += [torch.ones(0), torch.zeros(0), torch.randn(0, 0), torch.zeros(0), torch.randn(0, 0)]
    w += [torch.zeros(0), torch.ones(0), torch.zeros(0), torch.randn(16, 0), torch.zeros(16)]
    w += [torch.randn(0, 16), torch.zeros(0), torch.ones(0), torch.zeros(0), torch.randn(v, 0)]
    kv = torch.zeros(1, 2, 1, heads, s, head_dim)
    ids, zero = torch.tensor([[1, 2]]), torch.tensor([0])
    message = rf"hidden size num_heads \* head_dim must be >= 1, got {heads} \* {head_dim}"
    with pytest.raises(ValueError, match=message):
        if name in CHAINS:
            args = (ids, kv, zero, torch.tensor([2]), 2, 2, w, heads, 1e-5)
            if name == "causal_lm_draft_sample_chain":
                args += (torch.tensor([1]), 1.0, 0, 1.0)
            getattr(op, name)(*args)
        else:
            getattr(op, name)(ids, kv, zero, 2, torch.tensor([1]), w, heads, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_speculative_greedy_is_the_targets_own_in_every_dtype(dtype):
    target, draft = sk.models.load_bundled("tiny", dtype=dtype, draft_dtype=torch.float32)
    assert target.row_invariant and draft.row_invariant
    prompts = [sk.models.encode(p) for p in ("def main():\n    ", "import os\n", "class A:")]
    want = sk.autoregressive_generate(target, prompts, 40).sequences
    for k in (2, 5, "auto"):
        assert sk.SpeculativeGenerator(target, draft, k).generate(prompts, 40).sequences == want


def test_row_invariant_refuses_what_it_cannot_run():
    model = _model(torch.float32).double()
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        model.row_invariant = True
    model.row_invariant = False  # turning it off always works
    assert not row_invariant_available(model)
    odd = CausalLM(CausalLMConfig(vocab_size=11, n_positions=8, n_embd=24, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="head size"):
        odd.row_invariant = True


def test_fastest_dtype_is_measured_once_and_cached():
    calls = []

    def load(dt):
        calls.append(dt)
        return _model(torch.float32).to(dt)

    first = fastest_dtype(load)
    n = len(calls)
    assert first in (torch.float32, torch.bfloat16) and n >= 2
    assert fastest_dtype(load) == first and len(calls) == n + 1  # only the probe model again


def test_fastest_dtype_and_threads_time_candidates_round_robin(monkeypatch):
    """Both choices time every candidate in one round-robin (``passes_ms`` over all of them,
    so that a slow spell of the machine falls on each) and take the least total."""
    from specdec_kernels.models.bundled import fastest_threads
    from specdec_kernels.tuning import _timing

    seen = []

    def fake(entries, context, repeats, quantile=0.25, calls=1):
        seen.append(entries)
        slow = {torch.float32: 3.0, torch.bfloat16: 1.0, 1: 1.0}  # ms a pass, by dtype or count
        return [slow.get(e[3] if len(e) > 3 else e[0].lm_head.weight.dtype, 2.0) for e in entries]

    monkeypatch.setattr(_timing, "passes_ms", fake)
    monkeypatch.setattr(_timing, "_MEMORY", {})  # choices earlier tests made stay out
    assert fastest_dtype(lambda dt: _model(torch.float32).to(dt), cache=False) == torch.bfloat16
    assert [(e[0].lm_head.weight.dtype, e[2]) for e in seen[-1]] == [
        (torch.float32, 1), (torch.float32, 5), (torch.bfloat16, 1), (torch.bfloat16, 5)
    ]  # fmt: skip
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert fastest_threads(lambda: _model(torch.float32), cache=False) == 1
    assert [(e[2], e[3]) for e in seen[-1]] == [(1, 1), (5, 1), (1, 3), (5, 3)]


def test_passes_ms_runs_each_entry_on_its_threads():
    """An entry's fourth field is its thread count: each timed pass runs on it, an entry without
    one on the process's count (3 here, neither entry's), and the process's count is restored
    afterwards (also when a pass raises)."""
    model = _model(torch.float32)
    model.row_invariant = row_invariant_available(model)
    counts = []
    real = model.forward

    def forward(*args, **kw):
        counts.append(torch.get_num_threads())
        return real(*args, **kw)

    model.forward = forward
    outer = torch.get_num_threads()
    from specdec_kernels.tuning._timing import passes_ms

    torch.set_num_threads(3)
    try:
        ms = passes_ms([(model, 1, 1, 1), (model, 1, 2, 2), (model, 1, 1)], 8, 2)
        assert len(ms) == 3 and all(t > 0 for t in ms)
        assert counts == [1, 2, 3] * 3  # a warm-up round, then 2 timed rounds
        assert torch.get_num_threads() == 3
        model.forward = lambda *a, **kw: 1 / 0
        with pytest.raises(ZeroDivisionError):
            passes_ms([(model, 1, 1, 2)], 8, 1)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(outer)


# --------------------------------------------------------------------------------- pass costs


def summed_k(costs: PassCosts, alpha: torch.Tensor, max_k: int) -> int:
    """The ``K`` with the most of the rows' summed expected tokens per millisecond
    (:meth:`PassCosts.token_rates`, the one-row figure of the loop's choice)."""
    return int(pick_k(costs.token_rates(alpha.double().cpu(), max_k)))


def test_pass_costs_price_the_batch():
    """A K+1-token pass that is cheap at batch 1 and steep at batch 16 (a CPU's): "auto" drafts
    at batch 1 and decodes with the target alone at batch 16, for the same acceptance."""
    costs = PassCosts(
        batch=(1, 16),
        tokens=(1, 5, 9),
        target_ms=((2.0, 2.4, 2.8), (4.0, 14.0, 26.0)),
        draft_ms=(0.1, 0.3),
        step_ms=0.1,
    )
    alpha = torch.full((16,), 0.6)
    assert summed_k(costs, alpha[:1], 8) >= 3
    assert summed_k(costs, alpha, 8) == 0
    assert costs.ideal_speedup(0.6, 1, 4) > 1 > costs.ideal_speedup(0.6, 16, 4)
    assert PassCosts.from_dict(costs.to_dict()) == costs
    assert summed_k(PassCosts.linear(0.05, 0.0, 8), torch.tensor([0.0]), 8) == 0


def test_tokens_per_step_is_the_truncated_geometric_mean_and_variance():
    """Against the enumerated distribution: ``A = j`` accepted drafts with probability
    ``alpha**j (1 - alpha)`` for ``j < K`` and ``alpha**K`` for ``j = K``."""
    from specdec_kernels.tuning import expected_tokens, tokens_per_step

    alpha = torch.tensor([0.0, 0.3, 0.9, 1.0], dtype=torch.float64)
    mu, var = tokens_per_step(alpha, 4)
    for i, a in enumerate(alpha.tolist()):
        for k in range(5):
            p = [a**j * (1 - a) for j in range(k)] + [a**k]
            m = sum((1 + j) * q for j, q in enumerate(p))
            v = sum((1 + j) ** 2 * q for j, q in enumerate(p)) - m * m
            assert float(mu[i, k]) == pytest.approx(m) and float(var[i, k]) == pytest.approx(v)
    assert torch.allclose(mu[:3], expected_tokens(alpha[:3, None], torch.arange(5.0)[None]))


def test_finish_rates_price_the_slowest_row():
    """The batch runs until its last row is done: one slow row makes drafting lose even where
    summing the rows' tokens says it pays; rows alike (or one row) price as the sum does, and
    the target alone, whose rows end together, prices exactly as the sum."""
    costs = PassCosts(
        batch=(1, 4),
        tokens=(1, 3),
        target_ms=((1.0, 1.2), (1.6, 2.6)),
        draft_ms=(0.05, 0.1),
    )
    left = torch.full((4,), 32.0, dtype=torch.float64)
    alike = torch.full((4,), 0.8, dtype=torch.float64)
    one_slow = torch.tensor([0.8, 0.8, 0.8, 0.1], dtype=torch.float64)
    summed, finish = costs.token_rates(one_slow, 2), costs.finish_rates(one_slow, left, 2)
    assert int(pick_k(summed, 0.0)) == 2 and int(pick_k(finish, 0.0)) == 0
    assert float(finish[0]) == pytest.approx(float(summed[0]))
    assert int(pick_k(costs.finish_rates(alike, left, 2), 0.0)) == 2
    # the spread of steps to finish costs the batch: drafting's figure is below the sum's
    assert float(costs.finish_rates(alike, left, 2)[2]) < float(costs.token_rates(alike, 2)[2])
    one = torch.tensor([0.6], dtype=torch.float64)
    assert torch.equal(costs.finish_rates(one, left[:1], 2), costs.token_rates(one, 2))


def test_auto_drafts_only_for_a_gain_beyond_the_margin():
    """A predicted gain under ``DRAFT_MARGIN`` (within the measurement's error) keeps the
    target alone; a larger one drafts. The summed choice and the loop's on-device one agree."""
    from specdec_kernels.tuning import DRAFT_MARGIN, expected_tokens, pick_k

    a = torch.tensor([0.5])
    gain = float(expected_tokens(a, torch.tensor(1.0)))  # 1.5 tokens for K = 1
    for ratio, want in ((1 + DRAFT_MARGIN / 2, 0), (1 + 2 * DRAFT_MARGIN, 1)):
        # K = 1 costs gain / ratio ms: its tokens per ms are `ratio` times the target alone's
        costs = PassCosts((1,), (1, 2), ((1.0, gain / ratio),), (0.0,))
        assert summed_k(costs, a, 1) == want, ratio
        assert int(pick_k(torch.tensor([1.0, ratio]))) == want
    assert int(pick_k(torch.tensor([1.0, 0.5, 1.2, 1.2]))) == 2  # the first of equals
    assert int(pick_k(torch.tensor([1.0, 1 + DRAFT_MARGIN / 2]), margin=0.0)) == 1


def random_costs(g: torch.Generator, grid: dict) -> PassCosts:
    """A ``PassCosts`` with a random one-row pass (base and slope per token) scaled per batch
    size: ``grid`` maps each batch size to (its pass's factor, its draft pass's ms)."""
    tokens = (1, 2, 3, 5, 9)
    base = 0.5 + 2 * torch.rand(1, generator=g).item()
    slope = 0.02 + 0.6 * torch.rand(1, generator=g).item()
    row = tuple(base * (1 + slope * (t - 1)) for t in tokens)
    return PassCosts(
        tuple(grid),
        tokens,
        tuple(tuple(f * v for v in row) for f, _ in grid.values()),
        tuple(d for _, d in grid.values()),
        step_ms=0.1 * torch.rand(1, generator=g).item(),
        draft_fixed_ms=0.3 * torch.rand(1, generator=g).item(),
    )


def test_one_row_choice_from_host_floats_is_the_tensor_paths():
    """``PassCosts.finish_k`` of one row (a one-row loop on the CPU) picks what ``pick_k`` of
    ``token_rates`` picks, over random cost grids, acceptances from 0 to 0.999 and both margins,
    wherever the tensor path's float32 values do not tie within rounding (1e-5 relative)."""
    from specdec_kernels.tuning import pick_k

    g = torch.Generator().manual_seed(7)
    checked = 0
    for _ in range(25):
        draft = 0.02 + 0.2 * torch.rand(1, generator=g).item()
        costs = random_costs(g, {1: (1.0, draft), 4: (2.0, 0.3)})
        for a in torch.linspace(0.0, 0.999, 41).tolist():
            for margin in (0.0, 0.1):
                rates = costs.token_rates(torch.tensor([a]), 8)
                boosted = rates * torch.tensor([1 + margin] + [1.0] * 8)
                top = boosted.topk(2).values
                if top[0] - top[1] <= 1e-5 * top[0]:
                    continue  # a tie within float32 rounding: either choice is the best
                want = int(pick_k(rates, margin))
                assert costs.finish_k([a], [1.0], 8, margin) == want, (a, margin)
                checked += 1
    assert checked > 1900  # nearly every case decided


@pytest.mark.parametrize("rows", [1, 3])
def test_auto_keeps_drafting_below_the_margin_once_it_drafts(pair_tiny, rows):
    """Hysteresis: a predicted gain between ``STOP_MARGIN`` and ``DRAFT_MARGIN`` does not start
    a cold draft, and does not stop a running one; a gain under ``STOP_MARGIN`` stops it; one
    over ``DRAFT_MARGIN`` starts it (one row's choice and a batch's)."""
    from specdec_kernels.decoding import Decoder, ModelDrafter
    from specdec_kernels.decoding.adapters import CausalLMAdapter
    from specdec_kernels.tuning import (
        DRAFT_MARGIN,
        STOP_MARGIN,
        AcceptanceTracker,
        expected_tokens,
    )

    assert 0 < STOP_MARGIN < DRAFT_MARGIN
    target, draft = pair_tiny
    a = torch.tensor([0.5])
    gain = float(expected_tokens(a, torch.tensor(1.0)))  # tokens a K = 1 step yields
    # measured well (1e6 tries at 0.5): the estimate's upper bound is the estimate
    tracker = AcceptanceTracker.new(rows, "cpu", prior=0.5, prior_weight=1.0)
    tracker.update(torch.full((rows,), 5e5), torch.full((rows,), 1e6))
    tracker.tried.fill_(1e6)
    between = (STOP_MARGIN + DRAFT_MARGIN) / 2
    cases = {  # predicted gain of K = 1 over the target alone -> (K cold, K running)
        between: (0, 1),
        STOP_MARGIN / 2: (0, 0),
        2 * DRAFT_MARGIN: (1, 1),
    }
    for g, wants in cases.items():
        # a step of K = 1 costs gain / (1 + g) one-token passes: (1 + g) more tokens per ms
        costs = PassCosts((1, 4), (1, 2), ((1.0, gain / (1 + g)), (1.0, gain / (1 + g))),
                          (0.0, 0.0))  # fmt: skip
        dec = Decoder(
            CausalLMAdapter(target), ModelDrafter(CausalLMAdapter(draft)), "auto",
            max_speculative_tokens=1, costs=costs,
        )  # fmt: skip
        for cold, want in zip((True, False), wants):
            got = dec.policy.choose(tracker, torch.full((rows,), 1000), running=not cold)
            assert got.tolist() == [want] * rows, (g, cold)


@pytest.mark.parametrize("rows", [1, 3])
def test_a_running_draft_stops_only_where_it_loses_at_the_estimates_upper_bound(pair_tiny, rows):
    """A running draft whose estimate predicts a loss on a few tries goes on (the stop is final
    while the batch is unchanged, and a few early rejections are not evidence of a loss), with
    the best ``K >= 1`` at the estimate, not at its bound; the same estimate on many tries
    stops it; a cold draft restarts at the estimate alone. The bound is the batch's: 16 rows
    on the tries that keep 1 or 3 rows drafting stop (their mean has a quarter of a row's
    deviation)."""
    import math

    from specdec_kernels.decoding import Decoder, ModelDrafter
    from specdec_kernels.decoding.adapters import CausalLMAdapter
    from specdec_kernels.tuning import STOP_OPTIMISM, AcceptanceTracker

    assert STOP_OPTIMISM > 0
    target, draft = pair_tiny
    # a 2-token pass costs what 1.5 one-token passes do, a 3-token one 1.7: K = 1 breaks even
    # at acceptance 0.5; at 0.6 K = 2 beats K = 1
    costs = PassCosts((1, 4, 16), (1, 2, 3), ((1.0, 1.5, 1.7),) * 3, (0.0,) * 3)
    dec = Decoder(
        CausalLMAdapter(target), ModelDrafter(CausalLMAdapter(draft)), "auto",
        max_speculative_tokens=2, costs=costs,
    )  # fmt: skip
    assert costs.finish_k([1 / 3], [1.0], 2, 0.0) == 0
    assert costs.finish_k([0.6], [1.0], 2, 0.0) == 2

    def tracker(b, tried):  # the prior 1/3, worth one try; estimate 1/3 (a loss at any K)
        t = AcceptanceTracker.new(b, "cpu", prior=1 / 3, prior_weight=1.0)
        t.accepted.fill_(tried / 3)
        t.tried.fill_(tried)
        return t

    few, many = tracker(rows, 0.0), tracker(rows, 1e5)
    assert torch.allclose(few.alpha(), torch.tensor(1 / 3)) and torch.allclose(
        many.alpha(), torch.tensor(1 / 3)
    )
    bound = STOP_OPTIMISM / math.sqrt(rows)
    assert (few.alpha(bound) > 0.6).all() and (many.alpha(bound) < 0.34).all()
    left = torch.full((rows,), 1000)
    choose = dec.policy.choose
    assert choose(few, left, running=True).tolist() == [1] * rows  # goes on, at the best K
    assert choose(many, left, running=True).tolist() == [0] * rows  # stops
    sixteen = choose(tracker(16, 0.0), torch.full((16,), 1000), running=True)
    assert sixteen.tolist() == [0] * 16
    # a cold draft: the estimate alone
    assert choose(few, left, running=False).tolist() == [0] * rows


def test_autos_host_choice_on_the_cpu_is_the_tensor_paths(pair_tiny):
    """On the CPU ``AutoK.choose`` chooses from host floats (``AcceptanceTracker.host_alpha``
    and ``PassCosts.finish_k``) instead of the estimate's tensor ops: the same ``K`` as the
    tensor path (the estimate passed in as a tensor) for random trackers of 1 to 16 rows,
    running and cold drafts and every margin (the host's float64 and the tensors' float32 may
    break an exact tie apart: the priors here are random, so no estimate sits on a boundary),
    and ``host_alpha`` is ``alpha`` to float32."""
    import random

    from specdec_kernels.decoding import Decoder, ModelDrafter
    from specdec_kernels.decoding.adapters import CausalLMAdapter
    from specdec_kernels.tuning import AcceptanceTracker

    target, draft = pair_tiny
    costs = PassCosts.linear(cost_ratio=0.05, verify_cost=0.15, max_k=8)
    dec = Decoder(
        CausalLMAdapter(target), ModelDrafter(CausalLMAdapter(draft)), "auto",
        max_speculative_tokens=8, costs=costs,
    )  # fmt: skip
    rnd = random.Random(0)
    seen = set()
    for _ in range(300):
        b = rnd.choice([1, 1, 2, 3, 5, 16])
        w = rnd.choice([0.5, 1.3, 4.0])
        t = AcceptanceTracker.new(b, "cpu", prior=rnd.random(), prior_weight=w)
        tried = torch.tensor([float(rnd.randint(0, 60)) for _ in range(b)])
        t.tried.copy_(tried)
        t.accepted.copy_((tried * torch.rand(b)).floor())
        assert torch.allclose(torch.tensor(t.host_alpha(0.7)), t.alpha(0.7), atol=1e-6)
        left = torch.tensor([rnd.randint(1, 200) for _ in range(b)])
        running = rnd.random() >= 0.3
        for margin in (None, -1.0, 0.0, 0.1):
            got = dec.policy.choose(t, left, running=running, margin=margin)
            assert got.dtype == torch.int64 and got.shape == (b,)
            on_tensors = dec.policy.choose(t, left, running=running, margin=margin, alpha=t.alpha())
            assert torch.equal(got, on_tensors)
            seen.add(int(got[0]))
    assert len(seen) >= 4  # the trackers spanned stops, small and large K


@pytest.mark.parametrize("gain", [-0.05, 0.05])
def test_auto_drafts_from_the_start_wherever_the_prior_predicts_a_gain(pair_tiny, gain):
    """The prior's choice at the start of a run needs no margin (``PRIOR_MARGIN``): a step
    without drafts measures nothing, so a predicted gain under ``DRAFT_MARGIN`` drafts from the
    first step (and the draft is prefilled), while a predicted loss runs the target alone and
    never prefills the draft."""
    import specdec_kernels as sk
    from specdec_kernels.tuning import (
        DRAFT_MARGIN,
        PRIOR_MARGIN,
        AcceptanceTracker,
        expected_tokens,
    )

    assert PRIOR_MARGIN == 0.0 < 0.05 < DRAFT_MARGIN
    target, draft = pair_tiny
    prior = AcceptanceTracker.new(1, "cpu").prior_spread()  # one row's acceptance at the start
    tokens = float(expected_tokens(prior, torch.tensor(1.0)))  # a K = 1 step's, at the prior
    # a K = 1 step costs tokens / (1 + gain) one-token passes: (1 + gain) x the tokens per ms
    costs = PassCosts((1,), (1, 2), ((1.0, tokens / (1 + gain)),), (0.0,))
    prefills = []
    hook = draft.register_forward_pre_hook(lambda m, a: prefills.append(a[0].shape[-1]))
    try:
        gen = sk.SpeculativeGenerator(target, draft, "auto", costs=costs, max_speculative_tokens=1)
        # two new tokens: the first step can keep one draft (a step drafts only what it can)
        out = gen.generate([sk.models.encode("def f(x):\n    return")], max_new_tokens=2)
    finally:
        hook.remove()
    drafts = gain > 0.0
    assert (out.stats.drafted_tokens > 0) == drafts, out.stats
    assert bool(prefills) == drafts  # the draft's cache is filled only where it drafts
    if not drafts:
        return
    # a draft the target always rejects (its logits negated: it proposes the target's least
    # likely token): after one step its estimate predicts a loss, but a run the prior started
    # drafting drafts for its first AUTO_EVERY steps, then stops for good
    import copy

    from specdec_kernels.decoding.policy import AUTO_EVERY

    wrong = copy.deepcopy(draft)
    with torch.no_grad():
        wrong.lm_head.weight.neg_()
    prompt = [sk.models.encode("def f(x):\n    return")]
    gen = sk.SpeculativeGenerator(target, wrong, "auto", costs=costs, max_speculative_tokens=1)
    out = gen.generate(prompt, max_new_tokens=24)
    assert out.stats.accepted_tokens == 0
    assert out.stats.drafted_tokens == AUTO_EVERY, out.stats  # one draft token a step
    alone = sk.autoregressive_generate(target, prompt, max_new_tokens=24)
    assert out.sequences == alone.sequences


def test_pass_costs_charge_drafting_once_per_step():
    """``draft_fixed_ms`` is paid by a step that drafts at all, once: it never prices ``K = 0``
    and, unlike a per-token cost, it favours longer drafts (fewer steps pay it)."""
    import dataclasses

    base = PassCosts(
        batch=(1,), tokens=(1, 9), target_ms=((2.0, 2.0),), draft_ms=(0.1,), draft_step_ms=0.1
    )
    fixed = dataclasses.replace(base, draft_fixed_ms=1.0)
    assert fixed.step_cost(1, 0) == base.step_cost(1, 0) == 2.0
    assert fixed.step_cost(1, 3) == pytest.approx(base.step_cost(1, 3) + 1.0)
    a = torch.tensor([0.8])
    per_token = dataclasses.replace(base, draft_step_ms=1.1)  # the same 1 ms spread per token
    assert per_token.step_cost(1, 1) == pytest.approx(fixed.step_cost(1, 1))
    assert summed_k(fixed, a, 8) > summed_k(per_token, a, 8) >= 1
    assert PassCosts.from_dict(fixed.to_dict()) == fixed
    assert PassCosts.from_dict({**base.to_dict(), "draft_fixed_ms": 0.0}) == base


def test_auto_switches_between_target_alone_and_drafting_and_stays_lossless(pair_tiny):
    """Costs that make drafting pay only once the batch is down to one row: "auto" runs K = 0
    steps while three and then two rows are live (the draft is neither prefilled nor fed), then
    drafts for the last row (prefilled then with its committed tokens); the output is still the
    target's own (greedy), and sampling still runs."""
    target, draft = pair_tiny
    costs = PassCosts(
        batch=(1, 2),
        tokens=(1, 9),
        target_ms=((1.0, 1.0), (1.0, 1000.0)),
        draft_ms=(0.01, 0.01),
        step_ms=0.0,
    )
    ids = sk.models.encode(heldout_text("tiny"))
    ctx = target.max_seq_len
    prompts = [ids[: ctx - 6], ids[100 : 100 + ctx - 40], ids[300:320]]  # rows retire at 6, 40
    gen = sk.SpeculativeGenerator(target, draft, "auto", costs=costs, max_speculative_tokens=4)
    rows_seen = []  # the batch size of every pass the draft runs: forwards and native chains
    hook = draft.register_forward_pre_hook(lambda m, a: rows_seen.append(len(a[0])))
    chain = draft.greedy_chain

    def counted_chain(input_ids, *args, **kw):
        rows_seen.append(len(input_ids))
        return chain(input_ids, *args, **kw)

    draft.greedy_chain = counted_chain
    try:
        out = gen.generate(prompts, 60)
    finally:
        hook.remove()
        del draft.greedy_chain
    assert rows_seen and set(rows_seen) == {1}  # never the three or two rows of the K = 0 steps
    assert out.sequences == sk.autoregressive_generate(target, prompts, 60).sequences
    passes = out.stats.target_forwards
    assert 0 < out.stats.drafted_tokens < 4 * passes  # some steps drafted, some did not
    # the last row alone drafts (its last steps, with 4 tokens or fewer to go, only the drafts
    # it can keep: at most 1 + 2 + 3 + 4 fewer)
    assert out.stats.drafted_tokens >= 4 * (passes - 40) - 4 - 10
    sampled = gen.generate(prompts, 60, temperature=1.0, seed=2)
    assert [len(s) for s in sampled.sequences] == [ctx, ctx, 80]


def test_auto_renews_a_batchs_choice_every_step_then_every_few(pair_tiny, monkeypatch):
    """A batch's choice is renewed after each of the first ``AUTO_EVERY`` steps (while the
    estimate leaves the prior), then every ``AUTO_EVERY`` steps and whenever rows retire; one
    row's after every step. The output is the target's own either way."""
    from specdec_kernels.decoding import policy

    target, draft = pair_tiny
    costs = PassCosts(batch=(1, 4), tokens=(1, 5), target_ms=((1.0, 1.1), (1.2, 1.4)),
                      draft_ms=(0.01, 0.01))  # fmt: skip
    calls = []
    real = policy.AutoK.choose

    def counted(self, tracker, left, **kw):
        calls.append(left.numel())
        return real(self, tracker, left, **kw)

    monkeypatch.setattr(policy.AutoK, "choose", counted)
    ids = sk.models.encode(heldout_text("tiny"))
    gen = sk.SpeculativeGenerator(target, draft, "auto", costs=costs, max_speculative_tokens=4)
    for prompts in ([ids[:20]], [ids[:20], ids[200:230], ids[400:410]]):
        calls.clear()
        out = gen.generate(prompts, 40)
        assert out.sequences == sk.autoregressive_generate(target, prompts, 40).sequences
        steps = out.stats.target_forwards
        if len(prompts) == 1:
            assert len(calls) == steps + 1  # the start's choice and one after every step
        else:
            batch = [n for n in calls if n > 1]
            assert calls[: policy.AUTO_EVERY + 1] == [3] * (policy.AUTO_EVERY + 1)  # the first
            bound = 1 + policy.AUTO_EVERY + steps // policy.AUTO_EVERY + len(prompts)
            assert policy.AUTO_EVERY < len(batch) <= bound < steps


def test_batch_choice_from_host_floats_is_the_tensor_paths():
    """``PassCosts.finish_k`` (the CPU loop's choice) picks what ``pick_k`` of
    ``finish_rates`` (a device loop's) picks, over random cost grids, batches of 2-6 rows with
    random acceptances and tokens to go, and both margins, wherever the tensor path's values do
    not tie within rounding (1e-9 relative, float64)."""
    g = torch.Generator().manual_seed(11)
    checked, drafted = 0, 0
    for _ in range(40):
        grid = {1: (1.0, 0.02), 2: (1.3, 0.03), 4: (1.9, 0.05), 8: (3.5, 0.09)}
        costs = random_costs(g, grid)
        for _ in range(25):
            b = int(torch.randint(2, 7, (1,), generator=g))
            alpha = torch.rand(b, generator=g, dtype=torch.float64) * 0.999
            left = torch.randint(0, 90, (b,), generator=g).double()
            for margin in (0.0, 0.1):
                rates = costs.finish_rates(alpha, left, 8)
                boosted = rates * torch.tensor([1 + margin] + [1.0] * 8, dtype=torch.float64)
                top = boosted.topk(2).values
                if top[0] - top[1] <= 1e-9 * top[0]:
                    continue
                k = costs.finish_k(alpha.tolist(), left.tolist(), 8, margin)
                assert k == int(pick_k(rates, margin)), (alpha, left, margin)
                checked += 1
                drafted += k > 0
    assert checked > 1900 and 100 < drafted < checked  # both kinds of choice exercised


def test_a_running_drafts_choice_evaluates_the_bound_only_where_the_estimate_loses(pair_tiny):
    """A running draft goes on with the best ``K >= 1`` at the rows' estimate unless drafting
    loses (gains under ``STOP_MARGIN``) even at the estimate's upper bound. On the CPU the
    bound is evaluated only where the estimate itself does not gain: the choice must be the
    rule's, evaluated in full, over random cost grids, batches of 1-6 rows with random counts
    and tokens to go; both outcomes (going on, stopping) occur, and the bound changes some."""
    from specdec_kernels.tuning import STOP_MARGIN, STOP_OPTIMISM, AcceptanceTracker

    target, draft = pair_tiny
    g = torch.Generator().manual_seed(12)
    seen = {"go": 0, "stop": 0, "by_bound": 0}
    for _ in range(30):
        grid = {1: (1.0, 0.02), 2: (1.3, 0.03), 4: (1.9, 0.05), 8: (3.5, 0.09)}
        costs = random_costs(g, grid)
        gen = sk.SpeculativeGenerator(target, draft, "auto", costs=costs)
        dec = gen.decoder
        for _ in range(20):
            b = int(torch.randint(1, 7, (1,), generator=g))
            tracker = AcceptanceTracker.new(b, "cpu", prior=0.7)
            tried = torch.randint(0, 30, (b,), generator=g).float()
            tracker.tried += tried
            tracker.accepted += (tried * torch.rand(b, generator=g)).floor()
            left = torch.randint(1, 90, (b,), generator=g)
            alpha, ahead = tracker.host_alpha(), left.tolist()
            bound = tracker.host_alpha(STOP_OPTIMISM / b**0.5)
            goes_on = costs.finish_k(bound, ahead, dec.max_k, STOP_MARGIN) > 0
            want = costs.finish_k(alpha, ahead, dec.max_k, -1.0) if goes_on else 0
            got = dec.policy.choose(tracker, left, running=True)  # a running draft
            assert got.tolist() == [want] * b, (alpha, ahead)
            seen["go" if want else "stop"] += 1
            at_estimate = costs.finish_k(alpha, ahead, dec.max_k, STOP_MARGIN)
            seen["by_bound"] += want > 0 and at_estimate == 0
    assert seen["go"] > 50 and seen["stop"] > 50 and seen["by_bound"] > 5, seen


def test_measured_costs_are_cached(pair_tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    target, draft = pair_tiny
    costs = measure_pass_costs(target, draft, max_k=4, max_batch=2, repeats=2)
    assert costs.batch == (1, 2) and costs.tokens == (1, 2, 3, 4, 5)  # every K's pass
    for row in costs.target_ms:  # non-decreasing in tokens
        assert list(row) == sorted(row)
    assert (tmp_path / "pass_costs.json").exists()
    assert measure_pass_costs(target, draft, max_k=4, max_batch=2, repeats=2) is costs
    wider = measure_pass_costs(target, draft, max_k=1, max_batch=8, repeats=1)
    assert wider.batch == (1, 2, 3, 4, 8)  # powers of two, and the demo's 3
    assert list(wider.draft_ms) == sorted(wider.draft_ms) and wider.draft_ms[0] > 0
    # the draft's prefill is measured (no timing relation asserted: under a second test
    # process a prompt token of it once timed above a one-token pass)
    assert 0 < costs.draft_prefill_ms < float("inf")
    assert PassCosts.from_dict(costs.to_dict()) == costs


def test_auto_starts_a_draft_only_where_it_saves_more_than_its_prefill(pair_tiny):
    """``"auto"`` starts the draft (at the first step, or again after the batch changes) only where
    the time it is predicted to save until the last row is done exceeds the draft's prefill of
    the tokens it must read (``PassCosts.draft_prefill_ms`` a token): with a prefill priced
    above any saving the draft never runs, with a cheap one it does, and the output is the
    target's own either way. The saving is ``finish_ms`` at ``K = 0`` less at ``K``."""
    target, draft = pair_tiny
    grid = dict(batch=(1, 4), tokens=(1, 5), target_ms=((1.0, 1.1), (1.2, 1.4)),
                draft_ms=(0.01, 0.01))  # fmt: skip
    ids = sk.models.encode(heldout_text("tiny"))
    for prompts in ([ids[:20]], [ids[:20], ids[200:230], ids[400:410]]):
        want = sk.autoregressive_generate(target, prompts, 40).sequences
        saving = PassCosts(**grid).finish_ms([0.9] * len(prompts), [40.0] * len(prompts), 4)
        assert saving[0] - saving[4] > 5.0  # a draft pays at the prior's acceptance
        for per_token, drafts in ((0.0, True), (1e-4, True), (10.0, False)):
            costs = PassCosts(**grid, draft_prefill_ms=per_token)
            gen = sk.SpeculativeGenerator(
                target, draft, "auto", costs=costs, max_speculative_tokens=4
            )
            out = gen.generate(prompts, 40)
            assert out.sequences == want
            assert (out.stats.draft_forwards > 0) == drafts, (prompts, per_token)


def test_pass_grid_times_quick_rows_longer_and_keeps_each_rows_shape(monkeypatch):
    """A batch size's row of the grid gets rounds for about ``GRID_ROW_SECONDS`` (quick passes
    many, slow ones the sweep's share), and its shape is the sweeps' median one: a sweep whose
    entries dipped unevenly does not bend it, as the smallest figure per entry did."""
    from specdec_kernels.tuning import measure

    ms = {1: 0.1, 16: 50.0}  # a middle pass of each batch size, ms
    monkeypatch.setattr(measure, "pass_ms", lambda model, b, t, ctx, reps: ms[b])
    tokens = list(range(1, 10))
    assert measure._grid_rounds(None, 1, tokens, 64, 2) == 16  # capped at 8x the share
    assert measure._grid_rounds(None, 16, tokens, 64, 2) == 2  # at least the share
    sweeps = [[2.0, 2.2, 2.6, 3.0], [1.0, 1.1, 1.3, 1.5], [2.0, 1.0, 1.0, 3.0]]
    row = measure._grid_row(sweeps)
    assert row == pytest.approx([1.0, 1.1, 1.3, 1.5])  # the two alike sweeps' shape
    assert [min(x) for x in zip(*sweeps)] == [1.0, 1.0, 1.0, 1.5]  # per entry: bent


def test_draft_costs_time_the_drafters_pass(pair_tiny, monkeypatch):
    """The draft's cost is that of the pass a drafter runs (``CausalLM.draft_logits``: float32
    kernels), not the bitwise forward."""
    from specdec_kernels.tuning import _timing

    target, draft = pair_tiny
    calls = []
    real = type(draft).draft_logits

    def counted(self, *args):
        calls.append(args[0].shape)
        return real(self, *args)

    monkeypatch.setattr(type(draft), "draft_logits", counted)
    ms = _timing.pass_ms(draft, 2, 1, 16, repeats=2, drafting=True)
    assert ms > 0 and calls and all(shape == (2, 1) for shape in calls)
    calls.clear()
    _timing.pass_ms(draft, 2, 1, 16, repeats=2)
    assert not calls  # the plain forward


def test_cached_costs_are_keyed_by_the_kernels(pair_tiny, monkeypatch):
    """A rebuilt extension, a forced linear tile or other vector units have other pass costs:
    another key."""
    import os
    from types import SimpleNamespace

    from specdec_kernels.tuning import _timing, measure

    target, draft = pair_tiny
    key = measure._fingerprint(target, draft)
    assert measure._fingerprint(target, draft) == key
    monkeypatch.setenv("SPECDEC_LINEAR_TILE", "generic")
    assert measure._fingerprint(target, draft) != key
    monkeypatch.delenv("SPECDEC_LINEAR_TILE")
    so = sk._extension._C.__file__
    st = os.stat(so)
    assert _timing.kernels_id().startswith(f"{st.st_size}:{st.st_mtime_ns}:")
    real = os.stat
    later = SimpleNamespace(st_size=st.st_size, st_mtime_ns=st.st_mtime_ns + 1)  # a rebuild

    def stat(path, *a, **kw):
        return later if path == so else real(path, *a, **kw)

    monkeypatch.setattr(_timing.os, "stat", stat)
    assert measure._fingerprint(target, draft) != key
    monkeypatch.undo()
    # one model name, another generation of CPU (other vector units): another key too
    assert set(_timing.cpu_flags()) <= set(_timing.VECTOR_FLAGS)
    monkeypatch.setattr(_timing, "cpu_flags", lambda: ["avx2", "fma", "avx512f", "amx_tile"])
    assert measure._fingerprint(target, draft) != key


def test_passes_ms_times_each_entry_in_turns(pair_tiny, monkeypatch):
    """``calls`` passes of an entry per turn, the first of a turn not timed; turns round-robin
    (a slow spell spreads over every entry)."""
    from specdec_kernels.tuning import _timing

    target, _ = pair_tiny
    order = []
    real = type(target).forward

    def forward(self, x, *args, **kw):
        order.append(x.shape)
        return real(self, x, *args, **kw)

    clock = iter(range(10**6))
    monkeypatch.setattr(type(target), "forward", forward)
    monkeypatch.setattr(_timing.time, "perf_counter", lambda: float(next(clock)))
    ms = _timing.passes_ms([(target, 1, 1), (target, 2, 3)], 8, repeats=3, calls=2)
    # a warm-up round, then 3 rounds; each round one turn of 2 passes per entry
    assert order == [(1, 1), (1, 1), (2, 3), (2, 3)] * 4
    assert ms == [1e3, 1e3]  # the fake clock: one tick per timed pass
    order.clear()
    _timing.passes_ms([(target, 1, 1), (target, 2, 3)], 8, repeats=2)
    assert order == [(1, 1), (2, 3)] * 3


@pytest.fixture(scope="module")
def pair_tiny():
    return sk.models.load_bundled("tiny")


def test_loop_costs_per_batch_size_interpolate_and_round_trip():
    """The loop's corrections, one per size of ``loop_batch``: linear between them, the nearest
    beyond; negative ones price a step under its passes but never under a tenth of them; a
    float is the same figure at every size; the cached form round-trips, and the older one
    (floats, no ``loop_batch``) still loads."""
    grid = dict(
        batch=(1, 16), tokens=(1, 9), target_ms=((1.0, 2.0), (4.0, 12.0)), draft_ms=(0.1, 0.4)
    )
    c = PassCosts(
        **grid,
        step_ms=(0.5, -0.5, 1.0),
        draft_step_ms=(0.0, 0.2, 0.2),
        draft_fixed_ms=(0.3, 0.3, -0.6),
        loop_batch=(1, 4, 16),
    )
    assert c.step_cost(1, 0) == pytest.approx(1.0 + 0.5)
    assert c.step_cost(4, 0) == pytest.approx(c.target(4, 1) - 0.5)
    assert c.step_cost(16, 2) == pytest.approx(c.target(16, 3) + 2 * (0.4 + 0.2) + 1.0 - 0.6)
    assert c.loop_ms(2.5) == pytest.approx((0.0, 0.1, 0.3))  # halfway from 1 to 4
    assert c.loop_ms(64) == c.loop_ms(16) and c.loop_ms(0.5) == c.loop_ms(1)
    deep = PassCosts(**grid, step_ms=-5.0)  # a correction beyond the passes themselves
    assert deep.step_cost(1, 0) == pytest.approx(0.1 * deep.target(1, 1))
    assert PassCosts(**grid, step_ms=0.25).loop_ms(7) == (0.25, 0.0, 0.0)
    assert PassCosts.from_dict(c.to_dict()) == c
    old = {**PassCosts(**grid, step_ms=0.25).to_dict(), "step_ms": 0.25}
    del old["loop_batch"]
    assert PassCosts.from_dict(old) == PassCosts(**grid, step_ms=0.25)
    with pytest.raises(ValueError, match=r"step_ms has 2 figures for 3 loop_batch sizes"):
        PassCosts(**grid, step_ms=(0.1, 0.2), loop_batch=(1, 4, 16))


def test_loop_costs_price_each_batch_size_as_the_loop_ran(pair_tiny, monkeypatch):
    """``with_loop_costs`` calibrates at batch sizes 1, 4 and the grid's largest: with the
    corrections, the step costs at ``K = 0, 1, 4`` are the loop's own per-step walls there,
    whatever the passes' grid says (here 40% off): a drafting step at the median over the
    tries of its ratio to the same try's ``K = 0`` step, that step at the tries' median (a try
    in a slow spell, one in a fast spell, one with two runs disturbed, one whose ``K = 0``
    figure at batch 4 a hiccup drove below 0)."""
    from specdec_kernels import generation

    target, draft = pair_tiny
    grid = PassCosts(
        batch=(1, 4, 16),
        tokens=tuple(range(1, 10)),
        target_ms=tuple(tuple(b * (0.5 + 0.1 * t) for t in range(1, 10)) for b in (1, 2, 5)),
        draft_ms=(0.05, 0.1, 0.3),
    )
    truth = {  # the loop's ms per step: not the grid's passes
        (b, k): 1.4 * grid.target(b, k + 1) + 0.2 * k + (0.3 if k else 0.0) + 0.05 * b
        for b in (1, 4, 16)
        for k in (0, 1, 4)
    }
    tries: dict = {}
    ctx = min(target.max_seq_len, draft.max_seq_len)
    short, long_ = ctx // 24, ctx // 4  # the two runs' new tokens

    class FakeDecoder:
        def __init__(self, target, drafter, k):
            self.k = k if drafter is not None else 0

        def run(self, prompts, n):
            key = (len(prompts), self.k, n)
            tries[key] = tries.get(key, 0) + 1
            steps = -(-n // (self.k + 1))  # every draft accepted
            attempt = tries[key] - (n == short)  # 0: the warm-up run (short only)
            spell = {0: 50.0, 1: 1.5, 3: 0.7}.get(attempt, 1.0)  # a slow try and a fast one
            if attempt == 5 and key[:2] == (1, 1):
                spell = 3.0  # the last try's runs at batch 1, K = 1 disturbed
            if attempt == 2 and key == (4, 0, short):
                spell = 100.0  # a hiccup: that try's K = 0 figure at batch 4 below 0
            wall = spell * (20.0 + steps * truth[len(prompts), self.k])
            stats = sk.GenerationStats(target_forwards=steps, wall_seconds=wall / 1e3)
            return type("R", (), {"stats": stats})()

    monkeypatch.setattr(generation, "Decoder", FakeDecoder)
    c = generation.with_loop_costs(grid, target, draft, cache=False)
    assert c.loop_batch == (1, 4, 16)
    # LOOP_TRIES tries of every run, a warm-up run of each shape first
    tries_n = generation.LOOP_TRIES
    assert {n: c for (_, _, n), c in tries.items()} == {short: tries_n + 1, long_: tries_n}
    for (b, k), ms in truth.items():
        # the walls are whole-step multiples, so the difference of two lengths is exact
        assert c.step_cost(b, k) == pytest.approx(ms, rel=1e-6), (b, k)


def test_auto_prices_the_start_at_the_priors_spread(pair_tiny):
    """At the start of a run the rows' acceptance is the prior's own spread
    (``AcceptanceTracker.prior_spread``), not one figure: a batch waits for its slowest row,
    and of 16 rows one is likely to accept far less than the prior's mean. Costs under which
    16 rows all at the prior's 0.7 would draft (a ``K = 1`` step 30% more tokens per ms for a
    row, at a step cost that does not grow with the rows) start 16 rows with the target alone
    (the draft never prefilled), and one row drafting."""
    import specdec_kernels as sk
    from specdec_kernels.tuning import AcceptanceTracker

    target, draft = pair_tiny
    step = 1.7 / 1.3  # a K = 1 step, in one-token steps: 1 + 0.7 tokens for 1.3 x the time
    costs = PassCosts((1, 16), (1, 2), ((1.0, step), (1.0, step)), (0.0, 0.0))
    spread = AcceptanceTracker.new(16, "cpu").prior_spread()
    assert spread[0] < 0.3 < 0.9 < spread[-1] and list(spread) == sorted(spread)
    assert costs.finish_k([0.7] * 16, [24.0] * 16, 1, 0.0) == 1  # one figure: drafts
    assert costs.finish_k(spread.tolist(), [24.0] * 16, 1, 0.0) == 0  # the spread: alone
    prefills = []
    hook = draft.register_forward_pre_hook(lambda m, a: prefills.append(a[0].shape[-1]))
    prompt = sk.models.encode("def f(x):\n    return")
    try:
        gen = sk.SpeculativeGenerator(target, draft, "auto", costs=costs, max_speculative_tokens=1)
        many = gen.generate([prompt] * 16, max_new_tokens=8)
        assert many.stats.drafted_tokens == 0 and not prefills, many.stats
        one = gen.generate([prompt], max_new_tokens=8)
        assert one.stats.drafted_tokens > 0 and prefills, one.stats
    finally:
        hook.remove()
    alone = sk.autoregressive_generate(target, [prompt] * 16, max_new_tokens=8)
    assert many.sequences == alone.sequences


def _plain_greedy(model, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens of ``model`` from full uncached passes on its PyTorch path (the
    argmax of the last position each time): what any generation of it must give."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        for _ in range(n):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[0].tolist()


@pytest.mark.parametrize("convert", ["double", "half"])
def test_a_model_converted_after_loading_falls_back_to_pytorch_and_back(convert):
    """``load_bundled`` turns the row-invariant kernels on; ``.double()`` / ``.half()`` after it
    made every generation fail inside the native kernel (``x must be float32 or bfloat16, got
    Double``). The model now runs as one that never had the kernels (one warning), with the
    PyTorch path's tokens, and ``.float()`` turns the kernels back on."""
    target, draft = sk.models.load_bundled("tiny")
    want32 = sk.autoregressive_generate(target, [sk.models.encode("def f(x):\n")], 6).sequences
    plain, _ = sk.models.load_bundled("tiny", row_invariant=False)
    plain = getattr(plain, convert)()
    target, draft = getattr(target, convert)(), getattr(draft, convert)()
    prompt = sk.models.encode("def f(x):\n")
    dtype = {"double": "float64", "half": "float16"}[convert]
    with pytest.warns(RuntimeWarning, match=f"row_invariant.*{dtype}.*PyTorch path") as seen:
        alone = sk.autoregressive_generate(target, [prompt], 6).sequences
        spec = sk.SpeculativeGenerator(target, draft, 3).generate([prompt], 6).sequences
        sk.autoregressive_generate(target, [prompt], 2)  # no second warning for either model
    messages = [str(w.message) for w in seen if "row_invariant" in str(w.message)]
    assert len(messages) == 2, messages  # one for the target, one for the draft
    assert not target.row_invariant and not draft.row_invariant
    assert alone == spec == [_plain_greedy(plain, prompt, 6)]
    target, draft = target.float(), draft.float()
    assert target.row_invariant and draft.row_invariant
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the native path again, silently
        again = sk.autoregressive_generate(target, [prompt], 6).sequences
    if convert == "double":  # float16 weights on disk: float32 -> float64 -> float32 is exact
        assert again == want32
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        target.to(torch.float64).row_invariant = True  # asking for them explicitly still raises
