"""Block verification (Sun et al. 2024, arXiv 2403.10444): the reference
``specdec_kernels.reference.verify_block`` against the paper's rule and against the target.

The models of these tests are *context dependent*: small tables give the target's and the draft's
next-token distribution for every prefix of length 0 .. K (V = 4, so 4**3 = 64 prefixes at most),
the drafts are sampled from the draft table along their own prefix and the target rows are
gathered along the draft path, as in real speculative decoding. Two kinds of check:

* exact (float64, no randomness): an independent implementation of Algorithm 2 enumerates every
  draft block, every stop ``tau`` and every recovered / bonus token, and completes each emitted
  sequence with the target's own conditionals up to length K+1. Lossless means that completed
  sequence follows the target's joint distribution exactly; the same enumeration gives the
  expected number of accepted tokens of block and token verification;
* statistical (the reference op, its counter-based RNG): 200k rows in one batched call (rows are
  independent through their seeds), each row's emitted sequence completed from the target with a
  test-side generator, and the completed sequence's id (one of V**(K+1) = 256 cells) tested by
  ``helpers.chi_square_check`` at two-sided level ALPHA = 1e-7 (bins of expected count < 5
  merged; power >= 0.99 against a 2% bias asserted inside). Three chi-square checks and seven
  z-tests at level <= ALPHA each: a correct reference fails this file with probability < 1e-6.
  Planted bug: the token-level residual ``max(0, P_tau - Q_tau)`` drawn at the block's stop
  instead of ``max(0, p_tau P_tau - Q_tau)``. Its exact completed distribution gives the
  noncentral chi-square power of the test at the same n (asserted >= 0.999, printed), and the
  test runs the bugged op and asserts that the check rejects it.
"""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from specdec_kernels.reference import verify_block as block_module
from specdec_kernels.reference.verify_block import verify_block
from specdec_kernels.reference.verify_greedy import verify_greedy
from specdec_kernels.reference.verify_sampling import verify_sampling

from helpers import ALPHA, chi_square_check, oracle_probs

N = 200_000
Z_CRIT = stats.norm.isf(ALPHA / 2)  # ~5.33


# ---------------------------------------------------------------- context-dependent models
class Tables:
    """Target logits and draft probabilities for every prefix: ``logits[L]`` ``[V**L, V]``
    (L = 0 .. K), ``draft[L]`` ``[V**L, V]`` (L = 0 .. K-1); prefix ``x_1 .. x_L`` has index
    ``sum x_i V**(L-i)``. ``target[L]`` is the filtered target (``oracle_probs``, written
    independently of the package) in float64."""

    def __init__(self, k, v, seed, temperature=1.0, top_k=None, top_p=None, spread=1.2):
        g = torch.Generator().manual_seed(seed)
        self.k, self.v = k, v
        self.controls = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        self.logits = [torch.randn(v**n, v, generator=g) * spread for n in range(k + 1)]
        self.draft = [
            torch.softmax(self.logits[n] * 0.5 + torch.randn(v**n, v, generator=g), dim=-1)
            for n in range(k)
        ]
        self.target = [oracle_probs(x, temperature, top_k, top_p) for x in self.logits]

    def joint(self) -> torch.Tensor:
        """``[V**(K+1)]`` float64: the target's probability of every sequence of K+1 tokens."""
        joint = torch.ones(1, dtype=torch.float64)
        for n in range(self.k + 1):
            joint = (joint[:, None] * self.target[n]).reshape(-1)
        return joint


