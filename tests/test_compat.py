"""The drop-in adapters (specdec_kernels.compat), vLLM's flattened layout in the core ops, and
typical acceptance (sk.verify_typical).

Expected values are built independently of the code under test: greedy answers from argmax by
hand, one-hot targets whose result is forced, the typical-acceptance rule recomputed in float64
here, the upstream counter semantics (FlashInfer) on cases where every accept test is decided.

Statistical tests reuse test_statistics' checks: two-sided level ALPHA = 1e-7 per check (fewer
than 10 checks here, so a correct implementation fails a run with probability < 1e-6); each
chi-square check asserts its own power >= 0.99 against a 2% bias before testing.
"""

import math
from types import SimpleNamespace

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.compat.flashinfer import chain_speculative_sampling
from specdec_kernels.compat.vllm import rejection_sample
from specdec_kernels.reference import rng

from helpers import (
    ALL_BACKENDS,
    NATIVE,
    TRITON_CUDA,
    available,
    chi_square_check,
    flatten_layout,
    make_draft_probs,
    make_inputs,
    no_host_sync,
    on_backend,
)

# --- vLLM's flattened layout in the core ops ----------------------------------------------------


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("with_q", [False, True])
def test_flat_layout_equals_padded(backend, with_q):
    b, k, v = 5, 3, 37
    logits, drafts, _ = make_inputs(b, k, v, seed=3)
    nd = torch.tensor([3, 0, 2, 0, 1])  # ragged, with empty requests
    q = make_draft_probs(b, k, v, drafts=drafts)[0] if with_q else None
    padded_drafts = torch.where(torch.arange(k)[None] < nd[:, None], drafts, -1)
    flat_logits, flat_drafts, flat_q, cu = flatten_layout(logits, drafts, nd, q)
    g = sk.verify_greedy(logits, padded_drafts, num_draft_tokens=nd, backend=backend)
    gf = sk.verify_greedy(flat_logits, flat_drafts, cu_num_draft_tokens=cu, backend=backend)
    assert torch.equal(g.tokens, gf.tokens) and torch.equal(g.num_accepted, gf.num_accepted)
    configs = [dict(), dict(top_k=5, temperature=0.7), dict(top_p=0.8)]
    if backend == "triton":  # the interpreter is slow; filters: the row-strategy test below
        configs = [dict(temperature=0.7)]
    for kwargs in configs:
        s = sk.verify_sampling(
            logits, padded_drafts, q, num_draft_tokens=nd, seed=11, backend=backend, **kwargs
        )
        sf = sk.verify_sampling(
            flat_logits, flat_drafts, flat_q, cu_num_draft_tokens=cu, seed=11, backend=backend,
            max_spec_len=k, **kwargs,
        )  # fmt: skip
        assert torch.equal(s.tokens, sf.tokens), (kwargs, s.tokens, sf.tokens)
        assert torch.equal(s.num_accepted, sf.num_accepted)


def test_flat_layout_triton_row_strategy():
    # The row strategy (one program per request) reads the flat rows through the same offsets.
    from specdec_kernels.ops import verify_sampling as triton_ops

    b, k, v = 3, 2, 37
    logits, drafts, _ = make_inputs(b, k, v, seed=4)
    q = make_draft_probs(b, k, v, drafts=drafts)[0]
    nd = torch.tensor([2, 0, 1])
    flat_logits, _, flat_q, cu = flatten_layout(logits, drafts, nd, q)
    start = cu - nd
    args = (nd, torch.full((b,), 0.9), torch.full((b,), 5), None, torch.arange(b))
    padded = triton_ops.verify(logits, drafts, q, *args, greedy_only=False, strategy="row")
    flat = triton_ops.verify(
        flat_logits, drafts, flat_q, *args, greedy_only=False, strategy="row",
        logits_row_start=start + torch.arange(b), probs_row_start=start,
    )  # fmt: skip
    ref = sk.verify_sampling(
        logits, drafts, q, num_draft_tokens=nd, temperature=0.9, top_k=5, seed=torch.arange(b),
        backend="reference",
    )  # fmt: skip
    assert torch.equal(padded[0], flat[0]) and torch.equal(flat[0], ref.tokens)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_flat_layout_no_drafts_at_all(backend):
    # every request without drafts: only bonus rows, an empty [0, V] draft_probs
    logits = torch.randn(3, 11)
    out = sk.verify_sampling(
        logits, torch.zeros(0, dtype=torch.long), torch.zeros(0, 11),
        cu_num_draft_tokens=torch.zeros(3, dtype=torch.long), seed=5, backend=backend,
    )  # fmt: skip
    assert out.tokens.shape == (3, 1) and (out.num_accepted == 0).all()
    greedy = sk.verify_greedy(
        logits, torch.zeros(0, dtype=torch.long),
        cu_num_draft_tokens=torch.zeros(3, dtype=torch.long), backend=backend,
    )  # fmt: skip
    assert greedy.tokens[:, 0].tolist() == logits.argmax(-1).tolist()


