"""The kernels' serving features (API.md section 9), on the native C++ kernels and the Triton
kernels (interpreted on a CPU, small ``V``; both chain strategies): block verification equals its
reference token for token on the same seeds, and token bitmasks read inside the chain and tree
kernels equal the same kernel on ``logits.masked_fill(~allowed, -inf)`` token for token (and the
reference), in every mode and layout; a disallowed draft token is rejected. The native kernels
also on many random cases (:func:`chain_case`: every mode, typical included, ragged rows, flat
layout, every logits dtype) and on every CPU capability build."""

import os
import textwrap

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import _dispatch
from specdec_kernels.reference import bitmask as ref_bitmask
from specdec_kernels.verification import run_chain

from helpers import (
    NATIVE,
    TRITON,
    assert_verification_equal,
    flatten_layout,
    make_draft_probs,
    make_inputs,
    random_draft_probs,
    random_trees,
    run_under_capability,
)

#: ``(backend, chain strategy)``: the native kernel, and the Triton kernel in both of its chain
#: strategies (the launcher picks one by batch size; :func:`pin_strategy` forces it).
KERNELS = [
    pytest.param("native", None, marks=NATIVE.marks, id="native"),
    *(pytest.param("triton", s, marks=TRITON.marks, id=f"triton-{s}") for s in ("row", "split")),
]


@pytest.fixture
def pin_strategy(monkeypatch):
    """``pin_strategy(strategy)``: the Triton chain launcher uses ``strategy`` (``None``: the
    native kernel, nothing to pin)."""

    def pin(strategy):
        if strategy is not None:
            from specdec_kernels.ops import verify_sampling as triton_chain  # imports triton

            monkeypatch.setattr(triton_chain, "pick_strategy", lambda batch, device: strategy)

    return pin


