"""Tree verification: the reference against small independent oracles (greedy walks, depths,
masks), chains against the chain ops, seeds and batch invariance, argument checks, garbage with
validate=False, every backend against the reference, and statistical losslessness per draft mode
(with a planted bug that the same statistic must catch)."""

import math

import pytest
import torch
from scipy import stats

import specdec_kernels as sk
from specdec_kernels import _extension

from helpers import (
    NATIVE,
    TRITON_CUDA,
    assert_same,
    native_tree_case,
    on_backend,
    random_draft_probs,
    random_trees,
    run_under_capability,
)

MODES = ["deterministic", "independent", "without_replacement"]
FILTERS = [(None, None), (3, None), (None, 0.8), (20, 0.9)]
ALL_BACKENDS = ["reference", "triton", NATIVE]
KERNEL_BACKENDS = ["triton", NATIVE]
FAST_BACKENDS = ["reference", NATIVE]  # for the tests with many calls (Triton is interpreted)
#: Triton where a test adds little to the default run's Triton coverage: only with -m slow
TRITON_SLOW = pytest.param("triton", marks=pytest.mark.slow)


# --- inputs ----------------------------------------------------------------------------------


def chain_parents(b, k):
    return torch.arange(-1, k)[None, :].expand(b, k + 1).contiguous()


# --- oracles (written independently of the reference) ------------------------------------------


def oracle_children(parents_row, n_real, node):
    return [i for i in range(1, n_real) if parents_row[i] == node]


def oracle_greedy(logits, tokens, parents, num_nodes):
    """Per row, per node, in plain Python: first matching child wins; the argmax at the end."""
    out = []
    for b in range(logits.shape[0]):
        n_real = int(num_nodes[b])
        par, tok = parents[b].tolist(), tokens[b].tolist()
        node, emitted, path = 0, [], [0]
        while True:
            t = int(logits[b, node].float().argmax())
            nxt = [c for c in oracle_children(par, n_real, node) if tok[c] == t]
            emitted.append(t)
            if not nxt:
                break
            node = nxt[0]
            path.append(node)
        out.append((emitted, path))
    return out


def oracle_depths(parents, num_nodes):
    depths = []
    for b in range(parents.shape[0]):
        n_real, par = int(num_nodes[b]), parents[b].tolist()
        row = []
        for i in range(parents.shape[1]):
            if i >= n_real:
                row.append(-1)
                continue
            d, j = 0, i
            while j != 0:
                j, d = par[j], d + 1
            row.append(d)
        depths.append(row)
    return torch.tensor(depths)


def oracle_mask(parents, num_nodes):
    b, n = parents.shape
    mask = torch.zeros(b, n, n, dtype=torch.bool)
    for r in range(b):
        for i in range(n):
            mask[r, i, i] = True
            if i < int(num_nodes[r]):
                j = i
                while j != 0:
                    j = int(parents[r, j])
                    mask[r, i, j] = True
    return mask


def check_result_against_oracle(out, expected, what):
    for b, (emitted, path) in enumerate(expected):
        got_tokens = out.tokens[b, : int(out.num_emitted[b])].tolist()
        got_path = out.accepted_nodes[b, : int(out.num_accepted[b]) + 1].tolist()
        assert got_tokens == emitted, f"{what} row {b}: tokens {got_tokens} != {emitted}"
        assert got_path == path, f"{what} row {b}: path {got_path} != {path}"
        assert (out.tokens[b, len(emitted) :] == -1).all(), f"{what} row {b}: padding"
        assert (out.accepted_nodes[b, len(path) :] == -1).all(), f"{what} row {b}: padding"


def check_consistent(out, tokens, parents, v, what):
    """Invariants of any result: ids in range, the path is a chain of parent links, the
    accepted tokens are the path's tree tokens, the counts are those of the non-padding
    entries (the path has the root and the accepted nodes, the tokens one more than those)."""
    emitted = (out.tokens >= 0).sum(-1)
    assert_same(out.num_emitted, emitted, f"{what} num_emitted")
    assert_same(out.num_accepted + 1, (out.accepted_nodes >= 0).sum(-1), f"{what} path")
    for b in range(out.tokens.shape[0]):
        a = int(out.num_accepted[b])
        path = out.accepted_nodes[b, : a + 1].tolist()
        assert path[0] == 0, f"{what} row {b}: path {path}"
        for d in range(1, a + 1):
            assert int(parents[b, path[d]]) == path[d - 1], f"{what} row {b}: path {path}"
            assert int(out.tokens[b, d - 1]) == int(tokens[b, path[d]]), f"{what} row {b}"
        assert 0 <= int(out.tokens[b, a]) < v, f"{what} row {b}: recovered/bonus {out.tokens[b, a]}"
        assert (out.tokens[b, a + 1 :] == -1).all() and (out.accepted_nodes[b, a + 1 :] == -1).all()


