"""The serving keywords of API.md section 9 in the Triton kernels (interpreted on a CPU, small V):
``method="block"`` equals the reference token for token on the same seeds, in both chain
strategies; ``token_bitmask=`` equals the op on ``logits.masked_fill(~allowed, -inf)`` on the
chain and tree ops, and a disallowed draft token is rejected."""

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.ops import verify_sampling as triton_chain
from specdec_kernels.reference import bitmask as ref_bitmask

from helpers import (
    assert_verification_equal,
    flatten_layout,
    make_draft_probs,
    make_inputs,
    random_draft_probs,
    random_trees,
)

B, K, V = 6, 3, 40  # W = 2 bitmask words, the second one partly past V
STRATEGIES = ["row", "split"]
FILTERS = [{}, {"top_k": 7, "top_p": 0.9}]


@pytest.fixture(params=STRATEGIES)
def strategy(request, monkeypatch):
    """Both chain strategies through the public op (the launcher picks by batch size)."""
    monkeypatch.setattr(triton_chain, "pick_strategy", lambda batch, device: request.param)
    return request.param


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


@pytest.mark.parametrize("one_hot", [True, False])
@pytest.mark.parametrize("filters", FILTERS)
def test_block_matches_reference(one_hot, filters, strategy):
    logits, drafts, kwargs = _chain_case(one_hot)
    kwargs.update(filters, method="block")
    expected = sk.verify_sampling(logits, drafts, backend="reference", **kwargs)
    actual = sk.verify_sampling(logits, drafts, backend="triton", **kwargs)
    assert_verification_equal(actual, expected, f"block {strategy} one_hot={one_hot} {filters}")


def test_block_is_not_the_token_rule_on_these_inputs():
    """The block tests above are not vacuous: on more rows block and token differ somewhere,
    and both strategies agree with the reference there too."""
    b, k = 6, 4
    logits, drafts, kwargs = _chain_case(False, b=b, k=k, seed=3)
    kwargs["num_draft_tokens"] = torch.full((b,), k)
    drafts = make_draft_probs(b, k, V, seed=4)[1]
    block = sk.verify_sampling(logits, drafts, backend="triton", method="block", **kwargs)
    token = sk.verify_sampling(logits, drafts, backend="triton", **kwargs)
    expected = sk.verify_sampling(logits, drafts, backend="reference", method="block", **kwargs)
    assert_verification_equal(block, expected, "block, full rows")
    assert not torch.equal(block.tokens, token.tokens)


@pytest.mark.parametrize("one_hot", [True, False])
def test_block_flat_layout_matches_padded_reference(one_hot, strategy):
    logits, drafts, kwargs = _chain_case(one_hot)
    nd = kwargs.pop("num_draft_tokens")
    q = kwargs.pop("draft_probs")
    flat_logits, flat_drafts, flat_q, cu = flatten_layout(logits, drafts, nd, q)
    expected = sk.verify_sampling(
        logits, drafts, q, num_draft_tokens=nd, method="block", backend="reference", **kwargs
    )
    actual = sk.verify_sampling(
        flat_logits, flat_drafts, flat_q, cu_num_draft_tokens=cu, max_spec_len=K,
        method="block", backend="triton", **kwargs,
    )  # fmt: skip
    assert_verification_equal(actual, expected, f"flat block {strategy} one_hot={one_hot}")


# --- token bitmask: chains -------------------------------------------------------------------


def _chain_call(mode, logits, drafts, kwargs, **extra):
    if mode == "greedy":
        nd = kwargs["num_draft_tokens"]
        return sk.verify_greedy(logits, drafts, num_draft_tokens=nd, **extra)
    method = "block" if mode == "block" else "token"
    return sk.verify_sampling(logits, drafts, method=method, **kwargs, **extra)