# --- the native kernels' random cases ----------------------------------------------------------

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def pack_bitmask(allowed: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """``[..., V]`` bool -> ``[..., ceil(V / 32)]`` int32 in xgrammar's layout, with random bits
    past ``V`` (the kernels must ignore them)."""
    v = allowed.shape[-1]
    w = (v + 31) // 32
    bits = torch.randint(0, 2, (*allowed.shape[:-1], w * 32), generator=g, dtype=torch.int64)
    bits[..., :v] = allowed.long()
    words = (bits.view(*allowed.shape[:-1], w, 32) << torch.arange(32)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def random_allowed(logits: torch.Tensor, drafts, g: torch.Generator) -> torch.Tensor:
    """A ``[..., V]`` mask that allows about 60% of the tokens and at least one per row, and
    forbids the draft's token (``drafts [..., K]`` at positions ``0 .. K-1``) at a third of the
    positions."""
    allowed = torch.rand(logits.shape, generator=g) < 0.6
    rows = allowed.view(-1, logits.shape[-1])
    rows[
        torch.arange(rows.shape[0]),
        torch.randint(0, logits.shape[-1], (rows.shape[0],), generator=g),
    ] = True
    if drafts is not None:
        k = drafts.shape[-1]
        d = drafts.clamp(0, logits.shape[-1] - 1)
        forbid = (torch.rand(d.shape, generator=g) < 1 / 3) & (drafts >= 0)
        head = allowed[..., :k, :]
        head.scatter_(-1, d[..., None], ~forbid[..., None] & head.gather(-1, d[..., None]))
    return allowed


def chain_case(seed: int, *, dense=None, flat=None, dtype=None, filters=None, log_input=False):
    """Random chain inputs: ``(logits, drafts, kwargs of run_chain, allowed [B, K+1, V])``.

    Ragged rows, odd vocabularies, drafts near the target (so that blocks of several tokens
    are accepted), a greedy row now and then; unspecified options are drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda options: options[torch.randint(0, len(options), (1,), generator=g).item()]  # noqa: E731
    b, k, v = pick([1, 2, 3, 5]), pick([0, 1, 2, 4, 6]), pick([7, 37, 1000, 5003])
    dense = pick([True, False]) if dense is None else dense
    flat = pick([True, False]) if flat is None else flat
    dtype = pick(DTYPES) if dtype is None else dtype
    filters = pick([True, False]) if filters is None else filters
    base = torch.randn(b, k + 1, v, generator=g) * pick([2.0, 4.0, 8.0])
    temperature = torch.rand(b, generator=g) * 1.2 + 0.4
    temperature[torch.rand(b, generator=g) < 0.2] = 0.0  # greedy rows
    t = torch.where(temperature > 0, temperature, 1.0)[:, None, None]
    near = torch.softmax(base[:, :k] / t + 0.3 * torch.randn(b, k, v, generator=g), -1)
    q = near if dense else None
    if k > 0:
        drafts = torch.multinomial(near.reshape(-1, v), 1, generator=g).view(b, k)
        if not dense:  # a deterministic drafter: mostly the likeliest token
            top = torch.rand(b, k, generator=g) < 0.8
            drafts = torch.where(top, near.argmax(-1), drafts)
    else:
        drafts = torch.zeros(b, 0, dtype=torch.int64)
    nd = torch.randint(0, k + 1, (b,), generator=g)
    drafts = torch.where(torch.arange(k)[None, :] < nd[:, None], drafts, -1)
    kw = dict(
        num_draft_tokens=nd,
        temperature=temperature,
        seeds=torch.randint(0, 2**40, (b,), generator=g),
        log_input=log_input,
    )
    if filters:
        kw["top_k"] = torch.randint(0, 60, (b,), generator=g)
        kw["top_p"] = torch.where(torch.rand(b, generator=g) < 0.5, 0.8, 1.0)
    logits = torch.softmax(base, -1) if log_input else base
    if log_input:
        kw["temperature"] = torch.where(temperature == 0, 0.0, 1.0)
    allowed = random_allowed(base, drafts, g)
    logits = logits.to(dtype)
    kw["draft_probs"] = None if q is None else q.to(dtype)
    return logits, drafts, kw, allowed, flat


def flatten_case(logits, drafts, kw, mask):
    """The padded inputs of :func:`chain_case` in vLLM's flat layout (the bitmask too)."""
    nd = kw["num_draft_tokens"]
    target, _, q, cu = flatten_layout(logits, drafts, nd, kw["draft_probs"])
    if q is not None and q.shape[0] == 0:  # no draft token at all: nothing to read q from
        q = None
    kw = dict(kw, draft_probs=q, logits_row_start=cu - nd + torch.arange(len(nd)))
    if q is not None:
        kw["probs_row_start"] = cu - nd
    if mask is not None:
        mask = flatten_layout(mask, drafts, nd)[0]
    return target, kw, mask


def chain(logits, drafts, kw, mask, mode, backend, flat):
    if flat:
        logits, kw, mask = flatten_case(logits, drafts, kw, mask)
    if mode == "typical":
        kw = dict(kw, draft_probs=None, posterior_threshold=0.09, posterior_alpha=0.3)
        kw.pop("probs_row_start", None)
    if mode == "greedy":
        kw = {
            "num_draft_tokens": kw["num_draft_tokens"],
            "logits_row_start": kw.get("logits_row_start"),
            "log_input": kw["log_input"],
        }
    return run_chain(logits, drafts, mode=mode, backend=backend, token_bitmask=mask, **kw)


# --- the Triton tests' fixed cases -------------------------------------------------------------

B, K, V = 6, 3, 40  # W = 2 bitmask words, the second one partly past V
FILTERS = [{}, {"top_k": 7, "top_p": 0.9}]


def _chain_case(one_hot, b=B, k=K, v=V, seed=0):
    logits, _, nd = make_inputs(b, k, v, ragged=True, strided=True, scale=1.5, seed=seed)
    q, drafts = make_draft_probs(b, k, v, seed=seed + 1)
    drafts = torch.where(torch.arange(k)[None, :] < nd[:, None], drafts, -1)
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.3, 1.0, 0.9])[:b]
    kwargs = dict(
        draft_probs=None if one_hot else q,
        temperature=temperature,
        num_draft_tokens=nd,
        seed=torch.arange(b) * 7919 + 5,
    )
    return logits, drafts, kwargs


