"""The Triton tree kernel's two strategies against the reference, token for token: ``"split"``
(every node's statistics first, each row spread over the chain's split statistics kernels, the
walk reads them) and ``"row"`` (the walk reads each node it reaches, in one pass with the
filter's candidate buffer). Filters at their edges, flat rows (the candidates overflow the
buffer: the search fallback), a token bitmask, bfloat16, temperatures 1e-6 and 1e4."""

import pytest
import torch

from specdec_kernels import _dispatch

from helpers import random_draft_probs, random_trees

pytest.importorskip("triton")

from specdec_kernels.ops import verify_tree  # noqa: E402

STRATEGIES = ("row", "split")
MODES = (0, 1, 2)  # deterministic, independent, without replacement
#: (top_k, top_p) per row of a 3-row batch: off, edges, both
FILTERS = {
    "off": (None, None),
    "edges": ([1, 0, 7], [1.0, 1e-9, 1.0]),
    "both": ([5, 40, 0], [0.9, 0.5, 0.95]),
}


def _case(seed, v=300, scale=3.0, dtype=torch.float32, temps=(0.7, 0.0, 1.3)):
    logits, tokens, parents, nn = random_trees(3, 6, v, seed=seed, scale=scale, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    mask = torch.randint(-(2**31), 2**31 - 1, (3, 6, (v + 31) // 32), generator=g)
    mask = mask.to(torch.int32) | 1  # token 0 always allowed: every row keeps a finite logit
    return logits, tokens, parents, nn, torch.tensor(temps), mask


def _both_and_reference(logits, tokens, parents, q, nn, mode, temp, top_k, top_p, seeds,
                        mask, greedy_only):  # fmt: skip
    filters = [None if f is None else torch.tensor(f) for f in (top_k, top_p)]
    args = (logits, tokens, parents, q, nn, mode, temp, *filters, seeds)
    want = _dispatch._reference_tree(*args, mask, greedy_only, False)
    for strategy in STRATEGIES:
        got = verify_tree.verify_tree(
            *args, greedy_only=greedy_only, token_bitmask=mask, strategy=strategy
        )
        for name, g, w in zip(("tokens", "num_accepted", "accepted_nodes"), got, want):
            assert torch.equal(g, w), f"{strategy} mode {mode} {name}: {g.tolist()} != {w.tolist()}"


@pytest.mark.parametrize("filters", FILTERS)
@pytest.mark.parametrize("mode", MODES)
def test_strategies_equal_the_reference(mode, filters):
    seed = mode  # a different tree a mode
    logits, tokens, parents, nn, temp, mask = _case(seed)
    q = random_draft_probs(3, 6, logits.shape[-1], seed) if mode else None
    seeds = torch.tensor([seed, seed + 7, seed + 11])
    for m in (None, mask) if filters == "both" else (None,):
        _both_and_reference(logits, tokens, parents, q, nn, mode, temp, *FILTERS[filters],
                            seeds, m, False)  # fmt: skip


def test_greedy_only_strategies():
    # V = 5000: two chunks a row (launch_config), merged in chunk order by the split walk
    logits, tokens, parents, nn, temp, mask = _case(3, v=5000)
    for m in (None, mask):
        _both_and_reference(logits, tokens, parents, None, nn, 0, temp, None, None,
                            torch.zeros(3, dtype=torch.int64), m, True)  # fmt: skip


@pytest.mark.slow  # the interpreter: ~30 s each on 2 cores
@pytest.mark.parametrize("temps", [(1e-6, 1e-6, 1e-6), (1e4, 1e4, 1e4)])
def test_extreme_temperatures_bf16(temps):
    logits, tokens, parents, nn, temp, _ = _case(4, dtype=torch.bfloat16, temps=temps)
    for top_k, top_p in FILTERS.values():
        _both_and_reference(logits, tokens, parents, None, nn, 0, temp, top_k, top_p,
                            torch.tensor([1, 2, 3]), None, False)  # fmt: skip


@pytest.mark.slow  # the interpreter's search fallback: ~60 s on 2 cores
def test_flat_rows_fall_back_to_the_search():
    # randn * 0.1 over 5000 tokens (two chunks): top-p 0.9 and top-k 3000 keep thousands, more
    # than the candidate buffer's 1024; top-k 5 fits it
    logits, tokens, parents, nn, temp, _ = _case(5, v=5000, scale=0.1, temps=(1.0, 1.0, 1.0))
    _both_and_reference(logits, tokens, parents, None, nn, 0, temp, [5, 0, 3000],
                        [1.0, 0.9, 1.0], torch.tensor([1, 2, 3]), None, False)  # fmt: skip


@pytest.mark.parametrize("mode", (0, 1))
def test_two_chunk_rows_race_in_chunks(mode):
    # V = 5000: the split strategy's race runs two programs a row, merged in chunk order
    logits, tokens, parents, nn, temp, _ = _case(6, v=5000)
    q = random_draft_probs(3, 6, 5000, 6) if mode else None
    _both_and_reference(logits, tokens, parents, q, nn, mode, temp, None, None,
                        torch.tensor([4, 5, 6]), None, False)  # fmt: skip


@pytest.mark.parametrize("op", ["verify_tree_greedy", "verify_tree_sampling"])
def test_split_traffic_matches_the_chain(op):
    """B = 1, a binary tree of 8 nodes, V = 9000 (3 chunks): in the split strategy no program
    reads more than a chunk of a row (the row strategy's walk read its path, 2-3 rows, in one
    program), and the tree loads what the chain of 8 positions loads (sampling: plus one read
    of the stop node's row for its race, which the chain's one-hot race does in its statistics
    pass)."""
    from specdec_kernels.benchmarks import ops, traffic

    case = ops.Case(op, 1, 7, 9000, "bf16", 0.5)
    row = traffic.tree_traffic(case)
    assert row["strategy"] == "split"
    assert row["tree_rows_per_program"] <= 4096 / 9000 + 1e-6, row  # one CHUNK at most
    extra = 0 if op == "verify_tree_greedy" else 9000 * 2 / 2**20  # the stop row, bf16
    assert row["tree_loaded_mb"] <= row["chain_loaded_mb"] + extra + 1e-3, row
    walk = row["tree_launches"].index("_verify_tree_kernel")
    assert row["tree_programs"][walk] == 1 and "_split_stats_kernel" in row["tree_launches"]