def test_flat_layout_greedy_by_hand():
    # request 0: drafts [1, 2], argmax [1, 0, 2] -> [1, 0]; request 1: no drafts, argmax 2
    flat = torch.tensor([[0.0, 5, 0], [5, 0, 0], [0, 0, 5], [0, 0, 5]])
    out = sk.verify_greedy(flat, torch.tensor([1, 2]), cu_num_draft_tokens=torch.tensor([2, 2]))
    assert out.tokens.tolist() == [[1, 0, -1], [2, -1, -1]]
    assert out.num_accepted.tolist() == [1, 0]


def test_flat_layout_errors():
    flat = torch.randn(4, 7)
    drafts = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="num_tokens \\+ B"):
        sk.verify_greedy(flat[:3], drafts, cu_num_draft_tokens=torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="cu_num_draft_tokens\\[-1\\]"):
        sk.verify_greedy(flat[:3], drafts, cu_num_draft_tokens=torch.tensor([1]))
    with pytest.raises(ValueError, match="non-decreasing"):
        sk.verify_greedy(flat, drafts, cu_num_draft_tokens=torch.tensor([2, 1]))
    with pytest.raises(ValueError, match="not both"):
        sk.verify_greedy(
            flat, drafts, cu_num_draft_tokens=torch.tensor([2, 2]),
            num_draft_tokens=torch.tensor([2, 0]),
        )  # fmt: skip
    with pytest.raises(ValueError, match="draft_tokens\\[1\\] = 9"):
        sk.verify_greedy(flat, torch.tensor([1, 9]), cu_num_draft_tokens=torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="max_spec_len"):
        sk.verify_greedy(flat, drafts, cu_num_draft_tokens=torch.tensor([2, 2]), max_spec_len=1)
    with pytest.raises(ValueError, match="seed and generator"):
        sk.verify_sampling(
            flat, drafts, cu_num_draft_tokens=torch.tensor([2, 2]), seed=1,
            generator=torch.Generator(),
        )  # fmt: skip
    with pytest.raises(ValueError, match="draft_probs must have shape"):
        sk.verify_sampling(flat, drafts, torch.rand(3, 7), cu_num_draft_tokens=torch.tensor([2, 2]))


@pytest.mark.parametrize("backend", available(["triton", NATIVE]))
def test_flat_layout_bad_offsets_stay_in_bounds(backend):
    # validate=False with counts that overrun the rows: clamped reads, ids in [0, V) or -1
    flat = torch.randn(4, 7)
    cu = torch.tensor([5, 9])
    drafts = torch.tensor([1, 2, 3, 4, 5, 6, 0, 1, 2])
    for fn in (sk.verify_greedy, sk.verify_sampling):
        try:
            out = fn(flat, drafts, cu_num_draft_tokens=cu, max_spec_len=5, validate=False,
                     backend=backend)  # fmt: skip
        except ValueError:
            continue  # the row count is a shape: it is always checked
        assert ((out.tokens >= -1) & (out.tokens < 7)).all()


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize(
    "cu", [[2**40, 4], [-5, -9], [2**62, -(2**62)]], ids=["huge", "neg", "wrap"]
)
def test_flat_layout_garbage_counts_do_not_size_the_output(backend, cu):
    """validate=False and max_spec_len=None: the width derived from garbage cu_num_draft_tokens
    is clamped into [0, num_tokens] (no 8 TB allocation, no negative arange)."""
    flat, drafts = torch.randn(6, 10), torch.tensor([1, 2, 3, 4])
    q = torch.softmax(torch.randn(4, 10), -1)
    for call in (
        lambda: sk.verify_greedy(flat, drafts, cu_num_draft_tokens=torch.tensor(cu),
                                 backend=backend, validate=False),
        lambda: sk.verify_sampling(flat, drafts, q, cu_num_draft_tokens=torch.tensor(cu),
                                   seed=0, backend=backend, validate=False),
    ):  # fmt: skip
        out = call()
        assert out.tokens.shape[0] == 2 and 1 <= out.tokens.shape[1] <= 4 + 1
        assert ((out.tokens >= -1) & (out.tokens < 10)).all()


def test_out_of_int64_host_ints_are_value_errors():
    flat, drafts, cu = torch.randn(4, 7), torch.tensor([1, 2]), torch.tensor([2, 2])
    for big in (2**70, -(2**70)):
        with pytest.raises(ValueError, match=rf"max_spec_len .*got {big}"):
            sk.verify_greedy(flat, drafts, cu_num_draft_tokens=cu, max_spec_len=big)
    with pytest.raises(ValueError, match=rf"top_k must fit in int64.*got {2**70}"):
        sk.verify_sampling(flat, drafts, cu_num_draft_tokens=cu, top_k=2**70, seed=0)


# --- typical acceptance -----------------------------------------------------------------------