def _random_bitmask(shape, v, seed=0, density=0.6):
    """int32 ``shape + [W]`` with about ``density`` of the tokens allowed and garbage bits past
    ``V``; at least one allowed token in every row (bit 0 of word 0 is not enough: the argmax
    must move, so a random one)."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(*shape, v, generator=g) < density
    first = torch.randint(0, v, shape, generator=g)
    allowed.scatter_(-1, first[..., None], True)
    w = ref_bitmask.width(v)
    bits = torch.zeros(*shape, w * 32, dtype=torch.int64)
    bits[..., :v] = allowed.long()
    bits[..., v:] = torch.randint(0, 2, (*shape, w * 32 - v), generator=g)
    words = (bits.view(*shape, w, 32) << torch.arange(32)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _masked(logits, token_bitmask):
    return ref_bitmask.masked_logits(logits, token_bitmask)


# --- block verification ----------------------------------------------------------------------


@pytest.mark.parametrize("backend, strategy", KERNELS)
@pytest.mark.parametrize("one_hot", [True, False])
@pytest.mark.parametrize("filters", FILTERS)
def test_block_matches_reference(backend, strategy, one_hot, filters, pin_strategy):
    pin_strategy(strategy)
    logits, drafts, kwargs = _chain_case(one_hot)
    kwargs.update(filters, method="block")
    expected = sk.verify_sampling(logits, drafts, backend="reference", **kwargs)
    actual = sk.verify_sampling(logits, drafts, backend=backend, **kwargs)
    what = f"block {backend} {strategy} one_hot={one_hot} {filters}"
    assert_verification_equal(actual, expected, what)


@pytest.mark.parametrize("backend", [NATIVE])
@pytest.mark.parametrize("seed", range(120))
def test_block_matches_the_reference_on_random_cases(backend, seed):
    """Random cases (one-hot and dense drafts, filters, ragged rows, flat layout, float32 /
    bfloat16 / float16 logits, greedy rows): the native kernel's tokens are the reference's."""
    logits, drafts, kw, _, flat = chain_case(seed)
    got = chain(logits, drafts, kw, None, "block", backend, flat)
    want = chain(logits, drafts, kw, None, "block", "reference", flat)
    assert_verification_equal(got, want, f"block, case {seed}")


@pytest.mark.parametrize("backend", [NATIVE])
@pytest.mark.parametrize("dense", [False, True])
def test_block_with_probability_inputs(backend, dense):
    for seed in range(10):
        logits, drafts, kw, _, flat = chain_case(seed, dense=dense, log_input=True, filters=False)
        got = chain(logits, drafts, kw, None, "block", backend, flat)
        want = chain(logits, drafts, kw, None, "block", "reference", flat)
        assert_verification_equal(got, want, f"block, probabilities, case {seed}")


@pytest.mark.parametrize("backend", [NATIVE])
def test_block_with_one_draft_is_the_token_rule(backend):
    """With one draft (gamma = 1, h_1 = p_1 = min(1, P/Q), the residual at tau = 0 the token
    residual) block verification is token verification, on the same uniforms."""
    b, k1, v = 64, 5, 50
    g = torch.Generator().manual_seed(5)
    base = torch.randn(b, k1, v, generator=g) * 2
    q = torch.softmax(base[:, :-1] + torch.randn(b, k1 - 1, v, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).view(b, k1 - 1)
    kw = dict(
        num_draft_tokens=torch.full((b,), k1 - 1),
        draft_probs=q,
        temperature=torch.ones(b),
        seeds=torch.arange(b),
    )
    first = dict(kw, num_draft_tokens=torch.ones(b, dtype=torch.int64))
    one = run_chain(base, drafts, mode="block", backend=backend, **first)
    assert_verification_equal(
        one, run_chain(base, drafts, mode="sampling", backend=backend, **first), "K = 1"
    )


@pytest.mark.parametrize("backend", [NATIVE])
def test_block_is_routed_to_the_native_kernel(backend):
    assert _dispatch.kernel("verify_block", backend) is _dispatch._native_chain
    logits, drafts, kw, _, _ = chain_case(7, dense=False, flat=False)
    out = sk.verify_sampling(
        logits,
        drafts,
        method="block",
        backend=backend,
        num_draft_tokens=kw["num_draft_tokens"],
        temperature=kw["temperature"],
        seed=kw["seeds"],
    )
    want = chain(
        logits, drafts, dict(kw, top_k=None, top_p=None), None, "block", "reference", False
    )
    assert_verification_equal(out, want, "sk.verify_sampling(method='block')")


@pytest.mark.parametrize("backend, strategy", KERNELS)
def test_block_is_not_the_token_rule_on_these_inputs(backend, strategy, pin_strategy):
    """The block tests above are not vacuous: on more rows block and token differ somewhere,
    and the kernel agrees with the reference there too."""
    pin_strategy(strategy)
    b, k = 6, 4
    logits, drafts, kwargs = _chain_case(False, b=b, k=k, seed=3)
    kwargs["num_draft_tokens"] = torch.full((b,), k)
    drafts = make_draft_probs(b, k, V, seed=4)[1]
    block = sk.verify_sampling(logits, drafts, backend=backend, method="block", **kwargs)
    token = sk.verify_sampling(logits, drafts, backend=backend, **kwargs)
    expected = sk.verify_sampling(logits, drafts, backend="reference", method="block", **kwargs)
    assert_verification_equal(block, expected, "block, full rows")
    assert not torch.equal(block.tokens, token.tokens)


@pytest.mark.parametrize("backend, strategy", KERNELS)
@pytest.mark.parametrize("one_hot", [True, False])
def test_block_flat_layout_matches_padded_reference(backend, strategy, one_hot, pin_strategy):
    pin_strategy(strategy)
    logits, drafts, kwargs = _chain_case(one_hot)
    nd = kwargs.pop("num_draft_tokens")
    q = kwargs.pop("draft_probs")
    flat_logits, flat_drafts, flat_q, cu = flatten_layout(logits, drafts, nd, q)
    expected = sk.verify_sampling(
        logits, drafts, q, num_draft_tokens=nd, method="block", backend="reference", **kwargs
    )
    actual = sk.verify_sampling(
        flat_logits, flat_drafts, flat_q, cu_num_draft_tokens=cu, max_spec_len=K,
        method="block", backend=backend, **kwargs,
    )  # fmt: skip
    assert_verification_equal(actual, expected, f"flat block {strategy} one_hot={one_hot}")


# --- token bitmasks in the chain kernels -------------------------------------------------------


@pytest.mark.parametrize("backend", [NATIVE])
@pytest.mark.parametrize("mode", ["greedy", "sampling", "block", "typical"])
@pytest.mark.parametrize("flat", [False, True])
def test_chain_bitmask_equals_masked_logits_on_random_cases(backend, mode, flat):
    """For the same seeds, the kernel under a bitmask returns what it returns on the masked
    logits (and what the reference returns), in every mode and layout, with a mask that forbids
    the draft's token at a third of the positions."""
    for seed in range(12):
        logits, drafts, kw, allowed, _ = chain_case(100 + seed, flat=flat)
        g = torch.Generator().manual_seed(seed)
        mask = pack_bitmask(allowed, g)
        masked = logits.masked_fill(~allowed, -torch.inf)
        got = chain(logits, drafts, kw, mask, mode, backend, flat)
        want = chain(masked, drafts, kw, None, mode, backend, flat)
        what = f"{mode}, case {seed}, flat={flat}"
        assert_verification_equal(got, want, what)
        ref = chain(logits, drafts, kw, mask, mode, "reference", flat)
        assert_verification_equal(got, ref, what + " (reference)")


