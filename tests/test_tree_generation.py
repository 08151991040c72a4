"""Speculative generation with token trees (SpeculativeGenerator(..., tree=...)): the tree
forward of CausalLM, the caches after compaction, greedy losslessness for static and dynamic
trees, sampling, bad arguments."""

import pytest
import torch

import specdec_kernels as sk
from specdec_kernels.decoding import (
    CausalLMAdapter,
    DynamicTree,
    StaticTree,
    TreeDrafter,
    TreeProposal,
)
from specdec_kernels.models import TreeAttention

from helpers import (
    ALL_BACKENDS,
    VOCAB,
    assert_row_is_batch_invariant,
    assert_rows_equal,
    available,
    ragged_prompts,
    reference,
    tiny_pair,
)

pytestmark = pytest.mark.usefixtures("one_thread")

TREES = {
    "static-3211": StaticTree([3, 2, 1, 1]),
    "static-parents": StaticTree(parents=[-1, 0, 0, 1, 1, 2, 3, 4, 0]),
    "static-star": StaticTree([3]),
    "dynamic-16": DynamicTree(num_nodes=16, top_k=4, depth=5),
    "dynamic-8": DynamicTree(num_nodes=8, top_k=2, depth=4),
    "dynamic-deep": DynamicTree(num_nodes=10, top_k=1, depth=9),  # a chain chosen dynamically
}


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.fixture(scope="module")
def greedy_refs(pair):
    """The target's own greedy decoding of 6 ragged prompts, 24 tokens, with an eos that the
    last row emits as its 6th token (so rows stop at different times)."""
    target, _ = pair
    prompts = ragged_prompts(6)
    free = reference(target, prompts, 24)
    eos = free[-1][len(prompts[-1]) + 5]
    return prompts, eos, reference(target, prompts, 24, eos)


def ancestors(parents):
    """Root-to-node paths of a parents list, node ids (an independent oracle: a plain walk)."""
    paths = []
    for i in range(len(parents)):
        path, j = [], i
        while j >= 0:
            path.append(j)
            j = parents[j]
        paths.append(path[::-1])
    return paths


# ------------------------------------------------------------------ the model's tree forward
@pytest.mark.parametrize("parents", [[-1, 0, 0, 1, 1, 3, 2], [-1, 0, 1, 2], [-1, 0, 0, 0]])
def test_tree_forward_equals_each_path_run_alone(pair, parents):
    """Logits of every node from one tree pass over a cached ragged prefix equal a plain causal
    pass over prefix + the node's root-to-node path."""
    target, _ = pair
    g = torch.Generator().manual_seed(len(parents))
    prefixes = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (5, 11)]
    n = len(parents)
    tokens = torch.randint(0, VOCAB, (2, n), generator=g)
    paths = ancestors(parents)
    depth = torch.tensor([len(p) - 1 for p in paths])
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(paths):
        mask[i, p] = True
    model = CausalLMAdapter(target)
    model.prefill(prefixes, 40)
    base = model.lengths.clone()
    tree = TreeAttention(base[:, None] + depth, mask.expand(2, n, n), base)
    with torch.no_grad():
        got = model.extend(tokens, torch.tensor([n, n]), tree=tree)  # [2, N, V]
        for b in range(2):
            for i, p in enumerate(paths):
                seq = torch.tensor([prefixes[b] + tokens[b, p].tolist()])
                want = target(seq)[0, -1]
                torch.testing.assert_close(got[b, i], want, rtol=1e-9, atol=1e-9)


def test_tree_drafter_masks_match_parents(pair):
    """The drafted trees' masks and depths are those of their parents (walked here), parents
    precede children, depths ascend, and siblings carry distinct tokens."""
    target, draft = pair
    prompts = ragged_prompts(3)
    for tree in (TREES["dynamic-16"], TREES["static-parents"]):
        drafter = TreeDrafter(CausalLMAdapter(draft), tree)
        drafter.prefill(prompts, 64)
        tokens = torch.zeros(3, 40, dtype=torch.int64)
        for b, p in enumerate(prompts):
            tokens[b, : len(p)] = torch.tensor(p)
        seq_len = torch.tensor([len(p) for p in prompts])
        prop = drafter.propose(tokens, seq_len, torch.tensor([9, 9, 2]), 9, None, None)
        n = tree.num_nodes
        assert prop.tokens.shape == prop.parents.shape == (3, n)
        assert prop.num_nodes.tolist()[:2] == [n, n]
        for b in range(3):
            par = prop.parents[b].tolist()
            assert par[0] == -1 and all(0 <= par[i] < i for i in range(1, n))
            paths = ancestors(par)
            assert prop.depths[b].tolist() == [len(p) - 1 for p in paths]
            assert prop.depths[b].tolist() == sorted(prop.depths[b].tolist())
            want = torch.zeros(n, n, dtype=torch.bool)
            for i, p in enumerate(paths):
                want[i, p] = True
            assert torch.equal(prop.mask[b], want)
            kids = {}
            for i in range(1, n):
                kids.setdefault(par[i], []).append(int(prop.tokens[b, i]))
            assert all(len(set(v)) == len(v) for v in kids.values())
        # row 2 may add at most 2 tokens: only nodes of depth <= 2 count
        assert int(prop.num_nodes[2]) == int((prop.depths[2] <= 2).sum())