# --- greedy, depths, masks against the oracles ---------------------------------------------------


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("b, n, v", [(1, 1, 7), (9, 6, 7), (17, 9, 37), (5, 16, 1000)])
def test_greedy_matches_oracle(b, n, v, backend):
    logits, tokens, parents, nn = random_trees(b, n, v, seed=b * n)
    out = sk.verify_tree_greedy(logits, tokens, parents, num_nodes=nn, backend=backend)
    check_result_against_oracle(out, oracle_greedy(logits, tokens, parents, nn), backend)
    depth = int(oracle_depths(parents, nn).max())
    assert out.tokens.shape == (b, depth + 1) and out.accepted_nodes.shape == (b, depth + 1)


@pytest.mark.parametrize("backend", ["reference", TRITON_SLOW, NATIVE])
def test_greedy_rows_of_sampling_equal_tree_greedy(backend):
    logits, tokens, parents, nn = random_trees(12, 7, 37, seed=3)
    temperature = torch.tensor([0.0, 0.8, 1.0, 0.0] * 3)
    q = random_draft_probs(12, 7, 37)
    out = sk.verify_tree_sampling(
        logits,
        tokens,
        parents,
        q,
        draft_mode="independent",
        temperature=temperature,
        top_k=None if backend == "triton" else 5,
        num_nodes=nn,
        seed=1,
        backend=backend,
    )
    greedy = oracle_greedy(logits, tokens, parents, nn)
    for b in (0, 3, 4, 7, 8, 11):
        check_result_against_oracle(
            sk.TreeVerification(*(t[b : b + 1] for t in out[:4])), [greedy[b]], f"{backend} {b}"
        )
    check_consistent(out, tokens, parents, 37, backend)


def test_depths_and_mask_match_oracle():
    _, _, parents, nn = random_trees(20, 12, 5, seed=11)
    assert_same(sk.tree_depths(parents, nn), oracle_depths(parents, nn), "depths")
    assert_same(sk.tree_attention_mask(parents, nn), oracle_mask(parents, nn), "mask")
    assert_same(
        sk.tree_attention_mask(parents.to(torch.int32), nn.to(torch.int32)),
        oracle_mask(parents, nn),
        "mask int32",
    )
    full = chain_parents(2, 4)
    assert sk.tree_depths(full).tolist() == [[0, 1, 2, 3, 4]] * 2
    assert_same(sk.tree_attention_mask(full)[0], torch.ones(5, 5).tril().bool(), "chain mask")