def sample_rows(t: Tables, n_rows, seed, one_hot=False, ragged=False):
    """``n_rows`` verification problems: drafts from the draft table (or its argmax, one-hot),
    target logits along the draft path; ragged rows get ``-1`` drafts and garbage logits and
    draft rows past ``k_b``. Returns ``(logits, drafts, draft_probs, num_draft_tokens)``."""
    g = torch.Generator().manual_seed(seed)
    k, v = t.k, t.v
    idx = torch.zeros(n_rows, dtype=torch.int64)
    drafts, qs, rows = [], [], []
    for j in range(k + 1):
        rows.append(t.logits[j][idx])
        if j == k:
            break
        q = t.draft[j][idx]
        x = q.argmax(-1) if one_hot else torch.multinomial(q, 1, generator=g)[:, 0]
        drafts.append(x)
        qs.append(q)
        idx = idx * v + x
    logits = torch.stack(rows, 1)  # [N, K+1, V]
    drafts = torch.stack(drafts, 1)  # [N, K]
    q = None if one_hot else torch.stack(qs, 1)  # [N, K, V]
    nd = torch.full((n_rows,), k, dtype=torch.int64)
    if ragged:
        nd = torch.randint(0, k + 1, (n_rows,), generator=g)
        pos = torch.arange(k)[None, :]
        drafts = torch.where(pos < nd[:, None], drafts, -1)
        garbage = torch.randn(logits.shape, generator=g) * 30
        logits = torch.where(
            torch.arange(k + 1)[None, :, None] > nd[:, None, None], garbage, logits
        )
        if q is not None:
            q = torch.where((pos >= nd[:, None])[..., None], torch.full_like(q, 0.25), q)
    return logits, drafts, q, nd


def completed_ids(t: Tables, tokens, num_emitted, seed):
    """Complete every emitted sequence with the target's conditionals up to K+1 tokens; returns
    each completed sequence's index in ``Tables.joint``."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.zeros(tokens.shape[0], dtype=torch.int64)
    for j in range(t.k + 1):
        fresh = torch.multinomial(t.target[j][idx], 1, generator=g)[:, 0]
        idx = idx * t.v + torch.where(j < num_emitted, tokens[:, j], fresh)
    return idx


def run(op, t: Tables, logits, drafts, q, nd, seed_offset=10**9):
    n = logits.shape[0]
    c = t.controls
    return op(
        logits,
        drafts,
        q,
        nd,
        torch.full((n,), float(c["temperature"])),
        None if c["top_k"] is None else torch.full((n,), c["top_k"]),
        None if c["top_p"] is None else torch.full((n,), float(c["top_p"])),
        torch.arange(n) + seed_offset,
    )


# ---------------------------------------------------------------- the exact enumeration
def _complete(t: Tables, prefix, mass, out):
    """Add ``mass`` times the target's completions of ``prefix`` (up to K+1 tokens) to ``out``."""
    if len(prefix) == t.k + 1:
        out[_index(prefix, t.v)] += mass
        return
    p = _row(t.target, prefix, t.v)
    for y in range(t.v):
        if p[y] > 0:
            _complete(t, prefix + (y,), mass * p[y], out)


def _index(prefix, v):
    i = 0
    for x in prefix:
        i = i * v + x
    return i


def _row(table, prefix, v):
    row = table[len(prefix)][_index(prefix, v)].double().numpy()
    return row / row.sum()  # float32 draft rows sum to 1 only within rounding


def exact_block(t: Tables, residual="block", one_hot=False):
    """Algorithm 2 of Sun et al. written out in float64 per draft block, independently of the
    reference: returns ``(completed [V**(K+1)] float64, expected tau)``. ``residual="token"`` is
    the planted bug: ``max(0, P_tau - Q_tau)`` at the stop."""
    k, v = t.k, t.v
    out = np.zeros(v ** (k + 1))
    expected_tau = 0.0
    for x in itertools.product(range(v), repeat=k):
        q_rows = [_row(t.draft, x[:i], v) for i in range(k)]
        if one_hot:
            if any(x[i] != int(np.argmax(q_rows[i])) for i in range(k)):
                continue
            q_rows = [np.eye(v)[x[i]] for i in range(k)]
        prob_block = math.prod(q_rows[i][x[i]] for i in range(k))
        if prob_block == 0:
            continue
        p_rows = [_row(t.target, x[:i], v) for i in range(k + 1)]
        w = [1.0]
        for i in range(1, k + 1):
            w.append(min(1.0, w[-1] * p_rows[i - 1][x[i - 1]] / q_rows[i - 1][x[i - 1]]))
        h = []
        for i in range(1, k):
            r = np.maximum(w[i] * p_rows[i] - q_rows[i], 0).sum()
            h.append(r / (r + 1 - w[i]) if r + 1 - w[i] > 0 else 1.0)
        h.append(w[k])
        for tau in range(k + 1):
            p_tau = (h[tau - 1] if tau > 0 else 1.0) * math.prod(
                1 - h[j - 1] for j in range(tau + 1, k + 1)
            )
            if p_tau == 0:
                continue
            expected_tau += prob_block * p_tau * tau
            if tau == k:
                dist = p_rows[k]
            else:
                scale = w[tau] if residual == "block" else 1.0
                dist = np.maximum(scale * p_rows[tau] - q_rows[tau], 0)
                dist = dist / dist.sum() if dist.sum() > 0 else p_rows[tau]
            for y in range(v):
                if dist[y] > 0:
                    _complete(t, x[:tau] + (y,), prob_block * p_tau * dist[y], out)
    return out, expected_tau