def _chain_call(mode, logits, drafts, kwargs, **extra):
    if mode == "greedy":
        nd = kwargs["num_draft_tokens"]
        return sk.verify_greedy(logits, drafts, num_draft_tokens=nd, **extra)
    method = "block" if mode == "block" else "token"
    return sk.verify_sampling(logits, drafts, method=method, **kwargs, **extra)


@pytest.mark.parametrize("backend, strategy", KERNELS)
@pytest.mark.parametrize(
    "mode, one_hot",
    [("greedy", True), ("sampling", True), ("sampling", False), ("block", True), ("block", False)],
)
def test_chain_bitmask_equals_masked_logits(backend, strategy, mode, one_hot, pin_strategy):
    pin_strategy(strategy)
    logits, drafts, kwargs = _chain_case(one_hot)
    if mode != "greedy":
        kwargs.update(FILTERS[1])
    mask = _random_bitmask((B, K + 1), V)
    masked = _masked(logits, mask)
    actual = _chain_call(mode, logits, drafts, kwargs, token_bitmask=mask, backend=backend)
    on_masked = _chain_call(mode, masked, drafts, kwargs, backend=backend)
    expected = _chain_call(mode, logits, drafts, kwargs, token_bitmask=mask, backend="reference")
    what = f"{mode} {backend} {strategy} one_hot={one_hot}"
    assert_verification_equal(actual, on_masked, what + ": bitmask vs masked logits")
    assert_verification_equal(actual, expected, what + ": kernel vs reference")