def _typical_by_definition(logits, drafts, nd, temperature, threshold, alpha):
    """num_accepted of Medusa's rule, recomputed in float64 independently of the package."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    h = -(p * torch.where(p > 0, p.log(), 0)).sum(-1)  # [B, K+1]
    bound = torch.clamp(alpha * torch.exp(-h), max=threshold)
    accepted = []
    for b in range(logits.shape[0]):
        n = 0
        while n < int(nd[b]) and p[b, n, drafts[b, n]] > bound[b, n]:
            n += 1
        accepted.append(n)
    return torch.tensor(accepted), p


@pytest.mark.parametrize("backend", available(["reference", NATIVE]))
def test_typical_matches_definition(backend):
    b, k, v = 64, 4, 50
    logits, drafts, nd = make_inputs(b, k, v, ragged=True, scale=2.5, seed=5)
    drafts = drafts.clamp(min=0)
    out = sk.verify_typical(
        logits, drafts, num_draft_tokens=nd, temperature=0.8, posterior_threshold=0.2,
        posterior_alpha=0.5, seed=torch.arange(b), backend=backend,
    )  # fmt: skip
    expected, p = _typical_by_definition(logits, drafts, nd, 0.8, 0.2, 0.5)
    assert torch.equal(out.num_accepted, expected)
    assert expected.min() < expected.max()  # the case exercises both outcomes
    rows = torch.arange(b)
    for i in range(b):
        n = int(expected[i])
        assert out.tokens[i, :n].tolist() == drafts[i, :n].tolist()
        assert out.tokens[i, n + 1 :].eq(-1).all()
    recovered_or_bonus = out.tokens[rows, expected]
    assert (p[rows, expected, recovered_or_bonus] > 0).all()  # in p_j's support
    assert torch.equal((out.tokens >= 0).sum(-1), expected + 1)  # accepted + the recovered/bonus


def test_typical_native_equals_reference_and_greedy_rows():
    if "native" not in available([NATIVE]):
        pytest.skip("no native backend")
    b, k, v = 16, 3, 300
    logits, drafts, nd = make_inputs(b, k, v, ragged=True, seed=8)
    drafts = drafts.clamp(min=0)
    temp = torch.rand(b) + 0.3
    temp[::4] = 0  # greedy rows
    kwargs = dict(num_draft_tokens=nd, temperature=temp, top_k=20, top_p=0.9, seed=3)
    ref = sk.verify_typical(logits, drafts, backend="reference", **kwargs)
    nat = sk.verify_typical(logits, drafts, backend="native", **kwargs)
    assert torch.equal(ref.tokens, nat.tokens)
    greedy = sk.verify_greedy(logits, drafts, num_draft_tokens=nd)
    assert torch.equal(ref.tokens[::4], greedy.tokens[::4])


@pytest.mark.parametrize("backend", available(["reference", NATIVE]))
def test_typical_rejection_token_follows_target(backend):
    # The draft has p ~ 1e-4 < the threshold: always rejected at position 0, and the token
    # emitted there must follow p_0 (chi-square, power asserted inside).
    n, v = 200_000, 10
    logits = torch.linspace(0, 2, v).repeat(2, 1)
    logits[0, 0] = -8.0
    out = sk.verify_typical(
        logits.expand(n, 2, v), torch.zeros(n, 1, dtype=torch.long),
        seed=torch.arange(n), backend=backend, validate=False,
    )  # fmt: skip
    assert (out.num_accepted == 0).all()
    chi_square_check(out.tokens[:, 0], torch.softmax(logits[0].double(), -1), "typical reject")


def test_typical_bad_arguments():
    logits, drafts, _ = make_inputs(2, 2, 9)
    with pytest.raises(ValueError, match="posterior_threshold"):
        sk.verify_typical(logits, drafts, posterior_threshold=-0.1)
    with pytest.raises(TypeError, match="posterior_alpha"):
        sk.verify_typical(logits, drafts, posterior_alpha=True)
    with pytest.raises(ValueError, match="seed and generator"):
        sk.verify_typical(logits, drafts, seed=1, generator=torch.Generator())


# --- FlashInfer -------------------------------------------------------------------------------


def test_flashinfer_counters_and_layout():
    # Every accept test is decided: p(x) = 1 passes whatever u, p(x) = 0 never does.
    b, n, v = 3, 4, 6
    drafts = torch.tensor([[1, 2, 3, 4], [5, 5, 5, 5], [0, 1, 2, 3]], dtype=torch.int32)
    target = torch.zeros(b, n + 1, v)
    target[torch.arange(b)[:, None], torch.arange(n), drafts.long()] = 1.0  # all pass...
    target[0, 1] = torch.eye(v)[0]  # ...except row 0 at position 1 (target says 0)
    target[1, 0] = torch.eye(v)[4]  # row 1 at position 0 (target says 4)
    target[:, n] = torch.eye(v)[2]  # bonus rows: token 2
    q = torch.full((b, n, v), 1.0 / v)
    acc = torch.tensor([10, 20, 30], dtype=torch.int32)
    emi = torch.tensor([1, 1, 1], dtype=torch.int32)
    out, acc_out, emi_out = chain_speculative_sampling(
        q, drafts, target, acc, emi, seed=0, offset=0
    )
    assert out.dtype == torch.int32 and out.shape == (b, n + 1)
    assert out.tolist() == [[1, 0, -1, -1, -1], [4, -1, -1, -1, -1], [0, 1, 2, 3, 2]]
    assert acc_out is acc and emi_out is emi  # accumulated in place and returned
    assert acc.tolist() == [10 + 3, 20 + 3, 30 + 4]  # passes also after the first rejection
    assert emi.tolist() == [1 + 1, 1 + 0, 1 + 4]  # the accepted prefix
    _, a2, e2 = chain_speculative_sampling(q, drafts, target)
    assert a2.tolist() == [3, 3, 4] and e2.tolist() == [1, 0, 4] and a2.dtype == torch.int32


def _accept_tests_by_hand(q, drafts, target, seeds, after):
    """The accepted counter's rule, one position at a time in Python: position i > after[b]
    counts when draft x is in [0, V), q(x) > 0 and u * q(x) < p(x) in float32, u the accept
    uniform of (seed, i) from the counter RNG's primitives."""
    b, n, v = q.shape
    out = []
    for r in range(b):
        key = rng.row_key(seeds[r : r + 1])
        count = 0
        for i in range(int(after[r]) + 1, n):
            x = int(drafts[r, i])
            if not 0 <= x < v:
                continue
            u = rng.uniform(rng.stream_key(key, i, rng.PURPOSE_ACCEPT), 0)
            qx, px = q[r, i, x].float(), target[r, i, x].float()
            count += bool(qx > 0) and bool(u * qx < px)
        out.append(count)
    return torch.tensor(out)


