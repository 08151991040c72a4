"""The native C++ CPU kernels: what the shared matrix (test_verify_*.py, test_statistics.py,
test_validation.py, test_zero_probability.py, test_custom_ops.py) does not cover: results that do
not depend on the thread count (row vs split strategy) or on the CPU capability the kernels were
compiled for, the adapter's own argument checks, and how the backend is chosen."""

import os
import textwrap

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels import _dispatch, _warnings

from helpers import (
    PLAIN_CHAIN,
    assert_same,
    assert_verification_equal,
    make_draft_probs,
    make_inputs,
    run_under_capability,
)

pytestmark = pytest.mark.skipif(
    not _dispatch.native_available(), reason="the C++ extension (native backend) is not built"
)


def _case(b=6, k=4, v=9000, dtype=torch.bfloat16, filters=True):
    logits, _, nd = make_inputs(b, k, v, dtype=dtype, ragged=True, strided=True, scale=3.0)
    q, drafts = make_draft_probs(b, k, v, dtype=dtype)
    kwargs = dict(
        draft_probs=q,
        num_draft_tokens=nd,
        seed=torch.arange(b) * 31 + 7,
        temperature=torch.tensor([0.0, 0.7, 1.0, 1.3, 1.0, 0.9])[:b],
    )
    if filters:
        kwargs["top_k"] = torch.tensor([0, 7, 50, 0, 3, 100])[:b]
        kwargs["top_p"] = torch.tensor([0.9, 1.0, 0.7, 0.5, 1.0, 0.95])[:b]
    return logits, drafts, kwargs


@pytest.mark.parametrize("filters", [False, True])
def test_result_does_not_depend_on_the_thread_count(filters):
    """One thread walks rows (the row strategy); more threads than rows split every position's
    vocabulary chunks across threads (the split strategy). Chunks are fixed by V alone and merged
    in order, so both give the same tokens, and the reference's."""
    logits, drafts, kwargs = _case(filters=filters)
    expected = sk.verify_sampling(logits, drafts, backend="reference", **kwargs)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 16):  # 16 > B = 6: split strategy
            torch.set_num_threads(n)
            out = sk.verify_sampling(logits, drafts, backend="native", **kwargs)
            assert_verification_equal(out, expected, f"{n} threads")
            greedy = sk.verify_greedy(
                logits, drafts, backend="native", num_draft_tokens=kwargs["num_draft_tokens"]
            )
            assert_verification_equal(
                greedy,
                sk.verify_greedy(
                    logits, drafts, backend="reference", num_draft_tokens=kwargs["num_draft_tokens"]
                ),
                f"greedy, {n} threads",
            )
    finally:
        torch.set_num_threads(threads)


_CAPABILITY_SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    import specdec_kernels as sk
    from helpers import make_draft_probs, make_inputs
    print(torch.backends.cpu.get_cpu_capability())
    logits, _, nd = make_inputs(5, 3, 5000, ragged=True, strided=True, scale=3.0)
    q, drafts = make_draft_probs(5, 3, 5000)
    for kw in (dict(), dict(top_k=20, top_p=0.8), dict(temperature=0.0)):
        kw = dict(kw, num_draft_tokens=nd, seed=11)
        a = sk.verify_sampling(logits, drafts, q, backend="native", **kw)
        b = sk.verify_sampling(logits, drafts, q, backend="reference", **kw)
        assert torch.equal(a.tokens, b.tokens), (kw, a.tokens, b.tokens)
    print("ok")
""")


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_every_cpu_capability_build_matches_the_reference(capability):
    """The kernels are compiled per CPU capability and follow torch's own choice, which
    ATEN_CPU_CAPABILITY lowers: the DEFAULT (scalar) and AVX2 builds are exercised here on any
    machine that runs them (the AVX-512 one runs in every other test where the CPU has it)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    run_under_capability(_CAPABILITY_SCRIPT.format(tests=tests), capability)