# --- a chain is a tree ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("top_k, top_p", FILTERS)
def test_chain_equals_chain_ops(top_k, top_p, backend):
    b, k, v = (4 if backend == "triton" else 16), 4, 37
    if backend == "triton" and (top_k, top_p) != (None, None):
        pytest.skip("interpreted Triton: filters are covered by test_kernels_match_reference")
    for seed in range(1 if backend == "triton" else 3):
        logits, tokens, _, _ = random_trees(b, k + 1, v, seed=seed, ragged=False, match=0.8)
        nd = torch.randint(0, k + 1, (b,), generator=torch.Generator().manual_seed(seed))
        drafts = tokens[:, 1:].contiguous()
        q = random_draft_probs(b, k + 1, v, seed=seed + 5)
        # chain-style draft: drafts sampled from q (so the acceptance is not tiny)
        drafts_q = torch.multinomial(q[:, :k].reshape(-1, v), 1).reshape(b, k)
        tokens_q = torch.cat([tokens[:, :1], drafts_q], dim=1)
        parents = chain_parents(b, k)
        temperature = torch.tensor([0.0, 0.7, 1.0, 1.3] * (b // 4))
        seeds = torch.arange(b) * 7919 + seed
        common = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seeds)
        chain = sk.verify_sampling(logits, drafts, num_draft_tokens=nd, backend=backend, **common)
        tree = sk.verify_tree_sampling(
            logits, tokens, parents, num_nodes=nd + 1, backend=backend, **common
        )
        assert_same(tree.tokens, chain.tokens, f"{backend} deterministic seed {seed}")
        assert_same(tree.num_accepted, chain.num_accepted, f"{backend} deterministic {seed}")
        chain = sk.verify_sampling(
            logits, drafts_q, q[:, :k], num_draft_tokens=nd, backend=backend, **common
        )
        for mode in ("independent", "without_replacement"):
            tree = sk.verify_tree_sampling(
                logits,
                tokens_q,
                parents,
                q,
                draft_mode=mode,
                num_nodes=nd + 1,
                backend=backend,
                **common,
            )
            assert_same(tree.tokens, chain.tokens, f"{backend} {mode} seed {seed}")
            assert_same(tree.num_accepted, chain.num_accepted, f"{backend} {mode} {seed}")
        greedy = sk.verify_greedy(logits, drafts, num_draft_tokens=nd, backend=backend)
        tree = sk.verify_tree_greedy(logits, tokens, parents, num_nodes=nd + 1, backend=backend)
        assert_same(tree.tokens, greedy.tokens, f"{backend} greedy seed {seed}")
        assert_same(
            tree.accepted_nodes[:, 1:],
            torch.where(greedy.tokens[:, 1:] >= 0, torch.arange(1, k + 1), -1),
            "greedy path",
        )


# --- seeds, batch invariance, padding ----------------------------------------------------------


def _sampling_call(logits, tokens, parents, q, nn, mode, seed, backend="reference", **kw):
    return sk.verify_tree_sampling(
        logits,
        tokens,
        parents,
        q,
        draft_mode=mode,
        num_nodes=nn,
        seed=seed,
        backend=backend,
        **kw,
    )


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("mode", MODES)
def test_seeds_and_batch_invariance(mode, backend):
    b, n, v = 12, 8, 11
    logits, tokens, parents, nn = random_trees(b, n, v, seed=21, scale=1.0)
    q = random_draft_probs(b, n, v)
    seeds = torch.arange(b) * 1000003 + 17
    out = _sampling_call(logits, tokens, parents, q, nn, mode, seeds, backend, top_p=0.95)
    again = _sampling_call(logits, tokens, parents, q, nn, mode, seeds, backend, top_p=0.95)
    for a, e, name in zip(again, out, ("tokens", "accepted", "emitted", "nodes")):
        assert_same(a, e, f"same seed {name}")
    other = _sampling_call(logits, tokens, parents, q, nn, mode, seeds + 1, backend, top_p=0.95)
    assert not torch.equal(other.tokens, out.tokens), "another seed gave identical tokens"
    perm = torch.randperm(b)[: b - 3]  # a subset of the rows, in another order
    sub = _sampling_call(
        logits[perm],
        tokens[perm],
        parents[perm],
        q[perm],
        nn[perm],
        mode,
        seeds[perm],
        backend,
        top_p=0.95,
        validate=False,
    )
    w = sub.tokens.shape[1]  # D + 1 of the subset's deepest tree: at most the batch's
    assert w <= out.tokens.shape[1]
    assert_same(sub.tokens, out.tokens[perm, :w], "batch invariance")
    assert_same(sub.accepted_nodes, out.accepted_nodes[perm, :w], "batch invariance nodes")
    assert (out.tokens[perm, w:] == -1).all() and (out.accepted_nodes[perm, w:] == -1).all()
    check_consistent(out, tokens, parents, v, f"{backend} {mode}")


@pytest.mark.parametrize("backend", ["reference", TRITON_SLOW, NATIVE])
def test_padding_nodes_are_never_read(backend):
    b, n, v = (4 if backend == "triton" else 10), 9, 23
    logits, tokens, parents, nn = random_trees(b, n, v, seed=5)
    q = random_draft_probs(b, n, v)
    pad = torch.arange(n)[None, :] >= nn[:, None]
    logits2 = torch.where(pad[:, :, None], float("nan"), logits)
    q2 = torch.where(pad[:, :, None], -1.0, q)
    tokens2 = torch.where(pad, 10**6, tokens)
    parents2 = torch.where(pad, 0, parents)
    for mode in MODES[::2] if backend == "triton" else MODES:
        kw = dict(temperature=0.9)
        first = _sampling_call(logits, tokens, parents, q, nn, mode, 3, backend, **kw)
        second = _sampling_call(logits2, tokens2, parents2, q2, nn, mode, 3, backend, **kw)
        for a, e in zip(second[:4], first[:4]):
            assert_same(a, e, f"{backend} {mode}")


# --- argument checks and garbage ---------------------------------------------------------------


def test_bad_parents_raise_naming_row_and_node():
    logits, tokens, parents, _ = random_trees(3, 5, 7, ragged=False)
    cases = [
        ((1, 0), 0, r"parents\[1, 0\] must be -1"),
        ((2, 3), 3, r"parents\[2, 3\] = 3 is not a node before node 3"),
        ((0, 2), 4, r"parents\[0, 2\] = 4 is not a node before node 2"),
        ((1, 4), -1, r"parents\[1, 4\] = -1 is not a node before node 4"),
    ]
    for (row, node), value, message in cases:
        bad = parents.clone()
        bad[row, node] = value
        for fn in (
            lambda p: sk.verify_tree_greedy(logits, tokens, p),
            lambda p: sk.verify_tree_sampling(logits, tokens, p, seed=0),
            lambda p: sk.tree_depths(p),
            lambda p: sk.tree_attention_mask(p),
        ):
            with pytest.raises(ValueError, match=message):
                fn(bad)
    # the same entry in a padding node is fine
    bad = parents.clone()
    bad[2, 3] = 3
    sk.verify_tree_greedy(logits, tokens, bad, num_nodes=torch.tensor([5, 5, 3]))


def test_bad_values_and_shapes_raise():
    empty = torch.zeros(2, 0, dtype=torch.int64)
    for call in (
        lambda: sk.verify_tree_greedy(torch.randn(2, 0, 7), empty, empty),
        lambda: sk.verify_tree_sampling(torch.randn(2, 0, 7), empty, empty, seed=0),
    ):
        with pytest.raises(ValueError, match=r"target_logits must have N >= 1 .*\[2, 0, 7\]"):
            call()
    with pytest.raises(ValueError, match=r"target_logits must have shape \[B, N, V\]"):
        sk.verify_tree_greedy(torch.randn(2, 7), empty, empty)
    logits, tokens, parents, _ = random_trees(2, 4, 7, ragged=False)
    q = random_draft_probs(2, 4, 7)
    with pytest.raises(ValueError, match=r"num_nodes must lie in \[1, N\] = \[1, 4\]"):
        sk.verify_tree_greedy(logits, tokens, parents, num_nodes=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"num_nodes\[1\] = 5"):
        sk.verify_tree_greedy(logits, tokens, parents, num_nodes=torch.tensor([4, 5]))
    bad = tokens.clone()
    bad[1, 2] = 7
    with pytest.raises(ValueError, match=r"tree_tokens\[1, 2\] = 7 is outside \[0, V\)"):
        sk.verify_tree_sampling(logits, bad, parents, seed=0)
    with pytest.raises(ValueError, match=r"tree_tokens must have shape \[B, N\]"):
        sk.verify_tree_greedy(logits, tokens[:, :3], parents)
    with pytest.raises(ValueError, match=r"parents must have shape"):
        sk.verify_tree_greedy(logits, tokens, parents[:1])
    with pytest.raises(TypeError, match=r"parents must have dtype"):
        sk.verify_tree_greedy(logits, tokens, parents.float())
    with pytest.raises(ValueError, match=r"draft_mode must be one of"):
        sk.verify_tree_sampling(logits, tokens, parents, q, draft_mode="iid")
    with pytest.raises(ValueError, match=r"needs draft_probs"):
        sk.verify_tree_sampling(logits, tokens, parents, draft_mode="independent")
    with pytest.raises(ValueError, match=r"draft_probs must have shape \[B, N, V\]"):
        sk.verify_tree_sampling(logits, tokens, parents, q[:, :3], draft_mode="independent")
    with pytest.raises(ValueError, match=r"draft_probs\[0, 0\] .* does not sum to 1"):
        sk.verify_tree_sampling(logits, tokens, parents, q * 2, draft_mode="independent")
    with pytest.raises(ValueError, match=r"top_p must be in"):
        sk.verify_tree_sampling(logits, tokens, parents, top_p=1.5)
    with pytest.raises(ValueError, match=r"at most one of seed and generator"):
        sk.verify_tree_sampling(logits, tokens, parents, seed=1, generator=torch.Generator())
    nan = logits.clone()
    nan[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"target_logits\[0, 1, 2\]"):
        sk.verify_tree_greedy(nan, tokens, parents)
    # a leaf's draft row is never read: it may be anything
    leaves = sk.tree_depths(parents) >= 0
    is_parent = torch.zeros_like(leaves).scatter_(1, parents[:, 1:].clamp(min=0), True)
    junk = torch.where((leaves & ~is_parent)[:, :, None], 5.0, q)
    sk.verify_tree_sampling(logits, tokens, parents, junk, draft_mode="independent", seed=0)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_validate_false_with_garbage_stays_in_bounds(backend):
    g = torch.Generator().manual_seed(99)
    b, n, v = (4 if backend == "triton" else 16), 7, 13
    logits = torch.randn(b, n, v, generator=g) * 4
    logits[0, 2] = float("nan")
    logits[1] = float("-inf")
    logits[2, :, 3] = float("inf")
    parents = torch.randint(-10, 20, (b, n), generator=g)
    tokens = torch.randint(-20, 40, (b, n), generator=g)
    nn = torch.randint(-3, n + 4, (b,), generator=g)
    q = torch.rand(b, n, v, generator=g) * 3 - 1
    for mode in ["without_replacement"] if backend == "triton" else MODES:
        out = sk.verify_tree_sampling(
            logits,
            tokens,
            parents,
            q,
            draft_mode=mode,
            num_nodes=nn,
            max_depth=n - 1,  # every column, so any walk the garbage allows fits
            temperature=torch.rand(b, generator=g),
            top_k=3,
            top_p=0.7,
            seed=1,
            backend=backend,
            validate=False,
        )
        assert out.tokens.shape == (b, n) and out.accepted_nodes.shape == (b, n)
        assert ((out.tokens >= -1) & (out.tokens < v)).all()
        assert ((out.accepted_nodes >= -1) & (out.accepted_nodes < n)).all()
        assert ((out.num_accepted >= 0) & (out.num_accepted < n)).all()
        assert (out.tokens[torch.arange(b), out.num_accepted] >= 0).all()
    out = sk.verify_tree_greedy(
        logits, tokens, parents, num_nodes=nn, max_depth=n - 1, backend=backend, validate=False
    )
    assert out.tokens.shape == (b, n) and out.accepted_nodes.shape == (b, n)
    assert ((out.tokens >= -1) & (out.tokens < v)).all()
    assert ((out.num_accepted >= 0) & (out.num_accepted < n)).all()


# --- statistical losslessness --------------------------------------------------------------------
#
# One fixed "language model" of depth 3 over V = 6 tokens: p(. | prefix) depends only on the
# prefix's tokens (a root distribution, a [V, V] table after one token, a [V, V, V] table after
# two), so nodes that share a prefix share a distribution and the tree's outputs can be compared
# with the target. Each row draws its own tree tokens the way the draft mode assumes (fixed
# choices, i.i.d. from q_i, or without replacement from q_i). Checks per mode:
#   * the first emitted token follows p(. | root);
#   * for each first token x, the second emitted token of the rows that accepted a child with
#     token x follows p(. | x) (the token after each accepted child), for the x with enough rows.
# Each chi-square check runs at level ALPHA = 1e-7 (bins with expected count < 5 merged); a run
# makes at most 3 x 7 checks per backend, so a correct implementation fails with probability
# < 3e-6. Power: each check computes (noncentral chi-square) its power against moving 0.03 of
# probability from the most likely token to the second at its own sample size and must reach 0.99
# (checks with too few rows for that are skipped, not run weakly; the first-token checks always
# run). The planted bug (recovered token drawn from p instead of the residual) moves ~0.1 of the
# first token's mass here, and the same first-token check rejects it (power ~1; asserted).

STAT_ROWS = 150_000
STAT_V = 6
ALPHA = 1e-7
TREE = [-1, 0, 0, 0, 1, 1, 2, 4]  # root: 3 children; node 1: 2; node 2: 1; node 4: 1 (depth 3)


def _language_model(seed=0):
    g = torch.Generator().manual_seed(seed)
    v = STAT_V
    root = torch.randn(v, generator=g) * 1.2
    one = torch.randn(v, v, generator=g) * 1.2
    two = torch.randn(v, v, v, generator=g) * 1.2
    three = torch.randn(v, v, v, v, generator=g) * 1.2
    return root, one, two, three


def _draft_model(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.softmax(torch.randn(*([STAT_V] * d), STAT_V, generator=g), -1) for d in range(4)]


def _sample_without_replacement(q, count, g):
    """[R, V] rows -> [R, count] distinct tokens, each drawn from q minus the earlier ones."""
    return torch.multinomial(q, count, replacement=False, generator=g)


def statistical_case(mode, rows=STAT_ROWS, seed=0):
    """Per row: a tree of shape TREE whose tokens are drawn as ``mode`` assumes, the target
    logits and draft rows of every node (functions of the node's path tokens)."""
    g = torch.Generator().manual_seed(100 + MODES.index(mode))
    lm, dm = _language_model(seed), _draft_model(seed + 1)
    n, v = len(TREE), STAT_V
    parents = torch.tensor(TREE)[None, :].expand(rows, n).contiguous()
    tokens = torch.full((rows, n), -1, dtype=torch.int64)
    logits = torch.zeros(rows, n, v)
    q = torch.zeros(rows, n, v)
    paths = {0: []}
    depth = {0: 0}
    for i in range(n):
        if i > 0:
            paths[i] = paths[TREE[i]] + [tokens[:, i]]
            depth[i] = depth[TREE[i]] + 1
        idx = tuple(paths[i])
        logits[:, i] = lm[depth[i]][idx] if idx else lm[0].expand(rows, v)
        q[:, i] = dm[depth[i]][idx] if idx else dm[0].expand(rows, v)
        children = [c for c in range(1, n) if TREE[c] == i]
        if not children:
            continue
        if mode == "deterministic":  # the top choices of the draft, fixed per prefix
            chosen = torch.argsort(q[:, i], dim=-1, descending=True)[:, : len(children)]
        elif mode == "independent":
            chosen = torch.multinomial(q[:, i], len(children), replacement=True, generator=g)
        else:
            chosen = _sample_without_replacement(q[:, i], len(children), g)
        for s, c in enumerate(children):
            tokens[:, c] = chosen[:, s]
    return logits, tokens, parents, q, lm


def _chi_square(observed, p, what, bias=0.03, require_power=True):
    """Returns ``(statistic, critical value)``; asserts the support and the power."""
    counts = torch.bincount(observed, minlength=p.numel()).double()
    n = int(counts.sum())
    assert int(counts[p == 0].sum()) == 0, f"{what}: tokens outside the support"
    support = p > 0
    expected = p.double()[support] * n
    obs = counts[support]
    small = expected < 5
    if small.any():
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
        obs = torch.cat([obs[~small], obs[small].sum()[None]])
    df = len(expected) - 1
    if df < 1:  # nothing to test (no rows, or all in one bin)
        assert not require_power, f"{what}: no data"
        return 0.0, math.inf, 0.0
    stat = float(((obs - expected) ** 2 / expected).sum())
    critical = stats.chi2.isf(ALPHA, df)
    ps = p.double()[support]
    shifted = ps.clone()
    first, second = torch.argsort(ps, descending=True)[:2].tolist()
    shifted[first] -= bias
    shifted[second] += bias
    power = stats.ncx2.sf(critical, df, float(n * ((shifted - ps) ** 2 / ps).sum()))
    if require_power:
        assert power >= 0.99, f"{what}: too weak (power {power:.3f}, n = {n})"
    return stat, critical, power


def _lossless_checks(out, lm, what):
    """Run the first-token check and the conditional second-token checks; return how many
    conditional checks ran."""
    p_root = torch.softmax(lm[0].double(), -1)
    stat, critical, _ = _chi_square(out.tokens[:, 0], p_root, f"{what} first token")
    assert stat < critical, f"{what}: first token chi-square {stat:.1f} >= {critical:.1f}"
    ran = 0
    for x in range(STAT_V):
        rows = (out.num_accepted >= 1) & (out.tokens[:, 0] == x)
        p_next = torch.softmax(lm[1][x].double(), -1)
        stat, critical, power = _chi_square(
            out.tokens[rows, 1], p_next, f"{what} after {x}", require_power=False
        )
        if power < 0.99:
            continue
        ran += 1
        assert stat < critical, f"{what}: after {x} chi-square {stat:.1f} >= {critical:.1f}"
    return ran


@pytest.mark.parametrize("backend", [*FAST_BACKENDS, TRITON_CUDA])
@pytest.mark.parametrize("mode", MODES)
def test_emitted_tokens_follow_the_target(mode, backend):
    logits, tokens, parents, q, lm = statistical_case(mode)
    out = on_backend(
        backend,
        sk.verify_tree_sampling,
        logits,
        tokens,
        parents,
        q,
        draft_mode=mode,
        seed=torch.arange(STAT_ROWS) + 7 * 10**8,
        validate=False,
    )
    ran = _lossless_checks(out, lm, f"{backend} {mode}")
    assert ran >= 2, f"{mode}: only {ran} conditional checks had the power to run"
    # the tree does accept: a mean of more than 0.5 accepted tokens per row
    assert float(out.num_accepted.float().mean()) > 0.5


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_log_input_reads_probabilities_as_their_log(mode, dtype, backend):
    """``log_input=True`` (the SGLang drop-in's form): the op on probabilities gives, bitwise, what
    it gives on ``log(p)`` in float32 (the reference's own reading), zero-probability tokens
    included; the C++ kernel reads them in place."""
    b, n, v = 24, 6, 40
    g = torch.Generator().manual_seed(11)
    parents = torch.tensor([-1, 0, 0, 1, 1, 3]).expand(b, n).contiguous()
    p = torch.softmax(torch.randn(b, n, v, generator=g) * 2, -1)
    p[:, :, 5] = 0.0
    p = p.to(dtype)
    tokens = torch.randint(0, v, (b, n), generator=g)
    tokens[:, 1] = p[:, 0].float().argmax(-1)  # an accepted first child now and then
    tokens[:, 2] = 5  # a zero-probability sibling: never accepted
    q = None if mode == "deterministic" else random_draft_probs(b, n, v)
    nn = torch.full((b,), n)
    args = (tokens, parents, q, nn, MODES.index(mode), torch.ones(b), None, None)
    seeds = torch.arange(b) * 7919
    want = torch.ops.specdec.verify_tree_sampling(
        torch.log(p.float()), *args, seeds, None, "reference"
    )
    got = torch.ops.specdec.verify_tree_sampling(p, *args, seeds, None, backend, True)
    for name, x, y in zip(("tokens", "accepted", "emitted", "nodes"), got, want):
        assert_same(x, y, f"{backend} {mode} {dtype} {name}")
    assert not bool((got[0] == 5).any())


def test_planted_bug_is_caught():
    """Recovered tokens drawn from p (not the residual) after rejected siblings: the first-token
    check must reject it. The variant reuses the correct result and redraws only the recovered
    token of the rows whose walk stopped at a node with rejected children."""
    mode, rows = "independent", 60_000
    logits, tokens, parents, q, lm = statistical_case(mode, rows=rows)
    out = sk.verify_tree_sampling(
        logits,
        tokens,
        parents,
        q,
        draft_mode=mode,
        seed=torch.arange(rows) + 7 * 10**8,
        backend="reference",
        validate=False,
    )
    rows = torch.arange(rows)
    stop = out.accepted_nodes[rows, out.num_accepted]
    has_children = torch.zeros(len(TREE), dtype=torch.bool)
    has_children[torch.tensor(TREE[1:])] = True
    recovered = has_children[stop]
    g = torch.Generator().manual_seed(5)
    p_stop = torch.softmax(logits[rows, stop], -1)
    from_p = torch.multinomial(p_stop, 1, generator=g)[:, 0]
    buggy = out.tokens.clone()
    buggy[rows, out.num_accepted] = torch.where(
        recovered, from_p, out.tokens[rows, out.num_accepted]
    )
    assert float(recovered.float().mean()) > 0.2  # the bug matters for many rows
    p_root = torch.softmax(lm[0].double(), -1)
    stat, critical, _ = _chi_square(buggy[:, 0], p_root, "planted bug")
    assert stat > critical, (
        f"the planted bug went unnoticed: chi-square {stat:.1f} < {critical:.1f}"
    )
    # and the correct result passes the same check on the same rows
    stat, critical, _ = _chi_square(out.tokens[:, 0], p_root, "correct")
    assert stat < critical


# --- every backend against the reference ---------------------------------------------------


def _compare_with_reference(logits, tokens, parents, q, nn, temperature, filters, backend):
    """Every draft mode with every filter of ``filters`` (a list of ``(top_k, top_p)``, or
    ``"one"``: no filter in every mode, then both filters in the independent mode only)."""
    b = logits.shape[0]
    if filters == "one":
        cases = [(m, None, None) for m in MODES] + [("independent", 20, 0.9)]
    else:
        cases = [(m, k, p) for m in MODES for k, p in filters]
    for mode, top_k, top_p in cases:
        kw = dict(
            draft_mode=mode,
            num_nodes=nn,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=torch.arange(b) * 31 + 5,
            validate=False,
        )
        want = sk.verify_tree_sampling(logits, tokens, parents, q, backend="reference", **kw)
        got = sk.verify_tree_sampling(logits, tokens, parents, q, backend=backend, **kw)
        for a, e, name in zip(got, want, ("tokens", "accepted", "emitted", "nodes")):
            assert_same(a, e, f"{backend} {mode} top_k={top_k} top_p={top_p} {name}")
    want = sk.verify_tree_greedy(logits, tokens, parents, num_nodes=nn, backend="reference")
    got = sk.verify_tree_greedy(logits, tokens, parents, num_nodes=nn, backend=backend)
    for a, e in zip(got[:4], want[:4]):
        assert_same(a, e, f"{backend} greedy")


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize(
    "b, n, v, dtype",
    [
        (5, 6, 37, torch.float32),
        (4, 7, 37, torch.bfloat16),
        (3, 9, 1000, torch.float32),
        (2, 16, 32003, torch.float32),
        (3, 8, 5003, torch.float16),
    ],
)
def test_kernels_match_reference(b, n, v, dtype, backend):
    if backend == "triton" and (v > 40 or dtype != torch.float32):
        pytest.skip("interpreted Triton: other shapes and dtypes run in bench/gpu_check.sh")
    logits, tokens, parents, nn = random_trees(b, n, v, seed=v + n, scale=1.5, dtype=dtype)
    q = random_draft_probs(b, n, v, seed=n)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.9][:b])
    filters = "one" if backend == "triton" or v > 10_000 else FILTERS
    _compare_with_reference(logits, tokens, parents, q, nn, temperature, filters, backend)


