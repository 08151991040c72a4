"""The Triton filters' one-pass path: the candidate buffer, its fallback, and the traffic it saves.

Top-k / top-p thresholds come from the candidates the statistics pass gathered above a sampled
cutoff (``ops._common.select_filter``) and the race runs over them; a position whose kept set is
not in the buffer falls back to the search over the row. These tests pin both branches against
the reference, token for token, check that each case took the branch it was built for (the split
strategy's per-position flag), and count under the interpreter the bytes each call loads
(``benchmarks.traffic``): the filtered call may load at most 1.3x the unfiltered one, one-hot
sampling and greedy read each row once, the filter's row pass is spread over every chunk.
"""

import pytest
import torch

from specdec_kernels.benchmarks.traffic import count_traffic
from specdec_kernels.ops import verify_sampling as vs
from specdec_kernels.ops._common import CANDIDATES
from specdec_kernels.reference import verify_sampling as ref

pytestmark = pytest.mark.skipif(
    not vs.__dict__.get("_split_pivot_kernel"), reason="Triton kernels not importable"
)


def _run(logits, drafts, q, top_k, top_p, strategy, seeds=None, token_bitmask=None):
    """Tokens and accepted counts of the Triton kernels, with the split strategy's per-position
    "from the buffer" flags (None for the row strategy)."""
    b, k1, _ = logits.shape
    seen = {}
    original = vs._partials

    def capture(*args, **kwargs):
        seen["parts"] = original(*args, **kwargs)
        return seen["parts"]

    vs._partials = capture
    try:
        tokens, n = vs.verify(
            logits,
            drafts,
            q,
            torch.full((b,), k1 - 1),
            torch.ones(b),
            None if top_k is None else torch.full((b,), top_k),
            None if top_p is None else torch.full((b,), top_p, dtype=torch.float32),
            torch.arange(b) * 7 + 3 if seeds is None else seeds,
            greedy_only=False,
            strategy=strategy,
            token_bitmask=token_bitmask,
        )
    finally:
        vs._partials = original
    mode = seen["parts"].cand.mode.clone() if "parts" in seen else None
    return tokens, n, mode


def _reference(logits, drafts, q, top_k, top_p, seeds=None):
    b = logits.shape[0]
    return ref.verify_sampling(
        logits,
        drafts,
        q,
        torch.full((b,), logits.shape[1] - 1),
        torch.ones(b),
        None if top_k is None else torch.full((b,), top_k),
        None if top_p is None else torch.full((b,), top_p, dtype=torch.float32),
        torch.arange(b) * 7 + 3 if seeds is None else seeds,
    )


def _check(logits, drafts, q, top_k, top_p, want_buffer):
    """Both strategies equal the reference; the split flags say every position took the
    ``want_buffer`` branch."""
    want = _reference(logits, drafts, q, top_k, top_p)
    for strategy in ("row", "split"):
        tokens, n, mode = _run(logits, drafts, q, top_k, top_p, strategy)
        assert torch.equal(tokens, want[0]) and torch.equal(n, want[1]), strategy
        if mode is not None:
            assert bool((mode == int(want_buffer)).all()), (strategy, mode.tolist())


@pytest.mark.parametrize("with_q", [False, True])
def test_peaked_rows_take_the_buffer(with_q):
    g = torch.Generator().manual_seed(0)
    b, k, v = 3, 3, 6000
    logits = torch.randn(b, k + 1, v, generator=g) * 3
    drafts = logits[:, :k].argmax(-1)
    drafts[1] = torch.randint(0, v, (k,), generator=g)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 3, -1) if with_q else None
    _check(logits, drafts, q, 50, 0.9, want_buffer=True)
    _check(logits, drafts, q, 20, None, want_buffer=True)