def test_adapter_checks_name_the_argument():
    logits, drafts, _ = make_inputs(2, 3, 10)
    nd = torch.tensor([3, 3])

    def op(*args):  # the padded chain entry's first nine arguments
        return torch.ops.specdec.native_verify_ex(*args, *PLAIN_CHAIN)

    with pytest.raises(ValueError, match=r"draft_tokens must have shape \[B, K\] = \[2, 3\]"):
        op(logits, drafts[:, :2], None, nd, None, None, None, None, True)
    with pytest.raises(ValueError, match="temperature and seeds are required"):
        op(logits, drafts, None, nd, None, None, None, None, False)
    with pytest.raises(ValueError, match=r"draft_probs must have shape \[B, K, V\] = \[2, 3, 10\]"):
        op(
            logits,
            drafts,
            torch.ones(2, 3, 9),
            nd,
            torch.ones(2),
            None,
            None,
            torch.arange(2),
            False,
        )
    with pytest.raises(ValueError, match="stride 1 in its last"):
        op(logits.transpose(1, 2), drafts.new_zeros(2, 9), None, nd, None, None, None, None, True)
    with pytest.raises(TypeError, match="target_logits must be float32, bfloat16 or float16"):
        op(logits.double(), drafts, None, nd, None, None, None, None, True)
    mask = torch.full((2, 4, 1), -1, dtype=torch.int32)

    def masked(bitmask, mode=0):
        tail = (None, None, bitmask, False, mode, 0.0, 0.0)
        return torch.ops.specdec.native_verify_ex(
            logits, drafts, None, nd, torch.ones(2), None, None, torch.arange(2), False, *tail
        )

    with pytest.raises(
        ValueError, match=r"token_bitmask must have shape \[B, K\+1, W\] = \[2, 4, 1\]"
    ):
        masked(mask[:, :3])
    with pytest.raises(ValueError, match=r"token_bitmask must have shape"):
        masked(mask.new_zeros(2, 4, 2))  # W != ceil(V / 32)
    with pytest.raises(TypeError, match="token_bitmask must be int32"):
        masked(mask.long())
    with pytest.raises(ValueError, match="mode must be 0"):
        masked(None, mode=3)
    with pytest.raises(ValueError, match="same shape"):
        torch.ops.specdec.native_accept_reject(drafts, drafts[:, :2])


def test_auto_backend_and_fallbacks(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(_warnings, "_warned", set())  # the warnings below are one-time ones
    monkeypatch.delenv("SPECDEC_BACKEND", raising=False)
    assert _dispatch.resolve_backend(None, cpu) == "native"
    assert _dispatch.resolve_backend("native", cpu) == "native"
    monkeypatch.setenv("SPECDEC_BACKEND", "native")
    assert _dispatch.resolve_backend(None, cpu) == "native"
    # on another device: that device's automatic choice, with a one-time warning
    with pytest.warns(RuntimeWarning, match="native backend runs on CPU tensors only"):
        assert _dispatch.resolve_backend("native", torch.device("meta")) == "reference"
    # without the extension: the reference, with a one-time warning
    monkeypatch.setattr(_dispatch, "native_available", lambda: False)
    monkeypatch.delenv("SPECDEC_BACKEND")
    assert _dispatch.resolve_backend(None, cpu) == "reference"
    with pytest.warns(RuntimeWarning, match="native backend needs the C..? extension"):
        assert _dispatch.resolve_backend("native", cpu) == "reference"


@pytest.mark.parametrize("start", [2**63 - 1, 2**63 - 2, 2**62])
def test_flat_row_starts_near_int64_max_clamp_to_the_last_row(start):
    """Flat layout: position j of row b reads row clamp(row_start[b] + j, 0, rows - 1). The sum
    is never formed past the last row (issue 19: it wrapped for a garbage start near INT64_MAX,
    an UBSan report, and read row 0 from j = 1 on), so such a start reads the last row at every
    position, like a start of rows - 1."""
    rows, V = 4, 6
    logits = torch.randn(rows, V)
    logits[-1, 1] = 10.0  # the last row's argmax is 1, every other row's is 2
    logits[:-1, 2] = 10.0
    q = torch.softmax(torch.randn(rows, V), dim=-1)
    drafts, nd = torch.tensor([[1, 1, 1]]), torch.tensor([3])
    op = torch.ops.specdec.native_verify_ex

    def run(first, greedy):
        sampling = (torch.ones(1), None, None, torch.tensor([5])) if not greedy else (None,) * 4
        return op(
            logits,
            drafts,
            None if greedy else q,
            nd,
            *sampling,
            greedy,
            torch.tensor([first]),
            None if greedy else torch.tensor([first]),
            None,
            False,
            0,
            0.0,
            0.0,
        )

    for greedy in (True, False):
        expected = run(rows - 1, greedy)
        got = run(start, greedy)
        for name, a, e in zip(("tokens", "num_accepted"), got, expected):
            assert_same(a, e, f"{name} (greedy={greedy}, start={start})")
    assert run(start, True)[0].tolist() == [[1, 1, 1, 1]]