def _accept_tests(*args, backend):
    return torch.ops.specdec.accept_tests_passed(*args, backend)


@pytest.mark.parametrize("backend", [*ALL_BACKENDS, TRITON_CUDA])
@pytest.mark.parametrize(
    "dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.float16)], ids=str
)
def test_flashinfer_accept_tests_kernel_counts_by_hand(backend, dtypes):
    """``specdec::accept_tests_passed`` (the drop-in's accepted counter, one kernel) against the
    rule by hand: drafts outside the vocabulary, ``q(x) = 0``, ``after`` from -1 to n, seeds of
    both signs, mixed input dtypes."""
    b, n, v = 48, 5, 9
    g = torch.Generator().manual_seed(4)
    q = torch.softmax(torch.randn(b, n, v, generator=g), -1)
    q[:, :, 2] = 0.0  # drafts of token 2 never pass
    target = torch.softmax(torch.randn(b, n + 1, v, generator=g), -1)
    drafts = torch.randint(-2, v + 2, (b, n), generator=g)
    seeds = torch.randint(-(2**62), 2**62, (b,), generator=g)
    after = torch.randint(-1, n + 1, (b,), generator=g)
    q, target = q.to(dtypes[0]), target.to(dtypes[1])
    want = _accept_tests_by_hand(q, drafts, target, seeds, after)
    assert int(want.sum()) > b // 2  # the tests pass often enough to mean something
    got = on_backend(backend, _accept_tests, q, drafts, target, seeds, after)
    assert got.dtype == torch.int64 and got.tolist() == want.tolist()
    empty = on_backend(backend, _accept_tests, q[:, :0], drafts[:, :0], target, seeds, after)
    assert empty.tolist() == [0] * b


def test_flashinfer_one_hot_target_reproduced_exactly():
    b, n, v = 40, 3, 11
    g = torch.Generator().manual_seed(2)
    t = torch.randint(0, v, (b, n + 1), generator=g)
    drafts = torch.where(torch.rand(b, n, generator=g) < 0.6, t[:, :n], (t[:, :n] + 1) % v)
    q = torch.softmax(torch.randn(b, n, v, generator=g), -1)
    out, _, emitted = chain_speculative_sampling(
        q, drafts, torch.nn.functional.one_hot(t, v).float(), seed=7, offset=3
    )
    match = (drafts == t[:, :n]).long().cumprod(-1).sum(-1)
    assert torch.equal(emitted.long(), match)
    for i in range(b):
        m = int(match[i])
        assert out[i, : m + 1].tolist() == t[i, : m + 1].tolist()
        assert (out[i, m + 1 :] == -1).all()


def test_flashinfer_distribution():
    # Tokens at positions 0 and 1 follow p_0 and p_1 (chi-square, power asserted inside).
    n_rows, n, v = 150_000, 2, 8
    g = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(n + 1, v, generator=g), -1)
    q1 = torch.softmax(torch.randn(n, v, generator=g), -1)
    drafts = torch.multinomial(q1, n_rows, replacement=True, generator=g).T
    out, accepted, emitted = chain_speculative_sampling(
        q1.expand(n_rows, n, v), drafts, p.expand(n_rows, n + 1, v),
        seed=torch.arange(n_rows), offset=torch.zeros(n_rows, dtype=torch.long),
    )  # fmt: skip
    tokens = out.long()
    chi_square_check(tokens[:, 0], p[0].double(), "flashinfer position 0")
    chi_square_check(tokens[emitted >= 1, 1], p[1].double(), "flashinfer position 1")
    # the accepted counter's mean is sum_i sum_x min(p_i, q_i) (each position tested once)
    beta = torch.minimum(p[:n], q1).sum(-1).sum().item()
    sd = math.sqrt(n * 0.25 / n_rows)
    assert abs(accepted.double().mean().item() - beta) < 6 * sd