def exact_token_tau(t: Tables):
    """Expected accepted tokens of token verification: ``sum_i P(x_1 .. x_i all accepted)``."""
    k, v = t.k, t.v
    expected = 0.0
    for x in itertools.product(range(v), repeat=k):
        q_rows = [_row(t.draft, x[:i], v) for i in range(k)]
        prob_block = math.prod(q_rows[i][x[i]] for i in range(k))
        run_prob = 1.0
        for i in range(k):
            run_prob *= min(1.0, _row(t.target, x[:i], v)[x[i]] / q_rows[i][x[i]])
            expected += prob_block * run_prob
    return expected


# ---------------------------------------------------------------- exact checks
@pytest.mark.parametrize("k, v, seed", [(1, 5, 0), (2, 4, 1), (3, 4, 2), (2, 6, 3), (3, 3, 4)])
def test_algorithm_2_is_lossless_and_never_below_token_verification_exactly(k, v, seed):
    t = Tables(k, v, seed)
    completed, block_tau = exact_block(t)
    np.testing.assert_allclose(completed, t.joint().numpy(), rtol=0, atol=1e-12)
    token_tau = exact_token_tau(t)
    assert block_tau >= token_tau - 1e-12, (block_tau, token_tau)
    if k == 1:
        assert block_tau == pytest.approx(token_tau, abs=1e-12)  # one draft: the same rule
    # and the planted bug is not lossless (K = 1 stops only at tau = 0, where p_0 = 1)
    bugged, _ = exact_block(t, residual="token")
    assert np.abs(bugged - completed).sum() > (1e-3 if k > 1 else -1)


def test_paper_example_block_accepts_11_9_against_token_10_9():
    """Section 3 of the paper: V = {a, b}, context-free, M_s = (2/3, 1/3), M_b = (1/3, 2/3),
    gamma = 2: token verification accepts 10/9 tokens per block, block verification 11/9."""
    t = paper_tables()
    completed, block_tau = exact_block(t)
    np.testing.assert_allclose(completed, t.joint().numpy(), atol=1e-12)
    assert block_tau == pytest.approx(11 / 9, abs=1e-12)
    assert exact_token_tau(t) == pytest.approx(10 / 9, abs=1e-12)


def paper_tables():
    t = Tables(2, 2, 0)
    target = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64).log()
    t.logits = [target.float().expand(2**n, 2).clone() for n in range(3)]
    t.target = [
        torch.tensor([[1 / 3, 2 / 3]], dtype=torch.float64).expand(2**n, 2) for n in range(3)
    ]
    t.draft = [torch.tensor([[2 / 3, 1 / 3]]).expand(2**n, 2).clone() for n in range(2)]
    return t


# ---------------------------------------------------------------- statistical losslessness
CASES = {
    "draft_probs": dict(k=3, v=4, seed=11, one_hot=False, ragged=False),
    "one_hot_ragged_filters": dict(
        k=3, v=4, seed=12, one_hot=True, ragged=True, temperature=0.8, top_k=3, top_p=0.9
    ),
    "ragged_draft_probs_temperature": dict(
        k=2, v=6, seed=13, one_hot=False, ragged=True, temperature=1.3
    ),
}


def _case(name):
    cfg = dict(CASES[name])
    one_hot, ragged = cfg.pop("one_hot"), cfg.pop("ragged")
    t = Tables(cfg.pop("k"), cfg.pop("v"), cfg.pop("seed"), **cfg)
    return t, sample_rows(t, N, seed=5, one_hot=one_hot, ragged=ragged), one_hot


@pytest.mark.parametrize("case", list(CASES))
def test_emitted_sequences_follow_the_target(case):
    t, (logits, drafts, q, nd), one_hot = _case(case)
    tokens, accepted, emitted = run(verify_block, t, logits, drafts, q, nd)
    assert bool((accepted <= nd).all()) and bool((emitted == accepted + 1).all())
    chi_square_check(completed_ids(t, tokens, emitted, seed=6), t.joint(), f"block {case}")