def test_flat_rows_under_top_p_fall_back_exactly():
    """Top-p 0.9 alone on near-flat rows keeps most of the vocabulary: far more than the buffer
    holds, so every position searches, with the reference's tokens."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5000, generator=g) * 0.1
    drafts = torch.randint(0, 5000, (2, 2), generator=g)
    _check(logits, drafts, None, None, 0.9, want_buffer=False)


def test_ties_at_the_threshold():
    """Inside the buffer a tie group at the k-th value is kept whole (every tied token is a
    candidate); a tie group larger than the buffer (the cutoff lands in it) overflows and falls
    back; both match the reference."""
    v = 4 * CANDIDATES
    g = torch.Generator().manual_seed(2)
    rest = torch.randn(v - 70, generator=g) * 0.5 - 3.0
    row = torch.cat([torch.full((30,), 4.0), torch.full((40,), 2.0), rest])
    logits = row[torch.randperm(v, generator=g)].repeat(2, 3, 1).contiguous()
    drafts = torch.tensor([[0, 1], [2, 3]])
    _check(logits, drafts, None, 50, 0.95, want_buffer=True)  # k-th in the group of 40
    flat = torch.cat([torch.full((30,), 4.0), torch.zeros(v - 30)])
    logits = flat[torch.randperm(v, generator=g)].repeat(2, 3, 1).contiguous()
    _check(logits, drafts, None, 200, None, want_buffer=False)  # k-th among 4066 ties


def test_fewer_allowed_tokens_than_k():
    """A bitmask that leaves 3 tokens under top-k 50: the cutoff is -inf, every finite token is a
    candidate and the buffer is complete, so no search runs."""
    g = torch.Generator().manual_seed(3)
    b, k, v = 2, 2, 3000
    logits = torch.randn(b, k + 1, v, generator=g) * 3
    allowed = torch.tensor([5, 77, 2999])
    words = (v + 31) // 32
    bits = torch.zeros(b, k + 1, words, dtype=torch.int32)
    for t in allowed.tolist():
        bits[..., t // 32] |= 1 << (t % 32)
    masked = torch.full_like(logits, float("-inf"))
    masked[..., allowed] = logits[..., allowed]
    drafts = torch.tensor([[5, 77], [3, 2999]])
    want = _reference(masked, drafts, None, 50, 0.9)
    for strategy in ("row", "split"):
        tokens, n, mode = _run(logits, drafts, None, 50, 0.9, strategy, token_bitmask=bits)
        assert torch.equal(tokens, want[0]) and torch.equal(n, want[1]), strategy
        if mode is not None:
            assert bool(mode.all()), mode.tolist()


def _loads(logits, drafts, q, top_k, top_p):
    b = logits.shape[0]
    with count_traffic(logits=logits, q=q) as t:
        vs.verify(
            logits,
            drafts,
            q,
            torch.full((b,), drafts.shape[1]),
            torch.ones(b),
            None if top_k is None else torch.full((b,), top_k),
            None if top_p is None else torch.full((b,), top_p, dtype=torch.float32),
            torch.arange(b),
            greedy_only=False,
            strategy="split",
        )
    return t


def test_traffic_one_pass():
    """B = 1, K = 2, V = 32000 (8 chunks), bench-like rows: the filtered call loads <= 1.3x the
    unfiltered one; one-hot sampling reads each row once (the race rides on the statistics
    pass; twice before it, and while its log-domain form was switched off); the filter's row
    pass runs 8 programs per position."""
    g = torch.Generator().manual_seed(4)
    logits = (torch.randn(1, 3, 32000, generator=g) * 3).to(torch.bfloat16)
    drafts = torch.randint(0, 32000, (1, 2), generator=g)
    plain = _loads(logits, drafts, None, None, None)
    filtered = _loads(logits, drafts, None, 50, 0.9)
    assert plain.passes("logits") <= 1.1, plain
    assert filtered.loaded["logits"] <= 1.3 * plain.loaded["logits"], (filtered, plain)
    programs = dict(filtered.launches)
    assert programs["_split_stats_kernel"] == 3 * 8, filtered.launches