@pytest.mark.parametrize("backend", [TRITON_SLOW, NATIVE])
def test_kernels_match_reference_on_deep_walks(backend):
    """Trees drawn as each mode assumes, with a target close to the draft: many rows accept
    two or three levels deep, reject several siblings and race over shrunk residuals."""
    rows = 2 if backend == "triton" else 400
    for mode in MODES:
        logits, tokens, parents, q, _ = statistical_case(mode, rows=rows)
        nn = torch.full((rows,), len(TREE))
        temperature = torch.tensor([1.0, 0.8, 1.2]).repeat(rows)[:rows]
        filters = [(None, None)] if backend == "triton" else FILTERS
        _compare_with_reference(logits, tokens, parents, q, nn, temperature, filters, backend)
        if backend != "triton":
            out = sk.verify_tree_sampling(
                logits, tokens, parents, q, draft_mode=mode, seed=5, backend=backend
            )
            assert int(out.num_accepted.max()) >= 2


def test_tree_accepts_more_than_its_first_branch():
    """Sanity of the tree's point: with several children the walk accepts more often than with
    only the first child (same seeds)."""
    logits, tokens, parents, q, _ = statistical_case("independent", rows=20_000)
    full = sk.verify_tree_sampling(
        logits, tokens, parents, q, draft_mode="independent", seed=3, validate=False
    )
    first_only = parents.clone()
    first_only[:, [2, 3, 5]] = 99  # detach the later siblings: num_nodes keeps them real
    pruned = sk.verify_tree_sampling(
        logits, tokens, first_only, q, draft_mode="independent", seed=3, validate=False
    )
    assert float(full.num_accepted.float().mean()) > float(pruned.num_accepted.float().mean())
    assert math.isfinite(float(full.num_accepted.float().mean()))


