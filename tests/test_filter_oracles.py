"""Oracles from the peers' tests: no-op filters, top-p ties at the boundary, block verification's
toy values.

* A filter that removes nothing (``top_k >= V``, ``top_p = 1``) gives exactly the tokens of the
  call without it, on every backend, as a scalar and as a per-row tensor (TensorRT-LLM's review
  of its fast path found a difference there).
* Top-p with ties at the boundary (vLLM's case: 2 tokens at 2.0, 18 at 1.0, the rest at -20,
  ``top_p = 0.95``). This package's rule (API.md, section 1): top-p keeps the shortest prefix of
  the descending order whose mass reaches ``top_p`` **and every token tied with its last value**.
  A sort-based rule cuts the same threshold value (1.0) but keeps 17 of the 18 tied tokens,
  chosen by their position in the sort; this package keeps all 18 (the documented difference).
* Block verification (Sun et al. 2024) on their toy: ``p = (1/3, 2/3)``, ``q = (2/3, 1/3)``, i.i.d.,
  ``gamma = 2``: expected accepted drafts 10/9 with token verification, 11/9 with block
  verification (SGLang PR 36516's values).
"""

import math

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.reference.verify_sampling import filtered_probs

from helpers import NATIVE, chi_square_check

B, K, V = 16, 3, 257


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K + 1, V, generator=g) * 2.5
    drafts = torch.randint(0, V, (B, K), generator=g)
    drafts[: B // 2] = logits[: B // 2, :K].argmax(-1)  # half the rows accept: bonus races too
    q = torch.softmax(torch.randn(B, K, V, generator=g) * 2.0, -1)
    return logits, drafts, q


NOOPS = {
    "k=V": dict(top_k=V),
    "k>V": dict(top_k=V + 5),
    "k=2**40": dict(top_k=2**40),
    "p=1": dict(top_p=1.0),
    "k=V,p=1": dict(top_k=V, top_p=1.0),
    "per-row": "tensor",
}
# every no-op on the reference and the native kernels; the interpreted Triton kernels (~5 s a
# call here) on a scalar top-k past V and on per-row values (top-k past V, top-p = 1, both)
CASES = [
    pytest.param(
        backend, with_q, name, marks=marks, id=f"{name}-{'q' if with_q else 'one-hot'}-{backend}"
    )
    for backend, marks in (("reference", ()), ("native", NATIVE.marks))
    for with_q in (False, True)
    for name in NOOPS
] + [pytest.param("triton", True, name, id=f"{name}-q-triton") for name in ("k>V", "per-row")]


@pytest.mark.parametrize("backend,with_q,name", CASES)
def test_noop_filters_are_identities(backend, with_q, name):
    noop = NOOPS[name]
    logits, drafts, q = _inputs()
    q = q if with_q else None
    if noop == "tensor":  # per-row no-op values, mixed with rows that have no filter at all
        noop = dict(
            top_k=torch.tensor([V, V + 1, 0, 10**9] * (B // 4)),
            top_p=torch.tensor([1.0, 1.0, 1.0, 1.0] * (B // 4)),
        )
    seeds = torch.arange(B) + 1000
    for temperature in (1.0, torch.tensor([0.7, 1.3] * (B // 2))):
        plain = sk.verify_sampling(
            logits, drafts, q, temperature=temperature, seed=seeds, backend=backend
        )
        filtered = sk.verify_sampling(
            logits, drafts, q, temperature=temperature, seed=seeds, backend=backend, **noop
        )
        assert torch.equal(filtered.tokens, plain.tokens), noop
        assert torch.equal(filtered.num_accepted, plain.num_accepted)


def _ties_row(v=64):
    """vLLM's case: 2 tokens at 2.0, 18 at 1.0, the rest at -20 (ids shuffled)."""
    values = torch.full((v,), -20.0)
    values[:2] = 2.0
    values[2:20] = 1.0
    perm = torch.randperm(v, generator=torch.Generator().manual_seed(5))
    return values[perm]


def test_top_p_ties_rule_of_the_reference():
    row = _ties_row()
    p = filtered_probs(row[None, None], torch.ones(1), None, torch.tensor([0.95]))[0, 0]
    kept = p > 0
    assert torch.equal(kept, row >= 1.0)  # threshold 1.0, all 18 tied tokens kept: 20 tokens
    # the sort-based rule: ascending sort, drop the prefix whose cumulative mass <= 1 - top_p
    full = torch.softmax(row.double(), -1)
    ordered, index = full.sort(stable=True)
    dropped = ordered.cumsum(0) <= 1 - 0.95
    sort_kept = torch.ones_like(kept)
    sort_kept[index[dropped]] = False
    assert float(row[sort_kept].min()) == 1.0  # the same threshold value ...
    assert int(sort_kept.sum()) == 19  # ... but one tied token dropped by its sort position
    assert torch.allclose(p.double(), torch.where(kept, full, 0.0) / full[kept].sum(), atol=1e-6)


def _ties_tokens(backend, rows, v=64):
    logits = _ties_row(v).expand(rows, 1, v).contiguous()
    out = sk.verify_sampling(
        logits,
        torch.zeros(rows, 0, dtype=torch.int64),
        top_p=0.95,
        seed=torch.arange(rows) + 77,
        backend=backend,
    )
    return out.tokens[:, 0]


@pytest.mark.parametrize("backend", ["reference", NATIVE])
def test_top_p_ties_at_the_boundary(backend):
    """The reference and the native kernels emit exactly the 20 kept tokens, with the
    renormalised probabilities (chi-square at level 1e-7, power >= 0.99 against a 2% bias:
    helpers.chi_square_check, 20,000 rows), and never a token below the threshold."""
    row = _ties_row()
    tokens = _ties_tokens(backend, 20000)
    kept = row >= 1.0
    assert bool(kept[tokens].all())
    assert set(tokens.tolist()) == set(kept.nonzero().flatten().tolist())  # all 20 appear
    full = torch.softmax(row.double(), -1)
    chi_square_check(tokens, torch.where(kept, full, 0.0) / full[kept].sum(), backend)


def test_top_p_ties_at_the_boundary_triton():
    """The interpreted Triton kernels (too slow here for the statistics) give the reference's
    tokens on 48 rows, so they keep the same 20 tokens."""
    assert torch.equal(_ties_tokens("triton", 48), _ties_tokens("reference", 48))


@pytest.mark.parametrize("backend", ["reference", NATIVE])
@pytest.mark.parametrize("method,want", [("token", 10 / 9), ("block", 11 / 9)])
def test_block_verification_toy_values(backend, method, want):
    """Sun et al.'s toy: the mean number of accepted drafts over 200,000 rows is within 4.5
    standard errors of 10/9 (token) and 11/9 (block); the two differ by 1/9 = ~50 standard
    errors (sd of the count <= 1, so the standard error is <= 0.0023)."""
    n = 200_000
    g = torch.Generator().manual_seed(11)
    p = torch.tensor([1 / 3, 2 / 3])
    q = torch.tensor([2 / 3, 1 / 3])
    drafts = torch.multinomial(q.expand(n * 2, 2), 1, generator=g).view(n, 2)
    logits = p.log().expand(n, 3, 2).contiguous()
    out = sk.verify_sampling(
        logits,
        drafts,
        q.expand(n, 2, 2).contiguous(),
        seed=torch.arange(n),
        method=method,
        backend=backend,
    )
    acc = out.num_accepted.double()
    se = float(acc.std()) / math.sqrt(n)
    assert abs(float(acc.mean()) - want) < 4.5 * se, (float(acc.mean()), want, se)
    # and the output stays the target's: the first emitted token follows p
    chi_square_check(out.tokens[:, 0], p.double(), f"{method} first token")