def test_flashinfer_seeds_per_row_and_generator():
    b, n, v = 6, 3, 9
    q, drafts = make_draft_probs(b, n, v, seed=3)
    target = torch.softmax(torch.randn(b, n + 1, v), -1)
    seeds = torch.arange(b) * 1000
    offsets = torch.arange(b) + 5
    full, _, _ = chain_speculative_sampling(q, drafts, target, seed=seeds, offset=offsets)
    for i in range(b):  # batch invariance with [B] seed / offset tensors
        one, _, _ = chain_speculative_sampling(
            q[i : i + 1], drafts[i : i + 1], target[i : i + 1],
            seed=seeds[i : i + 1], offset=offsets[i : i + 1],
        )  # fmt: skip
        assert torch.equal(one[0], full[i])
    g1 = torch.Generator().manual_seed(5)
    g2 = torch.Generator().manual_seed(5)
    a = chain_speculative_sampling(q, drafts, target, generator=g1)[0]
    assert torch.equal(a, chain_speculative_sampling(q, drafts, target, generator=g2)[0])


def test_flashinfer_bad_inputs_and_out_of_range_ids():
    q, drafts = make_draft_probs(2, 3, 9)
    target = torch.softmax(torch.randn(2, 4, 9), -1)
    with pytest.raises(ValueError, match="target_probs must have shape"):
        chain_speculative_sampling(q, drafts, target[:, :3])
    with pytest.raises(TypeError, match="draft_token_ids"):
        chain_speculative_sampling(q, drafts.float(), target)
    with pytest.raises(TypeError, match="seed"):
        chain_speculative_sampling(q, drafts, target, seed=1.5, offset=0)
    with pytest.raises(ValueError, match="maybe_output_accepted_token_num"):
        chain_speculative_sampling(q, drafts, target, torch.zeros(3, dtype=torch.int32))
    bad = drafts.clone()
    bad[:, 0] = torch.tensor([-1, 10**6])  # never read: rejected at position 0
    out, acc, emi = chain_speculative_sampling(q, bad, target, seed=1, offset=0)
    assert (emi == 0).all() and ((out[:, 0] >= 0) & (out[:, 0] < 9)).all()


# --- vLLM -----------------------------------------------------------------------------------

WORKED = [3, 0, 2, 0, 1]  # vLLM's worked example of draft counts


def _meta(temperature=None, generators=None):
    if temperature is None:
        return SimpleNamespace(all_greedy=True, all_random=False, temperature=None, generators={})
    greedy = temperature == 0
    return SimpleNamespace(
        all_greedy=bool(greedy.all()), all_random=bool((~greedy).all()),
        temperature=temperature, generators=generators or {},
    )  # fmt: skip


def _worked_inputs(v=13, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(WORKED)
    target_tok = torch.randint(0, v, (t,), generator=g)
    drafts = torch.where(torch.rand(t, generator=g) < 0.6, target_tok, (target_tok + 3) % v)
    cu = torch.tensor(WORKED).cumsum(0)
    bonus = torch.arange(100, 100 + len(WORKED))[:, None] % v
    return target_tok, drafts, cu, bonus


def _expected_by_hand(drafts, target_tok, bonus):
    """vLLM's greedy rule: accepted prefix, then the target's token, or the bonus token."""
    rows, start = [], 0
    for b, k in enumerate(WORKED):
        row = []
        for j in range(k):
            row.append(int(target_tok[start + j]))
            if drafts[start + j] != target_tok[start + j]:
                break
        else:
            row.append(int(bonus[b, 0]))
        rows.append(row + [-1] * (max(WORKED) + 1 - len(row)))
        start += k
    return rows


@pytest.mark.parametrize("mode", ["all_greedy", "temperature_zero", "one_hot_random"])
def test_vllm_worked_example(mode):
    v = 13
    target_tok, drafts, cu, bonus = _worked_inputs(v)
    if mode == "all_greedy":  # raw logits are fine on this path (upstream's early v1)
        target, meta = torch.randn(len(drafts), v) + 4 * torch.eye(v)[target_tok], _meta()
    elif mode == "temperature_zero":
        target = torch.softmax(torch.randn(len(drafts), v) + 4 * torch.eye(v)[target_tok], -1)
        meta = _meta(torch.zeros(len(WORKED)))
        meta.all_greedy = False  # exercise the mixed-batch path with greedy rows
    else:  # random rows with one-hot targets: forced to the same answer
        target = torch.eye(v)[target_tok]
        meta = _meta(torch.ones(len(WORKED)))
    q = torch.softmax(torch.randn(len(drafts), v), -1)
    out = rejection_sample(drafts, WORKED, max(WORKED), cu, q, target, bonus, meta)
    assert out.dtype == torch.int32 and out.shape == (len(WORKED), max(WORKED) + 1)
    assert out.tolist() == _expected_by_hand(drafts, target_tok, bonus)


def test_vllm_mixed_batch_and_ngram():
    v = 13
    target_tok, drafts, cu, bonus = _worked_inputs(v, seed=1)
    target = torch.softmax(torch.randn(len(drafts), v) + 3 * torch.eye(v)[target_tok], -1)
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.7, 1.0])
    out = rejection_sample(drafts, WORKED, 3, cu, None, target, bonus, _meta(temperature))
    greedy = rejection_sample(drafts, WORKED, 3, cu, None, target, bonus, _meta())
    assert torch.equal(out[temperature == 0], greedy[temperature == 0])
    assert ((out >= -1) & (out < v)).all()
    assert out[1].tolist() == [int(bonus[1, 0]), -1, -1, -1]  # no drafts: the bonus token
    # n-gram drafts (draft_probs None) with one-hot targets: forced answer
    one_hot = torch.eye(v)[target_tok]
    forced = rejection_sample(drafts, WORKED, 3, cu, None, one_hot, bonus, _meta(torch.ones(5)))
    assert forced.tolist() == _expected_by_hand(drafts, target_tok, bonus)