@pytest.mark.parametrize("backend, strategy", KERNELS)
@pytest.mark.parametrize("mode", ["sampling", "block"])
def test_chain_bitmask_flat_layout(backend, strategy, mode, pin_strategy):
    pin_strategy(strategy)
    logits, drafts, kwargs = _chain_case(False)
    nd = kwargs.pop("num_draft_tokens")
    q = kwargs.pop("draft_probs")
    mask = _random_bitmask((B, K + 1), V, seed=2)
    flat_logits, flat_drafts, flat_q, cu = flatten_layout(logits, drafts, nd, q)
    flat_mask = torch.cat([mask[i, : nd[i] + 1] for i in range(B)])  # [num_tokens + B, W]
    method = "block" if mode == "block" else "token"
    expected = sk.verify_sampling(
        logits, drafts, q, num_draft_tokens=nd, method=method, token_bitmask=mask,
        backend="reference", **kwargs,
    )  # fmt: skip
    actual = sk.verify_sampling(
        flat_logits, flat_drafts, flat_q, cu_num_draft_tokens=cu, max_spec_len=K,
        method=method, token_bitmask=flat_mask, backend=backend, **kwargs,
    )  # fmt: skip
    assert_verification_equal(actual, expected, f"flat {mode} {strategy} with a bitmask")


@pytest.mark.parametrize("backend, strategy", KERNELS)
@pytest.mark.parametrize("mode", ["greedy", "sampling", "block"])
def test_bitmask_that_forbids_the_draft_rejects_it(backend, strategy, mode, pin_strategy):
    """Drafts the target accepts for sure (its argmax; for sampling rows drawn from ``q = p``)
    are rejected at position 0 once the bitmask forbids them there, and the emitted token is
    an allowed one."""
    pin_strategy(strategy)
    b, k, v = 4, 2, V
    logits = torch.randn(b, k + 1, v) * 2
    p = torch.softmax(logits[:, :k], -1)
    drafts = logits[:, :k].argmax(-1)
    kwargs = dict(draft_probs=p, temperature=1.0, num_draft_tokens=torch.full((b,), k), seed=3)
    if mode == "greedy":
        kwargs["temperature"] = 0.0
    free = torch.full((b, k + 1, ref_bitmask.width(v)), -1, dtype=torch.int32)
    accepted = _chain_call(mode, logits, drafts, kwargs, token_bitmask=free, backend=backend)
    assert torch.equal(accepted.num_accepted, torch.full((b,), k))
    mask = free.clone()
    word, bit = drafts[:, 0] // 32, drafts[:, 0] % 32
    mask[torch.arange(b), 0, word] = ~(1 << bit).to(torch.int32)
    out = _chain_call(mode, logits, drafts, kwargs, token_bitmask=mask, backend=backend)
    assert torch.equal(out.num_accepted, torch.zeros(b, dtype=torch.int64))
    assert not bool((out.tokens[:, 0] == drafts[:, 0]).any())


