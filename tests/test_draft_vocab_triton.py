"""A reduced draft vocabulary (``draft_vocab_map``, EAGLE-3's draft-to-target map) in the Triton
chain kernels: they read ``q`` through the ``[V]`` int32 inverse index (``draft_vocab_inv``).

Oracle: the same kernels on ``q`` scattered to ``[B, K, V]`` (``reference.layout
.scatter_draft_vocab``, the specification), token for token (bitwise equal tokens and
num_accepted), over both chain strategies, padded and flat layouts, the token rule and block
verification (with and without top-k / top-p, so the candidate buffer's race reads ``q`` too),
fp32 and bf16 draft probabilities, drafts outside the map (``q = 0``: never accepted),
``V_draft = 1`` and odd vocabularies. Kernels run under Triton's interpreter on CPU: the shapes
are small.
"""

import pytest
import torch

from specdec_kernels.ops import verify_sampling as vs
from specdec_kernels.reference.layout import scatter_draft_vocab

from helpers import assert_same

pytestmark = pytest.mark.skipif(
    not vs.__dict__.get("_split_pivot_kernel"), reason="Triton kernels not importable"
)

STRATEGIES = ("row", "split")


def _draft_vocab(v, v_draft, g):
    """``(d2t [V_draft], inv [V] int32)``: distinct target ids of the draft columns (id 0 always
    outside the map, so an out-of-map draft exists), and the column of each target id or -1."""
    d2t = torch.randperm(v - 1, generator=g)[:v_draft] + 1
    inv = torch.full((v,), -1, dtype=torch.int32)
    inv[d2t] = torch.arange(v_draft, dtype=torch.int32)
    return d2t, inv


def _case(b, k, v, v_draft, dtype, seed):
    """Target logits close to the draft's distribution (so that drafts are accepted), reduced
    draft probabilities ``[B, K, V_draft]``, drafts (mostly sampled from ``q``, some outside the
    map), ragged counts and the inverse index."""
    g = torch.Generator().manual_seed(seed)
    d2t, inv = _draft_vocab(v, v_draft, g)
    q = torch.rand(b, k, v_draft, generator=g) ** 3 + 1e-3
    q = (q / q.sum(-1, keepdim=True)).to(dtype)
    dense = scatter_draft_vocab(q.float(), inv)  # [B, K, V]
    logits = torch.randn(b, k + 1, v, generator=g)
    logits[:, :k] = torch.log(dense + 1e-4) + 0.5 * logits[:, :k]
    cols = torch.multinomial(q.float().reshape(-1, v_draft), 1, generator=g).reshape(b, k)
    drafts = d2t[cols]
    outside = torch.rand(b, k, generator=g) < 0.2
    outside[0, 0] = False  # row 0: its first draft inside the map, its second outside
    if k > 1:
        outside[0, 1] = True
    drafts = torch.where(outside, torch.zeros_like(drafts), drafts)  # id 0: outside the map
    nd = torch.randint(0, k + 1, (b,), generator=g)
    nd[0] = k
    return logits, drafts, nd, q, inv


def _flat(logits, nd, q):
    """The padded rows in the flat layout (one garbage row in front of the logits, one behind
    the draft probabilities): ``[R, V]`` logits, ``[R', V_draft]`` q and their row starts."""
    b = logits.shape[0]
    flat = torch.cat(
        [torch.full_like(logits[0, :1], 7.0)] + [logits[i, : nd[i] + 1] for i in range(b)]
    )
    qflat = torch.cat([q[i, : nd[i]] for i in range(b)] + [q[0, :1]])
    return {
        "target_logits": flat,
        "logits_row_start": torch.cat(
            [torch.ones(1, dtype=torch.int64), (nd + 1).cumsum(0)[:-1] + 1]
        ),
        "draft_probs": qflat,
        "probs_row_start": torch.cat([torch.zeros(1, dtype=torch.int64), nd.cumsum(0)[:-1]]),
    }