def test_vllm_generators_and_distribution():
    # 100k requests of one draft each: the token emitted at position 0 follows p (accepted
    # drafts included), and a request's generator fixes its result.
    n_req, v = 100_000, 8
    g = torch.Generator().manual_seed(9)
    p = torch.softmax(torch.randn(v, generator=g), -1)
    q = torch.softmax(torch.randn(v, generator=g), -1)
    drafts = torch.multinomial(q, n_req, replacement=True, generator=g)
    cu = torch.arange(1, n_req + 1)
    bonus = torch.zeros(n_req, 1, dtype=torch.long)
    meta = _meta(torch.ones(n_req))
    out = rejection_sample(
        drafts, [1] * n_req, 1, cu, q.expand(n_req, v), p.expand(n_req, v), bonus, meta
    )
    chi_square_check(out[:, 0].long(), p.double(), "vllm position 0")
    small = slice(0, 4)
    gens = {i: torch.Generator().manual_seed(100 + i) for i in range(4)}
    args = (drafts[small], [1] * 4, 1, cu[:4], q.expand(4, v), p.expand(4, v), bonus[:4])
    a = rejection_sample(*args, _meta(torch.ones(4), gens))
    gens = {i: torch.Generator().manual_seed(100 + i) for i in range(4)}
    assert torch.equal(a, rejection_sample(*args, _meta(torch.ones(4), gens)))


def test_vllm_bad_inputs():
    target_tok, drafts, cu, bonus = _worked_inputs()
    target = torch.eye(13)[target_tok]
    with pytest.raises(ValueError, match="cu_num_draft_tokens"):
        rejection_sample(drafts, WORKED, 3, cu[:4], None, target, bonus, _meta())
    with pytest.raises(ValueError, match="bonus_token_ids"):
        rejection_sample(drafts, WORKED, 3, cu, None, target, bonus[:4], _meta())
    with pytest.raises(ValueError, match="target_probs must have shape"):
        rejection_sample(drafts, WORKED, 3, cu, None, target[:5], bonus, _meta())
    empty = rejection_sample(
        torch.zeros(0, dtype=torch.long), [0, 0], 2, torch.tensor([0, 0]), None,
        torch.zeros(0, 13), torch.tensor([[4], [5]]), _meta(),
    )  # fmt: skip
    assert empty.tolist() == [[4, -1, -1], [5, -1, -1]]


# --- SGLang -----------------------------------------------------------------------------------

# The tree 0 -> {1 -> 2, 3 -> 4 -> 5} in SGLang's linked lists.
NEXT_TOKEN = [1, 2, -1, 4, 5, -1]
NEXT_SIBLING = [-1, 3, -1, -1, -1, -1]
PARENTS = [-1, 0, 1, 0, 3, 4]


def _sglang_buffers(b, n=6, s=4, fill=-7):
    predicts = torch.full((b * n,), fill, dtype=torch.int32)
    accept_index = torch.full((b, s), -1, dtype=torch.int32)
    return predicts, accept_index, torch.full((b,), fill, dtype=torch.int32)


def test_sglang_parents_from_lists():
    from specdec_kernels.compat.sglang import parents_from_lists

    got = parents_from_lists(torch.tensor([NEXT_TOKEN]), torch.tensor([NEXT_SIBLING]))
    assert got.tolist() == [PARENTS]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 64])
