"""verify_greedy and accept_reject: Triton kernels against the reference, and the contract."""

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.ops import verify_sampling as triton_ops
from specdec_kernels.reference.verify_greedy import verify_greedy as reference_greedy

from helpers import (
    ALL_BACKENDS,
    KERNEL_BACKENDS,
    assert_same,
    assert_verification_equal,
    available,
    make_inputs,
    matching_prefix,
    skip_native_off_cpu,
)

SHAPES = [(1, 1, 7), (3, 4, 7), (3, 4, 1000), (1, 7, 1000), (37, 4, 1000), (3, 7, 32003)]
SLOW_SHAPES = [(37, 7, 32003), (37, 1, 32003)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _check_against_reference(b, k, v, dtype, device, backend, **kw):
    skip_native_off_cpu(backend, device)
    logits, drafts, nd = make_inputs(b, k, v, dtype=dtype, device=device, **kw)
    expected = sk.verify_greedy(logits, drafts, num_draft_tokens=nd, backend="reference")
    actual = sk.verify_greedy(logits, drafts, num_draft_tokens=nd, backend=backend)
    assert_verification_equal(actual, expected, f"{backend} B={b} K={k} V={v} {dtype} {kw}")
    return expected


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("b, k, v", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_matches_reference(b, k, v, dtype, device, backend):
    _check_against_reference(b, k, v, dtype, device, backend, ragged=True, strided=(b % 2 == 1))


@pytest.mark.slow
@pytest.mark.parametrize("b, k, v", SLOW_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_matches_reference_large(b, k, v, dtype, device):
    _check_against_reference(b, k, v, dtype, device, "triton", ragged=True, strided=True)


@pytest.mark.parametrize("b, k, v", SLOW_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", [KERNEL_BACKENDS[1]])
def test_native_matches_reference_large(b, k, v, dtype, backend):
    _check_against_reference(b, k, v, dtype, "cpu", backend, ragged=True, strided=True)


@pytest.mark.parametrize("strategy", ["row", "split"])
@pytest.mark.parametrize("b, k, v", [(5, 4, 1000), (2, 3, 9000)])
def test_both_strategies_match_reference(b, k, v, strategy, device):
    logits, drafts, nd = make_inputs(b, k, v, device=device, ragged=True, strided=True)
    nd = nd if nd is not None else torch.full((b,), k, device=device)
    tokens, accepted = triton_ops.verify(
        logits, drafts, None, nd, None, None, None, None, greedy_only=True, strategy=strategy
    )
    ref_tokens, ref_accepted, _ = reference_greedy(logits, drafts, nd)
    assert_same(tokens.cpu(), ref_tokens.cpu(), f"{strategy} tokens")
    assert_same(accepted.cpu(), ref_accepted.cpu(), f"{strategy} num_accepted")


def test_hand_checked_example():
    # argmax per position: 1, 2, 0. Draft [1, 0] accepts 1, rejects 0, emits the target's 2.
    logits = torch.tensor([[[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]]])
    for backend in available(ALL_BACKENDS):
        out = sk.verify_greedy(logits, torch.tensor([[1, 0]]), backend=backend)
        assert out.tokens.tolist() == [[1, 2, -1]]
        assert out.num_accepted.tolist() == [1]
        assert out.num_emitted.tolist() == [2]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_full_acceptance_emits_bonus_and_ragged_rows_stop_at_k_b(backend):
    logits = torch.randn(3, 5, 50)
    target = logits.argmax(-1)
    drafts = target[:, :4].clone()
    nd = torch.tensor([4, 2, 0])
    out = sk.verify_greedy(logits, drafts, num_draft_tokens=nd, backend=backend)
    assert out.num_accepted.tolist() == [4, 2, 0]
    assert out.tokens[0].tolist() == target[0].tolist()  # 4 drafts + bonus from row 4
    assert out.tokens[1].tolist() == target[1, :3].tolist() + [-1, -1]  # bonus from row k_b = 2
    assert out.tokens[2].tolist() == [target[2, 0].item(), -1, -1, -1, -1]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_ties_pick_first_index_like_torch_argmax(backend):
    logits = torch.zeros(2, 2, 10)
    logits[:, :, 3] = 1.0
    logits[:, :, 7] = 1.0  # tie between 3 and 7: argmax is 3
    out = sk.verify_greedy(logits, torch.tensor([[3], [7]]), backend=backend)
    assert out.tokens.tolist() == [[3, 3], [3, -1]]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_invariants(backend):
    logits, drafts, nd = make_inputs(37, 7, 100, ragged=True)
    out = sk.verify_greedy(logits, drafts, num_draft_tokens=nd, backend=backend)
    assert out.tokens.dtype == out.num_accepted.dtype == out.num_emitted.dtype == torch.int64
    assert torch.equal(out.num_accepted, matching_prefix(out.tokens, drafts, nd))
    assert bool((out.num_accepted <= nd).all()) and bool((out.num_accepted >= 0).all())
    pos = torch.arange(8)[None, :]
    assert bool((out.tokens[pos >= out.num_emitted[:, None]] == -1).all())
    assert bool((out.tokens[pos < out.num_emitted[:, None]] >= 0).all())


# --- accept_reject -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_accept_reject_1d_and_2d(backend):
    assert (
        sk.accept_reject(torch.tensor([5, 7, 9]), torch.tensor([5, 7, 1]), backend=backend).item()
        == 2
    )
    assert sk.accept_reject(torch.tensor([1, 2]), torch.tensor([0, 2]), backend=backend).item() == 0
    assert sk.accept_reject(torch.tensor([1, 2]), torch.tensor([1, 2]), backend=backend).item() == 2
    zero_d = sk.accept_reject(torch.tensor([4]), torch.tensor([4]), backend=backend)
    assert zero_d.dim() == 0 and zero_d.dtype == torch.int64
    d = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [9, 2, 3, 4]])
    v = torch.tensor([[1, 2, 0, 4], [1, 2, 3, 4], [1, 2, 3, 4]], dtype=torch.int32)
    out = sk.accept_reject(d, v, backend=backend)
    assert out.tolist() == [2, 4, 0] and out.dtype == torch.int64


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("b, k", [(1, 1), (37, 7), (3, 1500), (5, 0)])
def test_accept_reject_kernel_matches_reference(b, k, device, backend):
    skip_native_off_cpu(backend, device)
    a = torch.randint(0, 3, (b, k), device=device)
    c = torch.where(
        torch.rand(b, k, device=device) < 0.9, a, torch.randint(0, 3, (b, k), device=device)
    )
    assert_same(
        sk.accept_reject(a, c, backend=backend).cpu(),
        sk.accept_reject(a, c, backend="reference").cpu(),
        f"{backend} accept_reject",
    )


def test_accept_reject_errors():
    with pytest.raises(ValueError, match=r"same shape.*\[3\].*\[4\]"):
        sk.accept_reject(torch.zeros(3, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="verifier_tokens must have dtype"):
        sk.accept_reject(torch.zeros(3, dtype=torch.long), torch.zeros(3))
    with pytest.raises(ValueError, match="backend must be one of"):
        sk.accept_reject(
            torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long), backend="cuda"
        )