def test_planted_token_residual_at_the_stop_is_detected(monkeypatch):
    """The planted bug, run through the very check above: the exact power is computed first."""
    t, (logits, drafts, q, nd), _ = _case("draft_probs")
    truth = t.joint().numpy()
    bugged, _ = exact_block(t, residual="token")
    expected, observed_bug = truth * N, bugged * N
    keep = expected >= 5  # the merge rule of chi_square_check (the rest is one more bin)
    lam = ((observed_bug[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    df = int(keep.sum()) - (0 if keep.all() else -1) - 1
    power = stats.ncx2.sf(stats.chi2.isf(ALPHA, df), df, lam)
    print(
        f"planted bug: TV {0.5 * np.abs(bugged - truth).sum():.4f}, lambda {lam:.0f}, "
        f"power {power:.6f} at n={N}"
    )
    assert power >= 0.999

    monkeypatch.setattr(block_module, "stop_residual", lambda w, p, q: (p - q).clamp(min=0))
    tokens, _, emitted = run(block_module.verify_block, t, logits, drafts, q, nd)
    with pytest.raises(AssertionError, match="chi-square"):
        chi_square_check(completed_ids(t, tokens, emitted, seed=6), t.joint(), "planted bug")


# ---------------------------------------------------------------- accepted tokens
def _mean_check(values, expected, what):
    sd = float(values.double().std()) / math.sqrt(values.numel())
    z = (float(values.double().mean()) - expected) / sd
    assert abs(z) < Z_CRIT, f"{what}: mean {float(values.double().mean()):.4f} vs {expected:.4f}"


@pytest.mark.parametrize("case", ["paper", "draft_probs"])
def test_mean_accepted_matches_exact_and_block_beats_token_on_the_same_rows(case):
    """Same rows, same seeds: each op's mean accepted equals its exact expectation (z-test at
    ALPHA), and the paired difference block - token is not below 0 (one-sided, Z_CRIT standard
    errors of the paired mean); on the paper's example it is strictly positive (11/9 - 10/9 =
    0.111, about 45 standard errors at n = 200k)."""
    t = paper_tables() if case == "paper" else _case("draft_probs")[0]
    logits, drafts, q, nd = sample_rows(t, N, seed=7)
    block = run(verify_block, t, logits, drafts, q, nd)[1]
    token = run(verify_sampling, t, logits, drafts, q, nd)[1]
    _, block_tau = exact_block(t)
    _mean_check(block, block_tau, f"{case} block")
    _mean_check(token, exact_token_tau(t), f"{case} token")
    d = (block - token).double()
    se = float(d.std()) / math.sqrt(N)
    assert float(d.mean()) > -Z_CRIT * se, f"{case}: block below token ({float(d.mean()):.4f})"
    if case == "paper":
        assert float(d.mean()) > Z_CRIT * se, f"{case}: block not above token"


def test_planted_weaker_thresholds_fail_the_mean_check(monkeypatch):
    """Thresholds scaled by 0.8 (still a valid-looking rule, fewer accepts) fail the z-test."""
    t = paper_tables()
    logits, drafts, q, nd = sample_rows(t, N, seed=7)
    original = block_module.block_thresholds
    monkeypatch.setattr(block_module, "block_thresholds", lambda *a: original(*a) * 0.8)
    block = run(block_module.verify_block, t, logits, drafts, q, nd)[1]
    with pytest.raises(AssertionError, match="mean"):
        _mean_check(block, exact_block(t)[1], "planted")


# ---------------------------------------------------------------- deterministic properties
def _random_problem(b, k, v, seed, one_hot=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, v, generator=g) * 2
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2, dim=-1)
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)
    if one_hot:
        drafts = torch.where(torch.rand(b, k, generator=g) < 0.7, logits[:, :k].argmax(-1), drafts)
    nd = torch.randint(0, k + 1, (b,), generator=g)
    return logits, drafts, None if one_hot else q, nd


def _controls(b, temperature=1.0, top_k=None, top_p=None, seed=0):
    t = torch.as_tensor(temperature, dtype=torch.float32).expand(b).clone()
    tk = None if top_k is None else torch.as_tensor(top_k).expand(b).clone()
    tp = None if top_p is None else torch.as_tensor(top_p, dtype=torch.float32).expand(b).clone()
    return t, tk, tp, torch.arange(b) * 7919 + seed


def test_greedy_rows_are_exactly_verify_greedy():
    b, k, v = 64, 4, 37
    logits, drafts, q, nd = _random_problem(b, k, v, 0)
    temp = torch.where(torch.arange(b) % 3 == 0, 0.0, 0.9)
    out = verify_block(logits, drafts, q, nd, temp, None, None, torch.arange(b))
    want = verify_greedy(logits, drafts, nd)
    greedy = temp == 0
    for got, exp in zip(out, want):
        assert torch.equal(got[greedy], exp[greedy])


def test_one_draft_is_token_verification():
    """k_b <= 1 (and k_b = 0): block verification is the token rule, token for token."""
    b, k, v = 4000, 3, 11
    logits, drafts, q, nd = _random_problem(b, k, v, 1)
    nd = nd.clamp(max=1)
    t, tk, tp, s = _controls(b, 0.8, 5, 0.9)
    block = verify_block(logits, drafts, q, nd, t, tk, tp, s)
    token = verify_sampling(logits, drafts, q, nd, t, tk, tp, s)
    for got, exp in zip(block, token):
        assert torch.equal(got, exp)


@pytest.mark.parametrize("one_hot", [False, True])
def test_ragged_rows_ignore_everything_past_k_b(one_hot):
    """A row with k_b drafts gives the same answer as the same row cut to K = k_b: garbage
    drafts, draft rows and logits rows past k_b are never read into the answer."""
    b, k, v = 48, 5, 13
    logits, drafts, q, nd = _random_problem(b, k, v, 2, one_hot=one_hot)
    t, tk, tp, s = _controls(b, 1.1, 6, 0.95)
    g = torch.Generator().manual_seed(3)
    past = torch.arange(k)[None, :] >= nd[:, None]
    junk_drafts = torch.where(past, torch.randint(-3, v + 3, (b, k), generator=g), drafts)
    junk_logits = logits.clone()
    junk_logits[torch.arange(k + 1)[None, :] > nd[:, None]] = 40.0
    junk_q = None if q is None else torch.where(past[..., None], torch.rand(b, k, v), q)
    tokens, accepted, emitted = verify_block(junk_logits, junk_drafts, junk_q, nd, t, tk, tp, s)
    assert bool((accepted <= nd).all())
    for r in range(b):
        kb = int(nd[r])
        one = verify_block(
            logits[r : r + 1, : kb + 1],
            drafts[r : r + 1, :kb],
            None if q is None else q[r : r + 1, :kb],
            nd[r : r + 1],
            t[r : r + 1],
            tk[r : r + 1],
            tp[r : r + 1],
            s[r : r + 1],
        )
        assert torch.equal(tokens[r, : kb + 1], one[0][0]) and int(accepted[r]) == int(one[1])
        assert bool((tokens[r, kb + 1 :] == -1).all())


def test_one_hot_drafts_are_explicit_one_hot_draft_probs():
    """``draft_probs=None`` uses closed forms (``R_i = p_i (1 - P_i(X_{i+1}))``, the residual
    without the factor ``p_tau``) that equal the general sums in exact arithmetic; on these
    inputs the answers are equal token for token."""
    b, k, v = 200, 4, 9
    logits, drafts, _, nd = _random_problem(b, k, v, 4, one_hot=True)
    q = torch.nn.functional.one_hot(drafts, v).float()
    t, tk, tp, s = _controls(b, 0.7, 4, None)
    for got, exp in zip(
        verify_block(logits, drafts, None, nd, t, tk, tp, s),
        verify_block(logits, drafts, q, nd, t, tk, tp, s),
    ):
        assert torch.equal(got, exp)


def test_batch_invariance():
    b, k, v = 40, 3, 17
    logits, drafts, q, nd = _random_problem(b, k, v, 5)
    t, tk, tp, s = _controls(b, 1.0, None, 0.8)
    full = verify_block(logits, drafts, q, nd, t, tk, tp, s)
    perm = torch.randperm(b)
    shuffled = verify_block(logits[perm], drafts[perm], q[perm], nd[perm], t, tk, tp, s[perm])
    for got, exp in zip(shuffled, full):
        assert torch.equal(got, exp[perm])


# ---------------------------------------------------------------- corner cases
def test_zero_draft_probability_and_zero_target_probability_are_never_accepted():
    """q(x_j) = 0 (a draft not drawn from q) or p(x_j) = 0 (-inf logit) sets p_j = 0: x_j and
    every later draft are rejected, whatever the seed; emitted tokens stay in p's support."""
    b, k, v = 3000, 3, 6
    logits, drafts, q, nd = _random_problem(b, k, v, 6)
    nd = torch.full((b,), k)
    q = q.clone()
    rows = torch.arange(b)
    q[rows[::2], 1, drafts[::2, 1]] = 0.0  # even rows: q(x_2) = 0
    q = q / q.sum(-1, keepdim=True)
    logits[rows[1::2], 1, drafts[1::2, 1]] = -math.inf  # odd rows: p(x_2) = 0
    t, tk, tp, s = _controls(b)
    tokens, accepted, emitted = verify_block(logits, drafts, q, nd, t, tk, tp, s)
    assert int(accepted.max()) <= 1
    reached = emitted > 1
    assert bool(
        (tokens[reached & (rows % 2 == 1), 1] != drafts[reached & (rows % 2 == 1), 1]).all()
    )
    p = torch.softmax(logits, -1)
    for j in range(k + 1):
        at = emitted > j
        assert bool((p[at, j].gather(-1, tokens[at, j, None]) > 0).all())


def test_draft_equal_to_target_accepts_everything():
    """q = p at every position: p_i = 1 and R_i = 0 (the 0/0 threshold is 1): tau = k_b."""
    b, k, v = 500, 4, 7
    logits, _, _, nd = _random_problem(b, k, v, 7)
    t, tk, tp, s = _controls(b, 1.0, 5, None)
    from specdec_kernels.reference.verify_sampling import filtered_probs

    p = filtered_probs(logits, t, tk, None)
    drafts = torch.multinomial(p[:, :k].reshape(-1, v), 1).reshape(b, k)
    _, accepted, _ = verify_block(logits, drafts, p[:, :k].contiguous(), nd, t, tk, None, s)
    assert torch.equal(accepted, nd)


@pytest.mark.parametrize("filters", [dict(top_k=1), dict(top_p=1e-6)])
def test_point_mass_targets_emit_the_argmax(filters):
    """top_k = 1 or a tiny top_p: the target is a point mass at the argmax; every emitted token is
    the argmax of its row (greedy-like, but through the sampling path)."""
    b, k, v = 400, 3, 10
    logits, drafts, q, nd = _random_problem(b, k, v, 8, one_hot=True)
    t, tk, tp, s = _controls(b, 1.0, filters.get("top_k"), filters.get("top_p"))
    tokens, accepted, emitted = verify_block(logits, drafts, q, nd, t, tk, tp, s)
    target = logits.argmax(-1)
    pos = torch.arange(k + 1)[None, :]
    assert torch.equal(torch.where(pos < emitted[:, None], target, -1), tokens)
    assert torch.equal(accepted, verify_greedy(logits, drafts, nd)[1])


def test_garbage_inputs_never_emit_an_id_outside_the_vocabulary():
    """validate=False territory: NaN / +inf logits, out-of-range draft ids, negative and
    unnormalised draft rows. Nothing raises and every id is in [0, V) or the -1 padding."""
    b, k, v = 300, 4, 8
    logits, drafts, q, nd = _random_problem(b, k, v, 9)
    g = torch.Generator().manual_seed(10)
    logits[torch.rand(b, k + 1, v, generator=g) < 0.1] = math.nan
    logits[torch.rand(b, k + 1, v, generator=g) < 0.05] = math.inf
    drafts = torch.where(
        torch.rand(b, k, generator=g) < 0.2, torch.randint(-9, v + 9, (b, k)), drafts
    )
    q = q - 0.05 * torch.rand(b, k, v, generator=g)
    t, tk, tp, s = _controls(b, 1.0, 3, 0.9)
    for probs in (q, None):
        tokens, accepted, emitted = verify_block(logits, drafts, probs, nd, t, tk, tp, s)
        pos = torch.arange(k + 1)[None, :]
        assert bool(((tokens >= 0) & (tokens < v))[pos < emitted[:, None]].all())
        assert bool((tokens[pos >= emitted[:, None]] == -1).all())
        assert bool((accepted <= nd).all())