def test_sglang_parents_from_lists_random_trees(n):
    """Random trees of N nodes (parents before children, siblings in index order, a row of
    them one long sibling list, the deepest case for the parents to travel), SGLang's lists
    built from them, links that end a list written as -1 or as any index outside [0, N): the
    parents come back. Nodes a row does not use (no link reaches them) get -1."""
    from specdec_kernels.compat.sglang import parents_from_lists

    g = torch.Generator().manual_seed(n)
    rows = 16
    nxt = torch.full((rows, n), -1, dtype=torch.int64)
    sib = torch.full((rows, n), -1, dtype=torch.int64)
    want = torch.full((rows, n), -1, dtype=torch.int64)
    for r in range(rows):
        used = n if r % 4 else max(1, n // 2)  # some rows use fewer nodes
        for j in range(1, used):
            want[r, j] = 0 if r == 1 else int(torch.randint(0, j, (1,), generator=g))
        last_child: dict[int, int] = {}
        for j in range(1, used):
            p = int(want[r, j])
            if p in last_child:
                sib[r, last_child[p]] = j
            else:
                nxt[r, p] = j
            last_child[p] = j
        for t in (nxt, sib):  # an end of list may be any index outside [0, N)
            ends = t[r] == -1
            t[r, ends] = torch.where(torch.rand(int(ends.sum()), generator=g) < 0.5, -1 - r, n + r)
    assert parents_from_lists(nxt, sib).tolist() == want.tolist()


@pytest.mark.parametrize("s", [4, 2])
def test_sglang_verify_tree_greedy_by_hand(s):
    from specdec_kernels.compat.sglang import verify_tree_greedy

    cand = torch.tensor([[7, 10, 20, 30, 40, 50]] * 3)
    # row 0: 30 after the root, 40 after node 3, 50 after node 4, 77 after node 5 (full path)
    # row 1: 10 after the root, 21 after node 1 (rejects node 2): path 0 -> 1
    # row 2: 99 after the root: nothing accepted
    target = torch.tensor([[30, 0, 0, 40, 50, 77], [10, 21, 0, 0, 0, 0], [99, 0, 0, 0, 0, 0]])
    b, n = 3, 6
    rindex = torch.arange(b * n).reshape(b, n)  # request b's node i sits at b * N + i
    predicts, accept_index, accept_num = _sglang_buffers(b, s=s)
    verify_tree_greedy(
        predicts, accept_index, accept_num, cand, rindex,
        torch.tensor([NEXT_TOKEN] * b), torch.tensor([NEXT_SIBLING] * b), target,
    )  # fmt: skip
    full = {  # accepted path (global indices) and predicts per row, by hand
        0: ([0, 3, 4, 5], {0: 30, 3: 40, 4: 50, 5: 77}),
        1: ([6, 7], {6: 10, 7: 21}),
        2: ([12], {12: 99}),
    }
    expected_predicts = [-7] * (b * n)
    for row, (path, pred) in full.items():
        if len(path) > s:  # the depth limit S - 1: cut, the cut node predicts its target
            path = path[:s]
            pred = {k: target.reshape(-1)[k].item() for k in path}
        assert accept_index[row].tolist() == path + [-1] * (s - len(path))
        assert accept_num[row].item() == len(path) - 1
        for k, value in pred.items():
            expected_predicts[k] = value
    assert predicts.tolist() == expected_predicts  # other entries untouched


def _sampling_call(probs, cand, rindex=None, s=4, seed=0):
    from specdec_kernels.compat.sglang import tree_speculative_sampling_target_only

    b, n, _ = probs.shape
    rindex = torch.arange(b * n).reshape(b, n) if rindex is None else rindex
    predicts, accept_index, accept_num = _sglang_buffers(b, n, s)
    draft_probs = torch.zeros_like(probs)
    g = torch.Generator().manual_seed(seed)
    tree_speculative_sampling_target_only(
        predicts, accept_index, accept_num, cand, rindex,
        torch.tensor([NEXT_TOKEN] * b), torch.tensor([NEXT_SIBLING] * b),
        torch.rand(b, n, generator=g), torch.rand(b, generator=g), probs, draft_probs,
    )  # fmt: skip
    assert (draft_probs == 0).all()  # never used as scratch
    return predicts, accept_index, accept_num


def test_sglang_sampling_one_hot_target_reproduced():
    from specdec_kernels.compat.sglang import verify_tree_greedy

    b, n, v = 24, 6, 9
    g = torch.Generator().manual_seed(6)
    cand = torch.randint(0, v, (b, n), generator=g)
    target_tok = torch.where(
        torch.rand(b, n, generator=g) < 0.5, cand.roll(-1, dims=1), torch.randint(0, v, (b, n))
    )
    target_tok[:, 0] = torch.where(torch.rand(b, generator=g) < 0.5, cand[:, 3], cand[:, 1])
    probs = torch.nn.functional.one_hot(target_tok, v).float()
    got = _sampling_call(probs, cand)
    want = _sglang_buffers(b)
    verify_tree_greedy(*want, cand, torch.arange(b * n).reshape(b, n),
                       torch.tensor([NEXT_TOKEN] * b), torch.tensor([NEXT_SIBLING] * b),
                       target_tok)  # fmt: skip
    for x, y in zip(got, want):
        assert torch.equal(x, y)
    assert got[2].max() >= 2  # the case reaches deep paths
    # the probabilities are read in place: a view whose tokens are not contiguous, and bfloat16,
    # give the same result
    strided = torch.zeros(b, n, v, 2).select(-1, 0)
    strided.copy_(probs)
    assert strided.stride(-1) != 1
    for inputs in (strided, probs.bfloat16()):
        for x, y in zip(_sampling_call(inputs, cand), want):
            assert torch.equal(x, y)


def test_sglang_sampling_distribution():
    # Thresholds 1: the token after the root follows p_root, and after accepting node 3 the next
    # token follows p_3 (chi-square, power asserted inside).
    b, n, v = 120_000, 6, 8
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(n, v, generator=g)
    logits[0, 3] += 2.5  # the root's target often takes node 3: samples after it
    p = torch.softmax(logits, -1)
    cand = torch.tensor([[0, 1, 2, 3, 4, 5]]).expand(b, n)  # node i's token is i
    predicts, accept_index, _ = _sampling_call(p.expand(b, n, v), cand)
    root = predicts.reshape(b, n)[:, 0].long()
    chi_square_check(root, p[0].double(), "sglang root")
    at3 = accept_index[:, 1] == torch.arange(b) * n + 3  # node 3's global index
    chi_square_check(predicts.reshape(b, n)[at3, 3].long(), p[3].double(), "sglang node 3")


def test_sglang_bad_inputs():
    from specdec_kernels.compat.sglang import (
        tree_speculative_sampling_target_only,
        verify_tree_greedy,
    )

    b, n, v = 1, 6, 8
    cand = torch.zeros(b, n, dtype=torch.long)
    lists = (torch.arange(n)[None], torch.tensor([NEXT_TOKEN]), torch.tensor([NEXT_SIBLING]))
    probs = torch.full((b, n, v), 1.0 / v)
    args = (cand, *lists, torch.rand(b, n), torch.rand(b), probs, torch.zeros_like(probs))
    with pytest.raises(ValueError, match="threshold_acc must be 1"):
        tree_speculative_sampling_target_only(*_sglang_buffers(b), *args, threshold_acc=0.5)
    with pytest.raises(TypeError, match="predicts"):
        buffers = _sglang_buffers(b)
        verify_tree_greedy(buffers[0].long(), *buffers[1:], cand, *lists, cand)
    with pytest.raises(ValueError, match="target_predict"):
        verify_tree_greedy(*_sglang_buffers(b), cand, *lists, cand[:, :3])


def test_bench_compat_smoke():
    from specdec_kernels.benchmarks import compat as bench

    rows = bench.run(batches=(2,), k=2, v=64, budget_s=0.001)
    assert [r["entry_point"] for r in rows] == list(bench.ENTRY_POINTS)
    for r in rows:
        assert r["core_ms"] > 0 and r["compat_ms"] > 0 and r["pairs"] >= 5
        assert bench.format_row(r).startswith(r["entry_point"])


BENCH_PAIRS = [
    "flashinfer.chain_speculative_sampling",
    "vllm.rejection_sample",
    "flat_layout",
    "sglang.verify_tree_greedy",
    "sglang.tree_speculative_sampling_target_only",
]


@pytest.mark.parametrize("entry_point", BENCH_PAIRS)
def test_bench_compat_calls_never_read_the_device(entry_point):
    """Both calls of every benchmarked pair run without a host read (the CPU emulation of CUDA's
    sync debug mode), so that on a GPU both can be captured in CUDA graphs and compared as
    such: the tree pairs' core calls once read their output width from the device (no
    ``max_depth``), and every SGLang row was timed eagerly for it."""
    from specdec_kernels.benchmarks import compat as bench

    assert entry_point in bench.ENTRY_POINTS
    fns = bench.SETUP[entry_point](2, 4, 100, torch.device("cpu"))
    for which in ("core", "compat"):
        fns[which]()  # first calls may cache (kernels, seeds) outside the guarded block
        with no_host_sync():
            fns[which]()


def test_bench_compat_times_both_calls_the_same_way_on_cuda():
    """When one call can be captured in a CUDA graph and the other cannot, both are timed eagerly:
    a replayed graph against an eager call compares launch overheads (an H200 run once showed a
    core call at 5x its adapter's time). A fake ``measure`` stands in for the device timers."""
    from specdec_kernels.benchmarks import compat as bench
    from specdec_kernels.benchmarks.results import Timing

    def capturable():
        pass

    def syncs():
        pass

    asked = []

    def measure(fn, device, *, budget_s, cuda_graph=True):
        asked.append((fn.__name__, cuda_graph))
        graph = cuda_graph and fn is capturable
        return Timing(
            0.1 if graph else 1.0, 0.1, 1.0, -1, "do_bench_cudagraph" if graph else "do_bench"
        )

    fns = {"core": capturable, "compat": syncs}
    times, method = bench._paired_cuda(fns, "cuda", 0.01, measure)
    assert method == "do_bench" and {t.method for t in times.values()} == {"do_bench"}
    assert asked[-2:] == [("capturable", False), ("syncs", False)]
    asked.clear()
    times, method = bench._paired_cuda(
        {"core": capturable, "compat": capturable}, "cuda", 0.01, measure
    )
    assert method == "do_bench_cudagraph" and len(asked) == 2