def _verify(logits, drafts, nd, q, *, strategy, flat, inv=None, top_k=None, top_p=None, **kw):
    b = logits.shape[0]
    rows = dict(target_logits=logits, draft_probs=q)
    if flat:
        rows = _flat(logits, nd, q)
    return vs.verify(
        rows.pop("target_logits"),
        drafts,
        rows.pop("draft_probs"),
        nd,
        torch.tensor([1.0, 0.7, 1.3, 1.0] * b)[:b],
        top_k,
        top_p,
        torch.arange(b, dtype=torch.int64) * 7919 + 11,
        greedy_only=False,
        strategy=strategy,
        draft_vocab_inv=inv,
        **rows,
        **kw,
    )


# (id, B, K, V, V_draft, dtype, method, flat, top_k, top_p)
CASES = [
    ("token-odd", 3, 3, 257, 64, torch.float32, "token", False, None, None),
    ("token-bf16-flat", 3, 3, 1000, 300, torch.bfloat16, "token", True, None, None),
    ("token-filters", 3, 2, 1000, 300, torch.float32, "token", False, 50, 0.9),
    ("block-flat", 3, 3, 257, 100, torch.float32, "block", True, None, None),
    ("block-bf16", 2, 4, 1000, 200, torch.bfloat16, "block", False, None, None),
    ("block-filters", 3, 3, 1000, 300, torch.float32, "block", True, 40, 0.95),
    ("v-draft-1", 3, 2, 257, 1, torch.float32, "token", False, None, None),
    ("v-draft-1-block", 2, 2, 1000, 1, torch.bfloat16, "block", True, None, None),
]


@pytest.mark.parametrize(
    "b, k, v, v_draft, dtype, method, flat, top_k, top_p",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_draft_vocab_map_equals_the_scattered_probs(
    b, k, v, v_draft, dtype, method, flat, top_k, top_p
):
    logits, drafts, nd, q, inv = _case(b, k, v, v_draft, dtype, seed=v + v_draft + k)
    dense = scatter_draft_vocab(q, inv)  # [B, K, V], the dtype of q
    kw = dict(
        flat=flat,
        method=method,
        top_k=None if top_k is None else torch.tensor([top_k, 0, 2 * top_k, top_k] * b)[:b],
        top_p=None if top_p is None else torch.tensor([top_p, 1.0, 0.8, top_p] * b)[:b],
    )
    accepted = []
    for strategy in STRATEGIES:
        got = _verify(logits, drafts, nd, q, strategy=strategy, inv=inv, **kw)
        want = _verify(logits, drafts, nd, dense, strategy=strategy, **kw)
        assert_same(got[0], want[0], f"{method} {strategy} tokens")
        assert_same(got[1], want[1], f"{method} {strategy} num_accepted")
        accepted.append(got[1])
    assert_same(accepted[0], accepted[1], "row vs split num_accepted")
    n_acc = accepted[0]
    # a draft outside the map has q = 0: never accepted, so no row walks past one
    for i in range(b):
        assert bool((inv[drafts[i, : n_acc[i]]] >= 0).all()), (i, drafts[i], n_acc[i])
    if v_draft > 1:  # the case accepts drafts (an equality of all-rejections proves little)
        assert int(n_acc.sum()) > 0
    if k > 1:  # row 0's second draft lies outside the map: its walk stops there at the latest
        assert int(n_acc[0]) <= 1


def test_outside_drafts_are_rejected_whatever_the_target():
    """Every draft outside the map, the target sure of it: none is accepted (``q = 0``), and the
    recovered token is the target's own choice, the rejected draft (``max(0, p - 0) = p``)."""
    b, k, v, v_draft = 2, 3, 257, 16
    g = torch.Generator().manual_seed(3)
    d2t, inv = _draft_vocab(v, v_draft, g)
    outside = (inv < 0).nonzero()[:, 0]
    drafts = outside[torch.randint(0, outside.numel(), (b, k), generator=g)]
    logits = torch.full((b, k + 1, v), -10.0)
    logits.scatter_(2, torch.cat([drafts, drafts[:, :1]], 1)[..., None], 20.0)
    q = torch.full((b, k, v_draft), 1.0 / v_draft)
    nd = torch.full((b,), k)
    for strategy in STRATEGIES:
        for method in ("token", "block"):
            tokens, n_acc = _verify(
                logits, drafts, nd, q, strategy=strategy, flat=False, inv=inv, method=method
            )
            assert_same(n_acc, torch.zeros(b, dtype=torch.int64), f"{strategy} {method}")
            assert_same(tokens[:, 0], drafts[:, 0], f"{strategy} {method} recovered")