def test_caches_after_compact_equal_caches_of_the_accepted_tokens(pair):
    """After a tree step keeps an accepted path, the target's and the draft's KV caches hold
    (up to rounding) what prefilling the committed tokens alone gives."""
    target, draft = pair
    prompts = ragged_prompts(2, seed=5)
    tree = StaticTree(parents=[-1, 0, 0, 1, 2, 2, 4, 6])
    tgt = CausalLMAdapter(target)
    drafter = TreeDrafter(CausalLMAdapter(draft), tree)
    tgt.prefill([p[:-1] for p in prompts], 64)
    drafter.prefill(prompts, 64)
    tokens = torch.zeros(2, 40, dtype=torch.int64)
    for b, p in enumerate(prompts):
        tokens[b, : len(p)] = torch.tensor(p)
    seq_len = torch.tensor([len(p) for p in prompts])
    depth = torch.full((2,), tree.depth)
    prop = drafter.propose(tokens, seq_len, depth, tree.depth, None, None)
    assert isinstance(prop, TreeProposal)
    cur = tokens.gather(1, (seq_len - 1)[:, None])
    prop.score(tgt, cur)
    # accept the path 0 -> 2 -> 4 -> 6 in row 0 (node 6 was expanded) and 0 -> 1 in row 1
    paths = [[0, 2, 4, 6], [0, 1]]
    accepted = torch.tensor([p + [-1] * (5 - len(p)) for p in paths])
    num_acc = torch.tensor([len(p) - 1 for p in paths])

    class Ver:
        accepted_nodes, num_accepted = accepted, num_acc

    prop.keep(tgt, drafter, Ver)
    # the prompt and the accepted drafts (the next emitted token is in neither cache yet)
    committed = [prompts[b] + prop.tokens[b, paths[b][1:]].tolist() for b in range(2)]
    assert tgt.lengths.tolist() == [len(c) for c in committed]
    # the draft holds the expanded nodes of the path: 2, 4, 6 were, and 1 was (it has a child)
    assert drafter.model.lengths.tolist() == [len(c) for c in committed]
    for model, got in ((target, tgt), (draft, drafter.model)):
        fresh = CausalLMAdapter(model)
        fresh.prefill(committed, 64)
        assert torch.equal(fresh.lengths, got.lengths)
        for b in range(2):
            n = int(got.lengths[b])
            a, f = got.cache.kv[:, :, b, :, :n], fresh.cache.kv[:, :, b, :, :n]
            torch.testing.assert_close(a, f, rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------ greedy generation
@pytest.mark.parametrize("name", sorted(TREES))
def test_tree_greedy_equals_target_greedy(pair, greedy_refs, name):
    """Ragged batch of 6, eos in the middle of one row, rows retiring at different times."""
    target, draft = pair
    prompts, eos, want = greedy_refs
    gen = sk.SpeculativeGenerator(target, draft, tree=TREES[name])
    out = gen.generate(prompts, max_new_tokens=24, eos_token_id=eos)
    assert_rows_equal(out.sequences, want)
    s = out.stats
    assert s.draft_forwards == s.target_forwards * TREES[name].depth
    assert 0 < s.accepted_tokens <= s.drafted_tokens
    assert s.drafted_tokens <= (TREES[name].num_nodes - 1) * 6 * s.target_forwards
    assert len(s.accepted_histogram) == TREES[name].depth + 1
    kept = sum(map(sum, out.draft_accepted))
    assert kept <= s.accepted_tokens <= kept + 6 * TREES[name].depth


def test_batch_of_one_and_tensor_prompts(pair):
    target, draft = pair
    prompts = torch.randint(0, VOCAB, (1, 7))
    gen = sk.SpeculativeGenerator(target, draft, tree=TREES["dynamic-8"])
    out = gen.generate(prompts, 20)
    assert_rows_equal(out.sequences, reference(target, prompts.tolist(), 20))


def test_path_shaped_tree_is_the_chain(pair):
    """A path-shaped static tree drafts, accepts and emits exactly what the chain of the same
    length does: same tokens, same passes, same accepted counts."""
    target, draft = pair
    prompts = ragged_prompts(5, seed=2)
    chain = sk.SpeculativeGenerator(target, draft, 3).generate(prompts, 20)
    path = sk.SpeculativeGenerator(target, draft, tree=StaticTree(parents=[-1, 0, 1, 2])).generate(
        prompts, 20
    )
    assert path.sequences == chain.sequences
    assert path.draft_accepted == chain.draft_accepted
    assert path.stats.accepted_histogram == chain.stats.accepted_histogram
    assert path.stats.target_forwards == chain.stats.target_forwards


def test_trees_near_the_context_limit():
    """Rows whose context leaves room for fewer tokens than the tree is deep: deeper nodes are
    cut per row, and the output still equals greedy decoding up to the context. The one-token
    prompt has no committed prefix before the root (padding nodes then see only themselves)."""
    target, draft = tiny_pair(n_positions=24)
    prompts = [list(range(20)), [1], list(range(23))]
    for tree in (TREES["dynamic-16"], TREES["static-3211"]):
        out = sk.SpeculativeGenerator(target, draft, tree=tree).generate(prompts, 50)
        assert [len(s) for s in out.sequences] == [24, 24, 24]
        assert_rows_equal(out.sequences, reference(target, prompts, 50))


# ------------------------------------------------------------------ sampling
def test_tree_sampling_with_top_k_1_is_greedy(pair):
    """top_k = 1 leaves one token of probability 1: tree sampling reproduces greedy decoding."""
    target, draft = pair
    prompts = ragged_prompts(3)
    want = reference(target, prompts, 16)
    for tree in (TREES["dynamic-16"], TREES["static-3211"], StaticTree([3, 2], sampled=True)):
        gen = sk.SpeculativeGenerator(target, draft, tree=tree)
        for seed in (0, 1):
            got = gen.generate(prompts, 16, temperature=1.0, top_k=1, seed=seed).sequences
            assert_rows_equal(got, want)


@pytest.mark.parametrize("tree", [TREES["dynamic-8"], StaticTree([3, 1, 1], sampled=True)])
def test_tree_sampling_seeded_and_samples(pair, tree):
    target, draft = pair
    prompts = ragged_prompts(3)
    gen = sk.SpeculativeGenerator(target, draft, tree=tree)
    a = gen.generate(prompts, 12, temperature=0.8, top_p=0.9, seed=7)
    assert a.sequences == gen.generate(prompts, 12, temperature=0.8, top_p=0.9, seed=7).sequences
    assert a.sequences != gen.generate(prompts, 12, temperature=0.8, top_p=0.9, seed=8).sequences
    assert all(0 <= t < VOCAB for s in a.sequences for t in s)
    assert a.stats.accepted_tokens > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize(
    "tree", [StaticTree([3, 2, 1], sampled=True), TREES["dynamic-8"]], ids=["sampled", "dynamic"]
)
def test_tree_rows_are_batch_invariant(pair, tree, temperature):
    """As for chains: a row's tokens do not depend on the other rows, its live slot or when
    the others retire. A sampled tree's children are drawn with the draft's own counter-based
    stream (keyed by seed, row, position, depth); they used to come from one torch.Generator
    over the whole batch."""
    target, draft = pair
    gen = sk.SpeculativeGenerator(target, draft, tree=tree)
    kwargs = dict(max_new_tokens=12, temperature=temperature, seed=77)
    assert_row_is_batch_invariant(gen, ragged_prompts(7, seed=6), **kwargs)


@pytest.mark.parametrize(
    "tree", [DynamicTree(6, 3, 2), StaticTree([3, 2]), StaticTree([3, 2], sampled=True)]
)
def test_tree_sampling_first_two_tokens_follow_the_target(tree):
    """N identical rows, 2 new tokens each: the first token follows the target's p(x1) and the
    second its marginal sum_x1 p(x1) p(x2 | x1) (chi-square each, false-failure probability
    1e-4 each). Power: with N = 3000 over 11 tokens (10 degrees of freedom), any output
    distribution at chi-square distance sum (p' - p)**2 / p >= 0.02 from the target's
    (noncentrality 60) fails with probability >= 0.98. Accepted children are exercised: more
    than a tenth of the rows take a draft token (checked)."""
    from scipy.stats import chisquare

    target, draft = tiny_pair(vocab=11, dtype=torch.float32, seed=2)
    prompt = [1, 4, 2, 7]
    n = 3000
    with torch.no_grad():
        p1 = target(torch.tensor([prompt]))[0, -1].double().softmax(-1)
        nxt = torch.tensor([prompt + [x] for x in range(11)])
        p2 = (p1[:, None] * target(nxt)[:, -1].double().softmax(-1)).sum(0)
    out = sk.SpeculativeGenerator(target, draft, tree=tree).generate(
        [prompt] * n, max_new_tokens=2, temperature=1.0, seed=321
    )
    for pos, p in ((0, p1), (1, p2)):
        got = torch.bincount(
            torch.tensor([s[len(prompt) + pos] for s in out.sequences]), minlength=11
        )
        assert chisquare(got.double().numpy(), (p * n).numpy()).pvalue > 1e-4, pos
    assert out.stats.accepted_tokens > n / 10


# ------------------------------------------------------------------ bad arguments
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: StaticTree(), "exactly one"),
        (lambda: StaticTree([2], parents=[-1, 0]), "exactly one"),
        (lambda: StaticTree([2, 0]), "branching"),
        (lambda: StaticTree("21"), "branching"),
        (lambda: StaticTree(parents=[0, 0]), "parents"),
        (lambda: StaticTree(parents=[-1]), "parents"),
        (lambda: StaticTree(parents=[-1, 0, 2]), "parents"),
        (lambda: StaticTree(parents=[-1, -1]), "parents"),
        (lambda: StaticTree([2], sampled=1), "sampled"),
        (lambda: DynamicTree(1, 2, 2), "num_nodes"),
        (lambda: DynamicTree(8, 0, 2), "top_k"),
        (lambda: DynamicTree(8, 2, 0), "depth"),
        (lambda: DynamicTree(16, 2, 2), "candidates"),
        (lambda: DynamicTree(8.0, 2, 2), "num_nodes"),
    ],
)
def test_bad_tree_shapes(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_tree_arguments(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="ngram"):
        sk.SpeculativeGenerator(target, "ngram", tree=StaticTree([2]))
    with pytest.raises(ValueError, match="tree"):
        sk.SpeculativeGenerator(target, draft, tree=[3, 2])
    with pytest.raises(ValueError, match="auto"):
        sk.SpeculativeGenerator(target, draft, "auto", tree=StaticTree([2]))
    with pytest.raises(ValueError, match="vocabulary"):
        sk.SpeculativeGenerator(target, draft, tree=StaticTree([VOCAB + 1]))
    with pytest.raises(ValueError, match="tree"):
        TreeDrafter(CausalLMAdapter(draft), "dynamic")
    from specdec_kernels.decoding import Decoder, HFAdapter  # an adapter without tree support

    with pytest.raises(ValueError, match="tree support"):
        Decoder(HFAdapter.__new__(HFAdapter), TreeDrafter(CausalLMAdapter(draft), StaticTree([2])))


# ------------------------------------------------------------------ backends
@pytest.mark.parametrize("backend", available(ALL_BACKENDS))
def test_tree_generation_through_every_backend(pair, backend):
    """The tree ops' backends (SpeculativeGenerator's backend=) under generation: greedy equals
    the target's greedy decoding, and seeded sampling with a sampled static tree (draft
    probabilities, "without_replacement") gives the reference backend's tokens."""
    target, draft = pair
    prompts = ragged_prompts(2, seed=4)  # few tokens: Triton runs in its interpreter on a CPU
    want = reference(target, prompts, 4)
    kwargs = dict(max_new_tokens=3, temperature=0.9, top_k=20, seed=3)
    sampled = StaticTree([3, 2], sampled=True)
    want_sampled = sk.SpeculativeGenerator(
        target, draft, tree=sampled, backend="reference"
    ).generate(prompts, **kwargs)
    dynamic = DynamicTree(6, 2, 3)
    got = sk.SpeculativeGenerator(target, draft, tree=dynamic, backend=backend).generate(prompts, 4)
    assert_rows_equal(got.sequences, want)
    got = sk.SpeculativeGenerator(target, draft, tree=sampled, backend=backend).generate(
        prompts, **kwargs
    )
    assert_rows_equal(got.sequences, want_sampled.sequences)