@pytest.mark.parametrize("backend", [NATIVE])
def test_a_forbidden_draft_is_rejected(backend):
    b, k, v = 4, 3, 70
    logits = torch.zeros(b, k + 1, v)
    logits[..., 5] = 10.0  # the target's favourite, and the draft's
    drafts = torch.full((b, k), 5)
    allowed = torch.ones(b, k + 1, v, dtype=torch.bool)
    allowed[:, 1, 5] = False  # forbidden at position 1
    mask = pack_bitmask(allowed, torch.Generator().manual_seed(0))
    kw = dict(
        num_draft_tokens=torch.full((b,), k),
        temperature=torch.tensor([0.0, 1, 1, 0.5]),
        seeds=torch.arange(b),
    )
    for mode in ("sampling", "block"):
        out = run_chain(logits, drafts, mode=mode, backend=backend, token_bitmask=mask, **kw)
        assert out.num_accepted.tolist() == [1] * b, mode
        assert (out.tokens[:, 1] != 5).all(), mode


# --- token bitmasks in the tree kernels --------------------------------------------------------


def _random_tree_call(draft_mode, logits, tokens, parents, nn, q, seed, mask, backend):
    if draft_mode == "greedy":
        return sk.verify_tree_greedy(
            logits, tokens, parents, num_nodes=nn, token_bitmask=mask, backend=backend
        )
    return sk.verify_tree_sampling(
        logits,
        tokens,
        parents,
        None if draft_mode == "deterministic" else q,
        num_nodes=nn,
        draft_mode=draft_mode,
        seed=torch.arange(len(nn)) * 7 + seed,
        temperature=torch.tensor([0.0, 0.7, 1.0, 1.3]),
        top_k=torch.tensor([0, 5, 0, 40]),
        top_p=torch.tensor([1.0, 0.9, 0.7, 1.0]),
        token_bitmask=mask,
        backend=backend,
    )


@pytest.mark.parametrize("backend", [NATIVE])
@pytest.mark.parametrize(
    "draft_mode", ["greedy", "deterministic", "independent", "without_replacement"]
)
def test_tree_bitmask_equals_masked_logits_on_random_cases(backend, draft_mode):
    for seed in range(8):
        b, n, v = 4, 9, [37, 1000, 2003][seed % 3]
        logits, tokens, parents, nn = random_trees(b, n, v, seed=seed, scale=1.5)
        q = random_draft_probs(b, n, v, seed=seed)
        g = torch.Generator().manual_seed(seed)
        allowed = random_allowed(logits, None, g)
        # forbid the tree's own tokens at their parents' rows, now and then
        rows = torch.arange(b)[:, None].expand(b, n - 1)
        par = parents[:, 1:].clamp(0, n - 1)
        tok = tokens[:, 1:].clamp(0, v - 1)
        hit = torch.rand(b, n - 1, generator=g) < 0.3
        allowed[rows[hit], par[hit], tok[hit]] = False
        mask = pack_bitmask(allowed, g)
        masked = logits.masked_fill(~allowed, -torch.inf)
        tree = (tokens, parents, nn, q, seed)
        got = _random_tree_call(draft_mode, logits, *tree, mask, backend)
        want = _random_tree_call(draft_mode, masked, *tree, None, backend)
        ref = _random_tree_call(draft_mode, logits, *tree, mask, "reference")
        for name in ("tokens", "num_accepted", "accepted_nodes"):
            what = f"{draft_mode}, case {seed}: {name}"
            assert torch.equal(getattr(got, name), getattr(want, name)), what
            assert torch.equal(getattr(got, name), getattr(ref, name)), what + " (reference)"


def _tree_call(mode, logits, tokens, parents, nn, q, **extra):
    if mode == "greedy":
        return sk.verify_tree_greedy(logits, tokens, parents, num_nodes=nn, **extra)
    return sk.verify_tree_sampling(
        logits, tokens, parents, None if mode == "deterministic" else q, draft_mode=mode,
        temperature=torch.tensor([0.0, 0.7, 1.0, 1.3]), top_k=9, top_p=0.95, num_nodes=nn,
        seed=torch.tensor([1, 2, 3, 4]), **extra,
    )  # fmt: skip