# --- the native kernels: thread count, CPU capability, adapter checks --------------------------

NATIVE_ONLY = pytest.mark.skipif(
    not _extension.has_op("native_verify_tree"),
    reason="the C++ extension with the native tree kernel is not built",
)


@NATIVE_ONLY
def test_native_result_does_not_depend_on_the_thread_count():
    """One thread walks rows; more threads than rows split each node's vocabulary chunks."""
    logits, tokens, parents, q, kw = native_tree_case()
    threads = torch.get_num_threads()
    try:
        for mode in MODES:
            want = sk.verify_tree_sampling(
                logits, tokens, parents, q, draft_mode=mode, backend="reference", **kw
            )
            for n in (1, 16):  # 16 > B = 6: split strategy
                torch.set_num_threads(n)
                got = sk.verify_tree_sampling(
                    logits, tokens, parents, q, draft_mode=mode, backend="native", **kw
                )
                for a, e in zip(got[:4], want[:4]):
                    assert_same(a, e, f"{mode}, {n} threads")
    finally:
        torch.set_num_threads(threads)


_CAPABILITY_SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
import specdec_kernels as sk
from helpers import native_tree_case
MODES = {modes!r}
print(torch.backends.cpu.get_cpu_capability())
logits, tokens, parents, q, kw = native_tree_case(v=1001)
for mode in MODES:
    a = sk.verify_tree_sampling(logits, tokens, parents, q, draft_mode=mode, backend="native", **kw)
    b = sk.verify_tree_sampling(logits, tokens, parents, q, draft_mode=mode, backend="reference",
                                **kw)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.accepted_nodes, b.accepted_nodes)