@pytest.mark.parametrize(
    "mode, one_hot",
    [("greedy", True), ("sampling", True), ("sampling", False), ("block", True), ("block", False)],
)
def test_chain_bitmask_equals_masked_logits(mode, one_hot, strategy):
    logits, drafts, kwargs = _chain_case(one_hot)
    if mode != "greedy":
        kwargs.update(FILTERS[1])
    mask = _random_bitmask((B, K + 1), V)
    masked = _masked(logits, mask)
    actual = _chain_call(mode, logits, drafts, kwargs, token_bitmask=mask, backend="triton")
    on_masked = _chain_call(mode, masked, drafts, kwargs, backend="triton")
    expected = _chain_call(mode, logits, drafts, kwargs, token_bitmask=mask, backend="reference")
    what = f"{mode} {strategy} one_hot={one_hot}"
    assert_verification_equal(actual, on_masked, what + ": bitmask vs masked logits")
    assert_verification_equal(actual, expected, what + ": triton vs reference")


@pytest.mark.parametrize("mode", ["sampling", "block"])
def test_chain_bitmask_flat_layout(mode, strategy):
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
        method=method, token_bitmask=flat_mask, backend="triton", **kwargs,
    )  # fmt: skip
    assert_verification_equal(actual, expected, f"flat {mode} {strategy} with a bitmask")


@pytest.mark.parametrize("mode", ["greedy", "sampling", "block"])
def test_bitmask_that_forbids_the_draft_rejects_it(mode, strategy):
    """Drafts the target accepts for sure (its argmax; for sampling rows drawn from ``q = p``)
    are rejected at position 0 once the bitmask forbids them there, and the emitted token is
    an allowed one."""
    b, k, v = 4, 2, V
    logits = torch.randn(b, k + 1, v) * 2
    p = torch.softmax(logits[:, :k], -1)
    drafts = logits[:, :k].argmax(-1)
    kwargs = dict(draft_probs=p, temperature=1.0, num_draft_tokens=torch.full((b,), k), seed=3)
    if mode == "greedy":
        kwargs["temperature"] = 0.0
    free = torch.full((b, k + 1, ref_bitmask.width(v)), -1, dtype=torch.int32)
    accepted = _chain_call(mode, logits, drafts, kwargs, token_bitmask=free, backend="triton")
    assert torch.equal(accepted.num_accepted, torch.full((b,), k))
    mask = free.clone()
    word, bit = drafts[:, 0] // 32, drafts[:, 0] % 32
    mask[torch.arange(b), 0, word] = ~(1 << bit).to(torch.int32)
    out = _chain_call(mode, logits, drafts, kwargs, token_bitmask=mask, backend="triton")
    assert torch.equal(out.num_accepted, torch.zeros(b, dtype=torch.int64))
    assert not bool((out.tokens[:, 0] == drafts[:, 0]).any())


# --- token bitmask: trees --------------------------------------------------------------------


def _tree_call(mode, logits, tokens, parents, nn, q, **extra):
    if mode == "greedy":
        return sk.verify_tree_greedy(logits, tokens, parents, num_nodes=nn, **extra)
    return sk.verify_tree_sampling(
        logits, tokens, parents, None if mode == "deterministic" else q, draft_mode=mode,
        temperature=torch.tensor([0.0, 0.7, 1.0, 1.3]), top_k=9, top_p=0.95, num_nodes=nn,
        seed=torch.tensor([1, 2, 3, 4]), **extra,
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["greedy", "deterministic", "without_replacement"])
def test_tree_bitmask_equals_masked_logits(mode):
    b, n = 4, 6
    logits, tokens, parents, nn = random_trees(b, n, V, seed=5)
    q = random_draft_probs(b, n, V)
    mask = _random_bitmask((b, n), V, seed=6)
    masked = _masked(logits, mask)
    args = (tokens, parents, nn, q)
    actual = _tree_call(mode, logits, *args, token_bitmask=mask, backend="triton")
    on_masked = _tree_call(mode, masked, *args, backend="triton")
    expected = _tree_call(mode, logits, *args, token_bitmask=mask, backend="reference")
    for got, want, what in ((actual, on_masked, "masked logits"), (actual, expected, "reference")):
        assert torch.equal(got.tokens, want.tokens), (mode, what, got.tokens, want.tokens)
        assert torch.equal(got.num_accepted, want.num_accepted), (mode, what)