@pytest.mark.parametrize("backend", [NATIVE, TRITON])
@pytest.mark.parametrize("mode", ["greedy", "deterministic", "without_replacement"])
def test_tree_bitmask_equals_masked_logits(backend, mode):
    b, n = 4, 6
    logits, tokens, parents, nn = random_trees(b, n, V, seed=5)
    q = random_draft_probs(b, n, V)
    mask = _random_bitmask((b, n), V, seed=6)
    masked = _masked(logits, mask)
    args = (tokens, parents, nn, q)
    actual = _tree_call(mode, logits, *args, token_bitmask=mask, backend=backend)
    on_masked = _tree_call(mode, masked, *args, backend=backend)
    expected = _tree_call(mode, logits, *args, token_bitmask=mask, backend="reference")
    for got, want, what in ((actual, on_masked, "masked logits"), (actual, expected, "reference")):
        assert torch.equal(got.tokens, want.tokens), (mode, what, got.tokens, want.tokens)
        assert torch.equal(got.num_accepted, want.num_accepted), (mode, what)


# --- every CPU capability build of the native kernels -------------------------------------------

_CAPABILITY_SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    import specdec_kernels as sk
    import test_serving_kernels as t
    print(torch.backends.cpu.get_cpu_capability())
    for seed in range(16):
        for mode in ("greedy", "sampling", "block", "typical"):
            logits, drafts, kw, allowed, flat = t.chain_case(200 + seed)
            mask = t.pack_bitmask(allowed, torch.Generator().manual_seed(seed))
            masked = logits.masked_fill(~allowed, -torch.inf)
            got = t.chain(logits, drafts, kw, mask, mode, "native", flat)
            want = t.chain(masked, drafts, kw, None, mode, "native", flat)
            assert torch.equal(got.tokens, want.tokens), (mode, seed, got.tokens, want.tokens)
            if mode == "block":
                ref = t.chain(logits, drafts, kw, mask, mode, "reference", flat)
                assert torch.equal(got.tokens, ref.tokens), (seed, got.tokens, ref.tokens)
    logits, tokens, parents, nn = t.random_trees(3, 7, 1000, seed=3, scale=1.5)
    allowed = t.random_allowed(logits, None, torch.Generator().manual_seed(1))
    mask = t.pack_bitmask(allowed, torch.Generator().manual_seed(2))
    masked = logits.masked_fill(~allowed, -torch.inf)
    q = t.random_draft_probs(3, 7, 1000)
    for probs, mode in ((None, "deterministic"), (q, "independent")):
        kw = dict(num_nodes=nn, draft_mode=mode, seed=torch.arange(3), temperature=0.9)
        a = sk.verify_tree_sampling(logits, tokens, parents, probs, token_bitmask=mask,
                                    backend="native", **kw)
        b = sk.verify_tree_sampling(masked, tokens, parents, probs, backend="native", **kw)
        assert torch.equal(a.tokens, b.tokens), (mode, a.tokens, b.tokens)
    print("ok")
""")


@pytest.mark.parametrize("backend", [NATIVE])
@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_every_cpu_capability_build_reads_the_mask(backend, capability):
    """The DEFAULT (scalar), AVX2 and AVX-512 builds, each chosen through ATEN_CPU_CAPABILITY
    (a build the CPU cannot run is skipped): masked calls equal the calls on masked logits, and
    block verification its reference."""
    tests = os.path.dirname(os.path.abspath(__file__))
    run_under_capability(_CAPABILITY_SCRIPT.format(tests=tests), capability, timeout=600)


def test_reference_bitmask_helper_roundtrip():
    """The test's packer is xgrammar's layout as the reference reads it."""
    g = torch.Generator().manual_seed(0)
    allowed = torch.rand(3, 4, 70, generator=g) < 0.5
    assert torch.equal(ref_bitmask.allowed(pack_bitmask(allowed, g), 70), allowed)