print("ok")
"""


@NATIVE_ONLY
@pytest.mark.parametrize(
    "capability", ["default", pytest.param("avx2", marks=pytest.mark.slow)]
)  # a subprocess each (~10 s of imports on the shared CI machine); AVX-512 runs in-process
def test_native_every_cpu_capability_build_matches_the_reference(capability):
    import os

    tests = os.path.dirname(os.path.abspath(__file__))
    run_under_capability(_CAPABILITY_SCRIPT.format(tests=tests, modes=MODES), capability)


@NATIVE_ONLY
def test_native_adapter_checks_name_the_argument():
    logits, tokens, parents, q, kw = native_tree_case(b=2, n=4, v=11)
    nn, temp, seeds = kw["num_nodes"], kw["temperature"], kw["seed"]
    op = torch.ops.specdec.native_verify_tree
    with pytest.raises(ValueError, match=r"parents must have shape \[B, N\] = \[2, 4\]"):
        op(logits, tokens, parents[:, :3], None, nn, 0, temp, None, None, seeds, None, False)
    with pytest.raises(ValueError, match=r"mode must be 0"):
        op(logits, tokens, parents, q, nn, 5, temp, None, None, seeds, None, False)
    with pytest.raises(ValueError, match=r"needs draft_probs"):
        op(logits, tokens, parents, None, nn, 1, temp, None, None, seeds, None, False)
    with pytest.raises(ValueError, match=r"draft_probs must have shape \[B, N, V\]"):
        op(logits, tokens, parents, q[:, :3], nn, 2, temp, None, None, seeds, None, False)
    mask = torch.full((2, 4, 1), -1, dtype=torch.int32)
    with pytest.raises(
        ValueError, match=r"token_bitmask must have shape \[B, N, W\] = \[2, 4, 1\]"
    ):
        op(logits, tokens, parents, q, nn, 1, temp, None, None, seeds, mask[:, :3], False)
    with pytest.raises(TypeError, match=r"token_bitmask must be int32"):
        op(logits, tokens, parents, q, nn, 1, temp, None, None, seeds, mask.long(), False)


# --- validate decides checks only, never shapes or types ----------------------------------------


def _tree_calls(logits, tokens, parents, nn, q, backend, **kw):
    common = dict(num_nodes=nn, backend=backend, **kw)
    return {
        "greedy": lambda validate: sk.verify_tree_greedy(
            logits, tokens, parents, validate=validate, **common
        ),
        "greedy rows of sampling": lambda validate: sk.verify_tree_sampling(
            logits, tokens, parents, temperature=0.0, validate=validate, **common
        ),
        "sampling": lambda validate: sk.verify_tree_sampling(
            logits,
            tokens,
            parents,
            q,
            draft_mode="independent",
            seed=5,
            validate=validate,
            **common,
        ),  # fmt: skip
    }


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("b, n, v", [(1, 1, 7), (3, 4, 11), (9, 6, 7), (5, 16, 37)])
@pytest.mark.parametrize("max_depth", [None, "tree", "N-1"])
def test_validate_does_not_change_tree_shapes(b, n, v, max_depth, backend):
    """Ragged trees (num_nodes from 1 to N): validate=True and validate=False return the same
    types, shapes and values; the width is D + 1 with D the deepest real node's depth, or the
    max_depth passed (the static tree depth, or N - 1 for every column)."""
    logits, tokens, parents, nn = random_trees(b, n, v, seed=b + 10 * n)
    q = random_draft_probs(b, n, v)
    deepest = int(oracle_depths(parents, nn).max())
    kw = {} if max_depth is None else {"max_depth": deepest if max_depth == "tree" else n - 1}
    width = n if max_depth == "N-1" else deepest + 1
    for name, call in _tree_calls(logits, tokens, parents, nn, q, backend, **kw).items():
        checked, unchecked = call(True), call(False)
        assert type(checked) is type(unchecked) is sk.TreeVerification, name
        for got, want in zip(unchecked[:4], checked[:4]):
            assert got.shape == want.shape and got.dtype == want.dtype, name
            assert_same(got, want, f"{name} validate=False")
        assert checked.tokens.shape == (b, width), (name, checked.tokens.shape)
        assert checked.accepted_nodes.shape == (b, width), name


def test_max_depth_below_the_tree_raises_only_when_validating():
    parents = torch.tensor([[-1, 0, 1, 2]])  # a chain: depth 3
    tokens = torch.tensor([[-1, 1, 2, 0]])
    logits = torch.randn(1, 4, 5)
    with pytest.raises(ValueError, match=r"max_depth = 1 but the deepest real node has depth 3"):
        sk.verify_tree_greedy(logits, tokens, parents, max_depth=1)
    out = sk.verify_tree_greedy(logits, tokens, parents, max_depth=1, validate=False)
    assert out.tokens.shape == (1, 2) and out.accepted_nodes.shape == (1, 2)
    with pytest.raises(ValueError, match=r"max_depth must be >= 0"):
        sk.verify_tree_greedy(logits, tokens, parents, max_depth=-1)
    with pytest.raises(TypeError, match=r"max_depth must be None or an int"):
        sk.verify_tree_sampling(logits, tokens, parents, max_depth=2.0)
